// add_rms_norm: s = a + b and rms_norm(s, w), one workgroup per row.

@group(0) @binding(1) var<storage, read> a: array<f32>;
@group(0) @binding(2) var<storage, read> b: array<f32>;
@group(0) @binding(3) var<storage, read> w: array<f32>;
@group(0) @binding(4) var<storage, read_write> s: array<f32>;
@group(0) @binding(5) var<storage, read_write> out: array<f32>;
@group(0) @binding(6) var<storage, read_write> rstd: array<f32>;

// params: rows, d, eps
@compute @workgroup_size(256)
fn add_rms_norm(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let row = flat_group(wid);
    let d = pu(1u);
    let base = row * d;
    let t = lid.x;
    var ss = 0.0;
    if (row < pu(0u)) {
        for (var j = t; j < d; j += 256u) {
            let v = a[off(0u) + base + j] + b[off(1u) + base + j];
            s[off(3u) + base + j] = v;
            ss += v * v;
        }
    }
    let total = wg_sum(ss, t);
    if (row >= pu(0u)) { return; }
    let r = 1.0 / sqrt(total / f32(d) + pf(2u));
    for (var j = t; j < d; j += 256u) {
        let v = a[off(0u) + base + j] + b[off(1u) + base + j];
        out[off(4u) + base + j] = v * r * w[off(2u) + j];
    }
    if (t == 0u) { rstd[off(5u) + row] = r; }
}
