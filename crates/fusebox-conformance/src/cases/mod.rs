//! Cases per op family. Each module exports `cases::<B>()`.

pub mod activation;
pub mod attention;
pub mod conv;
pub mod delta;
pub mod elementwise;
pub mod embedding;
pub mod gdn_fixture;
pub mod layout;
pub mod loss;
pub mod matmul;
pub mod memory;
pub mod moe;
pub mod norm;
pub mod optim;
pub mod quant;
pub mod reduce;
pub mod rope;
pub mod softmax;
