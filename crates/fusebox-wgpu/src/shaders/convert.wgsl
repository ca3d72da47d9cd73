// Float storage conversions between F32, F16 and BF16 (kinds 0, 1, 2), in integer
// arithmetic: f16 rounds to nearest even (subnormals and overflow to inf included),
// bf16 rounds to nearest even, NaN stays a (quiet) NaN. 16-bit tensors hold two
// values per u32 word, the first in the low half.

@group(0) @binding(1) var<storage, read> xin: array<u32>;
@group(0) @binding(2) var<storage, read_write> yout: array<u32>;

fn from_f16(h: u32) -> f32 {
    let s = (h & 0x8000u) << 16u;
    let e = (h >> 10u) & 0x1fu;
    let m = h & 0x3ffu;
    if (e == 0u) {
        // m · 2^-24, exact in f32.
        let v = f32(m) * 5.9604644775390625e-8;
        return bitcast<f32>(bitcast<u32>(v) | s);
    }
    if (e == 31u) { return bitcast<f32>(s | 0x7f800000u | (m << 13u)); }
    return bitcast<f32>(s | ((e + 112u) << 23u) | (m << 13u));
}

fn to_f16(b: u32) -> u32 {
    let sign = (b >> 16u) & 0x8000u;
    let a = b & 0x7fffffffu;
    if (a > 0x7f800000u) { return sign | 0x7e00u | ((a >> 13u) & 0x3ffu); }
    if (a >= 0x477ff000u) { return sign | 0x7c00u; }
    if (a >= 0x38800000u) {
        let r = a - 0x38000000u;
        return sign | ((r + 0xfffu + ((r >> 13u) & 1u)) >> 13u);
    }
    let e = a >> 23u;
    if (e < 102u) { return sign; }
    let m = (a & 0x7fffffu) | 0x800000u;
    let shift = 126u - e;
    let q = m >> shift;
    let rem = m & ((1u << shift) - 1u);
    let hlf = 1u << (shift - 1u);
    var res = q;
    if (rem > hlf || (rem == hlf && (q & 1u) == 1u)) { res = q + 1u; }
    return sign | res;
}

fn to_bf16(b: u32) -> u32 {
    if ((b & 0x7fffffffu) > 0x7f800000u) { return (b >> 16u) | 0x40u; }
    return (b + 0x7fffu + ((b >> 16u) & 1u)) >> 16u;
}

// The f32 bits of element i of the input (kind k).
fn load_bits(k: u32, i: u32) -> u32 {
    if (k == 0u) { return xin[off(0u) + i]; }
    let h = (xin[off(0u) + i / 2u] >> (16u * (i & 1u))) & 0xffffu;
    if (k == 1u) { return bitcast<u32>(from_f16(h)); }
    return h << 16u;
}

fn store16(k: u32, bits: u32) -> u32 {
    if (k == 1u) { return to_f16(bits); }
    return to_bf16(bits);
}

// params: n, input kind, output kind. One thread per output element (f32 output) or
// per output word (two 16-bit elements). Writes only the output's own elements, so a
// 16-bit output may be a view into a live tensor (`narrow_into`).
@compute @workgroup_size(256)
fn cast_float(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let i = flat_group(wid) * 256u + lid.x;
    let n = pu(0u);
    let ik = pu(1u);
    let outk = pu(2u);
    if (outk == 0u) {
        if (i >= n) { return; }
        yout[off(1u) + i] = load_bits(ik, i);
        return;
    }
    let e = 2u * i;
    if (e >= n) { return; }
    var w = store16(outk, load_bits(ik, e));
    if (e + 1u < n) {
        w = w | (store16(outk, load_bits(ik, e + 1u)) << 16u);
    } else {
        // An odd count's last word: its high half is not ours (the next part of a
        // partitioned buffer, or padding), keep it.
        w = w | (yout[off(1u) + i] & 0xffff0000u);
    }
    yout[off(1u) + i] = w;
}
