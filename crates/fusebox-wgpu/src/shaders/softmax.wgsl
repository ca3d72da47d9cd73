// softmax (mode 0) and log_softmax (mode 1) over the last dim, one workgroup per row;
// a row of all −∞ gives zeros (softmax) or −∞ (log_softmax).

@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;

// params: rows, d, mode
@compute @workgroup_size(256)
fn softmax(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let row = flat_group(wid);
    let d = pu(1u);
    let base = row * d;
    let t = lid.x;
    let live = row < pu(0u);
    var m = -3.4028235e38;
    if (live) {
        for (var j = t; j < d; j += 256u) { m = max(m, x[off(0u) + base + j]); }
    }
    let rm = wg_max(m, t);
    var s = 0.0;
    if (live) {
        for (var j = t; j < d; j += 256u) { s += exp(x[off(0u) + base + j] - rm); }
    }
    let total = wg_sum(s, t);
    if (!live) { return; }
    let dead = rm <= -3.4028235e38;
    let log_mode = pu(2u) == 1u;
    let lse = log(total);
    for (var j = t; j < d; j += 256u) {
        let v = x[off(0u) + base + j];
        var y = 0.0;
        if (log_mode) {
            y = select(v - rm - lse, -inf_f32(), dead);
        } else {
            y = select(exp(v - rm) / total, 0.0, dead);
        }
        out[off(1u) + base + j] = y;
    }
}
