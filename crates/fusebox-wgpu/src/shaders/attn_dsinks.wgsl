// The attention sinks' gradient, thread per query head h:
//   dsinks[h] = −Σ_{b,i} e^(sinks[h] − lse[b,h,i])·delta[b,h,i]
// (delta = dO·O per row, from attn_delta.wgsl; a row with lse = −∞ adds 0). One dispatch
// covers the flat rows n0 ≤ n < n1 of n = b·Tq + i (loops are bounded, see
// attention.wgsl); the first starts from 0, the others add to what is stored.

@group(0) @binding(1) var<storage, read> lse: array<f32>;
@group(0) @binding(2) var<storage, read> delta: array<f32>;
@group(0) @binding(3) var<storage, read> sinks: array<f32>;
@group(0) @binding(4) var<storage, read_write> dsinks: array<f32>;

// params: hq, tq, n0, n1, first
@compute @workgroup_size(64)
fn attn_dsinks(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let h = flat_group(wid) * 64u + lid.x;
    let hq = pu(0u);
    if (h >= hq) { return; }
    let tq = pu(1u);
    var acc = 0.0;
    if (pu(4u) == 0u) { acc = dsinks[off(3u) + h]; }
    let s = sinks[off(2u) + h];
    for (var n = pu(2u); n < pu(3u); n++) {
        let r = ((n / tq) * hq + h) * tq + n % tq;
        let l = lse[off(0u) + r];
        if (l > -inf_f32()) { acc -= exp(s - l) * delta[off(1u) + r]; }
    }
    dsinks[off(3u) + h] = acc;
}
