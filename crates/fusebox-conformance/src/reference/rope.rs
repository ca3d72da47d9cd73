//! f64 twins of the rope family.
