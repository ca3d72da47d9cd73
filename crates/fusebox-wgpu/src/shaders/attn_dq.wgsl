// Causal attention backward, dq: thread per query row; P recomputed from the saved
// logsumexp: p = exp(s − lse), ds = p·(dO·v − delta), dq = scale·Σ_j ds·k_j.

@group(0) @binding(1) var<storage, read> q: array<f32>;
@group(0) @binding(2) var<storage, read> k: array<f32>;
@group(0) @binding(3) var<storage, read> v: array<f32>;
@group(0) @binding(4) var<storage, read> lse: array<f32>;
@group(0) @binding(5) var<storage, read> d_o: array<f32>;
@group(0) @binding(6) var<storage, read> delta: array<f32>;
@group(0) @binding(7) var<storage, read_write> dq: array<f32>;

// params: rows, hq, hkv, tq, tk, d, scale
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
    let limit = min(tk, i + (tk - tq) + 1u);
    let kb = (b * hkv + kvh) * tk * d;
    var qv: array<f32, 256>;
    var dov: array<f32, 256>;
    var acc: array<f32, 256>;
    for (var e = 0u; e < d; e++) {
        qv[e] = q[off(0u) + r * d + e];
        dov[e] = d_o[off(4u) + r * d + e];
        acc[e] = 0.0;
    }
    let l = lse[off(3u) + r];
    let dl = delta[off(5u) + r];
    for (var j = 0u; j < limit; j++) {
        let kr = off(1u) + kb + j * d;
        let vr = off(2u) + kb + j * d;
        var s = 0.0;
        var dp = 0.0;
        for (var e = 0u; e < d; e++) {
            s = fma(qv[e], k[kr + e], s);
            dp = fma(dov[e], v[vr + e], dp);
        }
        let p = exp(s * scale - l);
        let ds = p * (dp - dl) * scale;
        for (var e = 0u; e < d; e++) { acc[e] = fma(ds, k[kr + e], acc[e]); }
    }
    for (var e = 0u; e < d; e++) { dq[off(6u) + r * d + e] = acc[e]; }
}
