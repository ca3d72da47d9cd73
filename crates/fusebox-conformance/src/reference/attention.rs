//! f64 twins of the attention family.
