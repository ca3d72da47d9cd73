// dx of rms_norm (has_mean = 0) and layer_norm (has_mean = 1), one workgroup per row:
// x̂ = (x − μ)·r, g = dy·w; rms: dx = r·(g − x̂·mean(g·x̂));
// layer: dx = r·(g − mean(g) − x̂·mean(g·x̂)).

@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<f32>;
@group(0) @binding(3) var<storage, read> mean: array<f32>;
@group(0) @binding(4) var<storage, read> rstd: array<f32>;
@group(0) @binding(5) var<storage, read> dy: array<f32>;
@group(0) @binding(6) var<storage, read_write> dx: array<f32>;

// params: rows, d, has_mean
@compute @workgroup_size(256)
fn norm_backward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let row = flat_group(wid);
    let d = pu(1u);
    let base = row * d;
    let t = lid.x;
    let live = row < pu(0u);
    let has_mean = pu(2u) != 0u;
    var mu = 0.0;
    var r = 0.0;
    if (live) {
        if (has_mean) { mu = mean[off(2u) + row]; }
        r = rstd[off(3u) + row];
    }
    var sg = 0.0;
    var sgx = 0.0;
    if (live) {
        for (var j = t; j < d; j += 256u) {
            let xh = (x[off(0u) + base + j] - mu) * r;
            let g = dy[off(4u) + base + j] * w[off(1u) + j];
            sg += g;
            sgx += g * xh;
        }
    }
    let mean_g = wg_sum(sg, t) / f32(d);
    let mean_gx = wg_sum(sgx, t) / f32(d);
    if (!live) { return; }
    for (var j = t; j < d; j += 256u) {
        let xh = (x[off(0u) + base + j] - mu) * r;
        let g = dy[off(4u) + base + j] * w[off(1u) + j];
        var v = g - xh * mean_gx;
        if (has_mean) { v -= mean_g; }
        dx[off(5u) + base + j] = r * v;
    }
}
