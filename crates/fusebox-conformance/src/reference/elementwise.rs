//! f64 twins of the elementwise family.
