// Deterministic scatter-add of rows (embedding backward, scatter_add_rows), from a
// host-built grouping: meta = [rows[U], starts[U + 1], order[M]]; thread per
// (unique row u in [u0, u1), column j): dst[rows[u] − row0, j] (+)= Σ src[order[k], j]
// over k in starts[u] .. starts[u + 1], in order.

@group(0) @binding(1) var<storage, read> meta_: array<u32>;
@group(0) @binding(2) var<storage, read> src: array<f32>;
@group(0) @binding(3) var<storage, read_write> dst: array<f32>;

// params: u_total, d, u0, count (= (u1 − u0)·d), row0, accumulate
@compute @workgroup_size(256)
fn scatter_rows(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let id = flat_group(wid) * 256u + lid.x;
    if (id >= pu(3u)) { return; }
    let ut = pu(0u);
    let d = pu(1u);
    let u = pu(2u) + id / d;
    let j = id % d;
    let row = meta_[off(0u) + u];
    let k0 = meta_[off(0u) + ut + u];
    let k1 = meta_[off(0u) + ut + u + 1u];
    var acc = 0.0;
    for (var k = k0; k < k1; k++) {
        let n = meta_[off(0u) + 2u * ut + 1u + k];
        acc += src[off(1u) + n * d + j];
    }
    let at = off(2u) + (row - pu(4u)) * d + j;
    if (pu(5u) != 0u) { dst[at] = dst[at] + acc; } else { dst[at] = acc; }
}
