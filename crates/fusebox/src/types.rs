//! Small named structs that ops return or take: what a forward saves for its
//! backward, the gradients a backward returns, and op hyper-parameters.

use crate::tensor::Tensor;

/// Output of the fused causal attention: what its backward needs and nothing more.
#[derive(Debug, Clone)]
pub struct CausalAttentionResult {
    /// `(B, Hq, Tq, D)`, the input dtype.
    pub output: Tensor,
    /// `(B, Hq, Tq)` f32: `ln Σ_j exp(s_ij)` per query row (−∞ for a row that sees no key);
    /// with attention sinks `ln(exp(s_h) + Σ_j exp(s_ij))`, the sink included (`s_h` for a
    /// row that sees no key).
    pub logsumexp: Tensor,
}

/// Gradients of attention with respect to its inputs.
#[derive(Debug, Clone)]
pub struct AttentionGradients {
    /// `(B, Hq, Tq, D)`
    pub dq: Tensor,
    /// `(B, Hkv, Tk, D)`, summed over each query group.
    pub dk: Tensor,
    /// `(B, Hkv, Tk, D)`, summed over each query group.
    pub dv: Tensor,
    /// `(Hq)` f32, the gradient of the attention sinks: `Some` exactly when the forward
    /// had sinks.
    pub dsinks: Option<Tensor>,
}

/// Output of a normalization forward: the result and the saved statistics.
#[derive(Debug, Clone)]
pub struct NormOutput {
    /// Same shape and dtype as the input.
    pub output: Tensor,
    /// Per-row mean (f32, input shape without its last dim); `None` for RMS norms.
    pub mean: Option<Tensor>,
    /// Per-row `1/sqrt(var + eps)` (or `1/sqrt(mean(x²) + eps)`), f32.
    pub rstd: Tensor,
}

/// Gradients of a normalization with affine parameters.
#[derive(Debug, Clone)]
pub struct NormGradients {
    /// Same shape as the input.
    pub dx: Tensor,
    /// Same shape as the weight.
    pub dweight: Tensor,
    /// Same shape as the bias; `None` when the norm has no bias (RMS norm).
    pub dbias: Option<Tensor>,
}

/// Gradients of `matmul`.
#[derive(Debug, Clone)]
pub struct MatmulGradients {
    /// Gradient of `a`.
    pub da: Tensor,
    /// Gradient of `b`.
    pub db: Tensor,
}

/// Gradients of `linear_forward`.
#[derive(Debug, Clone)]
pub struct LinearGradients {
    /// `[..., in]`
    pub dx: Tensor,
    /// `[out, in]`
    pub dweight: Tensor,
    /// `[out]`, when the forward had a bias.
    pub dbias: Option<Tensor>,
}

/// Gradients of a two-input elementwise op (`silu_mul`: d_gate, d_up).
#[derive(Debug, Clone)]
pub struct PairGradients {
    /// Gradient of the first input.
    pub da: Tensor,
    /// Gradient of the second input.
    pub db: Tensor,
}

/// Gradients of `depthwise_conv1d_silu` / `depthwise_conv1d_silu_ctx`
/// (`depthwise_conv1d_silu_backward`).
#[derive(Debug, Clone)]
pub struct ConvGradients {
    /// Gradient of the input `x`, `[B, C, L]`, in x's dtype.
    pub dx: Tensor,
    /// Gradient of the taps `w`, `[C, K]`, in w's dtype.
    pub dw: Tensor,
    /// Gradient of the bias, `[C]`, in its dtype.
    pub dbias: Tensor,
    /// Gradient of the context `ctx`, `[B, C, K−1]`: `Some` exactly when a context was given.
    pub d_ctx: Option<Tensor>,
}

/// Gradients of `rms_norm_gated` (`rms_norm_gated_backward`).
#[derive(Debug, Clone)]
pub struct GatedNormGradients {
    /// Gradient of the normalized input `x`, in its shape and dtype.
    pub dx: Tensor,
    /// Gradient of the gate `z`, in its shape and dtype.
    pub dz: Tensor,
    /// Gradient of the weight, `[D]`, in its dtype.
    pub dweight: Tensor,
}

/// The Gated DeltaNet gates of `gdn_gates`, both F32 `[..., H]`.
#[derive(Debug, Clone)]
pub struct GateOutput {
    /// Log decay per step: `g = −exp(a_log[h])·softplus(a + dt_bias[h])` (≤ 0).
    pub g: Tensor,
    /// Write strength: `β = σ(b)`.
    pub beta: Tensor,
}

/// Gradients of `gdn_gates` (`gdn_gates_backward`).
#[derive(Debug, Clone)]
pub struct GateGradients {
    /// Gradient of `a`, `[..., H]`, in a's dtype.
    pub da: Tensor,
    /// Gradient of `b`, `[..., H]`, in b's dtype.
    pub db: Tensor,
    /// Gradient of `a_log`, `[H]` (summed over rows), in its dtype.
    pub da_log: Tensor,
    /// Gradient of `dt_bias`, `[H]` (summed over rows), in its dtype.
    pub ddt_bias: Tensor,
}

/// Output of the fused cross-entropy.
#[derive(Debug, Clone)]
pub struct CrossEntropyOutput {
    /// Mean loss over the counted (not ignored) rows, f32 scalar tensor.
    pub loss: Tensor,
    /// `[N, V]` f32: d(mean loss)/d(logits), zero rows for ignored targets.
    pub d_logits: Tensor,
    /// Number of rows that counted.
    pub count: usize,
}

/// Values and indices of `topk`.
#[derive(Debug, Clone)]
pub struct TopK {
    /// The k largest values along the last axis, largest first.
    pub values: Tensor,
    /// U32
    pub indices: Tensor,
}

/// AdamW hyper-parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamWConfig {
    /// Learning rate.
    pub lr: f32,
    /// Decay of the first moment (β₁).
    pub beta1: f32,
    /// Decay of the second moment (β₂).
    pub beta2: f32,
    /// Added to `√v̂` in the denominator.
    pub eps: f32,
    /// Decoupled weight decay: `p -= lr · weight_decay · p`.
    pub weight_decay: f32,
    /// Multiplies the gradient before the step (`g ← grad_scale · grad`): the
    /// global-norm clipping factor, or loss-scale undo; 1 for none. Fused into the
    /// step, so clipping costs no extra pass over the gradients.
    pub grad_scale: f32,
}

impl Default for AdamWConfig {
    fn default() -> Self {
        AdamWConfig { lr: 1e-3, beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.0, grad_scale: 1.0 }
    }
}

/// Which pairs rotary embedding rotates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RopeStyle {
    /// Pairs `(i, i + D/2)` (GPT-NeoX / Hugging Face Llama).
    HalfSplit,
    /// Adjacent pairs `(2i, 2i + 1)` (original Llama, GGUF llama weights).
    Interleaved,
}

/// The two forms of GELU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GeluForm {
    /// `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`
    Tanh,
    /// `0.5·x·(1 + erf(x/√2))`
    Erf,
}

/// The mask argument of `sdpa`.
#[derive(Debug, Clone, Copy)]
pub enum AttentionMask<'a> {
    /// f32 `(Tq, Tk)` or `(B, Hq, Tq, Tk)`, added to the scaled scores.
    Additive(&'a Tensor),
    /// U32 `(Tq, Tk)` or `(B, Hq, Tq, Tk)`: 1 keeps a score, 0 masks it out.
    Boolean(&'a Tensor),
}

/// Stride, padding, dilation and groups of a 1-d convolution.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Conv1dConfig {
    /// Step between output positions.
    pub stride: usize,
    /// Zeros added at each end of the input.
    pub padding: usize,
    /// Spacing between kernel taps.
    pub dilation: usize,
    /// Channel groups (input and output channels both divisible).
    pub groups: usize,
    /// Only for `conv_transpose1d`: extra length added to one side of the output.
    pub output_padding: usize,
}

impl Default for Conv1dConfig {
    fn default() -> Self {
        Conv1dConfig { stride: 1, padding: 0, dilation: 1, groups: 1, output_padding: 0 }
    }
}

/// Stride, padding and dilation per spatial axis `(h, w)`, and groups, of a 2-d convolution.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Conv2dConfig {
    /// Step between output positions (height, width).
    pub stride: (usize, usize),
    /// Zeros added at each end (height, width).
    pub padding: (usize, usize),
    /// Spacing between kernel taps (height, width).
    pub dilation: (usize, usize),
    /// Channel groups (input and output channels both divisible).
    pub groups: usize,
}

impl Default for Conv2dConfig {
    fn default() -> Self {
        Conv2dConfig { stride: (1, 1), padding: (0, 0), dilation: (1, 1), groups: 1 }
    }
}

/// How a mixture-of-experts router turns its logits `l` (one per expert) into the k
/// chosen experts and their weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Routing {
    /// `p = softmax(l)` over all experts; the k largest `p` are chosen and weighted by
    /// `p` itself (their sum is below 1): OLMoE, Qwen3-MoE with `norm_topk_prob: false`.
    SoftmaxTopK,
    /// As [`SoftmaxTopK`](Routing::SoftmaxTopK), the k weights then divided by their sum:
    /// Mixtral, Qwen3-MoE with `norm_topk_prob: true`.
    SoftmaxTopKNormalized,
    /// The k largest logits are chosen and weighted by the softmax over those k alone
    /// (gpt-oss). The same function as
    /// [`SoftmaxTopKNormalized`](Routing::SoftmaxTopKNormalized) (`e^{l_i}/Σ_chosen e^{l_j}`
    /// either way), named for the architectures that write it this way.
    TopKSoftmax,
}

impl Routing {
    /// Whether the k weights sum to 1 (a softmax over the chosen experts).
    pub fn normalized(self) -> bool {
        !matches!(self, Routing::SoftmaxTopK)
    }
}

/// Output of `moe_route`: the chosen experts of each row and their weights.
#[derive(Debug, Clone)]
pub struct Routed {
    /// `[..., k]` the router logits' dtype: each chosen expert's weight.
    pub weights: Tensor,
    /// `[..., k]` U32: the chosen experts, largest weight first (ties: lower index first).
    pub experts: Tensor,
}

/// Output of `gated_delta_rule`: the outputs and the final state.
#[derive(Debug, Clone)]
pub struct DeltaRuleOutput {
    /// `[B, T, Hv, Dv]` f32: `o_t = S_tᵀ(scale·q_t)` per token and value head.
    pub out: Tensor,
    /// `[B, Hv, Dk, Dv]` f32: the state after the last token.
    pub state: Tensor,
}

/// Gradients of `gated_delta_rule` with respect to its inputs.
#[derive(Debug, Clone)]
pub struct DeltaRuleGradients {
    /// `[B, T, Hk, Dk]`, summed over the value heads that share each key head.
    pub dq: Tensor,
    /// `[B, T, Hk, Dk]`, summed over the value heads that share each key head.
    pub dk: Tensor,
    /// `[B, T, Hv, Dv]`
    pub dv: Tensor,
    /// `[B, T, Hv]`, the gradient of the log-decays.
    pub dg: Tensor,
    /// `[B, T, Hv]`
    pub dbeta: Tensor,
    /// `[B, Hv, Dk, Dv]`: `Some` exactly when the forward was given an initial state.
    pub d_initial_state: Option<Tensor>,
}
