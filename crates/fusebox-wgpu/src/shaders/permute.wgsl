// Materialised permutation of up to 6 axes: thread i writes output element i, reading
// the input at Σ_d coord_d(i)·in_stride[perm[d]] (strides passed pre-permuted).

@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;

// params: n, rank, out_dims[6], in_strides_permuted[6]
@compute @workgroup_size(256)
fn permute(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let i = flat_group(wid) * 256u + lid.x;
    if (i >= pu(0u)) { return; }
    let rank = pu(1u);
    var rem = i;
    var src = 0u;
    for (var d = 0u; d < rank; d++) {
        let axis = rank - 1u - d;
        let dim = pu(2u + axis);
        let c = rem % dim;
        rem = rem / dim;
        src += c * pu(8u + axis);
    }
    out[off(1u) + i] = x[off(0u) + src];
}
