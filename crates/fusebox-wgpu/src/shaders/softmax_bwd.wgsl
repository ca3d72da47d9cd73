// softmax backward over the last dim: dx = y·(dy − Σ dy·y), one workgroup per row.

@group(0) @binding(1) var<storage, read> y: array<f32>;
@group(0) @binding(2) var<storage, read> dy: array<f32>;
@group(0) @binding(3) var<storage, read_write> dx: array<f32>;

// params: rows, d
@compute @workgroup_size(256)
fn softmax_backward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let row = flat_group(wid);
    let d = pu(1u);
    let base = row * d;
    let t = lid.x;
    let live = row < pu(0u);
    var s = 0.0;
    if (live) {
        for (var j = t; j < d; j += 256u) { s += y[off(0u) + base + j] * dy[off(1u) + base + j]; }
    }
    let dot = wg_sum(s, t);
    if (!live) { return; }
    for (var j = t; j < d; j += 256u) {
        let yv = y[off(0u) + base + j];
        dx[off(2u) + base + j] = yv * (dy[off(1u) + base + j] - dot);
    }
}
