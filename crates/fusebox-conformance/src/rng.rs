//! Seeded test data from the workspace's one generator ([`fusebox::rng::Rng`],
//! SplitMix64), so every case is reproducible.

use fusebox::{DType, Shape, Tensor};

/// Deterministic random numbers and tensors for test cases.
#[derive(Debug, Clone)]
pub struct Rng(fusebox::rng::Rng);

impl Rng {
    /// A generator from a seed. (The state is `seed ^ 0x9E37_79B9_7F4A_7C15`, which
    /// keeps every case's data what it has always been.)
    pub fn new(seed: u64) -> Rng {
        Rng(fusebox::rng::Rng::from_state(seed ^ 0x9E37_79B9_7F4A_7C15))
    }
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }
    /// Uniform in `[0, 1)`.
    pub fn uniform(&mut self) -> f64 {
        self.0.uniform_f64()
    }
    /// Uniform in `[lo, hi)`.
    pub fn range(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.uniform()
    }
    /// Uniform integer in `0..n`.
    pub fn below(&mut self, n: usize) -> usize {
        self.0.below(n)
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
