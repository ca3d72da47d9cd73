//! f64 twins of the matmul family.
