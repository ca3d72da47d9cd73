// Reductions along an axis: x viewed as [outer, n, inner], each output p = o·inner + i
// reduces the fibre x[(o·n + j)·inner + i], j < n. A workgroup owns `cols` consecutive
// outputs with 256/cols lanes each (a power of two): lanes stride over one block of the
// fibre (at most 64 elements each, so loops stay bounded), then combine in a fixed tree.
// With several blocks each writes a partial result at b·P + p (P outputs), and the
// host reduces the partials, viewed as [1, blocks, P], with another pass.
//
// Kinds: 0 Σx, 1 Σ|x|, 2 max (NaN skipped), 3 Σ(x − centre[p])², 4 argmax (value and
// index; NaN skipped, the lower index wins ties; `strict`: −∞ is no candidate either).

@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> centre: array<f32>;
@group(0) @binding(3) var<storage, read> in_idx: array<u32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;
@group(0) @binding(5) var<storage, read_write> out_idx: array<u32>;

const NO_INDEX: u32 = 0xffffffffu;

var<workgroup> rv: array<f32, 256>;
var<workgroup> ri: array<u32, 256>;

// Whether (vb, ib) beats (va, ia) for argmax.
fn beats(va: f32, ia: u32, vb: f32, ib: u32) -> bool {
    return vb > va || (vb == va && ib < ia);
}

// params: outer, n, inner, kind, cols, block, blocks, idx_in, strict, last
@compute @workgroup_size(256)
fn reduce_axis(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let outer = pu(0u);
    let n = pu(1u);
    let inner = pu(2u);
    let kind = pu(3u);
    let cols = pu(4u);
    let blocks = pu(6u);
    let lanes = 256u / cols;
    let t = lid.x;
    let c = t % cols;
    let l = t / cols;
    let g = flat_group(wid);
    let b = g % blocks;
    let p = (g / blocks) * cols + c;
    let total = outer * inner;
    let valid = p < total;
    let o = p / max(inner, 1u);
    let i = p % max(inner, 1u);
    let j0 = b * pu(5u);
    let j1 = min(j0 + pu(5u), n);
    var acc = 0.0;
    if (kind == 2u || kind == 4u) { acc = -inf_f32(); }
    var arg = NO_INDEX;
    if (valid) {
        var cen = 0.0;
        if (kind == 3u) { cen = centre[off(1u) + p]; }
        for (var j = j0 + l; j < j1; j += lanes) {
            let at = (o * n + j) * inner + i;
            let v = x[off(0u) + at];
            if (kind == 0u) {
                acc += v;
            } else if (kind == 1u) {
                acc += abs(v);
            } else if (kind == 2u) {
                if (v > acc) { acc = v; }
            } else if (kind == 3u) {
                let d = v - cen;
                acc += d * d;
            } else {
                var idx = j;
                if (pu(7u) != 0u) { idx = in_idx[off(2u) + at]; }
                let candidate = v == v && !(pu(8u) != 0u && v == -inf_f32()) && idx != NO_INDEX;
                if (candidate && beats(acc, arg, v, idx)) {
                    acc = v;
                    arg = idx;
                }
            }
        }
    }
    rv[t] = acc;
    ri[t] = arg;
    workgroupBarrier();
    for (var s = 128u; s > 0u; s >>= 1u) {
        if (s < lanes && l < s) {
            let u = t + s * cols;
            if (kind == 2u) {
                if (rv[u] > rv[t]) { rv[t] = rv[u]; }
            } else if (kind == 4u) {
                if (beats(rv[t], ri[t], rv[u], ri[u])) {
                    rv[t] = rv[u];
                    ri[t] = ri[u];
                }
            } else {
                rv[t] = rv[t] + rv[u];
            }
        }
        workgroupBarrier();
    }
    if (l == 0u && valid) {
        let dst = b * total + p;
        out[off(3u) + dst] = rv[t];
        var idx = ri[t];
        if (pu(9u) != 0u && idx == NO_INDEX) { idx = 0u; }
        out_idx[off(4u) + dst] = idx;
    }
}
