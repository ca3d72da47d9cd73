// Attention forward, thread per query row, online softmax over the keys; GQA by
// index (query head h reads kv head h / (Hq/Hkv)); causal mask aligned bottom-right:
// query i (at position p = i + Tk − Tq) sees keys j ≤ p, and with a sliding window of
// W keys (`window` > 0) only p − W < j ≤ p (the loop starts there, so a row reads W
// keys); k/v rows are read from caches of `cap` rows per head (cap = Tk for plain
// attention).
//
// One dispatch covers keys [j0, j1): software rasterizers bound the loop iterations of
// one invocation (llvmpipe stops a shader's loops after 65535 iterations), so the key
// loop is split across dispatches that carry the running max (in `lse`), the running
// sum (`lsum`) and the unnormalised output (`out`). The last dispatch normalises and
// stores lse = m + ln l (−∞ for a row that sees no key).
//
// Attention sinks (`has_sinks` ≠ 0): head h's logit sinks[h] is one more term of every
// row's denominator, with no value: the first dispatch starts the row at m = sinks[h],
// l = 1 (the term e^(sinks[h] − m)) instead of m = −∞, l = 0, and the updates rescale
// it with the rest (a row that sees no key gives zeros and lse = sinks[h]).

@group(0) @binding(1) var<storage, read> q: array<f32>;
@group(0) @binding(2) var<storage, read> k: array<f32>;
@group(0) @binding(3) var<storage, read> v: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;
@group(0) @binding(5) var<storage, read_write> lse: array<f32>;
@group(0) @binding(6) var<storage, read_write> lsum: array<f32>;
@group(0) @binding(7) var<storage, read> sinks: array<f32>;

// params: rows, hq, hkv, tq, tk, cap, d, scale, causal, j0, j1, first, last, window, has_sinks
@compute @workgroup_size(64)
fn attention(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let r = flat_group(wid) * 64u + lid.x;
    if (r >= pu(0u)) { return; }
    let hq = pu(1u);
    let hkv = pu(2u);
    let tq = pu(3u);
    let tk = pu(4u);
    let cap = pu(5u);
    let d = pu(6u);
    let scale = pf(7u);
    let first = pu(11u) != 0u;
    let last = pu(12u) != 0u;
    let i = r % tq;
    let bh = r / tq;
    let h = bh % hq;
    let b = bh / hq;
    let kvh = h / (hq / hkv);
    var limit = tk;
    var j0 = pu(9u);
    if (pu(8u) != 0u) {
        let pos = i + (tk - tq);
        limit = min(tk, pos + 1u);
        let w = pu(13u);
        if (w != 0u && pos + 1u > w) { j0 = max(j0, pos + 1u - w); }
    }
    let j1 = min(limit, pu(10u));
    let qb = off(0u) + r * d;
    let ob = off(3u) + r * d;
    let kb = (b * hkv + kvh) * cap * d;
    var qv: array<f32, 256>;
    var acc: array<f32, 256>;
    var m = -inf_f32();
    var l = 0.0;
    if (first) {
        for (var e = 0u; e < d; e++) { acc[e] = 0.0; }
        if (pu(14u) != 0u) {
            m = sinks[off(6u) + h];
            l = 1.0;
        }
    } else {
        for (var e = 0u; e < d; e++) { acc[e] = out[ob + e]; }
        m = lse[off(4u) + r];
        l = lsum[off(5u) + r];
    }
    for (var e = 0u; e < d; e++) { qv[e] = q[qb + e] * scale; }
    let d4 = d & ~3u;
    for (var j = j0; j < j1; j++) {
        let kr = off(1u) + kb + j * d;
        var s = 0.0;
        for (var e = 0u; e < d4; e += 4u) {
            s += qv[e] * k[kr + e] + qv[e + 1u] * k[kr + e + 1u] + qv[e + 2u] * k[kr + e + 2u] + qv[e + 3u] * k[kr + e + 3u];
        }
        for (var e = d4; e < d; e++) { s = fma(qv[e], k[kr + e], s); }
        let mn = max(m, s);
        let corr = exp(m - mn);
        let p = exp(s - mn);
        l = l * corr + p;
        let vr = off(2u) + kb + j * d;
        for (var e = 0u; e < d4; e += 4u) {
            acc[e] = fma(p, v[vr + e], acc[e] * corr);
            acc[e + 1u] = fma(p, v[vr + e + 1u], acc[e + 1u] * corr);
            acc[e + 2u] = fma(p, v[vr + e + 2u], acc[e + 2u] * corr);
            acc[e + 3u] = fma(p, v[vr + e + 3u], acc[e + 3u] * corr);
        }
        for (var e = d4; e < d; e++) { acc[e] = fma(p, v[vr + e], acc[e] * corr); }
        m = mn;
    }
    if (!last) {
        for (var e = 0u; e < d; e++) { out[ob + e] = acc[e]; }
        lse[off(4u) + r] = m;
        lsum[off(5u) + r] = l;
        return;
    }
    var inv = 0.0;
    if (l > 0.0) { inv = 1.0 / l; }
    for (var e = 0u; e < d; e++) { out[ob + e] = acc[e] * inv; }
    if (l > 0.0) { lse[off(4u) + r] = m + log(l); } else { lse[off(4u) + r] = -inf_f32(); }
}
