//! Cases of the memory family.

use fusebox::ComputeBackend;

use crate::case::Case;

/// Every case of the family.
pub fn cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    Vec::new()
}
