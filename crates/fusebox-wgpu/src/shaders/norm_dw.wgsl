// dweight and dbias of the norms: thread per column j, rows summed in order:
// dw[j] = Σ_r dy[r,j]·(x[r,j] − μ_r)·r_r, db[j] = Σ_r dy[r,j].

@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> mean: array<f32>;
@group(0) @binding(3) var<storage, read> rstd: array<f32>;
@group(0) @binding(4) var<storage, read> dy: array<f32>;
@group(0) @binding(5) var<storage, read_write> dw: array<f32>;
@group(0) @binding(6) var<storage, read_write> db: array<f32>;

// params: rows, d, has_mean
@compute @workgroup_size(256)
fn norm_dw(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let j = flat_group(wid) * 256u + lid.x;
    let d = pu(1u);
    if (j >= d) { return; }
    let rows = pu(0u);
    let has_mean = pu(2u) != 0u;
    var aw = 0.0;
    var ab = 0.0;
    for (var r = 0u; r < rows; r++) {
        var mu = 0.0;
        if (has_mean) { mu = mean[off(1u) + r]; }
        let g = dy[off(3u) + r * d + j];
        aw += g * (x[off(0u) + r * d + j] - mu) * rstd[off(2u) + r];
        ab += g;
    }
    dw[off(4u) + j] = aw;
    db[off(5u) + j] = ab;
}
