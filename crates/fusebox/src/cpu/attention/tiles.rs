//! Register-tiled block products and the softmax steps of the attention kernels.
//! Operands read by whole registers (the `B` side of the products, accumulators) have
//! rows of a multiple of 16 floats (one AVX-512 register), zero-padded; row counts are
//! multiples of [`TILE_ROWS`].
//!
//! Products:
//! - [`scores`]: `S = A·B` with A row-major (any row length) and B `[depth][cols]`, a
//!   4 × 64 tile of S in registers while the depth runs: the forward's transposed
//!   scores `Sᵀ = K·(scale·Q)ᵀ`, the backward's `S = (scale·Q)·Kᵀ` and `dP = dO·Vᵀ`;
//! - [`accumulate_rows`] / [`accumulate_cols`]: `C = α∘C + A·B` with B row-major and A
//!   given as is or transposed (so `Pᵀ` and `dSᵀ` need no transposed copy), a 4 × 64
//!   tile of C in registers while the inner index runs (`P·V` from `Pᵀ`, `dS·K`,
//!   `Pᵀ·dO`, `dSᵀ·Q`).
//!
//! Softmax steps: [`softmax_cols`] (the forward, down the columns of `Sᵀ`) and
//! [`probs_and_grads`] (the backward), with a vectorizable `e^x` of their own.
//!
//! Code generation: each tile keeps its accumulators in locals indexed only by
//! constants (rows unrolled by hand, column registers unrolled by `const` conditions),
//! so they live in registers; an accumulator array indexed by a loop counter that the
//! compiler does not unroll stays in memory, and the compiler then vectorizes the wrong
//! loop (with gathers). `FMA` selects fused multiply-adds, present in hardware on the
//! AVX2 and AVX-512 builds; the portable build multiplies and adds (a software `fmaf`
//! would be far slower).

use crate::cpu::simd::{exp_lane, madd, multiversion};

/// Rows of one register tile (query rows, or key rows in the backward's `Pᵀ·dO`).
pub const TILE_ROWS: usize = 4;
/// Query columns of the forward's wide transposed blocks (`Sᵀ[key][query]`), four registers
/// ([`softmax_cols`] also takes blocks of 16).
pub const QUERY_COLS: usize = 64;
const LANES: usize = 16;

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
    // Zipped iterators (no per-step bounds checks): step d gives a[r0..r0+4][d] and the
    // 16·W floats of bt row d from column c0.
    let steps = row(0)
        .iter()
        .zip(row(1))
        .zip(row(2).iter().zip(row(3)))
        .zip(bt.chunks(ld_b).map(|b| &b[c0..c0 + W * LANES]))
        .map(|(((&x0, &x1), (&x2, &x3)), b)| ([x0, x1, x2, x3], b));
    if W <= 2 {
        // Narrow tiles have too few accumulators to hide the FMA latency: a second set
        // takes the odd depths, and the two are added at the end.
        let mut odd: Acc<W> = [[[0.0; LANES]; W]; TILE_ROWS];
        let mut steps = steps;
        while let Some((x, b)) = steps.next() {
            rank1::<W, FMA>(&mut acc, x, b);
            if let Some((x, b)) = steps.next() {
                rank1::<W, FMA>(&mut odd, x, b);
            }
        }
        for (acc_row, odd_row) in acc.iter_mut().zip(&odd) {
            for (v, o) in acc_row.iter_mut().zip(odd_row) {
                for l in 0..LANES {
                    v[l] += o[l];
                }
            }
        }
    } else {
        for (x, b) in steps {
            rank1::<W, FMA>(&mut acc, x, b);
        }
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
        scores_impl::<FMA>(s, ld_s, a, lda, depth, bt, ld_b, cols)
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
        accumulate_impl::<false, FMA>(c, dp, a, b, ranges, alpha)
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
        accumulate_impl::<true, FMA>(c, dp, a, b, ranges, alpha)
    }
}

/// `p ← e^(scale·p − shift)` and `g ← scale·p·(g − delta)` on equal rows: the backward's
/// probabilities and score gradients, one register of lanes at a time.
#[inline(always)]
fn probs_and_grads_row<const FMA: bool>(p: &mut [f32], g: &mut [f32], scale: f32, shift: f32, delta: f32) {
    let mut pc = p.chunks_exact_mut(LANES);
    let mut gc = g.chunks_exact_mut(LANES);
    for (pv, gv) in (&mut pc).zip(&mut gc) {
        for l in 0..LANES {
            let e = exp_lane::<FMA>(madd::<FMA>(pv[l], scale, -shift));
            pv[l] = e;
            gv[l] = scale * e * (gv[l] - delta);
        }
    }
    for (pj, gj) in pc.into_remainder().iter_mut().zip(gc.into_remainder()) {
        let e = exp_lane::<FMA>(madd::<FMA>(*pj, scale, -shift));
        *pj = e;
        *gj = scale * e * (*gj - delta);
    }
}

#[inline(always)]
fn softmax_cols_impl<const FMA: bool, const W: usize>(
    st: &mut [f32],
    keys: usize,
    seen_by: &[(usize, usize)],
    m: &mut [f32],
    l: &mut [f32],
    alpha: &mut [f32],
) {
    let (m, l, alpha): (&mut [f32; W], &mut [f32; W], &mut [f32; W]) = (
        (&mut m[..W]).try_into().expect("W running maxima"),
        (&mut l[..W]).try_into().expect("W running sums"),
        (&mut alpha[..W]).try_into().expect("W factors"),
    );
    let rows = st[..keys * W].chunks_exact_mut(W);
    let mut max = [f32::NEG_INFINITY; W];
    for (row, &(lo, hi)) in rows.zip(seen_by) {
        row[..lo.min(W)].fill(f32::NEG_INFINITY);
        row[hi.min(W)..].fill(f32::NEG_INFINITY);
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
    /// One online-softmax step on a transposed score block `st [keys][cols]` (column r is
    /// a query, row c a key; `cols` is 16 or 64): key c is seen only by the queries
    /// `seen_by[c] = (lo, hi)`, `lo ≤ r < hi` (the others are set to −∞; `lo ≥ hi`: none);
    /// then per query `m' = max(m, max_c s_c)`,
    /// `α = e^(m − m')`, `s_c ← e^(s_c − m')`, `l' = α·l + Σ_c s_c` — all down columns,
    /// so every step is a plain vector operation (no horizontal reductions). A query that
    /// has seen no key keeps m = −∞, l = 0.
    pub fn softmax_cols(
        st: &mut [f32],
        cols: usize,
        keys: usize,
        seen_by: &[(usize, usize)],
        m: &mut [f32],
        l: &mut [f32],
        alpha: &mut [f32]
    ) {
        if cols == 16 {
            softmax_cols_impl::<FMA, 16>(st, keys, seen_by, m, l, alpha)
        } else {
            softmax_cols_impl::<FMA, QUERY_COLS>(st, keys, seen_by, m, l, alpha)
        }
    }
}

multiversion! {
    /// The backward's probabilities and score gradients on a block of unscaled scores
    /// `s = q·k`: for row r seeing keys `visible[r] = (lo, n)` and saved `lse[r]`,
    /// `p_j = e^(scale·s_j − lse)` and, with `ds` holding `dP` on entry,
    /// `dS_j = scale·p_j·(dP_j − delta[r])` for `lo ≤ j < n` (the softmax backward with
    /// the score scale folded in, so dQ and dK need no final scaling); both rows are
    /// zeroed before `lo` and from `n` to `ld`, and entirely when `lo ≥ n` or
    /// `lse = −∞`.
    pub fn probs_and_grads(
        p: &mut [f32],
        ds: &mut [f32],
        ld: usize,
        visible: &[(usize, usize)],
        lse: &[f32],
        delta: &[f32],
        scale: f32
    ) {
        for (r, &(lo, n)) in visible.iter().enumerate() {
            let p_row = &mut p[r * ld..(r + 1) * ld];
            let ds_row = &mut ds[r * ld..(r + 1) * ld];
            let n = if lse[r] == f32::NEG_INFINITY { 0 } else { n.min(ld) };
            let lo = lo.min(n);
            // Whole registers from `start` to `end`: the lanes outside `lo..n` hold whatever
            // the widened score tiles left there (finite or not) and are zeroed afterwards.
            let (start, end) = (lo / LANES * LANES, n.next_multiple_of(LANES).min(ld));
            let (p_part, ds_part) = (&mut p_row[start..end], &mut ds_row[start..end]);
            probs_and_grads_row::<FMA>(p_part, ds_part, scale, lse[r], delta[r]);
            p_row[..lo].fill(0.0);
            ds_row[..lo].fill(0.0);
            p_row[n..].fill(0.0);
            ds_row[n..].fill(0.0);
        }
    }
}
