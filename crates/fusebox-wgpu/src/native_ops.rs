//! The list of ops with a native kernel: what `WgpuBackend::supports` reports. The test
//! below checks it against the methods `backend.rs` overrides (`WgpuBackend::OVERRIDDEN`),
//! so a new native op is listed here and overridden there, or the test names it.

use fusebox::Op;

/// The ops with a native kernel on this backend.
pub const NATIVE_OPS: &[Op] = &[
    Op::Name,
    Op::Device,
    Op::Supports,
    Op::Upload,
    Op::ToHost,
    Op::UsesDeviceStorage,
    Op::Synchronize,
    Op::ReleaseResources,
    Op::ReleaseTemporaryResources,
    Op::Zeros,
    Op::Copy,
    Op::Cast,
    Op::CopyInto,
    Op::Fill,
    Op::PreprocessLinearWeight,
    Op::QuantizedMatmul,
    Op::Matmul,
    Op::MatmulBackward,
    Op::BatchedMatmul,
    Op::LinearForward,
    Op::LinearBackward,
    Op::LinearBackwardAccumulate,
    Op::Attention,
    Op::CausalAttention,
    Op::CausalAttentionBackward,
    Op::SupportsCausalAttention,
    Op::WriteHeadCache,
    Op::DecodeAttention,
    Op::SplitHeads,
    Op::MergeHeads,
    Op::Silu,
    Op::SiluBackward,
    Op::Gelu,
    Op::GeluBackward,
    Op::Relu,
    Op::ReluBackward,
    Op::Sigmoid,
    Op::SigmoidBackward,
    Op::Tanh,
    Op::TanhBackward,
    Op::SiluMul,
    Op::SiluMulBackward,
    Op::GeluMul,
    Op::GeluMulBackward,
    Op::StableSoftplus,
    Op::RmsNorm,
    Op::RmsNormBackward,
    Op::LayerNorm,
    Op::LayerNormBackward,
    Op::AddRmsNorm,
    Op::Softmax,
    Op::SoftmaxBackward,
    Op::LogSoftmax,
    Op::CrossEntropy,
    Op::CrossEntropyBackward,
    Op::AdamwUpdate,
    Op::GlobalNorm,
    Op::Rope,
    Op::RopeBackward,
    Op::Embedding,
    Op::EmbeddingBackward,
    Op::ScatterAddRows,
    Op::SliceRows,
    Op::Add,
    Op::Sub,
    Op::Mul,
    Op::Div,
    Op::AddScalar,
    Op::SubScalar,
    Op::MulScalar,
    Op::DivScalar,
    Op::AddAssign,
    Op::SubAssign,
    Op::MulAssign,
    Op::DivAssign,
    Op::AddRow,
    Op::SubRow,
    Op::MulRow,
    Op::DivRow,
    Op::AddCol,
    Op::SubCol,
    Op::MulCol,
    Op::DivCol,
    Op::Add3,
    Op::ExpMul,
    Op::SubMul,
    Op::AddScaled,
    Op::Exp,
    Op::Log,
    Op::Sqrt,
    Op::Pow,
    Op::Neg,
    Op::Abs,
    Op::Clamp,
    Op::ExpInplace,
    Op::LogInplace,
    Op::SqrtInplace,
    Op::PowInplace,
    Op::NegInplace,
    Op::AbsInplace,
    Op::ClampInplace,
    Op::Permute,
    Op::Transpose,
    Op::Sum,
    Op::Mean,
    Op::Max,
    Op::Var,
    Op::SumAbs,
    Op::Argmax,
    Op::MaxBackward,
    Op::SumToShape,
];

/// Whether `op` has a native kernel here.
pub fn is_native(op: Op) -> bool {
    NATIVE_OPS.contains(&op)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::WgpuBackend;

    /// Runs without an adapter: both lists are known at compile time.
    #[test]
    fn the_native_list_is_exactly_the_overridden_ops() {
        if let Err(drift) = fusebox::check_native_ops("WgpuBackend", WgpuBackend::OVERRIDDEN, is_native) {
            panic!("NATIVE_OPS and the overrides in backend.rs disagree:\n{}", drift.join("\n"));
        }
    }

    #[test]
    fn the_native_list_has_no_duplicates() {
        for (i, op) in NATIVE_OPS.iter().enumerate() {
            assert!(!NATIVE_OPS[..i].contains(op), "Op::{op:?} is listed twice");
        }
    }
}
