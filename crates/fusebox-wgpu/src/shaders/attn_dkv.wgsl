// Causal attention backward, dk and dv: thread per key row of a kv head, summing over
// every query head of its group and every query row that sees the key, in order:
// dv_j = Σ p·dO_i, dk_j = scale·Σ p·(dO_i·v_j − delta_i)·q_i.

@group(0) @binding(1) var<storage, read> q: array<f32>;
@group(0) @binding(2) var<storage, read> k: array<f32>;
@group(0) @binding(3) var<storage, read> v: array<f32>;
@group(0) @binding(4) var<storage, read> lse: array<f32>;
@group(0) @binding(5) var<storage, read> d_o: array<f32>;
@group(0) @binding(6) var<storage, read> delta: array<f32>;
@group(0) @binding(7) var<storage, read_write> dk: array<f32>;
@group(0) @binding(8) var<storage, read_write> dv: array<f32>;

// params: rows (B·Hkv·Tk), hq, hkv, tq, tk, d, scale
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
    var kv: array<f32, 256>;
    var vv: array<f32, 256>;
    var dka: array<f32, 256>;
    var dva: array<f32, 256>;
    for (var e = 0u; e < d; e++) {
        kv[e] = k[off(1u) + r * d + e];
        vv[e] = v[off(2u) + r * d + e];
        dka[e] = 0.0;
        dva[e] = 0.0;
    }
    // Query row i sees key j when j ≤ i + (tk − tq).
    var i0 = 0u;
    if (j > tk - tq) { i0 = j - (tk - tq); }
    for (var g = 0u; g < group; g++) {
        let h = kvh * group + g;
        let rb = (b * hq + h) * tq;
        for (var i = i0; i < tq; i++) {
            let qr = rb + i;
            var s = 0.0;
            var dp = 0.0;
            for (var e = 0u; e < d; e++) {
                s = fma(q[off(0u) + qr * d + e], kv[e], s);
                dp = fma(d_o[off(4u) + qr * d + e], vv[e], dp);
            }
            let p = exp(s * scale - lse[off(3u) + qr]);
            let ds = p * (dp - delta[off(5u) + qr]) * scale;
            for (var e = 0u; e < d; e++) {
                dva[e] = fma(p, d_o[off(4u) + qr * d + e], dva[e]);
                dka[e] = fma(ds, q[off(0u) + qr * d + e], dka[e]);
            }
        }
    }
    for (var e = 0u; e < d; e++) {
        dk[off(6u) + r * d + e] = dka[e];
        dv[off(7u) + r * d + e] = dva[e];
    }
}
