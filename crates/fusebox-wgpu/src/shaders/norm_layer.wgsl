// layer_norm: one workgroup per row; mean, then variance of (x − mean) (two passes).

@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<f32>;
@group(0) @binding(3) var<storage, read> bias: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;
@group(0) @binding(5) var<storage, read_write> mean: array<f32>;
@group(0) @binding(6) var<storage, read_write> rstd: array<f32>;

// params: rows, d, eps
@compute @workgroup_size(256)
fn layer_norm(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let row = flat_group(wid);
    let d = pu(1u);
    let base = row * d;
    let t = lid.x;
    let live = row < pu(0u);
    var s = 0.0;
    if (live) {
        for (var j = t; j < d; j += 256u) { s += x[off(0u) + base + j]; }
    }
    let mu = wg_sum(s, t) / f32(d);
    var ss = 0.0;
    if (live) {
        for (var j = t; j < d; j += 256u) { let c = x[off(0u) + base + j] - mu; ss += c * c; }
    }
    let var_ = wg_sum(ss, t) / f32(d);
    if (!live) { return; }
    let r = 1.0 / sqrt(var_ + pf(2u));
    for (var j = t; j < d; j += 256u) {
        out[off(3u) + base + j] = (x[off(0u) + base + j] - mu) * r * w[off(1u) + j] + bias[off(2u) + j];
    }
    if (t == 0u) {
        mean[off(4u) + row] = mu;
        rstd[off(5u) + row] = r;
    }
}
