//! The f64 twins: plain loops, one function per op and per backward, written to be
//! checked by eye rather than to be fast. Nothing in the `fusebox` crate can import
//! them (this is another crate).

pub mod activation;
pub mod attention;
pub mod conv;
pub mod delta;
pub mod elementwise;
pub mod embedding;
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
