//! f64 twins of the embedding family.
