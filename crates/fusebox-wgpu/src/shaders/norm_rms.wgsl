// rms_norm: one workgroup per row. y = x·w·r, r = 1/sqrt(mean(x²) + eps).

@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;
@group(0) @binding(4) var<storage, read_write> rstd: array<f32>;

// params: rows, d, eps
@compute @workgroup_size(256)
fn rms_norm(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let row = flat_group(wid);
    let d = pu(1u);
    let base = row * d;
    let t = lid.x;
    var ss = 0.0;
    if (row < pu(0u)) {
        for (var j = t; j < d; j += 256u) { let v = x[off(0u) + base + j]; ss += v * v; }
    }
    let total = wg_sum(ss, t);
    if (row >= pu(0u)) { return; }
    let r = 1.0 / sqrt(total / f32(d) + pf(2u));
    for (var j = t; j < d; j += 256u) {
        out[off(2u) + base + j] = x[off(0u) + base + j] * r * w[off(1u) + j];
    }
    if (t == 0u) { rstd[off(3u) + row] = r; }
}
