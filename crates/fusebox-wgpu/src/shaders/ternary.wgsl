// Three-input elementwise ops: add3 (code 0), sub_mul (code 1); silu_mul backward.

@group(0) @binding(1) var<storage, read> a: array<f32>;
@group(0) @binding(2) var<storage, read> b: array<f32>;
@group(0) @binding(3) var<storage, read> c: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;
@group(0) @binding(5) var<storage, read_write> out2: array<f32>;

// params: code, n
@compute @workgroup_size(256)
fn ternary(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let i = flat_group(wid) * 256u + lid.x;
    if (i >= pu(1u)) { return; }
    let x = a[off(0u) + i];
    let y = b[off(1u) + i];
    let z = c[off(2u) + i];
    if (pu(0u) == 0u) {
        out[off(3u) + i] = x + y + z;
    } else {
        out[off(3u) + i] = (x - y) * z;
    }
}

// d_gate = dy·up·silu'(gate), d_up = dy·silu(gate)      params: code (unused), n
@compute @workgroup_size(256)
fn silu_mul_backward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let i = flat_group(wid) * 256u + lid.x;
    if (i >= pu(1u)) { return; }
    let g = a[off(0u) + i];
    let u = b[off(1u) + i];
    let dy = c[off(2u) + i];
    let s = 1.0 / (1.0 + exp(-g));
    out[off(3u) + i] = dy * u * s * (1.0 + g * (1.0 - s));
    out2[off(4u) + i] = dy * g * s;
}
