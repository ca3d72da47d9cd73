//! Register-tiled block products and the row-wise softmax steps of the attention
//! kernels. Block operands are padded so their row length `dp` is a multiple of 16
//! (one AVX-512 register) and their row counts are multiples of [`TILE_ROWS`];
//! padding holds zeros.
//!
//! Products:
//! - [`scores`]: `S = A·Bᵀ` with `Bᵀ` packed column-major (`bt[d][c]`), a 4×64 (or 4×32)
//!   tile of S in registers while `d` runs (`Q·Kᵀ`, `dO·Vᵀ`);
//! - [`accumulate_rows`] / [`accumulate_cols`]: `C = α∘C + A·B` with `B` row-major and A
//!   given as is or transposed (so `Pᵀ` and `dSᵀ` need no transposed copy), a 4×64 tile
//!   of C in registers while the inner index runs (`P·V`, `dS·K` / `Pᵀ·dO`, `dSᵀ·Q`).
//!
//! Code generation: each tile keeps its accumulators in locals indexed only by
//! constants (rows unrolled by hand, column registers unrolled by `const` conditions),
//! so they live in registers; an accumulator array indexed by a loop counter that the
//! compiler does not unroll stays in memory, and the compiler then vectorizes the wrong
//! loop (with gathers). `FMA` selects fused multiply-adds, present in hardware on the
//! AVX2 and AVX-512 builds; the portable build multiplies and adds (a software `fmaf`
//! would be far slower).

use crate::cpu::simd::{multiversion, Isa};

/// Rows of one register tile (query rows, or key rows in the backward's `Pᵀ·dO`).
pub const TILE_ROWS: usize = 4;
/// Queries per block of the transposed forward layout (`S[key][query]`), four registers.
pub const QUERY_COLS: usize = 64;
const LANES: usize = 16;

/// Whether the running ISA has hardware FMA.
#[inline(always)]
fn has_fma() -> bool {
    Isa::selected() != Isa::Scalar
}

/// `acc[l] += x·b[l]` on one register of lanes.
#[inline(always)]
fn fma<const FMA: bool>(acc: &mut [f32; LANES], x: f32, b: &[f32; LANES]) {
    for l in 0..LANES {
        acc[l] = if FMA { x.mul_add(b[l], acc[l]) } else { acc[l] + x * b[l] };
    }
}

/// The `N` floats of `s` at `at` as an array (in bounds by construction: block buffers
/// hold whole tiles).
#[inline(always)]
fn lanes<const N: usize>(s: &[f32], at: usize) -> &[f32; N] {
    s[at..at + N].try_into().expect("block buffers hold whole tiles")
}

#[inline(always)]
fn lanes_mut<const N: usize>(s: &mut [f32], at: usize) -> &mut [f32; N] {
    (&mut s[at..at + N]).try_into().expect("block buffers hold whole tiles")
}

/// Four rows × W registers of accumulators, indexed by constants only.
type Acc<const W: usize> = [[[f32; LANES]; W]; TILE_ROWS];

/// `acc[r][w] += x[r]·b[w]` for the W registers of `b` (a row of 16·W floats).
#[inline(always)]
fn rank1<const W: usize, const FMA: bool>(acc: &mut Acc<W>, x: [f32; TILE_ROWS], b: &[f32]) {
    macro_rules! column {
        ($w:literal) => {
            if W > $w {
                let bw = lanes::<LANES>(b, $w * LANES);
                fma::<FMA>(&mut acc[0][$w], x[0], bw);
                fma::<FMA>(&mut acc[1][$w], x[1], bw);
                fma::<FMA>(&mut acc[2][$w], x[2], bw);
                fma::<FMA>(&mut acc[3][$w], x[3], bw);
            }
        };
    }
    column!(0);
    column!(1);
    column!(2);
    column!(3);
}

/// Stores (or loads, scaled by `f[r]`) a 4 × 16·W tile at `at` with row stride `ld`.
#[inline(always)]
fn store<const W: usize>(acc: &Acc<W>, dst: &mut [f32], at: usize, ld: usize) {
    for (r, row) in acc.iter().enumerate() {
        for (w, v) in row.iter().enumerate() {
            *lanes_mut::<LANES>(dst, at + r * ld + w * LANES) = *v;
        }
    }
}

#[inline(always)]
fn load<const W: usize>(src: &[f32], at: usize, ld: usize, f: [f32; TILE_ROWS]) -> Acc<W> {
    // Plain loops: `array::from_fn` here is not always inlined, and then runs without
    // the target features of its caller.
    let mut acc: Acc<W> = [[[0.0; LANES]; W]; TILE_ROWS];
    for (r, row) in acc.iter_mut().enumerate() {
        for (w, v) in row.iter_mut().enumerate() {
            let x = lanes::<LANES>(src, at + r * ld + w * LANES);
            for l in 0..LANES {
                v[l] = x[l] * f[r];
            }
        }
    }
    acc
}

/// One 4 × 16·W tile of `s = a·bt` at rows `r0..` (of `a`, row stride `lda`, `depth`
/// long), columns `c0..` (of `bt`, row stride `ld_b`, `depth` rows).
#[inline(always)]
fn score_tile<const W: usize, const FMA: bool>(
    s: &mut [f32],
    ld_s: usize,
    a: &[f32],
    lda: usize,
    depth: usize,
    r0: usize,
    bt: &[f32],
    ld_b: usize,
    c0: usize,
) {
    let mut acc: Acc<W> = [[[0.0; LANES]; W]; TILE_ROWS];
    let row = |r: usize| &a[(r0 + r) * lda..(r0 + r) * lda + depth];
    let (a0, a1, a2, a3) = (row(0), row(1), row(2), row(3));
    for (d, b) in bt.chunks(ld_b).take(depth).enumerate() {
        rank1::<W, FMA>(&mut acc, [a0[d], a1[d], a2[d], a3[d]], &b[c0..c0 + W * LANES]);
    }
    store(&acc, s, r0 * ld_s + c0, ld_s);
}

#[inline(always)]
fn scores_impl<const FMA: bool>(
    s: &mut [f32],
    ld_s: usize,
    a: &[f32],
    lda: usize,
    depth: usize,
    bt: &[f32],
    ld_b: usize,
    cols: &[(usize, usize)],
) {
    for (t, &(lo, hi)) in cols.iter().enumerate() {
        let r0 = t * TILE_ROWS;
        let hi = hi.next_multiple_of(LANES);
        let mut c0 = lo / LANES * LANES;
        while c0 + 4 * LANES <= hi {
            score_tile::<4, FMA>(s, ld_s, a, lda, depth, r0, bt, ld_b, c0);
            c0 += 4 * LANES;
        }
        match (hi.saturating_sub(c0)) / LANES {
            3 => score_tile::<3, FMA>(s, ld_s, a, lda, depth, r0, bt, ld_b, c0),
            2 => score_tile::<2, FMA>(s, ld_s, a, lda, depth, r0, bt, ld_b, c0),
            1 => score_tile::<1, FMA>(s, ld_s, a, lda, depth, r0, bt, ld_b, c0),
            _ => {}
        }
    }
}

multiversion! {
    /// `s[r][c] = Σ_{d < depth} a[r·lda + d]·bt[d·ld_b + c]` for row tile `t` (rows
    /// `4t..4t+4`) and columns `cols[t] = (lo, hi)`, widened to whole registers (lo
    /// rounded down, hi up to a multiple of 16); other columns are left alone.
    pub fn scores(
        s: &mut [f32],
        ld_s: usize,
        a: &[f32],
        lda: usize,
        depth: usize,
        bt: &[f32],
        ld_b: usize,
        cols: &[(usize, usize)]
    ) {
        if has_fma() {
            scores_impl::<true>(s, ld_s, a, lda, depth, bt, ld_b, cols)
        } else {
            scores_impl::<false>(s, ld_s, a, lda, depth, bt, ld_b, cols)
        }
    }
}

/// How the accumulate kernels read A: `A[r][i] = a[r·lda + i]` (rows) or `a[i·lda + r]`
/// (A given transposed).
#[derive(Clone, Copy)]
struct AView<'a> {
    a: &'a [f32],
    lda: usize,
}

/// One 4 × 16·W tile of `c = α∘c + A·b` at rows `r0..`, columns `col..`.
#[inline(always)]
fn accumulate_tile<const W: usize, const TRANS: bool, const FMA: bool>(
    c: &mut [f32],
    dp: usize,
    r0: usize,
    col: usize,
    a: AView,
    b: &[f32],
    (lo, hi): (usize, usize),
    f: [f32; TILE_ROWS],
) {
    let mut acc: Acc<W> = load(c, r0 * dp + col, dp, f);
    if hi > lo {
        let b_rows = b[lo * dp..hi * dp].chunks_exact(dp);
        if TRANS {
            // A[r][i] = a[i·lda + r]: the four values of step i are adjacent.
            for (i, brow) in (lo..hi).zip(b_rows) {
                let x = *lanes::<TILE_ROWS>(a.a, i * a.lda + r0);
                rank1::<W, FMA>(&mut acc, x, &brow[col..col + W * LANES]);
            }
        } else {
            let row = |r: usize| &a.a[(r0 + r) * a.lda + lo..(r0 + r) * a.lda + hi];
            let (a0, a1, a2, a3) = (row(0), row(1), row(2), row(3));
            for (k, brow) in b_rows.enumerate() {
                rank1::<W, FMA>(&mut acc, [a0[k], a1[k], a2[k], a3[k]], &brow[col..col + W * LANES]);
            }
        }
    }
    store(&acc, c, r0 * dp + col, dp);
}

#[inline(always)]
fn accumulate_impl<const TRANS: bool, const FMA: bool>(
    c: &mut [f32],
    dp: usize,
    a: AView,
    b: &[f32],
    ranges: &[(usize, usize)],
    alpha: Option<&[f32]>,
) {
    for (t, &range) in ranges.iter().enumerate() {
        let r0 = t * TILE_ROWS;
        let mut f = [1.0f32; TILE_ROWS];
        if let Some(al) = alpha {
            f.copy_from_slice(&al[r0..r0 + TILE_ROWS]);
        }
        let mut col = 0;
        while col + 4 * LANES <= dp {
            accumulate_tile::<4, TRANS, FMA>(c, dp, r0, col, a, b, range, f);
            col += 4 * LANES;
        }
        match (dp - col) / LANES {
            3 => accumulate_tile::<3, TRANS, FMA>(c, dp, r0, col, a, b, range, f),
            2 => accumulate_tile::<2, TRANS, FMA>(c, dp, r0, col, a, b, range, f),
            1 => accumulate_tile::<1, TRANS, FMA>(c, dp, r0, col, a, b, range, f),
            _ => {}
        }
    }
}

multiversion! {
    /// `c[r][:] = α[r]·c[r][:] + Σ_{i ∈ ranges[t]} a[r·lda + i]·b[i][:]` for row tile `t`
    /// (rows `4t..4t+4`); `c` and `b` have rows of `dp` (a multiple of 16) floats;
    /// `alpha = None` means α = 1.
    pub fn accumulate_rows(
        c: &mut [f32],
        dp: usize,
        a: &[f32],
        lda: usize,
        b: &[f32],
        ranges: &[(usize, usize)],
        alpha: Option<&[f32]>
    ) {
        let a = AView { a, lda };
        if has_fma() {
            accumulate_impl::<false, true>(c, dp, a, b, ranges, alpha)
        } else {
            accumulate_impl::<false, false>(c, dp, a, b, ranges, alpha)
        }
    }
}

multiversion! {
    /// `c[r][:] = α[r]·c[r][:] + Σ_{i ∈ ranges[t]} a[i·lda + r]·b[i][:]` (A given
    /// transposed) for row tile `t` (rows `4t..4t+4`); `c` and `b` have rows of `dp` (a
    /// multiple of 16) floats; `alpha = None` means α = 1.
    pub fn accumulate_cols(
        c: &mut [f32],
        dp: usize,
        a: &[f32],
        lda: usize,
        b: &[f32],
        ranges: &[(usize, usize)],
        alpha: Option<&[f32]>
    ) {
        let a = AView { a, lda };
        if has_fma() {
            accumulate_impl::<true, true>(c, dp, a, b, ranges, alpha)
        } else {
            accumulate_impl::<true, false>(c, dp, a, b, ranges, alpha)
        }
    }
}

/// `e^x` for `x ≤ 88` to a few ulp, vectorizable (no float→int conversion): with
/// `t = x·log2 e = n + f` (`n` the nearest integer, found by adding 1.5·2²³ so the
/// rounding lands in the low mantissa bits), `e^x = 2^n · e^(f·ln 2)`; `e^(f·ln 2)` by a
/// degree-6 Taylor polynomial (|f·ln 2| ≤ 0.35, error < 2e-7), `2^n` by building the
/// exponent bits from the same mantissa bits. `x < −87` (and −∞) gives 0.
#[inline(always)]
fn exp_lane<const FMA: bool>(x: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0; // 1.5·2²³
    let madd = |a: f32, b: f32, c: f32| if FMA { a.mul_add(b, c) } else { a * b + c };
    let xc = x.clamp(-87.0, 88.0);
    let t = xc * std::f32::consts::LOG2_E;
    let big = t + MAGIC;
    let n = big - MAGIC;
    let f = (t - n) * std::f32::consts::LN_2;
    let mut p = 1.0 / 720.0;
    for c in [1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0] {
        p = madd(p, f, c);
    }
    // big's bits are 0x4B40_0000 + n; the exponent field of 2^n is n + 127.
    let two_n = f32::from_bits(big.to_bits().wrapping_sub(0x4B40_0000 - 127) << 23);
    if x < -87.0 {
        0.0
    } else {
        p * two_n
    }
}

/// Tree reduction of 16 lanes with `op` (log-depth, so it vectorizes into shuffles
/// instead of a 16-step dependency chain).
#[inline(always)]
fn reduce_lanes(mut acc: [f32; LANES], op: impl Fn(f32, f32) -> f32) -> f32 {
    let mut half = LANES / 2;
    while half > 0 {
        for l in 0..half {
            acc[l] = op(acc[l], acc[l + half]);
        }
        half /= 2;
    }
    acc[0]
}

/// `x[i] ← e^(x[i] − m)`, returning `Σ x[i]`.
#[inline(always)]
fn exp_shift_sum<const FMA: bool>(x: &mut [f32], m: f32) -> f32 {
    let mut acc = [0.0f32; LANES];
    let mut chunks = x.chunks_exact_mut(LANES);
    for v in &mut chunks {
        for l in 0..LANES {
            v[l] = exp_lane::<FMA>(v[l] - m);
            acc[l] += v[l];
        }
    }
    let mut tail = 0.0;
    for v in chunks.into_remainder() {
        *v = exp_lane::<FMA>(*v - m);
        tail += *v;
    }
    reduce_lanes(acc, |a, b| a + b) + tail
}

/// `max x[i]` (−∞ for an empty slice).
#[inline(always)]
fn row_max(x: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; LANES];
    let mut chunks = x.chunks_exact(LANES);
    for v in &mut chunks {
        for l in 0..LANES {
            acc[l] = if v[l] > acc[l] { v[l] } else { acc[l] };
        }
    }
    let max = |a: f32, b: f32| if b > a { b } else { a };
    chunks.remainder().iter().fold(reduce_lanes(acc, max), |m, &v| max(m, v))
}

#[inline(always)]
fn softmax_rows_impl<const FMA: bool>(
    s: &mut [f32],
    ld: usize,
    visible: &[usize],
    clear: &[usize],
    m: &mut [f32],
    l: &mut [f32],
    alpha: &mut [f32],
) {
    for (r, &n) in visible.iter().enumerate() {
        let row = &mut s[r * ld..(r + 1) * ld];
        // Keys past n up to a whole register (and the tile's computed range) become
        // −∞, so e^(s − m') = 0 there and the exp runs on whole registers.
        let end = clear[r / TILE_ROWS].max(n).next_multiple_of(LANES).min(ld);
        let row = &mut row[..end];
        row[n..].fill(f32::NEG_INFINITY);
        let m_new = row_max(row).max(m[r]);
        if m_new == f32::NEG_INFINITY {
            row.fill(0.0);
            alpha[r] = 1.0;
            continue;
        }
        let a = exp_lane::<FMA>(m[r] - m_new);
        l[r] = l[r] * a + exp_shift_sum::<FMA>(row, m_new);
        m[r] = m_new;
        alpha[r] = a;
    }
}

multiversion! {
    /// One online-softmax step on every row of a score block (`s` rows of stride `ld`):
    /// row r's first `visible[r]` scores are its keys in this block; with the running max
    /// `m[r]` and sum `l[r]`: `m' = max(m, max_j s_j)`, `α = e^(m − m')`, `s_j ← e^(s_j − m')`,
    /// `l' = α·l + Σ_j s_j`; `alpha[r] ← α`. A row whose scores so far are all −∞ stays
    /// empty (zeros, α = 1, no `−∞ − −∞`). Scores from `visible[r]` up to `clear[r / 4]`
    /// are zeroed (keys past the diagonal inside the row tile's computed range).
    pub fn softmax_rows(
        s: &mut [f32],
        ld: usize,
        visible: &[usize],
        clear: &[usize],
        m: &mut [f32],
        l: &mut [f32],
        alpha: &mut [f32]
    ) {
        if has_fma() {
            softmax_rows_impl::<true>(s, ld, visible, clear, m, l, alpha)
        } else {
            softmax_rows_impl::<false>(s, ld, visible, clear, m, l, alpha)
        }
    }
}

#[inline(always)]
fn probs_and_grads_impl<const FMA: bool>(
    p: &mut [f32],
    ds: &mut [f32],
    ld: usize,
    visible: &[usize],
    lse: &[f32],
    delta: &[f32],
) {
    for (r, &n) in visible.iter().enumerate() {
        let p_row = &mut p[r * ld..(r + 1) * ld];
        let ds_row = &mut ds[r * ld..(r + 1) * ld];
        let n = if lse[r] == f32::NEG_INFINITY { 0 } else { n };
        // As in softmax_rows: −∞ up to a whole register so the exp gives exact zeros.
        let end = n.next_multiple_of(LANES).min(ld);
        p_row[n..end].fill(f32::NEG_INFINITY);
        exp_shift_sum::<FMA>(&mut p_row[..end], lse[r]);
        for (g, &pj) in ds_row[..end].iter_mut().zip(&p_row[..end]) {
            *g = pj * (*g - delta[r]);
        }
        p_row[end..].fill(0.0);
        ds_row[n..].fill(0.0);
    }
}

#[inline(always)]
fn softmax_cols_impl<const FMA: bool>(
    st: &mut [f32],
    keys: usize,
    first_query: &[usize],
    m: &mut [f32; QUERY_COLS],
    l: &mut [f32; QUERY_COLS],
    alpha: &mut [f32; QUERY_COLS],
) {
    const W: usize = QUERY_COLS;
    let rows = st[..keys * W].chunks_exact_mut(W);
    let mut max = [f32::NEG_INFINITY; W];
    for (row, &lo) in rows.zip(first_query) {
        row[..lo.min(W)].fill(f32::NEG_INFINITY);
        for r in 0..W {
            max[r] = if row[r] > max[r] { row[r] } else { max[r] };
        }
    }
    // Shift by m' where some key was seen, by 0 where none was (its scores are all −∞
    // and give e^(−∞) = 0; no −∞ − −∞).
    let mut shift = [0.0f32; W];
    for r in 0..W {
        let m_new = if max[r] > m[r] { max[r] } else { m[r] };
        shift[r] = if m_new == f32::NEG_INFINITY { 0.0 } else { m_new };
        alpha[r] = exp_lane::<FMA>(m[r] - shift[r]);
        m[r] = m_new;
    }
    let mut sum = [0.0f32; W];
    for row in st[..keys * W].chunks_exact_mut(W) {
        for r in 0..W {
            row[r] = exp_lane::<FMA>(row[r] - shift[r]);
            sum[r] += row[r];
        }
    }
    for r in 0..W {
        l[r] = l[r] * alpha[r] + sum[r];
    }
}

multiversion! {
    /// One online-softmax step on a transposed score block `st [keys][64]` (column r is
    /// query r of the block, row c key c): key c is hidden from queries before
    /// `first_query[c]` (set to −∞); then per query `m' = max(m, max_c s_c)`,
    /// `α = e^(m − m')`, `s_c ← e^(s_c − m')`, `l' = α·l + Σ_c s_c` — all down columns,
    /// so every step is a plain vector operation (no horizontal reductions). A query that
    /// has seen no key keeps m = −∞, l = 0.
    pub fn softmax_cols(
        st: &mut [f32],
        keys: usize,
        first_query: &[usize],
        m: &mut [f32; QUERY_COLS],
        l: &mut [f32; QUERY_COLS],
        alpha: &mut [f32; QUERY_COLS]
    ) {
        if has_fma() {
            softmax_cols_impl::<true>(st, keys, first_query, m, l, alpha)
        } else {
            softmax_cols_impl::<false>(st, keys, first_query, m, l, alpha)
        }
    }
}

multiversion! {
    /// The backward's probabilities and score gradients on a block: for row r with
    /// `n = visible[r]` keys and saved `lse[r]`, `p_j = e^(s_j − lse)` and, with `ds`
    /// holding `dP` on entry, `dS_j = p_j·(dP_j − delta[r])` for `j < n`; both rows are
    /// zeroed from `n` to `ld`, and entirely when `n = 0` or `lse = −∞`.
    pub fn probs_and_grads(p: &mut [f32], ds: &mut [f32], ld: usize, visible: &[usize], lse: &[f32], delta: &[f32]) {
        if has_fma() {
            probs_and_grads_impl::<true>(p, ds, ld, visible, lse, delta)
        } else {
            probs_and_grads_impl::<false>(p, ds, ld, visible, lse, delta)
        }
    }
}
