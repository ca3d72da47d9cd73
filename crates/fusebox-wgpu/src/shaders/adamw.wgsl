// One AdamW step in place, as the CPU kernel computes it, with g = grad_scale·grad:
// m ← β₁m + (1−β₁)g, v ← β₂v + (1−β₂)g², p ← p − lr·(m·inv_bc1/(√v·rsqrt_bc2 + ε) + λ·p).

@group(0) @binding(1) var<storage, read_write> p: array<f32>;
@group(0) @binding(2) var<storage, read> g: array<f32>;
@group(0) @binding(3) var<storage, read_write> m: array<f32>;
@group(0) @binding(4) var<storage, read_write> v: array<f32>;

// params: n, beta1, beta2, lr, eps, weight_decay, inv_bc1, rsqrt_bc2, grad_scale
@compute @workgroup_size(256)
fn adamw(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let i = flat_group(wid) * 256u + lid.x;
    if (i >= pu(0u)) { return; }
    let b1 = pf(1u);
    let b2 = pf(2u);
    let gi = pf(8u) * g[off(1u) + i];
    let mi = b1 * m[off(2u) + i] + (1.0 - b1) * gi;
    let vi = b2 * v[off(3u) + i] + (1.0 - b2) * gi * gi;
    m[off(2u) + i] = mi;
    v[off(3u) + i] = vi;
    let pi = p[off(0u) + i];
    let update = (mi * pf(6u)) / (sqrt(vi) * pf(7u) + pf(4u)) + pf(5u) * pi;
    p[off(0u) + i] = pi - pf(3u) * update;
}
