// a ← binop(a, b) in place (see elementwise.wgsl for codes).

@group(0) @binding(1) var<storage, read_write> a: array<f32>;
@group(0) @binding(2) var<storage, read> b: array<f32>;

// params: code, n
@compute @workgroup_size(256)
fn binary_inplace(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let i = flat_group(wid) * 256u + lid.x;
    if (i >= pu(1u)) { return; }
    a[off(0u) + i] = binop(pu(0u), a[off(0u) + i], b[off(1u) + i], 0.0);
}
