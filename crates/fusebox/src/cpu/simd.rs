//! Runtime ISA dispatch and the vector primitives kernels share.
//!
//! Each primitive is written once as plain lane-wise Rust and compiled three times:
//! for AVX-512 (x86-64-v4), for AVX2+FMA (x86-64-v3) and portable (scalar, and NEON
//! through the compiler's baseline on aarch64). [`Isa::selected`] picks the best the
//! CPU has; `FUSEBOX_ISA=avx512|avx2|scalar` forces one of our paths (the gemm crate
//! keeps its own dispatch), so the conformance suite can run on each.

use std::mem::MaybeUninit;
use std::sync::OnceLock;

/// The instruction set level our own kernels run with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Isa {
    /// AVX-512 (F, BW, VL, DQ) with FMA.
    Avx512,
    /// AVX2 with FMA.
    Avx2,
    /// Portable code (auto-vectorized for the build target).
    Scalar,
}

impl Isa {
    /// The best level this CPU supports.
    pub fn detected() -> Isa {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx512bw")
                && std::arch::is_x86_feature_detected!("avx512vl")
                && std::arch::is_x86_feature_detected!("fma")
            {
                return Isa::Avx512;
            }
            if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
                return Isa::Avx2;
            }
        }
        Isa::Scalar
    }

    /// The level in use: `FUSEBOX_ISA` when set (and supported here), else [`Isa::detected`].
    /// Read once per process.
    pub fn selected() -> Isa {
        static SELECTED: OnceLock<Isa> = OnceLock::new();
        *SELECTED.get_or_init(|| {
            let best = Isa::detected();
            match std::env::var("FUSEBOX_ISA").ok().as_deref().map(str::to_ascii_lowercase).as_deref() {
                Some("scalar") => Isa::Scalar,
                Some("avx2") if best != Isa::Scalar => Isa::Avx2,
                Some("avx512") if best == Isa::Avx512 => Isa::Avx512,
                _ => best,
            }
        })
    }

    /// Short name (`avx512`, `avx2`, `scalar`).
    pub fn name(self) -> &'static str {
        match self {
            Isa::Avx512 => "avx512",
            Isa::Avx2 => "avx2",
            Isa::Scalar => "scalar",
        }
    }
}

/// CPU features worth reporting (`fusebox info`).
pub fn cpu_features() -> Vec<&'static str> {
    let mut f = Vec::new();
    #[cfg(target_arch = "x86_64")]
    {
        macro_rules! probe {
            ($($name:tt),*) => {$(
                if std::arch::is_x86_feature_detected!($name) { f.push($name); }
            )*};
        }
        probe!(
            "sse4.2",
            "avx",
            "avx2",
            "fma",
            "f16c",
            "avx512f",
            "avx512bw",
            "avx512vl",
            "avx512bf16",
            "avx512fp16",
            "avx512vnni"
        );
    }
    #[cfg(target_arch = "aarch64")]
    {
        f.push("neon");
    }
    f
}

/// Defines `pub fn $name` compiled for AVX-512, AVX2+FMA and the portable baseline,
/// dispatching on [`Isa::selected`].
///
/// The body is expanded into each version (not called through one shared function), so
/// closures inside it inherit the version's target features and are vectorized for it
/// even when the compiler does not inline them. The body may read `FMA`: whether fused
/// multiply-adds are in hardware (true for the x86 AVX versions and on aarch64), for
/// [`madd`].
macro_rules! multiversion {
    ($(#[$meta:meta])* pub fn $name:ident($($arg:ident: $ty:ty),*) $(-> $ret:ty)? $body:block) => {
        $(#[$meta])*
        #[inline]
        pub fn $name($($arg: $ty),*) $(-> $ret)? {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
                fn v4($($arg: $ty),*) $(-> $ret)? {
                    #[allow(dead_code)]
                    const FMA: bool = true;
                    $body
                }
                #[target_feature(enable = "avx2,fma")]
                fn v3($($arg: $ty),*) $(-> $ret)? {
                    #[allow(dead_code)]
                    const FMA: bool = true;
                    $body
                }
                match $crate::cpu::simd::Isa::selected() {
                    // SAFETY: the selected ISA was detected on this CPU.
                    $crate::cpu::simd::Isa::Avx512 => return unsafe { v4($($arg),*) },
                    // SAFETY: as above.
                    $crate::cpu::simd::Isa::Avx2 => return unsafe { v3($($arg),*) },
                    $crate::cpu::simd::Isa::Scalar => {}
                }
            }
            #[allow(dead_code)]
            const FMA: bool = cfg!(target_arch = "aarch64");
            $body
        }
    };
}
#[allow(unused_imports)]
pub(crate) use multiversion;

/// Lanes of the accumulators: 16 f32 = one AVX-512 register, two AVX2 ones.
const LANES: usize = 16;

/// `dst[c·dst_stride + r] = src[r·src_stride + c]` for `r < rows`, `c < cols`: a
/// transposed copy in 16 × 16 blocks, so both sides move a cache line at a time; with
/// AVX-512 a whole block is transposed in registers (64 shuffles for 256 values), else
/// and for the partial edge blocks element by element.
pub fn transpose_into(src: &[f32], src_stride: usize, rows: usize, cols: usize, dst: &mut [f32], dst_stride: usize) {
    const B: usize = 16;
    if rows == 0 || cols == 0 {
        return;
    }
    assert!(
        (rows - 1) * src_stride + cols <= src.len() && (cols - 1) * dst_stride + rows <= dst.len(),
        "transpose_into: a view exceeds its slice"
    );
    for r0 in (0..rows).step_by(B) {
        for c0 in (0..cols).step_by(B) {
            let whole = r0 + B <= rows && c0 + B <= cols;
            #[cfg(target_arch = "x86_64")]
            if whole && Isa::selected() == Isa::Avx512 {
                // SAFETY: AVX-512 was detected; the block's 16 rows of 16 (source) and 16
                // columns of 16 (destination) lie inside the slices (asserted above).
                unsafe {
                    transpose16_avx512(
                        src.as_ptr().add(r0 * src_stride + c0),
                        src_stride,
                        dst.as_mut_ptr().add(c0 * dst_stride + r0),
                        dst_stride,
                    )
                };
                continue;
            }
            let _ = whole;
            for r in r0..(r0 + B).min(rows) {
                for c in c0..(c0 + B).min(cols) {
                    dst[c * dst_stride + r] = src[r * src_stride + c];
                }
            }
        }
    }
}

/// One 16 × 16 block of [`transpose_into`] in registers: 32-bit then 64-bit interleaves
/// within 128-bit lanes (afterwards lane L of `u[4k + j]` holds column `4L + j`, rows
/// `4k .. 4k + 4`), then a 4 × 4 transpose of the 128-bit lanes per `j`.
///
/// # Safety
/// AVX-512F must be present; `src + r·src_stride + [0, 16)` and `dst + c·dst_stride + [0, 16)`
/// must be valid for `r, c < 16`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn transpose16_avx512(src: *const f32, src_stride: usize, dst: *mut f32, dst_stride: usize) {
    use std::arch::x86_64::*;
    // SAFETY (whole body): the caller guarantees the 16 source rows and 16 destination rows.
    unsafe {
        let mut r = [_mm512_setzero_ps(); 16];
        for (i, v) in r.iter_mut().enumerate() {
            *v = _mm512_loadu_ps(src.add(i * src_stride));
        }
        let mut t = [_mm512_setzero_ps(); 16];
        for k in 0..8 {
            t[2 * k] = _mm512_unpacklo_ps(r[2 * k], r[2 * k + 1]);
            t[2 * k + 1] = _mm512_unpackhi_ps(r[2 * k], r[2 * k + 1]);
        }
        let mut u = [_mm512_setzero_ps(); 16];
        for k in 0..4 {
            let (a, b, c, d) = (
                _mm512_castps_pd(t[4 * k]),
                _mm512_castps_pd(t[4 * k + 1]),
                _mm512_castps_pd(t[4 * k + 2]),
                _mm512_castps_pd(t[4 * k + 3]),
            );
            u[4 * k] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
            u[4 * k + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
            u[4 * k + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
            u[4 * k + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
        }
        for j in 0..4 {
            let (v0, v1, v2, v3) = (u[j], u[4 + j], u[8 + j], u[12 + j]);
            let x0 = _mm512_shuffle_f32x4::<0x44>(v0, v1);
            let x1 = _mm512_shuffle_f32x4::<0xEE>(v0, v1);
            let x2 = _mm512_shuffle_f32x4::<0x44>(v2, v3);
            let x3 = _mm512_shuffle_f32x4::<0xEE>(v2, v3);
            _mm512_storeu_ps(dst.add(j * dst_stride), _mm512_shuffle_f32x4::<0x88>(x0, x2));
            _mm512_storeu_ps(dst.add((4 + j) * dst_stride), _mm512_shuffle_f32x4::<0xDD>(x0, x2));
            _mm512_storeu_ps(dst.add((8 + j) * dst_stride), _mm512_shuffle_f32x4::<0x88>(x1, x3));
            _mm512_storeu_ps(dst.add((12 + j) * dst_stride), _mm512_shuffle_f32x4::<0xDD>(x1, x3));
        }
    }
}

multiversion! {
    /// `y[i] += alpha·x[i]`.
    pub fn axpy(y: &mut [f32], alpha: f32, x: &[f32]) {
        for (y, &x) in y.iter_mut().zip(x) {
            *y += alpha * x;
        }
    }
}

multiversion! {
    /// `y[i] *= s`.
    pub fn scale(y: &mut [f32], s: f32) {
        for y in y.iter_mut() {
            *y *= s;
        }
    }
}

multiversion! {
    /// `Σ x[i]` (16 partial sums, fixed order).
    pub fn sum(x: &[f32]) -> f32 {
        let mut acc = [0.0f32; LANES];
        let mut c = x.chunks_exact(LANES);
        for v in &mut c {
            for l in 0..LANES {
                acc[l] += v[l];
            }
        }
        acc.iter().sum::<f32>() + c.remainder().iter().sum::<f32>()
    }
}

/// How far (in elements) [`Fold::fold_behind`] folds behind a kernel's writes.
pub const FOLD_LAG: usize = 256;

/// A reduction over one row (of `K` equal-length slices, read in step) folded 16 lanes
/// at a time, in order, possibly a few chunks per call from inside another loop: a row
/// kernel folds the *next* row while it writes the current one, so the next row's loads
/// overlap this row's stores instead of running as a separate pass.
///
/// Lane `l` folds elements `l, 16 + l, 32 + l, …` of the whole chunks; the remainder is
/// folded separately and [`finish`](Fold::finish) combines the lanes and the remainder
/// in a fixed order, so the result does not depend on how the row was split into steps.
pub struct Fold<'a, const K: usize> {
    rows: [&'a [f32]; K],
    /// Elements in whole chunks: the shortest row's length rounded down to 16.
    full: usize,
    acc: [f32; LANES],
    init: f32,
    done: usize,
}

impl<'a, const K: usize> Fold<'a, K> {
    /// A fold over `rows` (of one length; an empty one folds nothing) whose lanes (and
    /// remainder) start at `init` (0 for sums, −∞ for a max).
    #[inline(always)]
    pub fn new(rows: [&'a [f32]; K], init: f32) -> Fold<'a, K> {
        let full = rows.iter().map(|r| r.len()).min().unwrap_or(0) / LANES * LANES;
        Fold { rows, full, acc: [init; LANES], init, done: 0 }
    }

    /// Folds `lane = f(lane, [row_0[i], …, row_K−1[i]])` over the whole chunks below
    /// `end` not folded yet.
    #[inline(always)]
    pub fn step(&mut self, end: usize, f: impl Fn(f32, [f32; K]) -> f32) {
        let end = end.min(self.full);
        while self.done + LANES <= end {
            let i = self.done;
            self.fold_at(i, &f);
            self.done += LANES;
        }
    }

    /// Folds the whole chunk at `i` into the lanes (`i + 16 ≤ full`). The lane values are
    /// gathered by plain loops: `array::from_fn` here was left as an out-of-line call.
    #[inline(always)]
    fn fold_at(&mut self, i: usize, f: &impl Fn(f32, [f32; K]) -> f32) {
        let mut chunk = [[0.0f32; LANES]; K];
        for (c, r) in chunk.iter_mut().zip(&self.rows) {
            c.copy_from_slice(&r[i..i + LANES]);
        }
        for (l, acc) in self.acc.iter_mut().enumerate() {
            let mut v = [0.0f32; K];
            for (vk, c) in v.iter_mut().zip(&chunk) {
                *vk = c[l];
            }
            *acc = f(*acc, v);
        }
    }

    /// For a kernel's own 16-lane loop that writes element `i` of the current row: folds
    /// the next row's chunk at `i − FOLD_LAG` when it is the next whole chunk to fold
    /// (else nothing; [`step`](Fold::step) catches up after the loop).
    ///
    /// Why the lag: rows of large tensors sit at one offset modulo 4 KiB (every big
    /// allocation starts at the same small offset into a page), so a load of the next
    /// row's element `i` right after the store of this row's element `i` is "4K-aliased":
    /// the core may take it for a dependence on the store and replay it. Folding `FOLD_LAG` elements (1 KiB)
    /// behind the stores keeps their addresses apart. It costs nothing and removes the
    /// hazard on cores that pay it.
    #[inline(always)]
    pub fn fold_behind(&mut self, i: usize, f: impl Fn(f32, [f32; K]) -> f32) {
        if let Some(j) = i.checked_sub(FOLD_LAG) {
            if j == self.done && j + LANES <= self.full {
                self.fold_at(j, &f);
                self.done += LANES;
            }
        }
    }

    /// Folds what is left of the rows and returns `combine` over the lanes in order, then
    /// with the folded remainder.
    #[inline(always)]
    pub fn finish(mut self, f: impl Fn(f32, [f32; K]) -> f32, combine: impl Fn(f32, f32) -> f32) -> f32 {
        self.step(self.full, &f);
        let len = self.rows.iter().map(|r| r.len()).min().unwrap_or(0);
        let mut tail = self.init;
        for i in self.full..len {
            tail = f(tail, self.rows.map(|r| r[i]));
        }
        let lanes = self.acc.iter().skip(1).fold(self.acc[0], |a, &b| combine(a, b));
        combine(lanes, tail)
    }
}

/// `Σ x²` folded by [`Fold`] (the same value whether folded alone or inside a row kernel).
#[inline(always)]
pub fn fold_sq(acc: f32, [x]: [f32; 1]) -> f32 {
    acc + x * x
}

/// `max` folded by [`Fold`] (`x > acc` as a comparison, NaN-free inputs assumed).
#[inline(always)]
pub fn fold_max(acc: f32, [x]: [f32; 1]) -> f32 {
    if x > acc {
        x
    } else {
        acc
    }
}

/// `Σ a·b` folded by [`Fold`].
#[inline(always)]
pub fn fold_dot(acc: f32, [a, b]: [f32; 2]) -> f32 {
    acc + a * b
}

multiversion! {
    /// `Σ x[i]²` (16 partial sums, combined in a fixed order: a [`Fold`], so the value a
    /// row kernel folds for its next row is this one).
    pub fn sum_squares(x: &[f32]) -> f32 {
        Fold::new([x], 0.0).finish(fold_sq, |a, b| a + b)
    }
}

multiversion! {
    /// `max x[i]` (−∞ for an empty slice; NaN-free inputs assumed), by a [`Fold`].
    pub fn max(x: &[f32]) -> f32 {
        Fold::new([x], f32::NEG_INFINITY).finish(fold_max, fold_max2)
    }
}

multiversion! {
    /// `Σ a[i]·b[i]` (16 partial sums, combined in a fixed order), by a [`Fold`].
    pub fn dot(a: &[f32], b: &[f32]) -> f32 {
        Fold::new([a, b], 0.0).finish(fold_dot, |x, y| x + y)
    }
}

/// `max(a, b)` as a combining function of [`Fold::finish`].
#[inline(always)]
pub fn fold_max2(a: f32, b: f32) -> f32 {
    fold_max(a, [b])
}

/// Hints the cache lines of `data[start..start + len]` into L2 ahead of their use (the
/// part past `data`'s end is ignored; a no-op off x86-64). Row kernels call it for the
/// next row while they write the current one, so its loads overlap their stores.
#[inline(always)]
pub fn prefetch(data: &[f32], start: usize, len: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        let end = start.saturating_add(len).min(data.len());
        let mut i = start;
        while i < end {
            // SAFETY: i < data.len(); prefetching never faults and SSE is part of x86-64.
            unsafe {
                std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T1 }>(data.as_ptr().add(i).cast())
            };
            i += 16;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (data, start, len);
}

/// Prefetches the line holding element `i` of `data` into L1 (`prefetcht0`; nothing past
/// the end, and nothing off x86-64).
#[inline(always)]
pub fn prefetch_l1(data: &[f32], i: usize) {
    #[cfg(target_arch = "x86_64")]
    if i < data.len() {
        // SAFETY: i < data.len(); prefetching never faults and SSE is part of x86-64.
        unsafe { std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(data.as_ptr().add(i).cast()) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (data, i);
}

/// How far (in elements: 8 KiB) ahead of its reads from memory a row kernel prefetches
/// the rows that follow ([`prefetch_far`]) when its output streams, i.e. when the working
/// set is beyond the last-level cache, where demand loads and the hardware prefetchers
/// alone leave the row kernels well short of copy bandwidth; 8 KiB beat 4 and 16 KiB.
pub const FAR_AHEAD: usize = 2048;

/// Prefetches element `i + FAR_AHEAD` of each of `rest` into L2 (one line; the part past
/// a slice's end is ignored). A row kernel passes its inputs from the *next* row on and
/// calls it once per 16 elements with `i` its index in the current row, so the rows to
/// come are requested a steady distance ahead of the loads that will need them.
#[inline(always)]
pub fn prefetch_far<const K: usize>(rest: [&[f32]; K], i: usize) {
    for r in rest {
        prefetch(r, i + FAR_AHEAD, 1);
    }
}

/// Elements ahead of a kernel's current chunk that it prefetches for writing when it
/// writes an output in place (`Dst::in_place`): 32 lines, enough to cover the latency
/// of a read-for-ownership from L3 at this loop's pace.
pub const OWN_AHEAD: usize = 512;

/// For a kernel that writes an output in place (`Dst::in_place`) while it reads `inputs`
/// at the same index, element by element: at element `i` (called once per 16), asks for
/// the inputs' lines [`OWN_AHEAD`] elements ahead and for ownership of the output's line
/// there (`out` is the output's first element). A loop with much arithmetic per element
/// (an exp, a divide) keeps too few iterations in flight for the out-of-order window to
/// reach that far by itself. Not used for plain streams such as `add`, which gain nothing.
#[inline(always)]
pub fn stream_ahead<const K: usize>(inputs: [&[f32]; K], out: *const f32, i: usize) {
    let j = i + OWN_AHEAD;
    for x in inputs {
        prefetch(x, j, 1);
    }
    prefetch_write(out.wrapping_add(j));
}

/// Hints the cache line at `p` into L1 for writing (`prefetchw`: read-for-ownership ahead
/// of the stores; a no-op off x86-64, and a NOP on x86 CPUs without PREFETCHW).
///
/// Emitted as the instruction itself (LLVM lowers the `_MM_HINT_ET0` intrinsic to a plain
/// `prefetcht0` unless the `prfchw` feature is enabled for the whole function); its
/// encoding decodes as a NOP on CPUs that predate it, so no feature check is needed.
#[inline(always)]
pub fn prefetch_write<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch never faults, whatever the address, and touches no register or flag.
    unsafe {
        std::arch::asm!("prefetchw [{p}]", p = in(reg) p, options(nostack, preserves_flags, readonly))
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// `a·b + c`: one fused multiply-add (one rounding) when `FMA` (the multiversioned
/// bodies' `FMA`: the instruction is in hardware), else a multiply and an add (a software
/// `fmaf` would be far slower).
#[inline(always)]
pub fn madd<const FMA: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FMA {
        a.mul_add(b, c)
    } else {
        a * b + c
    }
}

/// `e^r` for `|r| ≤ ln2/2`: `1 + r·q(r)` with the degree-4 `q` of least maximum relative
/// error (fitted by Lawson's iteration; the constant term is exactly 1, so `e^0 = 1`),
/// within 1.8e-7 relative in f32 Horner arithmetic.
#[inline(always)]
fn exp_reduced<const FMA: bool>(r: f32) -> f32 {
    const C: [f32; 6] = [1.0, 0.999_999_7, 0.499_991_5, 0.166_676_36, 0.041_897_93, 0.008_290_313];
    let mut p = C[5];
    for &c in C[..5].iter().rev() {
        p = madd::<FMA>(p, r, c);
    }
    p
}

/// Shared by [`exp_lane`] and [`fast_exp`]: for `x ∈ [−88, 88.73]` returns `(e^r, n)` with
/// `e^x = e^r·2^n`, `n = round(x·log2 e) ∈ [−127, 128]` as a float and `r = x − n·ln 2`.
/// `n` is found by adding 1.5·2²³, which rounds to an integer in the low mantissa bits
/// (no float→int conversion, so loops vectorize); `r` in two steps (Cody–Waite:
/// `n·LN2_HI` is exact), so it keeps full precision even at |x| ≈ 88.
#[inline(always)]
fn exp_parts<const FMA: bool>(x: f32) -> (f32, f32, f32) {
    const MAGIC: f32 = 12_582_912.0; // 1.5·2²³
    const LN2_HI: f32 = 0.693_145_75; // = 0.693145751953125 exactly (bits 0x3F31_7200)
    const LN2_LO: f32 = 1.428_606_8e-6; // ln 2 − LN2_HI
    let big = madd::<FMA>(x, std::f32::consts::LOG2_E, MAGIC);
    let n = big - MAGIC;
    let r = madd::<FMA>(n, -LN2_LO, madd::<FMA>(n, -LN2_HI, x));
    (exp_reduced::<FMA>(r), n, big)
}

/// `2^n` for an integer `n ∈ [−127, 127]` given `big = n + 1.5·2²³` (from [`exp_parts`]):
/// the low mantissa bits of `big` hold `n`, moved into the exponent field (`n = −127`
/// gives exactly 0).
#[inline(always)]
fn pow2_from_magic(big: f32) -> f32 {
    f32::from_bits(big.to_bits().wrapping_sub(0x4B40_0000 - 127) << 23)
}

/// `e^x` for `x ≤ 88.3` — the arguments of softmax, `x − max ≤ 0` — within 2.5e-7
/// relative, branch-free so loops over it vectorize. `x < −88` (and −∞) gives exactly 0
/// (results below 2^−126.5 flush to 0), NaN stays NaN; above 88.3 the result is wrong
/// (use [`fast_exp`]).
#[inline(always)]
pub fn exp_lane<const FMA: bool>(x: f32) -> f32 {
    // Written as a comparison so NaN passes through (x86 `maxps` keeps its second operand).
    let xc = if x < -88.0 { -88.0 } else { x };
    let (p, _, big) = exp_parts::<FMA>(xc);
    p * pow2_from_magic(big)
}

/// `e^x` on the whole f32 range, within 2.5e-7 relative, branch-free: `x < −88` (and −∞)
/// gives 0, `x > 88.72` gives +∞, NaN stays NaN.
#[inline(always)]
pub fn fast_exp<const FMA: bool>(x: f32) -> f32 {
    let xc = x.clamp(-88.0, 88.72);
    let (p, n, big) = exp_parts::<FMA>(xc);
    // 2^128 is not an f32: n = 128 builds 2^127 and doubles once more.
    let top = n > 127.0;
    let scale = pow2_from_magic(if top { big - 1.0 } else { big });
    let r = p * scale * if top { 2.0 } else { 1.0 };
    if x > 88.72 {
        f32::INFINITY
    } else {
        r
    }
}

multiversion! {
    /// `e[i] = e^(x[i] − m)` (equal lengths; every slot of `e` written), returning `Σ e[i]`:
    /// the softmax inner loop, reading the row where it lies and writing the exps to a
    /// scratch row or to the output row itself. Meanwhile the lines from `own` on (the
    /// output row this pass's results go to, or a point ahead in `e` itself; null for
    /// none) are prefetched for writing, one line per 16 elements, so that the stores
    /// find their lines owned, and `ahead` (the next row; may be empty) is prefetched:
    /// both memory streams overlap this compute-heavy pass. (`own` is only ever a
    /// prefetch address, never dereferenced.)
    #[allow(clippy::not_unsafe_ptr_arg_deref)]
    pub fn exp_sub_sum_into(x: &[f32], e: &mut [MaybeUninit<f32>], m: f32, own: *const f32, ahead: &[f32]) -> f32 {
        let n = x.len().min(e.len());
        let (x, e) = (&x[..n], &mut e[..n]);
        let mut acc = [0.0f32; LANES];
        let mut cx = x.chunks_exact(LANES);
        let mut ce = e.chunks_exact_mut(LANES);
        for (i, (v, o)) in (&mut cx).zip(&mut ce).enumerate() {
            prefetch(ahead, i * LANES, LANES);
            if !own.is_null() {
                prefetch_write(own.wrapping_add(i * LANES));
            }
            let mut w = [0.0f32; LANES];
            for l in 0..LANES {
                w[l] = exp_lane::<FMA>(v[l] - m);
                acc[l] += w[l];
            }
            o.write_copy_of_slice(&w);
        }
        let mut tail = 0.0;
        for (v, o) in cx.remainder().iter().zip(ce.into_remainder()) {
            tail += *o.write(exp_lane::<FMA>(*v - m));
        }
        acc.iter().sum::<f32>() + tail
    }
}

multiversion! {
    /// `x[i] ← e^(x[i] − m)`, returning `Σ x[i]` afterwards (the softmax inner loop).
    pub fn exp_sub_sum(x: &mut [f32], m: f32) -> f32 {
        let mut acc = [0.0f32; LANES];
        let mut c = x.chunks_exact_mut(LANES);
        for v in &mut c {
            for l in 0..LANES {
                v[l] = exp_lane::<FMA>(v[l] - m);
                acc[l] += v[l];
            }
        }
        let mut tail = 0.0;
        for v in c.into_remainder() {
            *v = exp_lane::<FMA>(*v - m);
            tail += *v;
        }
        acc.iter().sum::<f32>() + tail
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both exps, with and without fused multiply-adds, against f64 over their ranges.
    #[test]
    fn exps_are_accurate() {
        fn check(name: &str, f: impl Fn(f32) -> f32, lo: f32, hi: f32) {
            let mut worst = 0.0f64;
            let mut x = lo;
            while x < hi {
                let want = (x as f64).exp();
                worst = worst.max(((f(x) as f64 - want) / want).abs());
                x += 0.0137;
            }
            assert!(worst < 3e-7, "{name}: worst relative error {worst}");
        }
        check("exp_lane fma", exp_lane::<true>, -87.0, 88.3);
        check("exp_lane", exp_lane::<false>, -87.0, 88.3);
        check("fast_exp fma", fast_exp::<true>, -87.0, 88.7);
        check("fast_exp", fast_exp::<false>, -87.0, 88.7);
        type Exp = fn(f32) -> f32;
        let pairs: [(Exp, Exp); 2] = [(exp_lane::<true>, fast_exp::<true>), (exp_lane::<false>, fast_exp::<false>)];
        for (lane, full) in pairs {
            assert_eq!(lane(f32::NEG_INFINITY), 0.0);
            assert_eq!(lane(-100.0), 0.0);
            assert!(lane(f32::NAN).is_nan());
            assert_eq!(lane(0.0), 1.0);
            assert_eq!(full(f32::NEG_INFINITY), 0.0);
            assert_eq!(full(100.0), f32::INFINITY);
            assert_eq!(full(f32::INFINITY), f32::INFINITY);
            assert!(full(f32::NAN).is_nan());
            let (top, want) = (88.7f32, (88.7f32 as f64).exp());
            assert!(full(top).is_finite() && ((full(top) as f64 - want) / want).abs() < 1e-6);
        }
    }

    /// A fold gives the same bits however its row is split into steps (and with the lag
    /// of `fold_behind`), for every length around the 16-lane chunks.
    #[test]
    fn a_fold_does_not_depend_on_its_steps() {
        for n in [0usize, 1, 15, 16, 17, 100, 257, 1000] {
            let a: Vec<f32> = (0..n).map(|i| ((i * 37) % 101) as f32 * 0.013 - 0.6).collect();
            let b: Vec<f32> = (0..n).map(|i| ((i * 11) % 53) as f32 * 0.021 - 0.5).collect();
            let whole = dot(&a, &b);
            for step in [1usize, 5, 16, 64, 300] {
                let mut fold = Fold::new([&a[..], &b[..]], 0.0);
                let mut i = 0;
                while i < n {
                    fold.fold_behind(i, fold_dot);
                    fold.step(i.saturating_sub(3), fold_dot);
                    i += step;
                }
                let split = fold.finish(fold_dot, |x, y| x + y);
                assert_eq!(split.to_bits(), whole.to_bits(), "n {n} step {step}");
            }
            let m = max(&a);
            assert_eq!(m, a.iter().cloned().fold(f32::NEG_INFINITY, f32::max), "max n {n}");
            let sq: f32 = a.iter().map(|v| v * v).sum();
            assert!((sum_squares(&a) - sq).abs() <= 1e-4 * sq.max(1.0), "squares n {n}");
        }
    }

    #[test]
    fn transpose_into_matches_plain_loops() {
        for (rows, cols) in [(16, 16), (37, 50), (128, 64), (5, 3), (0, 4)] {
            let (ss, ds) = (cols + 3, rows + 5);
            let src: Vec<f32> = (0..rows * ss).map(|i| i as f32).collect();
            let mut dst = vec![-1.0f32; cols * ds];
            transpose_into(&src, ss, rows, cols, &mut dst, ds);
            for c in 0..cols {
                for r in 0..ds {
                    let want = if r < rows { src[r * ss + c] } else { -1.0 };
                    assert_eq!(dst[c * ds + r], want, "{rows}x{cols} at ({r}, {c})");
                }
            }
        }
    }

    #[test]
    fn primitives_match_plain_loops() {
        let a: Vec<f32> = (0..37).map(|i| (i as f32 * 0.37).sin()).collect();
        let b: Vec<f32> = (0..37).map(|i| (i as f32 * 0.11).cos()).collect();
        let d: f32 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
        assert!((dot(&a, &b) - d).abs() < 1e-5);
        assert!((sum(&a) - a.iter().sum::<f32>()).abs() < 1e-5);
        assert_eq!(max(&a), a.iter().cloned().fold(f32::NEG_INFINITY, f32::max));
        let mut y = b.clone();
        axpy(&mut y, 2.0, &a);
        for i in 0..37 {
            assert!((y[i] - (b[i] + 2.0 * a[i])).abs() < 1e-6);
        }
    }
}
