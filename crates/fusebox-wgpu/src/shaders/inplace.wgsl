// In-place elementwise ops (see elementwise.wgsl for codes) and the AdamW step.

@group(0) @binding(1) var<storage, read_write> x: array<f32>;

// x = unop(x)                             params: code, n, p0, p1
@compute @workgroup_size(256)
fn unary_inplace(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let i = flat_group(wid) * 256u + lid.x;
    if (i >= pu(1u)) { return; }
    x[off(0u) + i] = unop(pu(0u), x[off(0u) + i], pf(2u), pf(3u));
}
