//! f64 twins of the reduce family.
