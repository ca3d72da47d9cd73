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

// out[g] = Σ x[i]² over the 4096 elements of chunk g (tree reduction in a fixed order).
// params: n
@compute @workgroup_size(256)
fn sum_squares(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let g = flat_group(wid);
    let n = pu(0u);
    var acc = 0.0;
    for (var e = 0u; e < 16u; e++) {
        let i = g * 4096u + e * 256u + lid.x;
        if (i < n) { let v = x[off(0u) + i]; acc += v * v; }
    }
    part[lid.x] = acc;
    workgroupBarrier();
    for (var s = 128u; s > 0u; s >>= 1u) {
        if (lid.x < s) { part[lid.x] += part[lid.x + s]; }
        workgroupBarrier();
    }
    if (lid.x == 0u) { out[off(1u) + g] = part[0]; }
}
