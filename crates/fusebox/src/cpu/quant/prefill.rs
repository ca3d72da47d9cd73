//! The integer prefill path of `quantized_matmul` (many x rows, `exact_decode(false)`):
//! x rounded to 8 bits once per call (the decode path's rounding, see `int.rs`), W
//! decoded a panel at a time into a packed integer form shared by every x row, and a
//! tiled kernel: each tile is a few x rows times a few groups of [`GROUP`] W rows, so a
//! weight's decode serves all m rows and an x value's load serves 16 W rows.
//!
//! # The packed forms
//!
//! Each format is read as super-blocks of `S` elements (256 for the K formats, else the
//! 32-element block) with one f32 scale `d` per W row and super-block, split into units
//! of `U` elements (32; Q6_K's 16) each with an integer scale `sc` (1 where the format
//! has none), and, for Q4_K / Q5_K / Q4_1, a second f32 scale `e` with per-unit integer
//! mins `mn` (Q4_K/Q5_K: `e = −dmin`, `mn` the 6-bit mins; Q4_1: `e = m`, one unit min
//! of 1). A weight is the signed integer `w` (Q4_K's nibble, Q6_K's `q − 32`, Q8_0's
//! byte, …), so element j of W row r in super-block b is `d·sc_u·w_j + e·mn_u` per
//! element sum (the mins multiply the unit's Σx̃).
//!
//! * **W panel**: groups of 16 rows; per group and super-block the weights as `S/4`
//!   vectors of 64 bytes, vector t holding elements 4t..4t+4 of the 16 rows in turn
//!   (one i32 lane per row: what `vpdpbusd` sums), then per row: `sc` per unit, the
//!   correction `−128·Σ_u sc_u·Σ_{j∈u} w_j`, `d`, `e`, and the mins in i16 pairs.
//! * **x**: per row the 8-bit values as `q + 128` (unsigned bytes), the scale `d_x` per
//!   super-block and, for the formats with mins, the integer sums of q per 32 in i16
//!   pairs (the same rounding as `int.rs`'s `quantize_row`).
//!
//! # The arithmetic, one order for every kernel
//!
//! Per x row i, W row r and super-block b, exactly in i32:
//! `T1 = Σ_u sc_u·Σ_{j∈u} w_j·q_j` (the SIMD kernels sum `(q + 128)·w` and start from the
//! correction, which is the same integer) and `T2 = Σ_u mn_u·qsum_u`; then in f32
//! `f = d·T1`, `f = fma(e, T2, f)` (formats with mins), `acc = fma(f, d_x, acc)`, over b
//! in order. Each output is one lane from start to end, so the portable twin
//! ([`twin_tile`]), the AVX-512 VNNI kernel (`prefill_vnni.rs`) and the AVX2 kernel
//! (`prefill_avx2.rs`, where AVX-512 VNNI is absent or capped off) give the same bits, and
//! a row's result depends neither on the other rows nor on the threads. It is the
//! decode path's value `Σ_j W[r, j]·x̃[j]` up to f32 rounding, in another summation order.
//!
//! The integer sums cannot overflow: a unit's `Σ (q + 128)·w` is at most
//! 32·255·128 < 2^21 in magnitude and `Σ_u sc_u·…` at most 16·16·255·32·128 < 2^29.

use super::fields::{f16_at, scale_min_k4, Iq4Nl, LevelTable, Mxfp4};
use super::int;
use crate::cpu::pool::SharedMut;
use crate::cpu::CpuBackend;
use crate::dtype::DType;

/// W rows per packed group: the 16 i32 lanes of a 512-bit vector (two 256-bit halves
/// for AVX2).
pub(super) const GROUP: usize = 16;

/// At most this many W rows per panel (a multiple of [`GROUP`]): a Llama-sized panel of
/// 128 rows of 5,632 packed bytes stays in a 1 MiB L2 while every x row passes it.
const PANEL_ROWS: usize = 128;

/// How a format reads as super-blocks and units (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Layout {
    /// Elements per super-block (one `d` per row).
    pub s: usize,
    /// Elements per unit (one integer scale per row); `u == s`: no integer scales.
    pub u: usize,
    /// Pairs of unit mins (0: no mins).
    pub p: usize,
}

/// The layout of `dtype`, or `None` where it has no integer prefill kernel.
pub(super) fn layout(dtype: DType) -> Option<Layout> {
    match dtype {
        DType::Q8_0 | DType::Q4_0 | DType::Q5_0 | DType::IQ4NL | DType::MXFP4 => Some(Layout { s: 32, u: 32, p: 0 }),
        DType::Q4_1 => Some(Layout { s: 32, u: 32, p: 1 }),
        DType::Q4K | DType::Q5K => Some(Layout { s: 256, u: 32, p: 4 }),
        DType::Q6K => Some(Layout { s: 256, u: 16, p: 0 }),
        _ => None,
    }
}

/// The largest |w| of `dtype`'s integer weights as [`unpack`] gives them: Q4_0 −8..7,
/// Q4_1 and Q4_K 0..15, Q5_0 −16..15, Q5_K 0..31, Q6_K −32..31, MXFP4 −12..12 (its
/// doubled E2M1 levels), IQ4_NL −127..113, Q8_0 any i8.
pub(super) fn max_abs_weight(dtype: DType) -> i32 {
    match dtype {
        DType::Q4_0 => 8,
        DType::Q4_1 | DType::Q4K => 15,
        DType::Q5_0 => 16,
        DType::MXFP4 => 12,
        DType::Q5K => 31,
        DType::Q6K => 32,
        DType::IQ4NL => 127,
        _ => 128,
    }
}

/// A panel of W rows in the packed form (see the module docs), kept per thread.
#[derive(Default)]
pub(super) struct Panel {
    pub lay: Option<Layout>,
    /// The format's bound on |w| ([`max_abs_weight`]), for the AVX2 kernel's i16 sums.
    pub max_abs_w: i32,
    /// Super-blocks per row.
    pub nsb: usize,
    /// Groups of 16 rows.
    pub groups: usize,
    /// `[group][sb][S/4][16][4]` weights (i8 stored as u8).
    pub w: Vec<u8>,
    /// `[group][sb][S/U][16]` unit scales (empty when `U == S`).
    pub sc: Vec<i32>,
    /// `[group][sb][16]` the correction for the `+128` of x: `−128·Σ_u sc_u·Σ w`.
    pub corr: Vec<i32>,
    /// `[group][sb][16]` the scales `d` and `e`.
    pub d: Vec<f32>,
    pub e: Vec<f32>,
    /// `[group][sb][P][16]` unit mins in i16 pairs (units 2p, 2p + 1).
    pub mn: Vec<i32>,
}

/// The x rows in the packed form (see the module docs).
pub(super) struct XRows {
    pub lay: Layout,
    pub k: usize,
    pub nsb: usize,
    /// `[m][k]` the 8-bit values plus 128.
    pub q: Vec<u8>,
    /// `[m][nsb]` the scale per super-block.
    pub d: Vec<f32>,
    /// `[m][nsb][P]` the integer sums of q per 32, in i16 pairs.
    pub qs: Vec<i32>,
}

/// An i16 pair as one i32 (the layout `vpdpwssd` reads): `lo` in the low half.
#[inline(always)]
fn pair16(lo: i32, hi: i32) -> i32 {
    (lo as u16 as u32 | (hi as u16 as u32) << 16) as i32
}

/// The two i16 halves of [`pair16`].
#[cfg(test)]
#[inline(always)]
fn unpair16(v: i32) -> (i32, i32) {
    (i32::from(v as i16), v >> 16)
}

impl XRows {
    /// Rounds the `m` rows of `xs` (`k` values each, whole super-blocks) for `dtype`
    /// weights, as the decode path does.
    pub(super) fn new(cpu: &CpuBackend, dtype: DType, lay: Layout, xs: &[f32], m: usize, k: usize) -> Self {
        let nsb = k / lay.s;
        let mut x = XRows { lay, k, nsb, q: vec![0; m * k], d: vec![0.0; m * nsb], qs: vec![0; m * nsb * lay.p] };
        let (q, d, qs) = (SharedMut(x.q.as_mut_ptr()), SharedMut(x.d.as_mut_ptr()), SharedMut(x.qs.as_mut_ptr()));
        cpu.for_each_index(m, 4 * k, |i| {
            let (q, d, qs) = (&q, &d, &qs);
            let row = int::quantize_row(&xs[i * k..(i + 1) * k], dtype);
            // SAFETY: row i's ranges of the three buffers, written by this task alone.
            let (q, d, qs) = unsafe {
                (
                    std::slice::from_raw_parts_mut(q.0.add(i * k), k),
                    std::slice::from_raw_parts_mut(d.0.add(i * nsb), nsb),
                    std::slice::from_raw_parts_mut(qs.0.add(i * nsb * lay.p), nsb * lay.p),
                )
            };
            for (o, &v) in q.iter_mut().zip(&row.q) {
                *o = (v as u8) ^ 0x80;
            }
            d.copy_from_slice(&row.d);
            // The sums per 32 in pairs: K formats 8 per super-block, Q4_1 one (and 0).
            for (b, o) in qs.chunks_exact_mut(lay.p.max(1)).enumerate().take(if lay.p > 0 { nsb } else { 0 }) {
                if lay.p == 1 {
                    o[0] = pair16(row.qsum[b], 0);
                } else {
                    for (p, v) in o.iter_mut().enumerate() {
                        *v = pair16(row.qsum[8 * b + 2 * p], row.qsum[8 * b + 2 * p + 1]);
                    }
                }
            }
        });
        x
    }
}

/// One super-block of one W row: weights, unit scales, unit mins, `d`, `e`.
struct Unpacked {
    w: [i8; 256],
    sc: [i32; 16],
    mn: [i32; 8],
    d: f32,
    e: f32,
}

/// Fills `o` from the super-block `blk` of `dtype` (see the module docs).
fn unpack(dtype: DType, blk: &[u8], o: &mut Unpacked) {
    o.sc = [1; 16];
    o.mn = [0; 8];
    o.e = 0.0;
    match dtype {
        DType::Q8_0 => {
            o.d = f16_at(blk, 0);
            for j in 0..32 {
                o.w[j] = blk[2 + j] as i8;
            }
        }
        DType::Q4_0 | DType::Q4_1 => {
            let (qs, sub) = if dtype == DType::Q4_1 { (&blk[4..20], 0) } else { (&blk[2..18], 8) };
            o.d = f16_at(blk, 0);
            for (j, &b) in qs.iter().enumerate() {
                o.w[j] = (b & 0x0F) as i8 - sub;
                o.w[j + 16] = (b >> 4) as i8 - sub;
            }
            if dtype == DType::Q4_1 {
                o.e = f16_at(blk, 2);
                o.mn[0] = 1;
            }
        }
        DType::Q5_0 => {
            o.d = f16_at(blk, 0);
            let qh = u32::from_le_bytes([blk[2], blk[3], blk[4], blk[5]]);
            for j in 0..16 {
                o.w[j] = ((blk[6 + j] & 0x0F) | (((qh >> j) & 1) << 4) as u8) as i8 - 16;
                o.w[j + 16] = ((blk[6 + j] >> 4) | (((qh >> (j + 16)) & 1) << 4) as u8) as i8 - 16;
            }
        }
        DType::IQ4NL => o.d = table::<Iq4Nl>(blk, &mut o.w),
        DType::MXFP4 => o.d = table::<Mxfp4>(blk, &mut o.w),
        DType::Q4K | DType::Q5K => {
            let (scales, qs_at) = (&blk[4..16], if dtype == DType::Q5K { 48 } else { 16 });
            o.d = f16_at(blk, 0);
            o.e = -f16_at(blk, 2);
            for s in 0..8 {
                let (sc, mn) = scale_min_k4(s, scales);
                (o.sc[s], o.mn[s]) = (i32::from(sc), i32::from(mn));
                let (pair, high) = (s / 2, s % 2 == 1);
                for l in 0..32 {
                    let byte = blk[qs_at + 32 * pair + l];
                    let nib = if high { byte >> 4 } else { byte & 0x0F };
                    let bit = if dtype == DType::Q5K { (blk[16 + l] >> s) & 1 } else { 0 };
                    o.w[32 * s + l] = (nib | (bit << 4)) as i8;
                }
            }
        }
        DType::Q6K => {
            o.d = f16_at(blk, 208);
            for (u, sc) in o.sc.iter_mut().enumerate() {
                *sc = i32::from(blk[192 + u] as i8);
            }
            for half in 0..2 {
                let (ql, qh) = (&blk[64 * half..], &blk[128 + 32 * half..]);
                for g in 0..4 {
                    for l in 0..32 {
                        let byte = ql[l + 32 * (g % 2)];
                        let nib = if g < 2 { byte & 0x0F } else { byte >> 4 };
                        o.w[128 * half + 32 * g + l] = (nib | (((qh[l] >> (2 * g)) & 3) << 4)) as i8 - 32;
                    }
                }
            }
        }
        _ => unreachable!("layout() admits only the formats above"),
    }
}

/// `v` as `len` zeros.
fn fit<T: Default + Clone>(v: &mut Vec<T>, len: usize) {
    v.clear();
    v.resize(len, T::default());
}

/// The levels and scale of an IQ4_NL / MXFP4 block.
fn table<T: LevelTable>(blk: &[u8], w: &mut [i8; 256]) -> f32 {
    for j in 0..16 {
        w[j] = T::VALUES[usize::from(blk[T::QS_AT + j] & 0x0F)];
        w[j + 16] = T::VALUES[usize::from(blk[T::QS_AT + j] >> 4)];
    }
    T::scale(blk)
}

impl Panel {
    /// Packs the `rows` whole rows of `w` (`dtype` blocks, `k` elements each).
    pub(super) fn pack(&mut self, dtype: DType, lay: Layout, w: &[u8], rows: usize, k: usize) {
        let nsb = k / lay.s;
        let groups = rows.div_ceil(GROUP);
        let units = lay.s / lay.u;
        let cells = groups * nsb;
        self.lay = Some(lay);
        self.max_abs_w = max_abs_weight(dtype);
        self.nsb = nsb;
        self.groups = groups;
        // Resized to this panel's size; rows past `rows` in the last group are zeros.
        if self.w.len() != cells * lay.s * GROUP || !rows.is_multiple_of(GROUP) {
            fit(&mut self.w, cells * lay.s * GROUP);
        }
        fit(&mut self.sc, if units > 1 { cells * units * GROUP } else { 0 });
        fit(&mut self.corr, cells * GROUP);
        fit(&mut self.d, cells * GROUP);
        fit(&mut self.e, cells * GROUP);
        fit(&mut self.mn, cells * lay.p * GROUP);
        let row_bytes = dtype.storage_bytes(k);
        let sb_bytes = dtype.storage_bytes(lay.s);
        let mut un = Unpacked { w: [0; 256], sc: [1; 16], mn: [0; 8], d: 0.0, e: 0.0 };
        for r in 0..rows {
            let (g, lane) = (r / GROUP, r % GROUP);
            let row = &w[r * row_bytes..(r + 1) * row_bytes];
            for sb in 0..nsb {
                unpack(dtype, &row[sb * sb_bytes..(sb + 1) * sb_bytes], &mut un);
                let cell = g * nsb + sb;
                let wdst = &mut self.w[cell * lay.s * GROUP..(cell + 1) * lay.s * GROUP];
                for t in 0..lay.s / 4 {
                    for b in 0..4 {
                        wdst[(t * GROUP + lane) * 4 + b] = un.w[4 * t + b] as u8;
                    }
                }
                debug_assert!(un.w[..lay.s].iter().all(|&v| i32::from(v).abs() <= self.max_abs_w), "{dtype} bound");
                let mut corr = 0i32;
                for u in 0..units {
                    let wsum: i32 = un.w[u * lay.u..(u + 1) * lay.u].iter().map(|&v| i32::from(v)).sum();
                    corr += un.sc[u] * wsum;
                    if units > 1 {
                        self.sc[(cell * units + u) * GROUP + lane] = un.sc[u];
                    }
                }
                self.corr[cell * GROUP + lane] = -128 * corr;
                self.d[cell * GROUP + lane] = un.d;
                self.e[cell * GROUP + lane] = un.e;
                for p in 0..lay.p {
                    self.mn[(cell * lay.p + p) * GROUP + lane] = pair16(un.mn[2 * p], un.mn[2 * p + 1]);
                }
            }
        }
    }
}

/// `dst[i·dst_row + GROUP·g + l]` for x rows `i` in `i0..i0 + xn` and the W rows `GROUP·g + l` of
/// groups `g0..g0 + gn` (lanes past `valid` rows from group `g0`'s first are not
/// written), in plain loops: the twin of the SIMD kernels.
///
/// # Safety
/// `dst` valid for those writes; `x` and `panel` packed for the same format and `k`.
#[cfg(test)]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn twin_tile(
    panel: &Panel,
    g0: usize,
    gn: usize,
    x: &XRows,
    i0: usize,
    xn: usize,
    valid: usize,
    dst: *mut f32,
    dst_row: usize,
) {
    let lay = x.lay;
    let (nsb, k, units) = (x.nsb, x.k, lay.s / lay.u);
    for i in i0..i0 + xn {
        for g in g0..g0 + gn {
            for lane in 0..GROUP.min(valid - (g - g0) * GROUP) {
                let mut acc = 0.0f32;
                for sb in 0..nsb {
                    let cell = g * nsb + sb;
                    let w = &panel.w[cell * lay.s * GROUP..];
                    let q = &x.q[i * k + sb * lay.s..];
                    let mut t1 = 0i32;
                    for u in 0..units {
                        let mut s = 0i32;
                        for j in u * lay.u..(u + 1) * lay.u {
                            let wj = i32::from(w[((j / 4) * GROUP + lane) * 4 + j % 4] as i8);
                            s += wj * (i32::from(q[j]) - 128);
                        }
                        t1 += s * if units > 1 { panel.sc[(cell * units + u) * GROUP + lane] } else { 1 };
                    }
                    let mut f = panel.d[cell * GROUP + lane] * t1 as f32;
                    if lay.p > 0 {
                        let mut t2 = 0i32;
                        for p in 0..lay.p {
                            let (a, b) = unpair16(panel.mn[(cell * lay.p + p) * GROUP + lane]);
                            let (c, d) = unpair16(x.qs[(i * nsb + sb) * lay.p + p]);
                            t2 += a * c + b * d;
                        }
                        f = panel.e[cell * GROUP + lane].mul_add(t2 as f32, f);
                    }
                    acc = f.mul_add(x.d[i * nsb + sb], acc);
                }
                // SAFETY: the caller vouches for the destination.
                unsafe { *dst.add(i * dst_row + g * GROUP + lane) = acc };
            }
        }
    }
}

/// The SIMD tile kernels of the integer prefill path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kernel {
    /// `prefill_vnni.rs`: AVX-512 VNNI.
    #[cfg(target_arch = "x86_64")]
    Vnni,
    /// `prefill_avx2.rs`: AVX2 and FMA.
    #[cfg(target_arch = "x86_64")]
    Avx2,
}

/// Products of a shorter `k` keep the f32 panels on AVX2: end to end (docs/decode.md,
/// "AVX2 paths") the AVX2 integer prefill ran 0.60–0.64× the panels on SmolLM2 (k 576
/// and 1536) and 0.75–0.78× on Gemma 3 270M (k 640 and 2048), 1.05–1.11× on the 1.5 B
/// (k 2048 and 5632).
const AVX2_MIN_K: usize = 2048;

/// Which tile kernel runs for the backend's ISA and a product of `dtype` weights over
/// `k`: AVX-512 VNNI where it is allowed, else AVX2 (not for Q8_0, nor below
/// [`AVX2_MIN_K`]), else none (the caller keeps the f32 panel path, faster than the
/// portable twin).
fn kernel(dtype: DType, k: usize) -> Option<Kernel> {
    #[cfg(target_arch = "x86_64")]
    {
        if super::prefill_vnni::runs() {
            return Some(Kernel::Vnni);
        }
        // On AVX2, Q8_0's sign trick makes the integer kernel slower than the f32 panels
        // (0.67–0.87× in `prefill_gemm`, docs/decode.md): Q8_0 keeps the panels there.
        if super::prefill_avx2::runs() && dtype != DType::Q8_0 && k >= AVX2_MIN_K {
            return Some(Kernel::Avx2);
        }
    }
    let _ = (dtype, k);
    None
}

/// `x · Wᵀ` for `m` rows of `xs` by the integer prefill path, or `None` where it does not
/// apply: the exact mode, a format without a packed form, a `k` that is not whole
/// super-blocks, or no tile kernel for the backend's ISA.
pub(super) fn matmul(
    cpu: &CpuBackend,
    xs: &[f32],
    m: usize,
    dtype: DType,
    wb: &[u8],
    n: usize,
    k: usize,
) -> Option<Vec<f32>> {
    let lay = layout(dtype)?;
    if cpu.exact_decode() || !k.is_multiple_of(lay.s) {
        return None;
    }
    let kernel = kernel(dtype, k)?;
    let x = XRows::new(cpu, dtype, lay, xs, m, k);
    let row_bytes = dtype.storage_bytes(k);
    let panel_rows = (n.div_ceil(cpu.threads() * 2).div_ceil(GROUP) * GROUP).clamp(GROUP, PANEL_ROWS);
    let panels = n.div_ceil(panel_rows);
    let mut out = vec![0.0f32; m * n];
    let dst = SharedMut(out.as_mut_ptr());
    thread_local! {
        static PANEL: std::cell::RefCell<Panel> = std::cell::RefCell::new(Panel::default());
    }
    cpu.for_each_index(panels, panel_rows * m * k, |p| {
        let dst = &dst;
        let first = p * panel_rows;
        let rows = panel_rows.min(n - first);
        PANEL.with_borrow_mut(|panel| {
            panel.pack(dtype, lay, &wb[first * row_bytes..(first + rows) * row_bytes], rows, k);
            // SAFETY: columns first..first + rows of every output row, which only this
            // task writes; `out` outlives the loop.
            unsafe { panel_product(kernel, panel, &x, m, rows, dst.0.add(first), n) };
        });
    });
    Some(out)
}

/// Every x row times the packed panel (`rows` valid W rows) into `dst` (row stride
/// `dst_row`), by the SIMD tile kernel `kernel`.
///
/// # Safety
/// `dst` valid for writes at `i·dst_row + r` for `i < m`, `r < rows`; `kernel` runs
/// here ([`kernel`] chose it).
unsafe fn panel_product(
    kernel: Kernel,
    panel: &Panel,
    x: &XRows,
    m: usize,
    rows: usize,
    dst: *mut f32,
    dst_row: usize,
) {
    // SAFETY: the caller's contract.
    #[cfg(target_arch = "x86_64")]
    unsafe {
        match kernel {
            Kernel::Vnni => super::prefill_vnni::panel_product(panel, x, m, rows, dst, dst_row),
            Kernel::Avx2 => super::prefill_avx2::panel_product(panel, x, m, rows, dst, dst_row),
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (panel, x, m, rows, dst, dst_row);
        match kernel {}
    }
}

#[cfg(test)]
mod tests {
    use super::super::encode::quantize_into;
    use super::*;
    use crate::backend::ComputeBackend;
    use crate::cpu::simd::Isa;
    use crate::tensor::Tensor;

    use super::super::test_data::{values, FORMATS};

    /// The twin computes `Σ_j W[r, j]·x̃[j]` (the decode path's value) up to f32
    /// rounding: against an f64 sum of the dequantized weights times the rounded x.
    #[test]
    fn the_twin_is_the_dot_of_the_dequantized_weights_and_the_rounded_x() {
        let cpu = CpuBackend::with_threads(1).unwrap();
        for dtype in FORMATS {
            let lay = layout(dtype).unwrap();
            let (k, rows, m) = (3 * 256, 21, 5);
            let xs = values(m * k, 3);
            let wf = values(rows * k, 4);
            let mut wb = vec![0u8; dtype.storage_bytes(rows * k)];
            quantize_into(dtype, &wf, &mut wb);
            let x = XRows::new(&cpu, dtype, lay, &xs, m, k);
            let mut panel = Panel::default();
            panel.pack(dtype, lay, &wb, rows, k);
            let mut got = vec![0.0f32; m * rows];
            // SAFETY: m × rows outputs.
            unsafe { twin_tile(&panel, 0, panel.groups, &x, 0, m, rows, got.as_mut_ptr(), rows) };
            let row_bytes = dtype.storage_bytes(k);
            for i in 0..m {
                let xq = int::quantize_row(&xs[i * k..(i + 1) * k], dtype);
                let block = int::activation_block(dtype).unwrap();
                for r in 0..rows {
                    let mut wd = vec![0.0f32; k];
                    super::super::dequantize_row_into(dtype, &wb[r * row_bytes..(r + 1) * row_bytes], &mut wd).unwrap();
                    let (mut want, mut scale) = (0.0f64, 0.0f64);
                    for (j, (&wj, &qj)) in wd.iter().zip(&xq.q).enumerate() {
                        let p = f64::from(wj) * f64::from(qj) * f64::from(xq.d[j / block]);
                        want += p;
                        scale += p.abs();
                    }
                    let v = f64::from(got[i * rows + r]);
                    assert!((v - want).abs() <= 2e-5 * scale + 1e-6, "{dtype} x {i} row {r}: {v} vs {want}");
                }
            }
        }
    }

    /// Through the backend, every ISA this CPU has gives the same bits as the twin
    /// (a kernel where one runs, else the f32 panel path, which is only close), for
    /// m = 17..=40 rows (tile remainders), W row counts that leave partial groups and
    /// panels, and 2 threads.
    #[test]
    fn every_isa_gives_the_twins_bits_or_keeps_the_f32_path() {
        for isa in Isa::available() {
            let cpu = CpuBackend::builder().threads(2).isa(isa).exact_decode(false).build().unwrap();
            for dtype in FORMATS {
                let lay = layout(dtype).unwrap();
                // k of 512 and of AVX2_MIN_K: both sides of the AVX2 kernel's threshold.
                for (k, n, m) in [(512, 37, 17), (512, 300, 23), (512, 16, 40), (AVX2_MIN_K, 37, 17)] {
                    let xs = values(m * k, 7 + n as u32);
                    let wf = values(n * k, 9);
                    let w = cpu.quantize(&Tensor::from_vec(wf, [n, k]).unwrap(), dtype).unwrap();
                    let y = cpu.quantized_matmul(&Tensor::from_vec(xs.clone(), [m, k]).unwrap(), &w).unwrap();
                    let y = y.to_vec_f32().unwrap();
                    let x = XRows::new(&cpu, dtype, lay, &xs, m, k);
                    let mut panel = Panel::default();
                    panel.pack(dtype, lay, w.host_bytes().unwrap(), n, k);
                    let mut want = vec![0.0f32; m * n];
                    // SAFETY: m × n outputs.
                    unsafe { twin_tile(&panel, 0, panel.groups, &x, 0, m, n, want.as_mut_ptr(), n) };
                    let runs = {
                        let _isa = crate::cpu::simd::IsaGuard::enter(isa);
                        kernel(dtype, k).is_some()
                    };
                    if runs {
                        for (j, (a, b)) in y.iter().zip(&want).enumerate() {
                            assert_eq!(
                                a.to_bits(),
                                b.to_bits(),
                                "{dtype} {} m={m} n={n} at {j}: {a} vs {b}",
                                isa.name()
                            );
                        }
                    } else {
                        let scale = want.iter().fold(0.0f32, |a, v| a.max(v.abs()));
                        for (a, b) in y.iter().zip(&want) {
                            assert!((a - b).abs() <= 0.03 * scale, "{dtype} {}: {a} vs {b}", isa.name());
                        }
                    }
                }
            }
        }
    }

    /// The packed panel and x of `dtype` weights `wb` (`n` rows) and x rows `xs`, and the
    /// twin's product of all of them.
    fn twin_product(dtype: DType, wb: &[u8], n: usize, xs: &[f32], m: usize, k: usize) -> (Panel, XRows, Vec<f32>) {
        let cpu = CpuBackend::with_threads(1).unwrap();
        let lay = layout(dtype).unwrap();
        let x = XRows::new(&cpu, dtype, lay, xs, m, k);
        let mut panel = Panel::default();
        panel.pack(dtype, lay, wb, n, k);
        let mut want = vec![f32::NAN; m * n];
        // SAFETY: m × n outputs.
        unsafe { twin_tile(&panel, 0, panel.groups, &x, 0, m, n, want.as_mut_ptr(), n) };
        (panel, x, want)
    }

    /// `kernel` on the packed panel: the twin's bits, and nothing written past the `n`
    /// valid columns of each row (the destination's stride is `n + 3`).
    #[cfg(target_arch = "x86_64")]
    fn assert_kernel_gives_twin_bits(
        kernel: Kernel,
        dtype: DType,
        panel: &Panel,
        x: &XRows,
        want: &[f32],
        m: usize,
        n: usize,
    ) {
        let stride = n + 3;
        let mut got = vec![-7.0f32; m * stride];
        // SAFETY: m rows of `stride` ≥ n outputs; the caller checked the kernel runs.
        unsafe { panel_product(kernel, panel, x, m, n, got.as_mut_ptr(), stride) };
        for i in 0..m {
            for r in 0..n {
                let (a, b) = (got[i * stride + r], want[i * n + r]);
                assert_eq!(a.to_bits(), b.to_bits(), "{kernel:?} {dtype} m={m} n={n} at ({i}, {r}): {a} vs {b}");
            }
            assert!(
                got[i * stride + n..(i + 1) * stride].iter().all(|&v| v == -7.0),
                "{kernel:?} {dtype} wrote past row {i}"
            );
        }
    }

    /// [`max_abs_weight`] bounds every weight `unpack` gives, and is reached, over blocks
    /// of random bytes (every nibble and bit pattern appears).
    #[test]
    fn max_abs_weight_is_the_bound_of_each_format() {
        let mut seed = 0x1234_5678u32;
        for dtype in FORMATS {
            let s = layout(dtype).unwrap().s;
            let mut blk = vec![0u8; dtype.storage_bytes(s)];
            let mut seen = 0;
            let mut un = Unpacked { w: [0; 256], sc: [1; 16], mn: [0; 8], d: 0.0, e: 0.0 };
            for _ in 0..2000 {
                for b in blk.iter_mut() {
                    seed ^= seed << 13;
                    seed ^= seed >> 17;
                    seed ^= seed << 5;
                    *b = seed as u8;
                }
                unpack(dtype, &blk, &mut un);
                seen = un.w[..s].iter().fold(seen, |m, &v| m.max(i32::from(v).abs()));
            }
            assert_eq!(seen, max_abs_weight(dtype), "{dtype}");
        }
    }

    /// The AVX2 kernel's i16 sums of `steps` `vpmaddubsw` lanes fit for every format
    /// (`prefill_avx2.rs`): x's `q + 128` ≤ 255, two products per lane.
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn the_avx2_kernels_i16_sums_cannot_saturate() {
        for dtype in FORMATS {
            let b = max_abs_weight(dtype);
            match super::super::prefill_avx2::steps(b) {
                0 => assert!(b > 32 && 2 * 128 * 127 <= i32::from(i16::MAX), "{dtype}: the sign trick's bound"),
                st => assert!(st as i32 * 2 * 255 * b <= i32::from(i16::MAX), "{dtype}: {st} steps"),
            }
        }
    }

    /// The AVX2 kernel (forced, whatever else this CPU has) gives the twin's bits on
    /// every format for every x tile remainder (m = 1..=9) and partial groups and halves
    /// (n = 1, 7, 9, 16, 33), k of one and of three super-blocks.
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn the_avx2_kernel_gives_the_twins_bits() {
        if !Isa::Avx2.is_available() {
            return; // no AVX2 on this CPU
        }
        for dtype in FORMATS {
            let s = layout(dtype).unwrap().s;
            for k in [s, 3 * s] {
                for n in [1, 7, 9, 16, 33] {
                    let mut wb = vec![0u8; dtype.storage_bytes(n * k)];
                    quantize_into(dtype, &values(n * k, 11 + n as u32), &mut wb);
                    for m in 1..=9 {
                        let xs = values(m * k, 5 + m as u32);
                        let (panel, x, want) = twin_product(dtype, &wb, n, &xs, m, k);
                        assert_kernel_gives_twin_bits(Kernel::Avx2, dtype, &panel, &x, &want, m, n);
                    }
                }
            }
        }
    }

    /// The i16 bounds of the AVX2 kernel at their limits: Q8_0 weights of −128 and 127,
    /// IQ4_NL's −127, Q6_K's −32 with scale −128, Q5_K's 31 with scale 63, against x
    /// whose 8-bit values are all ±127 (`q + 128` = 255 or 1). A saturated i16 would
    /// change the sums; every kernel this CPU runs must still give the twin's bits.
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn the_kernels_keep_the_twins_bits_at_the_extreme_weights() {
        let (n, m) = (16, 6);
        // Each case fills one block of its format.
        type Fill = fn(&mut [u8]);
        let cases: [(DType, Fill); 4] = [
            (DType::Q8_0, |b| {
                b[..2].copy_from_slice(&0x3C00u16.to_le_bytes()); // d = 1
                for (j, v) in b[2..].iter_mut().enumerate() {
                    *v = if j % 5 == 4 { 127 } else { 0x80 };
                }
            }),
            (DType::IQ4NL, |b| {
                b[..2].copy_from_slice(&0x3C00u16.to_le_bytes());
                b[2..].fill(0); // level 0: −127
            }),
            (DType::Q6K, |b| {
                b[..192].fill(0); // q = 0: w = −32
                b[192..208].fill(0x80); // scales −128
                b[208..].copy_from_slice(&0x3C00u16.to_le_bytes());
            }),
            (DType::Q5K, |b| {
                b[..2].copy_from_slice(&0x3C00u16.to_le_bytes());
                b[2..4].copy_from_slice(&0x3C00u16.to_le_bytes());
                b[4..16].fill(0xFF); // 6-bit scales and mins 63
                b[16..].fill(0xFF); // w = 31
            }),
        ];
        for (dtype, fill) in cases {
            let k = layout(dtype).unwrap().s * 2;
            let mut wb = vec![0u8; dtype.storage_bytes(n * k)];
            for blk in wb.chunks_exact_mut(dtype.storage_bytes(layout(dtype).unwrap().s)) {
                fill(blk);
            }
            for sign in [1.0f32, -1.0] {
                let xs: Vec<f32> = (0..m * k).map(|j| if (j / 3) % 2 == 0 { sign } else { sign * 0.9999 }).collect();
                let (panel, x, want) = twin_product(dtype, &wb, n, &xs, m, k);
                assert!(x.q.iter().all(|&q| q == 255 || q == 1), "{dtype}: x not at ±127");
                let mut kernels = Vec::new();
                if Isa::Avx2.is_available() {
                    kernels.push(Kernel::Avx2);
                }
                if kernel(dtype, k) == Some(Kernel::Vnni) {
                    kernels.push(Kernel::Vnni);
                }
                for kernel in kernels {
                    assert_kernel_gives_twin_bits(kernel, dtype, &panel, &x, &want, m, n);
                }
            }
        }
    }
}
