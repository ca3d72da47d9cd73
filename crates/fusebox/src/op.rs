//! `Op`: one variant per operation of [`ComputeBackend`](crate::ComputeBackend).
//!
//! Backends answer [`supports`](crate::ComputeBackend::supports) per `Op`, and the
//! conformance suite checks that every variant has at least one case.

macro_rules! ops {
    ($($variant:ident => $name:literal,)*) => {
        /// Every operation of the `ComputeBackend` trait.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum Op { $(#[doc = concat!("The `", $name, "` method.")] $variant,)* }

        impl Op {
            /// All operations, in trait order.
            pub const ALL: &'static [Op] = &[$(Op::$variant,)*];
            /// The trait method's name.
            pub fn name(self) -> &'static str {
                match self { $(Op::$variant => $name,)* }
            }
            /// The operation whose method is called `name`.
            pub fn from_name(name: &str) -> Option<Op> {
                match name { $($name => Some(Op::$variant),)* _ => None }
            }
        }

        impl std::fmt::Display for Op {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.name())
            }
        }
    };
}

ops! {
    // device, memory, dtypes
    Name => "name",
    Device => "device",
    Supports => "supports",
    Upload => "upload",
    ToHost => "to_host",
    UsesDeviceStorage => "uses_device_storage",
    Synchronize => "synchronize",
    ReleaseResources => "release_resources",
    ReleaseTemporaryResources => "release_temporary_resources",
    Zeros => "zeros",
    Copy => "copy",
    CopyInto => "copy_into",
    Fill => "fill",
    Cast => "cast",
    PreprocessLinearWeight => "preprocess_linear_weight",
    F8e4m3ToF32 => "f8e4m3_to_f32",
    F8e4m3ToF16 => "f8e4m3_to_f16",
    F8e4m3ToBf16 => "f8e4m3_to_bf16",
    Quantize => "quantize",
    Dequantize => "dequantize",
    QuantizedMatmul => "quantized_matmul",
    QuantizedMatmulBackward => "quantized_matmul_backward",
    // linear algebra
    Matmul => "matmul",
    MatmulBackward => "matmul_backward",
    BatchedMatmul => "batched_matmul",
    LinearForward => "linear_forward",
    LinearBackward => "linear_backward",
    LinearBackwardAccumulate => "linear_backward_accumulate",
    LinearForwardBf16 => "linear_forward_bf16",
    LinearBackwardAccumulateBf16 => "linear_backward_accumulate_bf16",
    HeadPrefixMatmul => "head_prefix_matmul",
    // mixture of experts
    MoeRoute => "moe_route",
    MoeRouteBackward => "moe_route_backward",
    ExpertMatmul => "expert_matmul",
    ExpertMatmulBackward => "expert_matmul_backward",
    // linear attention
    GatedDeltaRule => "gated_delta_rule",
    GatedDeltaRuleBackward => "gated_delta_rule_backward",
    GatedDeltaRuleStep => "gated_delta_rule_step",
    BatchedGatedDeltaRuleStep => "batched_gated_delta_rule_step",
    // attention
    Attention => "attention",
    Sdpa => "sdpa",
    CausalAttention => "causal_attention",
    CausalAttentionBackward => "causal_attention_backward",
    SupportsCausalAttention => "supports_causal_attention",
    CausalMask => "causal_mask",
    CausalSoftmax => "causal_softmax",
    WriteHeadCache => "write_head_cache",
    DecodeAttention => "decode_attention",
    BatchedDecodeAttention => "batched_decode_attention",
    SplitHeads => "split_heads",
    MergeHeads => "merge_heads",
    // activations
    Silu => "silu",
    SiluBackward => "silu_backward",
    Gelu => "gelu",
    GeluBackward => "gelu_backward",
    Relu => "relu",
    ReluBackward => "relu_backward",
    Sigmoid => "sigmoid",
    SigmoidBackward => "sigmoid_backward",
    Tanh => "tanh",
    TanhBackward => "tanh_backward",
    SiluMul => "silu_mul",
    SiluMulBackward => "silu_mul_backward",
    GeluMul => "gelu_mul",
    GeluMulBackward => "gelu_mul_backward",
    ClampedSwiglu => "clamped_swiglu",
    ClampedSwigluBackward => "clamped_swiglu_backward",
    StableSoftplus => "stable_softplus",
    GdnGates => "gdn_gates",
    GdnGatesBackward => "gdn_gates_backward",
    // normalization
    RmsNorm => "rms_norm",
    RmsNormBackward => "rms_norm_backward",
    LayerNorm => "layer_norm",
    LayerNormBackward => "layer_norm_backward",
    AddRmsNorm => "add_rms_norm",
    RmsNormGated => "rms_norm_gated",
    RmsNormGatedBackward => "rms_norm_gated_backward",
    RmsNormChannel => "rms_norm_channel",
    GroupNorm => "group_norm",
    AdalnModulate => "adaln_modulate",
    Normalize => "normalize",
    L2Norm => "l2_norm",
    L2NormBackward => "l2_norm_backward",
    // softmax, loss, optimizer
    Softmax => "softmax",
    SoftmaxBackward => "softmax_backward",
    LogSoftmax => "log_softmax",
    CrossEntropy => "cross_entropy",
    CrossEntropyBackward => "cross_entropy_backward",
    AdamwUpdate => "adamw_update",
    GlobalNorm => "global_norm",
    ClipScale => "clip_scale",
    // positions and embeddings
    Rope => "rope",
    RopeBackward => "rope_backward",
    Embedding => "embedding",
    EmbeddingBackward => "embedding_backward",
    IndexSelect => "index_select",
    ScatterAddRows => "scatter_add_rows",
    SliceRows => "slice_rows",
    IndexAdd => "index_add",
    // elementwise
    Add => "add",
    Sub => "sub",
    Mul => "mul",
    Div => "div",
    AddScalar => "add_scalar",
    SubScalar => "sub_scalar",
    MulScalar => "mul_scalar",
    DivScalar => "div_scalar",
    AddAssign => "add_assign",
    SubAssign => "sub_assign",
    MulAssign => "mul_assign",
    DivAssign => "div_assign",
    AddRow => "add_row",
    SubRow => "sub_row",
    MulRow => "mul_row",
    DivRow => "div_row",
    AddCol => "add_col",
    SubCol => "sub_col",
    MulCol => "mul_col",
    DivCol => "div_col",
    Add3 => "add3",
    ExpMul => "exp_mul",
    SubMul => "sub_mul",
    AddScaled => "add_scaled",
    Exp => "exp",
    Log => "log",
    Sqrt => "sqrt",
    Pow => "pow",
    Neg => "neg",
    Abs => "abs",
    Clamp => "clamp",
    ExpInplace => "exp_inplace",
    LogInplace => "log_inplace",
    SqrtInplace => "sqrt_inplace",
    PowInplace => "pow_inplace",
    NegInplace => "neg_inplace",
    AbsInplace => "abs_inplace",
    ClampInplace => "clamp_inplace",
    // reductions
    Sum => "sum",
    Mean => "mean",
    Max => "max",
    Var => "var",
    SumAbs => "sum_abs",
    Argmax => "argmax",
    Topk => "topk",
    MaxBackward => "max_backward",
    SumToShape => "sum_to_shape",
    // layout
    Reshape => "reshape",
    Permute => "permute",
    Transpose => "transpose",
    Slice => "slice",
    SliceBackward => "slice_backward",
    Select => "select",
    Concat => "concat",
    Expand => "expand",
    // convolutions
    Conv1d => "conv1d",
    ConvTranspose1d => "conv_transpose1d",
    Conv2d => "conv2d",
    DepthwiseConv1dSilu => "depthwise_conv1d_silu",
    DepthwiseConv1dBias => "depthwise_conv1d_bias",
    DepthwiseConv1dBiasCtx => "depthwise_conv1d_bias_ctx",
    DepthwiseConv1dSiluCtx => "depthwise_conv1d_silu_ctx",
    DepthwiseConv1dSiluBackward => "depthwise_conv1d_silu_backward",
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{ComputeBackend, NON_OP_METHODS};
    use crate::cpu::CpuBackend;

    /// The method names of `trait ComputeBackend`, read from its source (the trait's
    /// body runs to the first line that is a lone `}`).
    fn trait_methods() -> Vec<&'static str> {
        let src = include_str!("backend.rs");
        let start = src.find("pub trait ComputeBackend").expect("backend.rs defines the trait");
        let body = &src[start..];
        let end = body.find("\n}\n").expect("the trait's body ends");
        body[..end]
            .lines()
            .filter_map(|line| line.trim_start().strip_prefix("fn "))
            .filter_map(|rest| rest.split(['(', '<']).next())
            .collect()
    }

    #[test]
    fn every_op_is_a_trait_method_and_every_method_an_op() {
        let methods = trait_methods();
        assert!(methods.len() > 100, "read only {} trait methods from backend.rs", methods.len());
        for &op in Op::ALL {
            assert!(methods.contains(&op.name()), "Op::{op:?} names `{}`, which is no trait method", op.name());
        }
        for m in methods.iter().filter(|m| !NON_OP_METHODS.contains(m)) {
            assert!(Op::from_name(m).is_some(), "trait method `{m}` has no `Op` variant (add it to op.rs)");
        }
    }

    #[test]
    fn names_round_trip() {
        for &op in Op::ALL {
            assert_eq!(Op::from_name(op.name()), Some(op));
        }
        assert_eq!(Op::from_name("no_such_op"), None);
    }

    #[test]
    fn cpu_backend_runs_every_op_natively() {
        let cpu = CpuBackend::with_threads(1).expect("a one-thread CPU backend");
        for &op in Op::ALL {
            assert!(cpu.supports(op), "CpuBackend::supports(Op::{op:?}) is false");
        }
    }

    crate::backend_impl! {
        impl ComputeBackend for Partial {
            fn name(&self) -> &str { "partial" }
            fn device(&self) -> crate::Device { crate::Device::cpu() }
            fn supports(&self, op: Op) -> bool { matches!(op, Op::Name | Op::Device | Op::Supports | Op::Upload | Op::ToHost | Op::Silu) }
            fn upload(&self, x: &crate::Tensor) -> crate::Result<crate::Tensor> { Ok(x.clone()) }
            fn to_host(&self, x: &crate::Tensor) -> crate::Result<crate::Tensor> { Ok(x.clone()) }
            fn relu(&self, x: &crate::Tensor) -> crate::Result<crate::Tensor> { Ok(x.clone()) }
        }
    }

    #[derive(Debug)]
    struct Partial;

    #[test]
    fn the_native_check_names_each_op_that_drifted() {
        let p = Partial;
        let drift = crate::check_native_ops("partial", Partial::OVERRIDDEN, |op| p.supports(op)).unwrap_err();
        assert_eq!(drift.len(), 2, "{drift:?}");
        assert!(drift[0].contains("`relu`") && drift[0].contains("false"), "{}", drift[0]);
        assert!(drift[1].contains("Op::Silu") && drift[1].contains("not overridden"), "{}", drift[1]);
        let fixed = |op| p.supports(op) && op != Op::Silu || op == Op::Relu;
        assert_eq!(crate::check_native_ops("partial", Partial::OVERRIDDEN, fixed), Ok(()));
    }
}
