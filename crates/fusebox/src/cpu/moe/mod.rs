//! Mixture-of-experts kernels: the router (`route.rs`: logits → the k chosen experts and
//! their weights, and its backward) and the expert matmul (`expert.rs`: each row times its
//! own expert's weight, grouped per expert so one expert's weight is read once per call).

mod expert;
mod route;

pub use expert::{expert_matmul, expert_matmul_backward};
pub use route::{moe_route, moe_route_backward};

use crate::error::{Error, Result};

/// Reads the chosen experts (`[T, k]` U32) and checks each is below `n_experts`.
fn expert_ids<'a>(op: &'static str, experts: &'a crate::Tensor, n_experts: usize) -> Result<&'a [u32]> {
    let ids = experts.as_slice::<u32>()?;
    if let Some(&bad) = ids.iter().find(|&&e| e as usize >= n_experts) {
        return Err(Error::value(op, "experts", format!("expert indices < {n_experts}"), bad));
    }
    Ok(ids)
}
