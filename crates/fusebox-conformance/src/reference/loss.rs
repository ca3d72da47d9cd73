//! f64 twins of the loss family.
