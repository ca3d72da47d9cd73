//! f64 twins of the optim family.
