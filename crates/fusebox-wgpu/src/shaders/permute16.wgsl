// Materialised permutation of a 16-bit tensor (F16/BF16 bits, two per u32 word, the first
// in the low half): thread w writes output word w (elements 2w and 2w + 1), reading each
// element at e0 + Σ_d coord_d·in_stride[perm[d]] as permute.wgsl does. The bits move
// unchanged; with the identity permutation and an element offset e0 this is a copy from
// any 16-bit position (slice_rows at an odd element offset).

@group(0) @binding(1) var<storage, read> x: array<u32>;
@group(0) @binding(2) var<storage, read_write> out: array<u32>;

// The input element of output element i.
fn src_index(i: u32) -> u32 {
    let rank = pu(1u);
    var rem = i;
    var src = pu(14u);
    for (var d = 0u; d < rank; d++) {
        let axis = rank - 1u - d;
        let dim = pu(2u + axis);
        let c = rem % dim;
        rem = rem / dim;
        src += c * pu(8u + axis);
    }
    return src;
}

fn elem(i: u32) -> u32 {
    let s = src_index(i);
    return (x[off(0u) + s / 2u] >> (16u * (s & 1u))) & 0xffffu;
}

// params: n, rank, out_dims[6], in_strides_permuted[6], e0
@compute @workgroup_size(256)
fn permute16(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let w = flat_group(wid) * 256u + lid.x;
    let n = pu(0u);
    let e = 2u * w;
    if (e >= n) { return; }
    var v = elem(e);
    if (e + 1u < n) {
        v = v | (elem(e + 1u) << 16u);
    } else {
        // An odd count's last word: its high half is not ours, keep it.
        v = v | (out[off(1u) + w] & 0xffff0000u);
    }
    out[off(1u) + w] = v;
}
