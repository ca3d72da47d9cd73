//! Linear layers, forward and backward side by side: `y = x·Wᵀ (+ b)` from dense or
//! block-quantized W; a projection group whose parts (q/k/v, gate/up) come from one
//! stacked matrix or one matrix each; and LoRA's `+ s·(x·Aᵀ)·Bᵀ` on the adapted parts.

use fusebox::{ComputeBackend, DType, Error, Result, Tensor};

use super::layout::Proj;
use super::lora::Group;
use super::{Sink, Transformer};

/// Rows up to which a stacked projection runs as one product (a server's decode batch).
const BATCH_ROWS: usize = 16;

/// The arithmetic of the products of dense (f32) linear layers and their backward.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Precision {
    /// f32 operands (`linear_forward`, `linear_backward_accumulate`).
    #[default]
    F32,
    /// Mixed precision: operands rounded to BF16, products accumulated in f32
    /// (`linear_forward_bf16`, `linear_backward_accumulate_bf16`), as PyTorch's
    /// `autocast(bfloat16)` does for linear layers. Weights, gradients, norms, softmax,
    /// attention and the loss stay f32.
    Bf16,
}

impl Precision {
    /// The name `--precision` takes (`f32`, `bf16`).
    pub fn name(self) -> &'static str {
        match self {
            Precision::F32 => "f32",
            Precision::Bf16 => "bf16",
        }
    }

    /// `y = x·Wᵀ (+ bias)` of a dense W in this precision.
    fn forward(self, b: &dyn ComputeBackend, x: &Tensor, w: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
        match self {
            Precision::F32 => b.linear_forward(x, w, bias),
            Precision::Bf16 => b.linear_forward_bf16(x, w, bias),
        }
    }

    /// `dW += dyᵀ·x`, `dbias += Σ dy`, returns `dx = dy·W`, in this precision.
    fn backward(
        self,
        b: &dyn ComputeBackend,
        x: &Tensor,
        w: &Tensor,
        dy: &Tensor,
        dw: &mut Tensor,
        db: Option<&mut Tensor>,
    ) -> Result<Tensor> {
        match self {
            Precision::F32 => b.linear_backward_accumulate(x, w, dy, dw, db),
            Precision::Bf16 => b.linear_backward_accumulate_bf16(x, w, dy, dw, db),
        }
    }
}

impl std::str::FromStr for Precision {
    type Err = Error;
    fn from_str(s: &str) -> Result<Precision> {
        match s {
            "f32" | "fp32" => Ok(Precision::F32),
            "bf16" => Ok(Precision::Bf16),
            _ => Err(Error::value("precision", "precision", "f32 or bf16", s)),
        }
    }
}

/// `x·Wᵀ (+ bias)`, from dense W (in `precision`) or block-quantized W.
///
/// # Shapes
/// `x` `[.., in]`, `wt` `[out, in]`, `bias` `[out]` → `[.., out]`.
pub(super) fn linear_with(
    b: &dyn ComputeBackend,
    x: &Tensor,
    wt: &Tensor,
    bias: Option<&Tensor>,
    precision: Precision,
) -> Result<Tensor> {
    if is_block_format(wt) {
        let y = b.quantized_matmul(x, wt)?;
        match bias {
            Some(bias) => b.add_row(&y, bias),
            None => Ok(y),
        }
    } else {
        precision.forward(b, x, wt, bias)
    }
}

/// Whether `w` is multiplied from its blocks (`quantized_matmul`) rather than dense.
fn is_block_format(w: &Tensor) -> bool {
    w.dtype().is_quantized() || w.dtype() == DType::F8E4M3
}

impl Transformer {
    /// `x·Wᵀ (+ bias)` for parameter indices `w` and `bias`.
    pub(super) fn linear(&self, b: &dyn ComputeBackend, x: &Tensor, w: usize, bias: Option<usize>) -> Result<Tensor> {
        linear_with(b, x, self.p(w), bias.map(|i| self.p(i)), self.precision)
    }

    /// Each part of projection group `p` of `site` (layer, group), with its LoRA
    /// adapters when attached.
    pub(super) fn proj(
        &self,
        b: &dyn ComputeBackend,
        x: &Tensor,
        p: &Proj,
        site: (usize, Group),
    ) -> Result<Vec<Tensor>> {
        let mut parts = self.base_proj(b, x, p)?;
        if let Some(ad) = &self.lora {
            // y += s·(x·Aᵀ)·Bᵀ per adapted part.
            for (i, part) in parts.iter_mut().enumerate() {
                if let Some(slot) = ad.slot(site.0, site.1, i) {
                    let xa = self.precision.forward(b, x, &ad.params.tensors[slot.a], None)?;
                    let d = self.precision.forward(b, &xa, &ad.params.tensors[slot.b], None)?;
                    *part = b.add(part, &b.mul_scalar(&d, ad.config.scale())?)?;
                }
            }
        }
        Ok(parts)
    }

    /// The base weights' parts: one matmul per matrix; for a stacked matrix one matmul
    /// sliced (up to [`BATCH_ROWS`] rows) or one per part's rows of it (a prompt).
    fn base_proj(&self, b: &dyn ComputeBackend, x: &Tensor, p: &Proj) -> Result<Vec<Tensor>> {
        let bias = |i: usize| p.biases.as_ref().map(|bs| bs[i]);
        if !p.stacked() {
            return p.weights.iter().enumerate().map(|(i, &w)| self.linear(b, x, w, bias(i))).collect();
        }
        let stacked = self.p(p.weights[0]);
        let rows: usize = x.dims()[..x.rank().saturating_sub(1)].iter().product();
        // A prompt: each part from its own rows of the stacked matrix (a view, no copy),
        // so its output needs no strided slice of a stacked one. A decode batch keeps one
        // GEMV (one parallel region) and slices its few rows.
        let y = if rows > BATCH_ROWS && stacked.is_host() {
            None
        } else {
            Some(self.linear(b, x, p.weights[0], bias(0))?)
        };
        let mut start = 0;
        let mut parts = Vec::with_capacity(p.parts.len());
        for &r in &p.parts {
            parts.push(match &y {
                None => {
                    let k = stacked.dims()[1];
                    let bias = bias(0).map(|i| self.p(i).view(start, [r])).transpose()?;
                    linear_with(b, x, &stacked.view(start * k, [r, k])?, bias.as_ref(), self.precision)?
                }
                // One row (a decode step) in host memory: each part is a contiguous run
                // of it, so a view of it, not a copy.
                Some(y) if y.is_host() && rows == 1 => {
                    let mut dims = y.dims().to_vec();
                    dims[y.rank() - 1] = r;
                    y.view(start, dims)?
                }
                Some(y) => b.slice(y, y.rank() - 1, start, r)?,
            });
            start += r;
        }
        Ok(parts)
    }

    /// Backward of one linear layer `y = x·Wᵀ (+ bias)`: adds the weight (and bias)
    /// gradient into the sink when the base trains, and returns `dx = dy·W`.
    pub(super) fn linear_grad(
        &self,
        b: &dyn ComputeBackend,
        sink: &mut Sink<'_>,
        x: &Tensor,
        (weight, bias): (usize, Option<usize>),
        dy: &Tensor,
    ) -> Result<Tensor> {
        if let Some(grads) = sink.base() {
            let (dw, db) = grads.pair_mut(weight, bias)?;
            return self.precision.backward(b, x, self.p(weight), dy, dw, db);
        }
        // Frozen W: only dx = dy·W, straight from the blocks of a block-format W.
        let w = self.p(weight);
        if is_block_format(w) {
            b.quantized_matmul_backward(dy, w)
        } else {
            let rows: usize = dy.dims()[..dy.rank() - 1].iter().product();
            let mut shape = dy.dims().to_vec();
            let last = shape.len() - 1;
            shape[last] = w.dims()[1];
            b.matmul(&dy.reshape([rows, dy.dims()[last]])?, w, false, false)?.reshape(shape)
        }
    }

    /// Backward of [`proj`](Self::proj) from each part's output gradient; returns `dx`.
    pub(super) fn proj_backward(
        &self,
        b: &dyn ComputeBackend,
        sink: &mut Sink<'_>,
        x: &Tensor,
        p: &Proj,
        site: (usize, Group),
        d_parts: &[Tensor],
    ) -> Result<Tensor> {
        let bias = |i: usize| p.biases.as_ref().map(|bs| bs[i]);
        let mut dx = if p.stacked() {
            let dy = b.concat(d_parts, d_parts[0].rank() - 1)?;
            self.linear_grad(b, sink, x, (p.weights[0], bias(0)), &dy)?
        } else {
            let mut dx: Option<Tensor> = None;
            for (i, (&w, dy)) in p.weights.iter().zip(d_parts).enumerate() {
                let d = self.linear_grad(b, sink, x, (w, bias(i)), dy)?;
                dx = Some(match dx {
                    Some(acc) => b.add(&acc, &d)?,
                    None => d,
                });
            }
            dx.ok_or_else(|| Error::value("Transformer::backward", "projection", "at least one matrix", 0))?
        };
        if let (Some(ad), Sink::Lora(grads)) = (&self.lora, sink) {
            // y = s·(x·Aᵀ)·Bᵀ: with u = x·Aᵀ and g = s·dy, dB += gᵀ·u, du = g·B,
            // dA += duᵀ·x, dx += du·A.
            for (i, dy) in d_parts.iter().enumerate() {
                if let Some(slot) = ad.slot(site.0, site.1, i) {
                    let (a, bm) = (&ad.params.tensors[slot.a], &ad.params.tensors[slot.b]);
                    let u = self.precision.forward(b, x, a, None)?;
                    let g = b.mul_scalar(dy, ad.config.scale())?;
                    let du = self.precision.backward(b, &u, bm, &g, &mut grads.tensors[slot.b], None)?;
                    let dxl = self.precision.backward(b, x, a, &du, &mut grads.tensors[slot.a], None)?;
                    dx = b.add(&dx, &dxl)?;
                }
            }
        }
        Ok(dx)
    }
}
