// Embedding gather of a 16-bit table (F16/BF16 bits, two per u32 word, the first in the
// low half) over one block of table rows [row0, row1): out[n, :] = table[ids[n] − row0, :],
// bits unchanged. Thread per output word; a half whose row lies in another block keeps
// what the block that owns it wrote (blocks are separate, ordered dispatches).

@group(0) @binding(1) var<storage, read> ids: array<u32>;
@group(0) @binding(2) var<storage, read> table: array<u32>;
@group(0) @binding(3) var<storage, read_write> out: array<u32>;

// params: n·d, d, row0, row1
@compute @workgroup_size(256)
fn embedding16(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let w = flat_group(wid) * 256u + lid.x;
    let total = pu(0u);
    if (2u * w >= total) { return; }
    let d = pu(1u);
    var word = out[off(2u) + w];
    for (var h = 0u; h < 2u; h++) {
        let e = 2u * w + h;
        if (e >= total) { break; }
        let r = ids[off(0u) + e / d];
        if (r < pu(2u) || r >= pu(3u)) { continue; }
        let s = (r - pu(2u)) * d + e % d;
        let v = (table[off(1u) + s / 2u] >> (16u * (s & 1u))) & 0xffffu;
        let shift = 16u * h;
        word = (word & ~(0xffffu << shift)) | (v << shift);
    }
    out[off(2u) + w] = word;
}
