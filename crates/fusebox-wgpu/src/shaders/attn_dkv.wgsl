// Causal attention backward, dk and dv: thread per key row of a kv head, summing over
// the query heads of its group and the query rows that see the key, in a fixed order:
// dv_j = Σ p·dO_i, dk_j = scale·Σ p·(dO_i·v_j − delta_i)·q_i.
// One dispatch covers query head g of the group and query rows [i0, i1), adding to
// dk/dv (the first one starts from zero); see attention.wgsl for why.

@group(0) @binding(1) var<storage, read> q: array<f32>;
@group(0) @binding(2) var<storage, read> k: array<f32>;
@group(0) @binding(3) var<storage, read> v: array<f32>;
@group(0) @binding(4) var<storage, read> lse: array<f32>;
@group(0) @binding(5) var<storage, read> d_o: array<f32>;
@group(0) @binding(6) var<storage, read> delta: array<f32>;
@group(0) @binding(7) var<storage, read_write> dk: array<f32>;
@group(0) @binding(8) var<storage, read_write> dv: array<f32>;

// params: rows (B·Hkv·Tk), hq, hkv, tq, tk, d, scale, g, i0, i1, first, window
@compute @workgroup_size(64)
fn attn_dkv(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let r = flat_group(wid) * 64u + lid.x;
    if (r >= pu(0u)) { return; }
    let hq = pu(1u);
    let hkv = pu(2u);
    let tq = pu(3u);
    let tk = pu(4u);
    let d = pu(5u);
    let scale = pf(6u);
    let j = r % tk;
    let bh = r / tk;
    let kvh = bh % hkv;
    let b = bh / hkv;
    let group = hq / hkv;
    let rb = off(6u) + r * d;
    let vb = off(7u) + r * d;
    var kv: array<f32, 256>;
    var vv: array<f32, 256>;
    var dka: array<f32, 256>;
    var dva: array<f32, 256>;
    for (var e = 0u; e < d; e++) {
        kv[e] = k[off(1u) + r * d + e];
        vv[e] = v[off(2u) + r * d + e];
    }
    if (pu(10u) != 0u) {
        for (var e = 0u; e < d; e++) { dka[e] = 0.0; dva[e] = 0.0; }
    } else {
        for (var e = 0u; e < d; e++) { dka[e] = dk[rb + e]; dva[e] = dv[vb + e]; }
    }
    // Query row i sees key j when j ≤ i + (tk − tq), and with a sliding window of W
    // keys (`window` > 0) when also i + (tk − tq) < j + W.
    var i_lo = pu(8u);
    if (j > tk - tq) { i_lo = max(i_lo, j - (tk - tq)); }
    var i_hi = pu(9u);
    let w = pu(11u);
    if (w != 0u) { i_hi = min(i_hi, select(0u, j + w - (tk - tq), j + w > tk - tq)); }
    let h = kvh * group + pu(7u);
    let qrb = (b * hq + h) * tq;
    let d4 = d & ~3u;
    for (var i = i_lo; i < i_hi; i++) {
        let qr = qrb + i;
        let qo = off(0u) + qr * d;
        let go = off(4u) + qr * d;
        var s = 0.0;
        var dp = 0.0;
        for (var e = 0u; e < d4; e += 4u) {
            s += q[qo + e] * kv[e] + q[qo + e + 1u] * kv[e + 1u] + q[qo + e + 2u] * kv[e + 2u] + q[qo + e + 3u] * kv[e + 3u];
            dp += d_o[go + e] * vv[e] + d_o[go + e + 1u] * vv[e + 1u] + d_o[go + e + 2u] * vv[e + 2u] + d_o[go + e + 3u] * vv[e + 3u];
        }
        for (var e = d4; e < d; e++) {
            s = fma(q[qo + e], kv[e], s);
            dp = fma(d_o[go + e], vv[e], dp);
        }
        let p = exp(s * scale - lse[off(3u) + qr]);
        let ds = p * (dp - delta[off(5u) + qr]) * scale;
        for (var e = 0u; e < d4; e += 4u) {
            dva[e] = fma(p, d_o[go + e], dva[e]);
            dva[e + 1u] = fma(p, d_o[go + e + 1u], dva[e + 1u]);
            dva[e + 2u] = fma(p, d_o[go + e + 2u], dva[e + 2u]);
            dva[e + 3u] = fma(p, d_o[go + e + 3u], dva[e + 3u]);
            dka[e] = fma(ds, q[qo + e], dka[e]);
            dka[e + 1u] = fma(ds, q[qo + e + 1u], dka[e + 1u]);
            dka[e + 2u] = fma(ds, q[qo + e + 2u], dka[e + 2u]);
            dka[e + 3u] = fma(ds, q[qo + e + 3u], dka[e + 3u]);
        }
        for (var e = d4; e < d; e++) {
            dva[e] = fma(p, d_o[go + e], dva[e]);
            dka[e] = fma(ds, q[qo + e], dka[e]);
        }
    }
    for (var e = 0u; e < d; e++) {
        dk[rb + e] = dka[e];
        dv[vb + e] = dva[e];
    }
}
