//! The BF16 GEMM of mixed-precision training: `c (+)= a·b` with both operands rounded to
//! BF16 (round to nearest even) and products accumulated in f32, the arithmetic of
//! PyTorch's `autocast(bfloat16)` matmuls.
//!
//! Goto/BLIS blocking: for blocks of `NC` columns and `KC` k, B's block is packed
//! once (BF16 pairs, `pack.rs`); for blocks of `MC` rows A's block is packed, and
//! [`MR`]×[`NR`] tiles of C are computed by a microkernel over the packed pairs, B's
//! strip staying in L1 while A's strips pass. Split over threads, the operand every
//! thread reads whole is packed once by all of them (`whole.rs`), and a thread's A that
//! meets several column blocks is packed once, whole. Kernels, chosen at run time: AMX
//! tiles (`tdpbf16ps`, 8,192 multiply-adds per instruction; `amx.rs`), `vdpbf16ps`
//! (AVX-512 BF16: 32 multiply-adds per instruction, twice f32's FMA), the same products
//! from widened BF16 with f32 FMA (AVX-512 without BF16), and portable code (compiled
//! for AVX2 + FMA where present). All three round the operands the same way and add a
//! pair's two products odd k first, so they agree within f32 rounding of the
//! accumulation order (the `vdpbf16ps` instructions also flush denormals to zero).

#[cfg(target_arch = "x86_64")]
mod amx;
#[cfg(target_arch = "x86_64")]
mod kernel_x86;
pub mod linear;
mod pack;
mod whole;

use std::mem::MaybeUninit;
use std::sync::OnceLock;

pub use pack::round_bf16;

pub(crate) use crate::cpu::matmul::View;
use crate::cpu::{pool::SharedMut, simd::Isa, CpuBackend};
use whole::{Side, Whole};

/// Rows of a microkernel tile.
pub const MR: usize = 6;
/// Columns of a microkernel tile (four vectors of 16 f32).
pub const NR: usize = 64;
/// k per packed block (even: whole pairs). B's strip, `KC·NR` BF16, is 32 KiB.
const KC: usize = 256;
/// Rows per packed block of A (`MC·KC` BF16: 48 KiB, in L2).
const MC: usize = 96;
/// Columns per packed block of B (`KC·NC` BF16: 512 KiB, in L2).
const NC: usize = 1024;
/// Rows (and columns) of C per block of the AMX kernel.
const AMX_ROWS: usize = 32;
/// Products with fewer multiply-adds than this run on one thread.
const PARALLEL_WORK: usize = 48 * 48 * 256;

/// Whether this CPU has AVX-512 BF16 (with F and BW), probed once.
pub fn has_avx512_bf16() -> bool {
    static HAS: OnceLock<bool> = OnceLock::new();
    *HAS.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            std::arch::is_x86_feature_detected!("avx512bf16")
                && std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx512bw")
        }
        #[cfg(not(target_arch = "x86_64"))]
        false
    })
}

/// Whether this CPU and OS run AMX BF16 tiles for this process (`FUSEBOX_AMX=0`: no),
/// probed once.
pub fn has_amx_bf16() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        amx::has_amx_bf16()
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Which microkernel a thread with ISA `isa` runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernel {
    /// AMX tiles (`tdpbf16ps`), with `vdpbf16ps` for the last pairs of k.
    Amx,
    /// `vdpbf16ps` (AVX-512 BF16).
    Dpbf16,
    /// BF16 widened to f32, AVX-512 FMA.
    Widened,
    /// Portable code (AVX2 + FMA when the CPU has them).
    Portable,
}

impl Kernel {
    /// The kernel for the ISA the calling thread holds.
    pub fn active() -> Kernel {
        Kernel::for_isa(Isa::active())
    }

    /// The kernel a backend with ISA `isa` runs.
    pub fn for_isa(isa: Isa) -> Kernel {
        match isa {
            Isa::Avx512 if has_amx_bf16() => Kernel::Amx,
            Isa::Avx512 if has_avx512_bf16() => Kernel::Dpbf16,
            Isa::Avx512 => Kernel::Widened,
            _ => Kernel::Portable,
        }
    }

    /// Short name for reports (`amx-bf16`, `avx512-bf16`, `avx512-widened`, `portable`).
    pub fn name(self) -> &'static str {
        match self {
            Kernel::Amx => "amx-bf16",
            Kernel::Dpbf16 => "avx512-bf16",
            Kernel::Widened => "avx512-widened",
            Kernel::Portable => "portable",
        }
    }
}

/// `c = a·b`, or `c += a·b` when `accumulate`, with `a` (`m×k`) and `b` (`k×n`) rounded
/// to BF16 and f32 accumulation; `c` row-major `[m, n]`. Large products are split over
/// `cpu`'s threads in blocks of rows or columns, each computed by one thread in a fixed
/// order, so results depend on the thread count only.
///
/// # Panics
/// When a view reaches past its slice or `c` is shorter than `m·n` (a caller bug: the
/// ops check shapes first).
#[allow(clippy::too_many_arguments)]
pub(crate) fn bgemm(
    cpu: &CpuBackend,
    m: usize,
    n: usize,
    k: usize,
    a: View<'_>,
    b: View<'_>,
    c: &mut [MaybeUninit<f32>],
    accumulate: bool,
) {
    bgemm_with(cpu, Kernel::active(), m, n, k, a, b, c, accumulate)
}

/// [`bgemm`] with a given kernel, which the CPU must be able to run.
#[allow(clippy::too_many_arguments)]
fn bgemm_with(
    cpu: &CpuBackend,
    kernel: Kernel,
    m: usize,
    n: usize,
    k: usize,
    a: View<'_>,
    b: View<'_>,
    c: &mut [MaybeUninit<f32>],
    accumulate: bool,
) {
    assert!(c.len() >= m * n, "bgemm: c holds {} values, not {m}x{n}", c.len());
    if m == 0 || n == 0 {
        return;
    }
    if k > 0 {
        a.check("a", m, k);
        b.check("b", k, n);
    }
    let work = m.saturating_mul(n).saturating_mul(k);
    let threads = cpu.threads();
    if threads == 1 || work < PARALLEL_WORK || crate::cpu::team::in_team() {
        // SAFETY: `c` holds m·n values (asserted); the views were checked above.
        let (a, b) = (Operand::View(a), Operand::View(b));
        return unsafe { serial(kernel, m, n, k, a, b, c.as_mut_ptr().cast(), n, accumulate) };
    }
    // One block per thread along the longer side (columns by multiples of NR, rows by
    // multiples of MR): each packs its share of one operand, and the other operand,
    // which every block reads whole, is packed once beforehand by all threads together.
    let by_rows = m * 2 >= n;
    // Rows split on the kernel's block: the AMX kernel computes a partial 32-row block
    // whole (and copies it), the others a partial MR-row tile.
    let rows_unit = if kernel == Kernel::Amx { AMX_ROWS } else { MR };
    let (len, unit) = if by_rows { (m, rows_unit) } else { (n, NR) };
    let step = len.div_ceil(threads).next_multiple_of(unit);
    let (side, shared, shared_len) = if by_rows { (Side::B, b, n) } else { (Side::A, a, m) };
    let c_at = SharedMut(c.as_mut_ptr().cast::<f32>());
    if kernel == Kernel::Amx && !by_rows {
        // The AMX kernel packs A row by row, not in the strips a shared A is packed in:
        // each block of columns packs its own A.
        cpu.for_each_index(len.div_ceil(step), PARALLEL_WORK, |blk| {
            let (lo, hi) = (blk * step, ((blk + 1) * step).min(len));
            let (a, b) = (Operand::View(a), Operand::View(b.cols_from(lo)));
            // SAFETY: blocks write disjoint columns of `c` (through stride n), which holds
            // m·n values; each block runs once.
            unsafe { serial(kernel, m, hi - lo, k, a, b, c_at.ptr().add(lo), n, accumulate) };
        });
        return;
    }
    thread_local! {
        /// The calling thread's buffer for the operand its blocks share, kept between
        /// calls (a product of the LM head's size would otherwise fault it in each time).
        static SHARED: std::cell::RefCell<Vec<u32>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    SHARED.with(|cell| {
        let (mut guard, mut own) = (cell.try_borrow_mut(), Vec::new());
        let words = match &mut guard {
            Ok(kept) => &mut **kept,
            // Only a product started inside this one's blocks finds it taken.
            Err(_) => &mut own,
        };
        grow(words, whole::words(side, shared_len, k));
        whole::pack_parallel(cpu, side, shared, shared_len, k, words);
        let packed = Whole::new(words, side, shared_len, k);
        cpu.for_each_index(len.div_ceil(step), PARALLEL_WORK, |blk| {
            let (lo, hi) = (blk * step, ((blk + 1) * step).min(len));
            let (rows, cols, a, b, at) = if by_rows {
                (hi - lo, n, Operand::View(a.rows_from(lo)), Operand::Whole(packed), lo * n)
            } else {
                (m, hi - lo, Operand::Whole(packed), Operand::View(b.cols_from(lo)), lo)
            };
            // SAFETY: blocks write disjoint rows (or columns, through stride n) of `c`,
            // which holds m·n values; each block runs once.
            unsafe { serial(kernel, rows, cols, k, a, b, c_at.ptr().add(at), n, accumulate) };
        });
    });
}

/// Makes a packing buffer kept between products at least `len` words long, never
/// shorter: only words past the longest length yet are zeroed (shrinking and growing
/// back zeroed megabytes per product). The packers write every word a kernel reads,
/// padding included.
fn grow(buffer: &mut Vec<u32>, len: usize) {
    if buffer.len() < len {
        buffer.resize(len, 0);
    }
}

/// An operand of [`serial`]: a strided matrix, packed block by block as the loops reach
/// it, or one packed whole beforehand (whose rows / columns start at the block's).
#[derive(Clone, Copy)]
enum Operand<'a> {
    View(View<'a>),
    Whole(Whole<'a>),
}

/// [`bgemm`] of an `m×n` block on the calling thread, `c(i, j) = c[i·ldc + j]`.
///
/// # Safety
/// `c` must be valid for reads (when `accumulate`) and writes of the block, which no
/// other thread touches; the views must hold their matrices (whole operands check their
/// panels' lengths).
#[allow(clippy::too_many_arguments)]
unsafe fn serial(
    kernel: Kernel,
    m: usize,
    n: usize,
    k: usize,
    a: Operand<'_>,
    b: Operand<'_>,
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
) {
    // SAFETY: the caller upholds this function's contract (see `# Safety`).
    unsafe {
        if k == 0 {
            if !accumulate {
                (0..m).for_each(|i| std::ptr::write_bytes(c.add(i * ldc), 0, n));
            }
            return;
        }
        #[cfg(target_arch = "x86_64")]
        if let (Kernel::Amx, Operand::View(a)) = (kernel, a) {
            return amx::serial_amx(m, n, k, a, b, c, ldc, accumulate);
        }
        thread_local! {
            /// Each thread's packed blocks (A, B) and its whole A, kept between calls.
            static PACKED: std::cell::RefCell<(Vec<u32>, Vec<u32>, Vec<u32>)> =
                const { std::cell::RefCell::new((Vec::new(), Vec::new(), Vec::new())) };
        }
        PACKED.with_borrow_mut(|(pa, pb, whole_a)| {
            grow(pa, MC.next_multiple_of(MR) * KC / 2);
            grow(pb, NC.next_multiple_of(NR) * KC / 2);
            // Each block of A meets every block of columns: with more than one, A is
            // packed once, whole, rather than once per column block.
            let a = match a {
                Operand::View(v) if n > NC => {
                    grow(whole_a, whole::words(Side::A, m, k));
                    whole::pack(Side::A, v, m, k, whole_a);
                    Operand::Whole(Whole::new(whole_a, Side::A, m, k))
                }
                a => a,
            };
            let mut edge = [0f32; MR * NR];
            for jc in (0..n).step_by(NC) {
                let nc = NC.min(n - jc);
                for pc in (0..k).step_by(KC) {
                    let kc = KC.min(k - pc);
                    let kp = kc.div_ceil(2);
                    let b_panel: &[u32] = match b {
                        Operand::View(v) => {
                            pack::pack_b(v, pc, kc, jc, nc, pb);
                            pb
                        }
                        Operand::Whole(w) => w.panel(jc, pc),
                    };
                    // The first k block stores unless accumulating; the others add.
                    let add = accumulate || pc > 0;
                    for ic in (0..m).step_by(MC) {
                        let mc = MC.min(m - ic);
                        let a_panel: &[u32] = match a {
                            Operand::View(v) => {
                                pack::pack_a(v, ic, mc, pc, kc, pa);
                                pa
                            }
                            Operand::Whole(w) => w.panel(ic, pc),
                        };
                        assert!(
                            a_panel.len() >= mc.next_multiple_of(MR) * kp
                                && b_panel.len() >= nc.next_multiple_of(NR) * kp,
                            "bgemm: a packed panel is short"
                        );
                        for jr in (0..nc).step_by(NR) {
                            let cols = NR.min(nc - jr);
                            let bs = b_panel.as_ptr().add(jr / NR * kp * NR);
                            for ir in (0..mc).step_by(MR) {
                                let rows = MR.min(mc - ir);
                                let as_ = a_panel.as_ptr().add(ir / MR * kp * MR);
                                let dst = c.add((ic + ir) * ldc + jc + jr);
                                if rows == MR && cols == NR {
                                    tile(kernel, kp, as_, bs, dst, ldc, add);
                                } else {
                                    // A partial tile: computed whole into `edge`, then its
                                    // valid part stored or added.
                                    tile(kernel, kp, as_, bs, edge.as_mut_ptr(), NR, false);
                                    for i in 0..rows {
                                        let out = dst.add(i * ldc);
                                        for (j, &v) in edge[i * NR..][..cols].iter().enumerate() {
                                            *out.add(j) = if add { *out.add(j) + v } else { v };
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        });
    }
}

/// One MR×NR tile with `kernel` (see `kernel_x86::tile_dpbf16`).
///
/// # Safety
/// As `kernel_x86::tile_dpbf16`; `kernel` must be one the CPU can run.
#[inline(always)]
unsafe fn tile(kernel: Kernel, kp: usize, a: *const u32, b: *const u32, c: *mut f32, ldc: usize, add: bool) {
    // SAFETY: the caller upholds this function's contract (see `# Safety`).
    unsafe {
        match kernel {
            // An A packed in strips (never passed to the AMX kernel) takes `vdpbf16ps`.
            #[cfg(target_arch = "x86_64")]
            Kernel::Dpbf16 | Kernel::Amx => kernel_x86::tile_dpbf16(kp, a, b, c, ldc, add),
            #[cfg(target_arch = "x86_64")]
            Kernel::Widened => kernel_x86::tile_widened(kp, a, b, c, ldc, add),
            _ => tile_portable(kp, a, b, c, ldc, add),
        }
    }
}

/// The portable tile: the products of [`tile`] in plain f32 arithmetic (compiled for
/// AVX2 + FMA where the CPU has them, so the NR lanes vectorise).
unsafe fn tile_portable(kp: usize, a: *const u32, b: *const u32, c: *mut f32, ldc: usize, add: bool) {
    // SAFETY: the caller upholds this function's contract (see `# Safety`).
    unsafe {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
            return tile_portable_avx2(kp, a, b, c, ldc, add);
        }
        tile_generic(kp, a, b, c, ldc, add)
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn tile_portable_avx2(kp: usize, a: *const u32, b: *const u32, c: *mut f32, ldc: usize, add: bool) {
    // SAFETY: the caller upholds this function's contract (see `# Safety`).
    unsafe { tile_generic(kp, a, b, c, ldc, add) }
}

#[inline(always)]
unsafe fn tile_generic(kp: usize, a: *const u32, b: *const u32, c: *mut f32, ldc: usize, add: bool) {
    // SAFETY: the caller upholds this function's contract (see `# Safety`).
    unsafe {
        let hi = |w: u32| f32::from_bits(w & 0xffff_0000);
        let lo = |w: u32| f32::from_bits(w << 16);
        for i in 0..MR {
            let mut acc = [0f32; NR];
            for p in 0..kp {
                let w = *a.add(p * MR + i);
                let (a_hi, a_lo) = (hi(w), lo(w));
                let bp = std::slice::from_raw_parts(b.add(p * NR), NR);
                for (lane, &bw) in acc.iter_mut().zip(bp) {
                    // Both products are exact in f32: mul_add rounds the same sum as `+`.
                    *lane = a_hi.mul_add(hi(bw), *lane);
                    *lane = a_lo.mul_add(lo(bw), *lane);
                }
            }
            let out = c.add(i * ldc);
            for (j, &v) in acc.iter().enumerate() {
                *out.add(j) = if add { *out.add(j) + v } else { v };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::simd::Isa;

    /// `c = round(a)·round(b)` in f64, row-major.
    fn reference(m: usize, n: usize, k: usize, a: View<'_>, b: View<'_>) -> Vec<f64> {
        let mut c = vec![0f64; m * n];
        for i in 0..m {
            for j in 0..n {
                c[i * n + j] = (0..k)
                    .map(|p| {
                        round_bf16(a.data[i * a.rs + p * a.cs]) as f64 * round_bf16(b.data[p * b.rs + j * b.cs]) as f64
                    })
                    .sum();
            }
        }
        c
    }

    fn values(len: usize, seed: u32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(2654435761).wrapping_add(12345);
        (0..len)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                (s as f32 / u32::MAX as f32) * 2.0 - 1.0
            })
            .collect()
    }

    /// Every kernel the CPU can run, on shapes with edges in every dimension, both
    /// operand layouts, stored and accumulated, serial and split over threads.
    #[test]
    fn agrees_with_f64_on_rounded_operands() {
        let mut kernels = vec![Kernel::Portable];
        if Isa::Avx512.is_available() {
            kernels.push(Kernel::Widened);
        }
        if Isa::Avx512.is_available() && has_avx512_bf16() {
            kernels.push(Kernel::Dpbf16);
        }
        if Isa::Avx512.is_available() && has_amx_bf16() {
            kernels.push(Kernel::Amx);
        }
        for kernel in kernels {
            for threads in [1, 2] {
                let cpu = CpuBackend::builder().threads(threads).build().unwrap();
                // Split by columns with A shared; by rows with B shared, and with
                // several column blocks per thread (A packed whole).
                for (m, n, k) in [
                    (1, 1, 1),
                    (7, 65, 3),
                    (13, 130, 257),
                    (97, 200, 600),
                    (200, 1100, 64),
                    (300, 130, 301),
                    (1030, 1030, 21),
                    // More k than one pass of the AMX kernel keeps C in its tiles for.
                    (33, 70, 4500),
                ] {
                    let av = values(m * k, 1);
                    let bv = values(k * n, 2);
                    for (a, b) in
                        [(View::new(&av, k, 1), View::new(&bv, n, 1)), (View::new(&av, 1, m), View::new(&bv, 1, k))]
                    {
                        let want = reference(m, n, k, a, b);
                        for accumulate in [false, true] {
                            let mut c = vec![MaybeUninit::new(0.5f32); m * n];
                            bgemm_with(&cpu, kernel, m, n, k, a, b, &mut c, accumulate);
                            for (t, (got, want)) in c.iter().zip(&want).enumerate() {
                                // SAFETY: bgemm wrote (or kept) every value.
                                let got = unsafe { got.assume_init() } as f64 - if accumulate { 0.5 } else { 0.0 };
                                let tol = 1e-6 * (k as f64).sqrt() * 4.0 + 1e-6;
                                assert!(
                                    (got - want).abs() <= tol,
                                    "{} {threads} threads {m}x{n}x{k} acc {accumulate} at {t}: {got} vs {want}",
                                    kernel.name()
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    /// Packing a shared operand once for all threads, or a thread's A once for all its
    /// column blocks, multiplies the same packed words in the same order: the products
    /// are bit-identical to one thread packing block by block.
    #[test]
    fn whole_packing_is_bit_identical() {
        let one = CpuBackend::builder().threads(1).build().unwrap();
        let two = CpuBackend::builder().threads(2).build().unwrap();
        let kernel = Kernel::active();
        for (m, n, k) in [(97, 200, 600), (300, 130, 301), (1030, 1030, 21), (40, 2100, 300)] {
            let (av, bv) = (values(m * k, 3), values(k * n, 4));
            for (a, b) in [(View::new(&av, k, 1), View::new(&bv, n, 1)), (View::new(&av, 1, m), View::new(&bv, 1, k))] {
                let mut by_block = vec![MaybeUninit::new(0f32); m * n];
                // SAFETY: `by_block` holds m·n values; the views hold their matrices.
                unsafe {
                    let (oa, ob) = (Operand::View(a), Operand::View(b));
                    let c: *mut f32 = by_block.as_mut_ptr().cast();
                    // Column blocks of at most NC, so that A is packed block by block.
                    for j0 in (0..n).step_by(NC) {
                        let ob = match ob {
                            Operand::View(v) => Operand::View(v.cols_from(j0)),
                            w => w,
                        };
                        serial(kernel, m, NC.min(n - j0), k, oa, ob, c.add(j0), n, false);
                    }
                }
                for cpu in [&one, &two] {
                    let mut c = vec![MaybeUninit::new(0f32); m * n];
                    bgemm_with(cpu, kernel, m, n, k, a, b, &mut c, false);
                    // SAFETY: both hold m·n written values.
                    let same = c
                        .iter()
                        .zip(&by_block)
                        .all(|(x, y)| unsafe { x.assume_init().to_bits() == y.assume_init().to_bits() });
                    assert!(same, "{m}x{n}x{k} on {} threads differs from block-by-block packing", cpu.threads());
                }
            }
        }
    }
}
