//! Mixture-of-experts ops: `moe_route` (router logits → chosen experts and weights),
//! `expert_matmul` (each row times its own expert's weight) and their backwards.

use super::check;
use super::quant::{is_storage_format, STORAGE_FORMATS};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// A validated `moe_route`: `rows` rows of `experts` logits, `k` chosen per row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteSpec {
    /// Rows (the product of the logits' leading dims).
    pub rows: usize,
    /// Experts (the logits' last dim).
    pub experts: usize,
    /// Experts chosen per row.
    pub k: usize,
    /// The outputs' dims: the logits' leading dims, then k.
    pub out_dims: Vec<usize>,
    /// The logits' dtype, which the weights take.
    pub dtype: DType,
}

/// `moe_route(logits, k, routing)`: logits F32/F16/BF16 `[..., E]` (rank ≥ 1, E < 2³²),
/// `1 ≤ k ≤ E`.
pub fn moe_route(logits: &Tensor, k: usize) -> Result<RouteSpec> {
    const OP: &str = "moe_route";
    check::float(OP, "logits", logits)?;
    check::min_rank(OP, "logits", logits, 1)?;
    let experts = logits.shape().last_dim();
    if experts > u32::MAX as usize {
        return Err(Error::shape(OP, "logits", "at most 2³² experts (last dim)", logits.shape()));
    }
    if k == 0 || k > experts {
        return Err(Error::value(OP, "k", format!("1..={experts} (the experts, logits' last dim)"), k));
    }
    let lead = &logits.dims()[..logits.rank() - 1];
    let out_dims: Vec<usize> = lead.iter().copied().chain([k]).collect();
    Ok(RouteSpec { rows: lead.iter().product(), experts, k, out_dims, dtype: logits.dtype() })
}

/// `moe_route_backward(logits, experts, d_weights, routing)`: logits as `moe_route`;
/// experts `[..., k]` U32 (the forward's choice); d_weights `[..., k]` of the logits'
/// dtype. The spec's `out_dims` are the logits' dims (the gradient's shape).
pub fn moe_route_backward(logits: &Tensor, experts: &Tensor, d_weights: &Tensor) -> Result<RouteSpec> {
    const OP: &str = "moe_route_backward";
    check::float(OP, "logits", logits)?;
    check::min_rank(OP, "logits", logits, 1)?;
    check::dtype(OP, "experts", experts, DType::U32)?;
    check::same_dtype(OP, "d_weights (the logits' dtype)", logits, d_weights)?;
    check::same_shape(OP, "d_weights (experts' shape)", experts, d_weights)?;
    let n = logits.shape().last_dim();
    let lead = &logits.dims()[..logits.rank() - 1];
    let k = experts.dims().last().copied().unwrap_or(0);
    if experts.rank() != logits.rank() || &experts.dims()[..experts.rank() - 1] != lead || k == 0 || k > n {
        let want: Vec<String> = lead.iter().map(|d| d.to_string()).chain([format!("1..={n}")]).collect();
        return Err(Error::shape(OP, "experts", format!("[{}]", want.join(", ")), experts.shape()));
    }
    Ok(RouteSpec {
        rows: lead.iter().product(),
        experts: n,
        k,
        out_dims: logits.dims().to_vec(),
        dtype: logits.dtype(),
    })
}

/// A validated `expert_matmul`: `tokens` rows, each with `k` chosen experts; expert e's
/// weight `[n, kin]` is rows `e·n .. (e+1)·n` of w.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpertMatmulSpec {
    /// Tokens (x's first dim).
    pub tokens: usize,
    /// Rows of x per token: 1 (shared by the k experts) or k (one per chosen expert).
    pub x_rows: usize,
    /// Experts chosen per token.
    pub k: usize,
    /// Experts in w.
    pub experts: usize,
    /// Outputs of one expert (w's second dim).
    pub n: usize,
    /// The inner size (x's last dim, w's last dim).
    pub kin: usize,
    /// w's dtype: x's float dtype, or a storage format.
    pub w_dtype: DType,
    /// x's dtype, which the output takes.
    pub dtype: DType,
}

/// `expert_matmul(x, w, experts)`: x F32/F16/BF16 `[T, R, K]` with R = 1 or k;
/// w `[E, N, K]` of x's dtype or a storage format; experts `[T, k]` U32 (values below E
/// are checked where they are read).
pub fn expert_matmul(x: &Tensor, w: &Tensor, experts: &Tensor) -> Result<ExpertMatmulSpec> {
    expert_operands("expert_matmul", x, w, experts)
}

fn expert_operands(op: &'static str, x: &Tensor, w: &Tensor, experts: &Tensor) -> Result<ExpertMatmulSpec> {
    check::float(op, "x", x)?;
    check::rank(op, "x", x, 3)?;
    check::rank(op, "w", w, 3)?;
    if !(w.dtype() == x.dtype() || is_storage_format(w.dtype())) {
        return Err(Error::dtype(op, "w", format!("{} (x's dtype) or {STORAGE_FORMATS}", x.dtype()), w.dtype()));
    }
    check::dtype(op, "experts", experts, DType::U32)?;
    check::rank(op, "experts", experts, 2)?;
    let (tokens, x_rows, kin) = (x.dims()[0], x.dims()[1], x.dims()[2]);
    let (n_experts, n) = (w.dims()[0], w.dims()[1]);
    let k = experts.dims()[1];
    if experts.dims()[0] != tokens || k == 0 || k > n_experts {
        return Err(Error::shape(
            op,
            "experts",
            format!("[{tokens}, 1..={n_experts}] (x's tokens, ≤ w's experts)"),
            experts.shape(),
        ));
    }
    if x_rows != 1 && x_rows != k {
        return Err(Error::shape(
            op,
            "x",
            format!("[{tokens}, 1 or {k}, {kin}] (one row per token or per chosen expert)"),
            x.shape(),
        ));
    }
    if w.dims()[2] != kin {
        return Err(Error::shape(op, "w (last dim = x's last dim)", format!("[{n_experts}, {n}, {kin}]"), w.shape()));
    }
    Ok(ExpertMatmulSpec { tokens, x_rows, k, experts: n_experts, n, kin, w_dtype: w.dtype(), dtype: x.dtype() })
}

/// `expert_matmul_backward(x, w, experts, dy, dw)`: as `expert_matmul`, with dy
/// `[T, k, N]` of x's dtype, and dw (when the weight gradient is asked for) `[E, N, K]`
/// of w's dtype, which must then be a float dtype (block-format weights are frozen).
pub fn expert_matmul_backward(
    x: &Tensor,
    w: &Tensor,
    experts: &Tensor,
    dy: &Tensor,
    dw: Option<&Tensor>,
) -> Result<ExpertMatmulSpec> {
    const OP: &str = "expert_matmul_backward";
    let s = expert_operands(OP, x, w, experts)?;
    check::same_dtype(OP, "dy (x's dtype)", x, dy)?;
    check::shape(OP, "dy", dy, &[s.tokens, s.k, s.n])?;
    if let Some(dw) = dw {
        if is_storage_format(w.dtype()) {
            return Err(Error::dtype(OP, "w (a weight gradient is asked for)", "f32, f16 or bf16", w.dtype()));
        }
        check::same_dtype(OP, "dw (w's dtype)", w, dw)?;
        check::same_shape(OP, "dw (w's shape)", w, dw)?;
    }
    Ok(s)
}
