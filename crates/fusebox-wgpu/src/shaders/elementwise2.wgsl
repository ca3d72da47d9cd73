// Two- and three-input elementwise ops and broadcasts (see elementwise.wgsl for codes).

@group(0) @binding(1) var<storage, read> a: array<f32>;
@group(0) @binding(2) var<storage, read> b: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

// out = binop(a, b)                      params: code, n, c
@compute @workgroup_size(256)
fn binary(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let i = flat_group(wid) * 256u + lid.x;
    if (i >= pu(1u)) { return; }
    out[off(2u) + i] = binop(pu(0u), a[off(0u) + i], b[off(1u) + i], pf(2u));
}

// out[i] = binop(a[i], b[i % cols])      params: code, n, cols
@compute @workgroup_size(256)
fn row(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let i = flat_group(wid) * 256u + lid.x;
    if (i >= pu(1u)) { return; }
    out[off(2u) + i] = binop(pu(0u), a[off(0u) + i], b[off(1u) + i % pu(2u)], 0.0);
}

// out[i] = binop(a[i], b[i / cols])      params: code, n, cols
@compute @workgroup_size(256)
fn col(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let i = flat_group(wid) * 256u + lid.x;
    if (i >= pu(1u)) { return; }
    out[off(2u) + i] = binop(pu(0u), a[off(0u) + i], b[off(1u) + i / pu(2u)], 0.0);
}
