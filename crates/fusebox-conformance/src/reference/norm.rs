//! f64 twins of the norm family.
