//! f64 twins of the activation family.
