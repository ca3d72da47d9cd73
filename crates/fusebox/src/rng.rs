//! The workspace's one seeded random generator: SplitMix64 (Steele, Lea and Flood,
//! "Fast splittable pseudorandom number generators", 2014), whose whole state is one
//! `u64`, so a stream can be saved (a trainer's data position in a checkpoint) and
//! resumed exactly.
//!
//! Each step adds the golden-ratio increment `0x9E3779B97F4A7C15` to the state and
//! returns a bijective mix of it, so every state has exactly one successor and the
//! sequence has period 2⁶⁴. It is for reproducible data, initialisation and tests,
//! not for anything that needs unpredictability.
//!
//! ```
//! use fusebox::rng::Rng;
//! let mut a = Rng::new(7);
//! let saved = a.state;
//! let x = a.next_u64();
//! assert_eq!(Rng::from_state(saved).next_u64(), x);
//! ```

/// The golden-ratio increment of SplitMix64.
const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

/// A SplitMix64 generator; `state` is everything it remembers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rng {
    /// The current state; [`Rng::from_state`] resumes from it.
    pub state: u64,
}

impl Rng {
    /// A generator from a seed (the seed is mixed with a constant, so small seeds do
    /// not start from nearby states).
    pub fn new(seed: u64) -> Rng {
        Rng { state: seed ^ 0x5851_F42D_4C95_7F2D }
    }

    /// The generator whose state is `state` (as saved from [`Rng::state`]).
    pub const fn from_state(state: u64) -> Rng {
        Rng { state }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(GOLDEN);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)` with 24 random bits (every value exact in f32).
    pub fn uniform(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }

    /// Uniform in `[0, 1)` with 53 random bits (every value exact in f64).
    pub fn uniform_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform integer in `lo..=hi` (`lo <= hi`), by the remainder (bias below
    /// `(hi − lo + 1) / 2⁶⁴`).
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        match (hi - lo).checked_add(1) {
            Some(n) => lo + self.next_u64() % n,
            None => self.next_u64(),
        }
    }

    /// Uniform integer in `0..n` by the remainder; 0 when `n` is 0.
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }

    /// Standard normal by Box–Muller: `√(−2 ln u₁) · cos(2π u₂)`, u₁ in `(0, 1)`.
    pub fn normal(&mut self) -> f32 {
        let u1 = ((self.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
        let u2 = (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        ((-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()) as f32
    }

    /// `n` values uniform in `[lo, hi)` (24-bit draws, as [`Rng::uniform`]).
    pub fn uniform_vec(&mut self, n: usize, lo: f32, hi: f32) -> Vec<f32> {
        (0..n).map(|_| lo + (hi - lo) * self.uniform()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_splitmix64_reference_stream() {
        // The first outputs of SplitMix64 from state 0 (the reference implementation's
        // `next()` with `x = 0`).
        let mut r = Rng::from_state(0);
        assert_eq!(r.next_u64(), 0xE220_A839_7B1D_CDAF);
        assert_eq!(r.next_u64(), 0x6E78_9E6A_A1B9_65F4);
        assert_eq!(r.next_u64(), 0x06C4_5D18_8009_454F);
        // `new` mixes the seed; resuming from a saved state continues the stream.
        let mut a = Rng::new(42);
        assert_eq!(a.state, 42 ^ 0x5851_F42D_4C95_7F2D);
        a.next_u64();
        let mut b = Rng::from_state(a.state);
        assert_eq!(a.next_u64(), b.next_u64());
    }

    #[test]
    fn ranges_stay_in_bounds() {
        let mut r = Rng::new(1);
        for _ in 0..1000 {
            assert!((0.0..1.0).contains(&r.uniform()));
            assert!((0.0..1.0).contains(&r.uniform_f64()));
            assert!((3..=5).contains(&r.range(3, 5)));
            assert!(r.below(7) < 7);
            assert!(r.normal().is_finite());
        }
        assert_eq!(r.below(0), 0);
        let _ = r.range(0, u64::MAX);
        assert!(r.uniform_vec(100, -2.0, 2.0).iter().all(|v| (-2.0..2.0).contains(v)));
    }
}
