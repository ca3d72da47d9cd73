//! f64 twins of the quant family.
