// Gradient of max along an axis: with x viewed as [outer, n, inner] and arg[p] the
// arg-max of output p = o·inner + i, dx[(o·n + arg[p])·inner + i] = dy[p] (dx zeroed
// beforehand). Thread per output.

@group(0) @binding(1) var<storage, read> arg: array<u32>;
@group(0) @binding(2) var<storage, read> dy: array<f32>;
@group(0) @binding(3) var<storage, read_write> dx: array<f32>;

// params: outputs, n, inner
@compute @workgroup_size(256)
fn max_route(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let p = flat_group(wid) * 256u + lid.x;
    if (p >= pu(0u)) { return; }
    let n = pu(1u);
    let inner = pu(2u);
    let o = p / inner;
    let i = p % inner;
    dx[off(2u) + (o * n + arg[off(0u) + p]) * inner + i] = dy[off(1u) + p];
}
