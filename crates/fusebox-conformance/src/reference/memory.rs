//! f64 twins of the memory family.
