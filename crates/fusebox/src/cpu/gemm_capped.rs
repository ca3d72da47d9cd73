//! The gemm crate's f32 GEMM under an ISA cap. gemm picks its microkernels by its own
//! CPU detection (AVX-512 wherever the CPU has it: `gemm-common`'s `gemm_def!`), which a
//! backend capped at AVX2 (`FUSEBOX_ISA=avx2`) must not run. There the same driver
//! (`gemm_basic_generic`) runs with gemm's AVX2 + FMA microkernels, those it picks on a
//! CPU without AVX-512, after the one normalisation `gemm::gemm` applies first (a
//! column-oriented destination is computed as its transpose).

use gemm_common::gemm::gemm_basic_generic;
use gemm_common::simd::{MixedSimd, V3};
use gemm_f32::microkernel::fma::f32 as fma;

use crate::cpu::simd::Isa;

/// f32 lanes of gemm's AVX2 microkernels.
const N: usize = 8;

/// `gemm::gemm::<f32>` with these arguments (no conjugation) on gemm's AVX2 + FMA
/// microkernels, where the calling thread's ISA is AVX2 and the CPU has AVX-512 (gemm
/// would pick that); false, doing nothing, elsewhere.
///
/// # Safety
/// As `gemm::gemm`; every stride non-negative.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn gemm_f32(
    m: usize,
    n: usize,
    k: usize,
    dst: *mut f32,
    dst_cs: isize,
    dst_rs: isize,
    read_dst: bool,
    lhs: *const f32,
    lhs_cs: isize,
    lhs_rs: isize,
    rhs: *const f32,
    rhs_cs: isize,
    rhs_rs: isize,
    alpha: f32,
    beta: f32,
    parallelism: gemm::Parallelism,
) -> bool {
    if Isa::active() != Isa::Avx2 || !std::arch::is_x86_feature_detected!("avx512f") {
        return false;
    }
    let Some(simd) = <V3 as MixedSimd<f32, f32, f32, f32>>::try_new() else {
        return false;
    };
    debug_assert!([dst_cs, dst_rs, lhs_cs, lhs_rs, rhs_cs, rhs_rs].iter().all(|&s| s >= 0));
    let (m, n, dst_cs, dst_rs, lhs, lhs_cs, lhs_rs, rhs, rhs_cs, rhs_rs) = if dst_cs.abs() < dst_rs.abs() {
        (n, m, dst_rs, dst_cs, rhs, rhs_rs, rhs_cs, lhs, lhs_rs, lhs_cs)
    } else {
        (m, n, dst_cs, dst_rs, lhs, lhs_cs, lhs_rs, rhs, rhs_cs, rhs_rs)
    };
    // SAFETY: the caller's contract (gemm::gemm's), after gemm::gemm's own transposition;
    // `simd` proves AVX2 and FMA, which the microkernels need.
    unsafe {
        gemm_basic_generic::<
            _,
            f32,
            N,
            { fma::MR_DIV_N * N },
            { fma::NR },
            { fma::MR_DIV_N },
            { fma::H_M },
            { fma::H_N },
        >(
            simd,
            m,
            n,
            k,
            dst,
            dst_cs,
            dst_rs,
            read_dst,
            lhs,
            lhs_cs,
            lhs_rs,
            rhs,
            rhs_cs,
            rhs_rs,
            alpha,
            beta,
            false,
            false,
            false,
            |a, b, c| a * b + c,
            &fma::UKR,
            &fma::H_UKR,
            false,
            parallelism,
        );
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::simd::IsaGuard;

    /// Under an AVX2 cap on a CPU with AVX-512 the AVX2 microkernels take the product
    /// (row-major destination, so transposed for gemm's driver; odd sizes for the
    /// microkernels' edges) and it is `a·b` to f32 rounding; uncapped they leave it to gemm.
    #[test]
    fn under_an_avx2_cap_gemms_avx2_microkernels_compute_the_product() {
        if !std::arch::is_x86_feature_detected!("avx512f") || !Isa::Avx2.is_available() {
            return; // gemm would pick no AVX-512 microkernel here
        }
        let (m, n, k) = (37, 29, 53);
        let a: Vec<f32> = (0..m * k).map(|i| (i * 37 % 101) as f32 / 50.0 - 1.0).collect();
        let b: Vec<f32> = (0..k * n).map(|i| (i * 53 % 89) as f32 / 44.0 - 1.0).collect();
        for accumulate in [false, true] {
            let mut c = vec![0.5f32; m * n];
            let run = |c: &mut Vec<f32>| {
                // SAFETY: a is m×k, b k×n, c m×n, all row-major and in bounds.
                unsafe {
                    gemm_f32(
                        m,
                        n,
                        k,
                        c.as_mut_ptr(),
                        1,
                        n as isize,
                        accumulate,
                        a.as_ptr(),
                        1,
                        k as isize,
                        b.as_ptr(),
                        1,
                        n as isize,
                        1.0,
                        1.0,
                        gemm::Parallelism::None,
                    )
                }
            };
            assert!(!run(&mut c), "no cap: gemm's own choice");
            let ran = {
                let _isa = IsaGuard::enter(Isa::Avx2);
                run(&mut c)
            };
            assert!(ran, "capped at AVX2: the AVX2 microkernels");
            for i in 0..m {
                for j in 0..n {
                    let want: f64 = (0..k).map(|p| f64::from(a[i * k + p]) * f64::from(b[p * n + j])).sum::<f64>()
                        + if accumulate { 0.5 } else { 0.0 };
                    let got = f64::from(c[i * n + j]);
                    assert!((got - want).abs() <= 1e-5 * (1.0 + want.abs()), "({i}, {j}): {got} vs {want}");
                }
            }
        }
    }
}
