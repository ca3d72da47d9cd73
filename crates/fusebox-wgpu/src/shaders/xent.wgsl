// Fused cross-entropy rows, one workgroup per row: row_loss = logsumexp(z) − z[t],
// d_logits = (softmax(z) − onehot(t))·scale; ignored rows give 0 and a zero gradient.

@group(0) @binding(1) var<storage, read> z: array<f32>;
@group(0) @binding(2) var<storage, read> targets: array<u32>;
@group(0) @binding(3) var<storage, read_write> row_loss: array<f32>;
@group(0) @binding(4) var<storage, read_write> dz: array<f32>;

// params: rows, v, has_ignore, ignore, scale
@compute @workgroup_size(256)
fn cross_entropy(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let row = flat_group(wid);
    let v = pu(1u);
    let base = row * v;
    let t = lid.x;
    let live = row < pu(0u);
    var target_id = 0u;
    var ignored = true;
    if (live) {
        target_id = targets[off(1u) + row];
        ignored = pu(2u) != 0u && target_id == pu(3u);
    }
    var m = -3.4028235e38;
    if (live && !ignored) {
        for (var j = t; j < v; j += 256u) { m = max(m, z[off(0u) + base + j]); }
    }
    let rm = wg_max(m, t);
    var s = 0.0;
    if (live && !ignored) {
        for (var j = t; j < v; j += 256u) { s += exp(z[off(0u) + base + j] - rm); }
    }
    let total = wg_sum(s, t);
    if (!live) { return; }
    let scale = pf(4u);
    for (var j = t; j < v; j += 256u) {
        var g = 0.0;
        if (!ignored) {
            g = exp(z[off(0u) + base + j] - rm) / total;
            if (j == target_id) { g -= 1.0; }
            g *= scale;
        }
        dz[off(3u) + base + j] = g;
    }
    if (t == 0u) {
        var l = 0.0;
        if (!ignored) { l = rm + log(total) - z[off(0u) + base + target_id]; }
        row_loss[off(2u) + row] = l;
    }
}
