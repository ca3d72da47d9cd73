// Materialised permutation of a 16-bit tensor (F16/BF16 bits, two per u32 word, the first
// in the low half): one thread per output word, reading output element i at input element
// e0 + Σ_d coord_d·in_stride[perm[d]] as permute.wgsl does, and storing it at
// element o0 + i of the output. The bits move unchanged; with the identity permutation
// and offsets this is a copy between any 16-bit positions (slice_rows at an odd element
// offset, KV-cache rows of an odd head dim).

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

// params: n, rank, out_dims[6], in_strides_permuted[6], e0, o0 (output element i is
// stored at element o0 + i of `out`; the other halves of the words touched are kept)
@compute @workgroup_size(256)
fn permute16(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let n = pu(0u);
    let o0 = pu(15u);
    let w = o0 / 2u + flat_group(wid) * 256u + lid.x;
    if (2u * w >= o0 + n) { return; }
    var v = out[off(1u) + w];
    for (var h = 0u; h < 2u; h++) {
        let e = 2u * w + h;
        if (e < o0 || e >= o0 + n) { continue; }
        let shift = 16u * h;
        v = (v & ~(0xffffu << shift)) | (elem(e - o0) << shift);
    }
    out[off(1u) + w] = v;
}
