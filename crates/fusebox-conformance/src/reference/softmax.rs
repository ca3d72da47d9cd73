//! f64 twins of the softmax family.
