//! A small seeded generator for test data (SplitMix64), so every case is reproducible.

use fusebox::{DType, Shape, Tensor};

/// Deterministic random numbers.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator from a seed.
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x9E37_79B9_7F4A_7C15)
    }
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in `[0, 1)`.
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// Uniform in `[lo, hi)`.
    pub fn range(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.uniform()
    }
    /// Uniform integer in `0..n`.
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }
    /// `n` uniform f32 values in `[lo, hi)`.
    pub fn vec(&mut self, n: usize, lo: f64, hi: f64) -> Vec<f32> {
        (0..n).map(|_| self.range(lo, hi) as f32).collect()
    }
    /// An f32 host tensor, uniform in `[lo, hi)`.
    pub fn tensor(&mut self, shape: impl Into<Shape>, lo: f64, hi: f64) -> Tensor {
        let shape = shape.into();
        Tensor::from_vec(self.vec(shape.elem_count(), lo, hi), shape).expect("length matches")
    }
    /// An f32 host tensor, uniform in `[-1, 1)`.
    pub fn normal_ish(&mut self, shape: impl Into<Shape>) -> Tensor {
        self.tensor(shape, -1.0, 1.0)
    }
    /// A U32 host tensor of ids in `0..max`.
    pub fn ids(&mut self, shape: impl Into<Shape>, max: usize) -> Tensor {
        let shape = shape.into();
        let v: Vec<u32> = (0..shape.elem_count()).map(|_| self.below(max) as u32).collect();
        Tensor::from_vec(v, shape).expect("length matches")
    }
    /// A tensor like `t` (same shape) with fresh values of `dtype`
    /// (floats uniform in [-1, 1), U32 in 0..4).
    pub fn like(&mut self, shape: &Shape, dtype: DType) -> Tensor {
        match dtype {
            DType::U32 => self.ids(shape.clone(), 4),
            d => Tensor::from_f32_as(&self.vec(shape.elem_count(), -1.0, 1.0), shape.clone(), d).expect("float dtype"),
        }
    }
}
