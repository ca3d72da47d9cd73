// Sums over a leading axis in a fixed order: out[j] = Σ_r x[r·stride + j] (column sums
// for linear's dbias, batch sums for shared matmul operands), and per-workgroup partial
// sums of squares for global_norm.

@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;

// params: rows, cols, stride, accumulate
@compute @workgroup_size(256)
fn sum_rows(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let j = flat_group(wid) * 256u + lid.x;
    let cols = pu(1u);
    if (j >= cols) { return; }
    let rows = pu(0u);
    let stride = pu(2u);
    var acc = 0.0;
    for (var r = 0u; r < rows; r++) {
        acc += x[off(0u) + r * stride + j];
    }
    if (pu(3u) != 0u) { acc += out[off(1u) + j]; }
    out[off(1u) + j] = acc;
}

var<workgroup> part: array<f32, 256>;

// Tree reduction of part[] in a fixed order, by max (is_max) or by sum; result in part[0].
fn reduce_part(lane: u32, is_max: bool) {
    for (var s = 128u; s > 0u; s >>= 1u) {
        if (lane < s) {
            if (is_max) { part[lane] = max(part[lane], part[lane + s]); } else { part[lane] += part[lane + s]; }
        }
        workgroupBarrier();
    }
}

// For chunk g of 4096 elements: out[2g] = m = max |x|, out[2g+1] = Σ (x/m)² (0 when m = 0).
// Scaling by the chunk's max keeps squares of values beyond 1.8e19 from overflowing f32;
// the host adds m²·s in f64. An infinite m gives s = 1 (so m²·s = ∞, as on the CPU).
// params: n
@compute @workgroup_size(256)
fn sum_squares(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let g = flat_group(wid);
    let n = pu(0u);
    var m = 0.0;
    for (var e = 0u; e < 16u; e++) {
        let i = g * 4096u + e * 256u + lid.x;
        if (i < n) { m = max(m, abs(x[off(0u) + i])); }
    }
    part[lid.x] = m;
    workgroupBarrier();
    reduce_part(lid.x, true);
    let chunk_max = part[0];
    workgroupBarrier();
    var acc = 0.0;
    if (chunk_max > 3.0e38) {
        acc = select(0.0, 1.0, lid.x == 0u);
    } else if (chunk_max > 0.0) {
        let inv = 1.0 / chunk_max;
        for (var e = 0u; e < 16u; e++) {
            let i = g * 4096u + e * 256u + lid.x;
            if (i < n) { let v = x[off(0u) + i] * inv; acc += v * v; }
        }
    }
    part[lid.x] = acc;
    workgroupBarrier();
    reduce_part(lid.x, false);
    if (lid.x == 0u) {
        out[off(1u) + 2u * g] = chunk_max;
        out[off(1u) + 2u * g + 1u] = part[0];
    }
}
