//! `Array`: the f64 tensor the reference twins compute with. Plain row-major data
//! and a shape; nothing clever.

use fusebox::{DType, Shape, Tensor};

/// A row-major f64 array.
#[derive(Debug, Clone, PartialEq)]
pub struct Array {
    /// Dimensions, outermost first.
    pub shape: Vec<usize>,
    /// The values, row-major (`shape`'s product of them).
    pub data: Vec<f64>,
}

impl Array {
    /// An array from its shape and data (lengths must agree).
    pub fn new(shape: impl Into<Vec<usize>>, data: Vec<f64>) -> Array {
        let shape = shape.into();
        assert_eq!(shape.iter().product::<usize>(), data.len(), "Array::new: shape {shape:?} vs {} values", data.len());
        Array { shape, data }
    }
    /// Zeros of a shape.
    pub fn zeros(shape: impl Into<Vec<usize>>) -> Array {
        let shape = shape.into();
        let n = shape.iter().product();
        Array { shape, data: vec![0.0; n] }
    }
    /// A rank-0 array.
    pub fn scalar(v: f64) -> Array {
        Array { shape: vec![], data: vec![v] }
    }
    /// The values of a host tensor of any float, U32 dtype as f64.
    pub fn from_tensor(t: &Tensor) -> Array {
        let data: Vec<f64> = match t.dtype() {
            DType::U32 => t.as_slice::<u32>().expect("host u32 tensor").iter().map(|&v| v as f64).collect(),
            DType::F32 | DType::F16 | DType::BF16 => {
                t.to_vec_f32().expect("host float tensor").into_iter().map(f64::from).collect()
            }
            other => panic!("Array::from_tensor: {other} tensors have no element values; dequantize first"),
        };
        Array { shape: t.dims().to_vec(), data }
    }
    /// An f32 host tensor of these values.
    pub fn to_tensor(&self) -> Tensor {
        let v: Vec<f32> = self.data.iter().map(|&x| x as f32).collect();
        Tensor::from_vec(v, Shape::new(self.shape.clone())).expect("shape matches data")
    }
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.data.len()
    }
    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }
    /// Size of the last dimension.
    pub fn last_dim(&self) -> usize {
        self.shape.last().copied().unwrap_or(1)
    }
    /// Number of rows when viewed as `[rows, last_dim]`.
    pub fn rows(&self) -> usize {
        self.len() / self.last_dim().max(1)
    }
    /// Row-major strides.
    pub fn strides(&self) -> Vec<usize> {
        Shape::new(self.shape.clone()).strides()
    }
    /// Flat index of a multi-index.
    pub fn index(&self, idx: &[usize]) -> usize {
        idx.iter().zip(self.strides()).map(|(i, s)| i * s).sum()
    }
    /// Value at a multi-index.
    pub fn at(&self, idx: &[usize]) -> f64 {
        self.data[self.index(idx)]
    }
    /// Mutable value at a multi-index.
    pub fn at_mut(&mut self, idx: &[usize]) -> &mut f64 {
        let i = self.index(idx);
        &mut self.data[i]
    }
    /// Row `r` of the `[rows, last_dim]` view.
    pub fn row(&self, r: usize) -> &[f64] {
        let d = self.last_dim();
        &self.data[r * d..(r + 1) * d]
    }
    /// The same data under another shape of equal size.
    pub fn reshaped(&self, shape: impl Into<Vec<usize>>) -> Array {
        Array::new(shape, self.data.clone())
    }
    /// Applies `f` to every element.
    pub fn map(&self, f: impl Fn(f64) -> f64) -> Array {
        Array { shape: self.shape.clone(), data: self.data.iter().map(|&v| f(v)).collect() }
    }
    /// Combines two equally shaped arrays elementwise.
    pub fn zip(&self, other: &Array, f: impl Fn(f64, f64) -> f64) -> Array {
        assert_eq!(self.shape, other.shape);
        Array { shape: self.shape.clone(), data: self.data.iter().zip(&other.data).map(|(&a, &b)| f(a, b)).collect() }
    }
    /// `Σ self·other` (the scalar the finite-difference checks differentiate).
    pub fn dot(&self, other: &Array) -> f64 {
        self.data.iter().zip(&other.data).map(|(a, b)| a * b).sum()
    }
}

/// Iterates over every multi-index of `shape` in row-major order.
pub fn indices(shape: &[usize]) -> impl Iterator<Item = Vec<usize>> + '_ {
    let n: usize = shape.iter().product();
    (0..n).map(move |mut flat| {
        let mut idx = vec![0; shape.len()];
        for d in (0..shape.len()).rev() {
            idx[d] = flat % shape[d];
            flat /= shape[d];
        }
        idx
    })
}
