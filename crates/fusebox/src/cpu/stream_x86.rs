//! The store pass of softmax rows that stream to memory, with the streaming stores issued
//! straight from registers (x86-64, AVX-512 or AVX2): `out = s·e`, less the one-hot at
//! the target, while the next row's max is folded at the same indices.
//!
//! The portable path writes a streamed row through [`Dst::write`](super::output::Dst):
//! 64-element staging tiles copied out by streaming stores, a call per tile, with the
//! next row folded 1 KiB behind the stores (`simd::Fold::fold_behind`). Here a row costs
//! one loop: load the exps, scale, stream the vector out, load and fold the next row's
//! vector, which moves more bytes per second than the portable path when the rows stream
//! from DRAM (docs/performance.md, "Softmax and cross-entropy"). Which of the differences
//! counts (the staging tile, the call per tile, the fold's lag) is not known: modelled in
//! C (`bench/models/softmax_rows.c`), none alone moved the loop beyond the noise.
//!
//! Every value is the portable path's, bit for bit: the same products `e·s`, the one-hot
//! subtracted after the product, and a max, which does not depend on the order it is
//! folded in (inputs without NaN, as `simd::fold_max` assumes).

use std::arch::x86_64::*;
use std::mem::MaybeUninit;

use crate::cpu::output::Dst;
use crate::cpu::simd::{fold_max, Isa};

/// Whether a kernel here runs with the ISA in use.
pub fn has_kernel() -> bool {
    matches!(Isa::active(), Isa::Avx512 | Isa::Avx2)
}

/// A row's own slots, for the kernels here, when it streams as F32 and they run with the
/// ISA in use; otherwise the row back, unchanged.
///
/// # Safety
/// The caller must write every slot it receives (see `Dst::into_streamed_f32`).
pub unsafe fn streamed_row(dst: Dst<'_>) -> std::result::Result<&mut [MaybeUninit<f32>], Dst<'_>> {
    if !has_kernel() {
        return Err(dst);
    }
    // SAFETY: forwarded to the caller.
    unsafe { dst.into_streamed_f32() }
}

/// `out = s·e`, less `minus.1` at index `minus.0` (an index past the row subtracts
/// nothing), written with streaming stores from the first 64-byte line of `out` on (plain
/// stores before it and for the last partial vector), while folding the max of `next`
/// (the next row, or empty). Returns that max (`−∞` for an empty `next`).
///
/// # Panics
/// When no kernel here fits the ISA in use (see [`has_kernel`]), or when `e`, `out` and
/// a non-empty `next` differ in length (kernel bugs).
pub fn scale_stream_fold_max(
    e: &[f32],
    out: &mut [MaybeUninit<f32>],
    s: f32,
    minus: (usize, f32),
    next: &[f32],
) -> f32 {
    assert_eq!(e.len(), out.len(), "scale_stream_fold_max: the exps and the output differ in length");
    assert!(next.is_empty() || next.len() == out.len(), "scale_stream_fold_max: the next row's length");
    match Isa::active() {
        // SAFETY: AVX-512F is present (the active ISA is always available, see `simd`); the lengths match.
        Isa::Avx512 => unsafe { scale_stream_fold_max_avx512(e, out, s, minus, next) },
        // SAFETY: AVX and FMA are present (the active ISA is always available, see `simd`); the lengths match.
        Isa::Avx2 => unsafe { scale_stream_fold_max_avx2(e, out, s, minus, next) },
        Isa::Scalar => panic!("scale_stream_fold_max: no kernel for the scalar ISA"),
    }
}

/// One kernel of [`scale_stream_fold_max`] per vector width: `$lanes` f32 lanes of
/// `$vec`, compiled with `$feature`.
macro_rules! scale_stream_kernel {
    ($name:ident, $feature:literal, $lanes:literal, $vec:ty,
     $set1:ident, $loadu:ident, $storeu:ident, $mul:ident, $max:ident, $stream:ident) => {
        /// See [`scale_stream_fold_max`].
        ///
        /// # Safety
        /// The CPU must support the kernel's features; `e` and `out` must be of equal
        /// length and `next` empty or of that length.
        #[target_feature(enable = $feature)]
        unsafe fn $name(e: &[f32], out: &mut [MaybeUninit<f32>], s: f32, minus: (usize, f32), next: &[f32]) -> f32 {
            let n = out.len();
            let (at, sub) = minus;
            // Streaming stores need aligned vectors: [head, body) starts on a line.
            let head = out.as_ptr().align_offset(64).min(n);
            let body = head + (n - head) / $lanes * $lanes;
            let scaled = |j: usize| if j == at { e[j] * s - sub } else { e[j] * s };
            for j in (0..head).chain(body..n) {
                out[j].write(scaled(j));
            }
            let fold = !next.is_empty();
            let mut lanes = [f32::NEG_INFINITY; $lanes];
            // SAFETY: i + $lanes <= body <= n for every vector, and `e`, `out` and (when
            // read) `next` hold n elements; `out + i` is aligned as the stream needs
            // (head is on a line, and $lanes·4 bytes divides 64).
            unsafe {
                let factor: $vec = $set1(s);
                let mut mx: $vec = $set1(f32::NEG_INFINITY);
                let (ep, op, np) = (e.as_ptr(), out.as_mut_ptr().cast::<f32>(), next.as_ptr());
                let mut i = head;
                while i < body {
                    let mut v = $mul($loadu(ep.add(i)), factor);
                    if at.wrapping_sub(i) < $lanes {
                        // The one-hot, once per row: subtracted after the product.
                        let mut t = [0.0f32; $lanes];
                        $storeu(t.as_mut_ptr(), v);
                        t[at - i] -= sub;
                        v = $loadu(t.as_ptr());
                    }
                    $stream(op.add(i), v);
                    if fold {
                        // `max(x, acc)` keeps `acc` unless x > acc, as `fold_max`.
                        mx = $max($loadu(np.add(i)), mx);
                    }
                    i += $lanes;
                }
                $storeu(lanes.as_mut_ptr(), mx);
            }
            if !fold {
                return f32::NEG_INFINITY;
            }
            let m = lanes.iter().fold(f32::NEG_INFINITY, |acc, &x| fold_max(acc, [x]));
            (0..head).chain(body..n).fold(m, |acc, j| fold_max(acc, [next[j]]))
        }
    };
}

scale_stream_kernel!(
    scale_stream_fold_max_avx512,
    "avx512f",
    16,
    __m512,
    _mm512_set1_ps,
    _mm512_loadu_ps,
    _mm512_storeu_ps,
    _mm512_mul_ps,
    _mm512_max_ps,
    _mm512_stream_ps
);

scale_stream_kernel!(
    scale_stream_fold_max_avx2,
    "avx",
    8,
    __m256,
    _mm256_set1_ps,
    _mm256_loadu_ps,
    _mm256_storeu_ps,
    _mm256_mul_ps,
    _mm256_max_ps,
    _mm256_stream_ps
);

#[cfg(test)]
mod tests {
    use super::*;

    /// Against the scalar definition, for every alignment of the output, lengths with and
    /// without a partial vector, and the one-hot in the head, the body and the tail.
    #[test]
    fn matches_the_scalar_definition() {
        if !has_kernel() {
            return;
        }
        for n in [0usize, 1, 15, 16, 17, 100, 1000, 4099] {
            let e: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin().abs() + 0.01).collect();
            let next: Vec<f32> = (0..n).map(|i| (i as f32 * 1.3).cos() * 5.0).collect();
            let want_max = next.iter().fold(f32::NEG_INFINITY, |a, &x| a.max(x));
            for skew in 0..16 {
                for at in [0, 3, n / 2, n.saturating_sub(1), n + 5] {
                    let mut buf = vec![MaybeUninit::new(f32::NAN); n + 32];
                    let start = buf.as_ptr().align_offset(64) + skew;
                    let out = &mut buf[start..start + n];
                    let m = scale_stream_fold_max(&e, out, 0.5, (at, 0.25), &next);
                    for (j, v) in out.iter().enumerate() {
                        // SAFETY: every slot was written (checked against NaN below).
                        let v = unsafe { v.assume_init() };
                        let want = if j == at { e[j] * 0.5 - 0.25 } else { e[j] * 0.5 };
                        assert_eq!(v.to_bits(), want.to_bits(), "n {n} skew {skew} at {at} j {j}");
                    }
                    assert_eq!(m, want_max, "n {n} skew {skew}");
                    assert_eq!(scale_stream_fold_max(&e, out, 0.5, (at, 0.25), &[]), f32::NEG_INFINITY);
                }
            }
        }
    }
}
