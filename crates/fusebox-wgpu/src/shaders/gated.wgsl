// The GeGLU backward: d_gate = dy·up·gelu'(gate), d_up = dy·gelu(gate), with gelu and
// gelu' from the elementwise function library (unop 15/16, binop 8/9 with dy = 1).

@group(0) @binding(1) var<storage, read> gate: array<f32>;
@group(0) @binding(2) var<storage, read> up: array<f32>;
@group(0) @binding(3) var<storage, read> dy: array<f32>;
@group(0) @binding(4) var<storage, read_write> d_gate: array<f32>;
@group(0) @binding(5) var<storage, read_write> d_up: array<f32>;

// params: form (0 tanh, 1 erf), n
@compute @workgroup_size(256)
fn gelu_mul_backward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let i = flat_group(wid) * 256u + lid.x;
    if (i >= pu(1u)) { return; }
    let g = gate[off(0u) + i];
    let u = up[off(1u) + i];
    let d = dy[off(2u) + i];
    var act = 0.0;
    var grad = 0.0;
    if (pu(0u) == 0u) {
        act = unop(15u, g, 0.0, 0.0);
        grad = binop(8u, g, 1.0, 0.0);
    } else {
        act = unop(16u, g, 0.0, 0.0);
        grad = binop(9u, g, 1.0, 0.0);
    }
    d_gate[off(3u) + i] = d * u * grad;
    d_up[off(4u) + i] = d * act;
}
