//! f64 twins of the conv family.
