//! f64 twins of the layout family.
