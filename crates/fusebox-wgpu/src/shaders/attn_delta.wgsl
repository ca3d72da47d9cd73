// delta[r] = Σ_e dO[r, e]·O[r, e], thread per query row (the softmax-backward term).

@group(0) @binding(1) var<storage, read> o: array<f32>;
@group(0) @binding(2) var<storage, read> d_o: array<f32>;
@group(0) @binding(3) var<storage, read_write> delta: array<f32>;

// params: rows, d
@compute @workgroup_size(64)
fn attn_delta(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let r = flat_group(wid) * 64u + lid.x;
    if (r >= pu(0u)) { return; }
    let d = pu(1u);
    var s = 0.0;
    for (var e = 0u; e < d; e++) { s = fma(o[off(0u) + r * d + e], d_o[off(1u) + r * d + e], s); }
    delta[off(2u) + r] = s;
}
