//! Runtime ISA dispatch and the vector primitives kernels share.
//!
//! Each primitive is written once as plain lane-wise Rust and compiled three times:
//! for AVX-512 (x86-64-v4), for AVX2+FMA (x86-64-v3) and portable (scalar, and NEON
//! through the compiler's baseline on aarch64). [`Isa::selected`] picks the best the
//! CPU has; `FUSEBOX_ISA=avx512|avx2|scalar` forces one of our paths (the gemm crate
//! keeps its own dispatch), so the conformance suite can run on each.

use std::sync::OnceLock;

/// The instruction set level our own kernels run with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Isa {
    Avx512,
    Avx2,
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
macro_rules! multiversion {
    ($(#[$meta:meta])* pub fn $name:ident($($arg:ident: $ty:ty),*) $(-> $ret:ty)? $body:block) => {
        $(#[$meta])*
        #[inline]
        pub fn $name($($arg: $ty),*) $(-> $ret)? {
            #[inline(always)]
            fn body($($arg: $ty),*) $(-> $ret)? $body
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
                unsafe fn v4($($arg: $ty),*) $(-> $ret)? { body($($arg),*) }
                #[target_feature(enable = "avx2,fma")]
                unsafe fn v3($($arg: $ty),*) $(-> $ret)? { body($($arg),*) }
                match Isa::selected() {
                    // SAFETY: the selected ISA was detected on this CPU.
                    Isa::Avx512 => return unsafe { v4($($arg),*) },
                    // SAFETY: as above.
                    Isa::Avx2 => return unsafe { v3($($arg),*) },
                    Isa::Scalar => {}
                }
            }
            body($($arg),*)
        }
    };
}
#[allow(unused_imports)]
pub(crate) use multiversion;

/// Lanes of the accumulators: 16 f32 = one AVX-512 register, two AVX2 ones.
const LANES: usize = 16;

multiversion! {
    /// `Σ a[i]·b[i]` (16 partial sums, combined in a fixed order).
    pub fn dot(a: &[f32], b: &[f32]) -> f32 {
        let n = a.len().min(b.len());
        let (a, b) = (&a[..n], &b[..n]);
        let mut acc = [0.0f32; LANES];
        let mut ca = a.chunks_exact(LANES);
        let mut cb = b.chunks_exact(LANES);
        for (x, y) in (&mut ca).zip(&mut cb) {
            for l in 0..LANES {
                acc[l] += x[l] * y[l];
            }
        }
        let mut tail = 0.0;
        for (x, y) in ca.remainder().iter().zip(cb.remainder()) {
            tail += x * y;
        }
        acc.iter().sum::<f32>() + tail
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

multiversion! {
    /// `Σ x[i]²`.
    pub fn sum_squares(x: &[f32]) -> f32 {
        let mut acc = [0.0f32; LANES];
        let mut c = x.chunks_exact(LANES);
        for v in &mut c {
            for l in 0..LANES {
                acc[l] += v[l] * v[l];
            }
        }
        acc.iter().sum::<f32>() + c.remainder().iter().map(|v| v * v).sum::<f32>()
    }
}

multiversion! {
    /// `max x[i]` (−∞ for an empty slice; NaN-free inputs assumed).
    pub fn max(x: &[f32]) -> f32 {
        let mut acc = [f32::NEG_INFINITY; LANES];
        let mut c = x.chunks_exact(LANES);
        for v in &mut c {
            for l in 0..LANES {
                acc[l] = if v[l] > acc[l] { v[l] } else { acc[l] };
            }
        }
        let mut m = f32::NEG_INFINITY;
        for &v in acc.iter().chain(c.remainder()) {
            if v > m {
                m = v;
            }
        }
        m
    }
}

/// `e^x` to about 2 ulp on f32, branch-free so loops over it vectorize; `x < −87.3`
/// (including −∞) gives exactly 0 and `x > 88.7` gives +∞.
#[inline(always)]
pub fn fast_exp(x: f32) -> f32 {
    // e^x = 2^n · e^r with n = round(x·log2 e) and r = x − n·ln 2, |r| ≤ ln2/2, computed
    // in two parts (Cody–Waite: ln 2 = LN2_HI + LN2_LO, LN2_HI exact in few bits) so r
    // keeps full precision even for |x| ≈ 88; e^r by its degree-6 Taylor polynomial
    // (truncation < 1.3e-7 relative); 2^n by building the exponent bits. Every step is
    // plain float arithmetic so loops over it vectorize (no saturating casts).
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // Adding 1.5·2^23 rounds to the nearest integer (ties to even) in the low mantissa bits.
    const ROUND: f32 = 12_582_912.0;
    let xc = x.clamp(-87.3, 88.7);
    let n = (xc * LOG2E + ROUND) - ROUND;
    let r = xc - n * LN2_HI - n * LN2_LO;
    let p = 1.0 + r * (1.0 + r * (0.5 + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0))))));
    // n ∈ [−126, 128]. (n' + 127) + 2^23 holds n' + 127 in its mantissa bits; shifting
    // them into the exponent field gives 2^n'. 2^128 is not an f32, so n = 128 uses
    // 2^127 and doubles once more.
    let clamped = n.min(127.0);
    let scale = f32::from_bits((clamped + (127.0 + 8_388_608.0)).to_bits() << 23);
    let r = p * scale * if n > 127.0 { 2.0 } else { 1.0 };
    if x < -87.3 {
        0.0
    } else if x > 88.7 {
        f32::INFINITY
    } else {
        r
    }
}

multiversion! {
    /// `x[i] ← e^(x[i] − m)`, returning `Σ x[i]` afterwards (the softmax inner loop).
    pub fn exp_sub_sum(x: &mut [f32], m: f32) -> f32 {
        let mut acc = [0.0f32; LANES];
        let mut c = x.chunks_exact_mut(LANES);
        for v in &mut c {
            for l in 0..LANES {
                v[l] = fast_exp(v[l] - m);
                acc[l] += v[l];
            }
        }
        let mut tail = 0.0;
        for v in c.into_remainder() {
            *v = fast_exp(*v - m);
            tail += *v;
        }
        acc.iter().sum::<f32>() + tail
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fast_exp_is_accurate() {
        let mut worst = 0.0f64;
        let mut x = -87.0f32;
        while x < 88.0 {
            let rel = ((fast_exp(x) as f64 - (x as f64).exp()) / (x as f64).exp()).abs();
            worst = worst.max(rel);
            x += 0.0137;
        }
        assert!(worst < 5e-7, "worst relative error {worst}");
        assert_eq!(fast_exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(fast_exp(-100.0), 0.0);
        assert_eq!(fast_exp(100.0), f32::INFINITY);
        let near_max = fast_exp(88.5);
        assert!(near_max.is_finite() && ((near_max as f64 - 88.5f64.exp()) / 88.5f64.exp()).abs() < 1e-6);
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
