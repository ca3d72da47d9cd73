// Causal attention backward, dq: thread per query row; P recomputed from the saved
// logsumexp: p = exp(s − lse), ds = p·(dO·v − delta), dq = scale·Σ_j ds·k_j over the
// keys the row sees: j ≤ p = i + (Tk − Tq), and j > p − W with a sliding window of W
// keys (`window` > 0).
// One dispatch covers keys [j0, j1) and adds to dq (the first one starts from zero);
// see attention.wgsl for why the key loop is split.

@group(0) @binding(1) var<storage, read> q: array<f32>;
@group(0) @binding(2) var<storage, read> k: array<f32>;
@group(0) @binding(3) var<storage, read> v: array<f32>;
@group(0) @binding(4) var<storage, read> lse: array<f32>;
@group(0) @binding(5) var<storage, read> d_o: array<f32>;
@group(0) @binding(6) var<storage, read> delta: array<f32>;
@group(0) @binding(7) var<storage, read_write> dq: array<f32>;

// params: rows, hq, hkv, tq, tk, d, scale, j0, j1, first, window
@compute @workgroup_size(64)
fn attn_dq(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let r = flat_group(wid) * 64u + lid.x;
    if (r >= pu(0u)) { return; }
    let hq = pu(1u);
    let hkv = pu(2u);
    let tq = pu(3u);
    let tk = pu(4u);
    let d = pu(5u);
    let scale = pf(6u);
    let i = r % tq;
    let bh = r / tq;
    let h = bh % hq;
    let b = bh / hq;
    let kvh = h / (hq / hkv);
    let pos = i + (tk - tq);
    let j1 = min(min(tk, pos + 1u), pu(8u));
    var j0 = pu(7u);
    let w = pu(10u);
    if (w != 0u && pos + 1u > w) { j0 = max(j0, pos + 1u - w); }
    let kb = (b * hkv + kvh) * tk * d;
    let db = off(6u) + r * d;
    var qv: array<f32, 256>;
    var dov: array<f32, 256>;
    var acc: array<f32, 256>;
    for (var e = 0u; e < d; e++) {
        qv[e] = q[off(0u) + r * d + e];
        dov[e] = d_o[off(4u) + r * d + e];
    }
    if (pu(9u) != 0u) {
        for (var e = 0u; e < d; e++) { acc[e] = 0.0; }
    } else {
        for (var e = 0u; e < d; e++) { acc[e] = dq[db + e]; }
    }
    let l = lse[off(3u) + r];
    let dl = delta[off(5u) + r];
    let d4 = d & ~3u;
    for (var j = j0; j < j1; j++) {
        let kr = off(1u) + kb + j * d;
        let vr = off(2u) + kb + j * d;
        var s = 0.0;
        var dp = 0.0;
        for (var e = 0u; e < d4; e += 4u) {
            s += qv[e] * k[kr + e] + qv[e + 1u] * k[kr + e + 1u] + qv[e + 2u] * k[kr + e + 2u] + qv[e + 3u] * k[kr + e + 3u];
            dp += dov[e] * v[vr + e] + dov[e + 1u] * v[vr + e + 1u] + dov[e + 2u] * v[vr + e + 2u] + dov[e + 3u] * v[vr + e + 3u];
        }
        for (var e = d4; e < d; e++) {
            s = fma(qv[e], k[kr + e], s);
            dp = fma(dov[e], v[vr + e], dp);
        }
        let p = exp(s * scale - l);
        let ds = p * (dp - dl) * scale;
        for (var e = 0u; e < d4; e += 4u) {
            acc[e] = fma(ds, k[kr + e], acc[e]);
            acc[e + 1u] = fma(ds, k[kr + e + 1u], acc[e + 1u]);
            acc[e + 2u] = fma(ds, k[kr + e + 2u], acc[e + 2u]);
            acc[e + 3u] = fma(ds, k[kr + e + 3u], acc[e + 3u]);
        }
        for (var e = d4; e < d; e++) { acc[e] = fma(ds, k[kr + e], acc[e]); }
    }
    for (var e = 0u; e < d; e++) { dq[db + e] = acc[e]; }
}
