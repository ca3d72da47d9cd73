// Rotary embedding, thread per (row, pair): (a, b) → (a·c − s·b, a·s + b·c) with
// s = sign·sin (sign −1 for the backward, the inverse rotation).

@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> cos_t: array<f32>;
@group(0) @binding(3) var<storage, read> sin_t: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;

// params: n (rows·half), t, half, interleaved, offset, sign
@compute @workgroup_size(256)
fn rope(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let id = flat_group(wid) * 256u + lid.x;
    if (id >= pu(0u)) { return; }
    let half = pu(2u);
    let row = id / half;
    let i = id % half;
    let pos = pu(4u) + row % pu(1u);
    let c = cos_t[off(1u) + pos * half + i];
    let s = sin_t[off(2u) + pos * half + i] * pf(5u);
    let base = row * half * 2u;
    var ia = base + i;
    var ib = base + i + half;
    if (pu(3u) != 0u) {
        ia = base + 2u * i;
        ib = ia + 1u;
    }
    let a = x[off(0u) + ia];
    let b = x[off(0u) + ib];
    out[off(3u) + ia] = a * c - b * s;
    out[off(3u) + ib] = a * s + b * c;
}
