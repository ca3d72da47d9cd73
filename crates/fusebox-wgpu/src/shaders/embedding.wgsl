// Embedding gather over one block of table rows [row0, row1) (tables larger than a
// binding are gathered block by block): out[n, :] = table[ids[n] − row0, :].

@group(0) @binding(1) var<storage, read> ids: array<u32>;
@group(0) @binding(2) var<storage, read> table: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

// params: n·d, d, row0, row1
@compute @workgroup_size(256)
fn embedding(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let id = flat_group(wid) * 256u + lid.x;
    if (id >= pu(0u)) { return; }
    let d = pu(1u);
    let n = id / d;
    let j = id % d;
    let r = ids[off(0u) + n];
    if (r < pu(2u) || r >= pu(3u)) { return; }
    out[off(2u) + id] = table[off(1u) + (r - pu(2u)) * d + j];
}
