// y = x·Wᵀ read straight from GGUF blocks (Q8_0: fmt 0, Q4_1: fmt 1); W's bytes are
// read as u32 words. Thread per output (row, out).

@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<u32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;

// The little-endian u32 starting at byte `i` (any alignment).
fn word_at(i: u32) -> u32 {
    let lo = w[i >> 2u];
    let sh = (i & 3u) * 8u;
    if (sh == 0u) { return lo; }
    let hi = w[(i >> 2u) + 1u];
    return (lo >> sh) | (hi << (32u - sh));
}

fn f16_at(i: u32) -> f32 {
    return unpack2x16float(word_at(i) & 0xffffu).x;
}

fn sbyte(wd: u32, k: u32) -> f32 {
    return f32(i32(wd << (24u - 8u * k)) >> 24u);
}

// params: rows, n_out, k_in, fmt
@compute @workgroup_size(64)
fn quantized_matmul(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let id = flat_group(wid) * 64u + lid.x;
    let n_out = pu(1u);
    if (id >= pu(0u) * n_out) { return; }
    let row = id / n_out;
    let o = id % n_out;
    let kin = pu(2u);
    let nb = kin / 32u;
    let fmt = pu(3u);
    let xb = off(0u) + row * kin;
    let wbase = off(1u) * 4u;
    var acc = 0.0;
    if (fmt == 0u) {
        let rb = wbase + o * nb * 34u;
        for (var blk = 0u; blk < nb; blk++) {
            let bb = rb + blk * 34u;
            let dsc = f16_at(bb);
            var s = 0.0;
            for (var q = 0u; q < 8u; q++) {
                let wd = word_at(bb + 2u + 4u * q);
                let xi = xb + blk * 32u + 4u * q;
                s += x[xi] * sbyte(wd, 0u) + x[xi + 1u] * sbyte(wd, 1u) + x[xi + 2u] * sbyte(wd, 2u) + x[xi + 3u] * sbyte(wd, 3u);
            }
            acc += dsc * s;
        }
    } else {
        let rb = wbase + o * nb * 20u;
        for (var blk = 0u; blk < nb; blk++) {
            let bb = rb + blk * 20u;
            let dm = unpack2x16float(word_at(bb));
            var s = 0.0;
            var sx = 0.0;
            for (var q = 0u; q < 4u; q++) {
                let wd = word_at(bb + 4u + 4u * q);
                for (var c = 0u; c < 4u; c++) {
                    let byte = (wd >> (8u * c)) & 0xffu;
                    let lo_i = xb + blk * 32u + 4u * q + c;
                    let hi_i = lo_i + 16u;
                    let xl = x[lo_i];
                    let xh = x[hi_i];
                    s += xl * f32(byte & 15u) + xh * f32(byte >> 4u);
                    sx += xl + xh;
                }
            }
            acc += dm.x * s + dm.y * sx;
        }
    }
    y[off(2u) + id] = acc;
}
