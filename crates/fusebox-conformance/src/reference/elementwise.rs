//! f64 twins of the elementwise family: plain loops, one function per op. An in-place
//! form (`add_assign`, `exp_inplace`, ...) computes the values of its out-of-place
//! twin, which its cases compare against.

use crate::array::Array;

/// `out[i] = f(x[i])`.
fn map(x: &Array, f: impl Fn(f64) -> f64) -> Array {
    let mut out = Array::zeros(x.shape.clone());
    for i in 0..x.len() {
        out.data[i] = f(x.data[i]);
    }
    out
}

/// `out[i] = f(a[i], b[i])` over equal shapes.
fn zip_with(a: &Array, b: &Array, f: impl Fn(f64, f64) -> f64) -> Array {
    assert_eq!(a.shape, b.shape, "elementwise twin: shapes differ");
    let mut out = Array::zeros(a.shape.clone());
    for i in 0..a.len() {
        out.data[i] = f(a.data[i], b.data[i]);
    }
    out
}

/// `out[r, j] = f(x[r, j], row[j])`, x viewed as `[rows, N]`, row `[N]`.
fn with_row(x: &Array, row: &Array, f: impl Fn(f64, f64) -> f64) -> Array {
    let n = x.last_dim();
    assert_eq!(row.shape, vec![n], "row twin: row must be [N]");
    let mut out = Array::zeros(x.shape.clone());
    for r in 0..x.rows() {
        for j in 0..n {
            out.data[r * n + j] = f(x.data[r * n + j], row.data[j]);
        }
    }
    out
}

/// `out[r, j] = f(x[r, j], col[r])`, x viewed as `[rows, N]`, col holding one value per row.
fn with_col(x: &Array, col: &Array, f: impl Fn(f64, f64) -> f64) -> Array {
    let n = x.last_dim();
    assert_eq!(col.len(), x.rows(), "col twin: one value per row");
    let mut out = Array::zeros(x.shape.clone());
    for r in 0..x.rows() {
        for j in 0..n {
            out.data[r * n + j] = f(x.data[r * n + j], col.data[r]);
        }
    }
    out
}

/// `a + b`.
pub fn add(a: &Array, b: &Array) -> Array {
    zip_with(a, b, |x, y| x + y)
}

/// `a − b`.
pub fn sub(a: &Array, b: &Array) -> Array {
    zip_with(a, b, |x, y| x - y)
}

/// `a · b`.
pub fn mul(a: &Array, b: &Array) -> Array {
    zip_with(a, b, |x, y| x * y)
}

/// `a / b`.
pub fn div(a: &Array, b: &Array) -> Array {
    zip_with(a, b, |x, y| x / y)
}

/// `a + s`.
pub fn add_scalar(a: &Array, s: f64) -> Array {
    map(a, |x| x + s)
}

/// `a − s`.
pub fn sub_scalar(a: &Array, s: f64) -> Array {
    map(a, |x| x - s)
}

/// `a · s`.
pub fn mul_scalar(a: &Array, s: f64) -> Array {
    map(a, |x| x * s)
}

/// `a / s`.
pub fn div_scalar(a: &Array, s: f64) -> Array {
    map(a, |x| x / s)
}

/// `x[..., j] + row[j]`.
pub fn add_row(x: &Array, row: &Array) -> Array {
    with_row(x, row, |v, r| v + r)
}

/// `x[..., j] − row[j]`.
pub fn sub_row(x: &Array, row: &Array) -> Array {
    with_row(x, row, |v, r| v - r)
}

/// `x[..., j] · row[j]`.
pub fn mul_row(x: &Array, row: &Array) -> Array {
    with_row(x, row, |v, r| v * r)
}

/// `x[..., j] / row[j]`.
pub fn div_row(x: &Array, row: &Array) -> Array {
    with_row(x, row, |v, r| v / r)
}

/// `x[i, j] + col[i]`.
pub fn add_col(x: &Array, col: &Array) -> Array {
    with_col(x, col, |v, c| v + c)
}

/// `x[i, j] − col[i]`.
pub fn sub_col(x: &Array, col: &Array) -> Array {
    with_col(x, col, |v, c| v - c)
}

/// `x[i, j] · col[i]`.
pub fn mul_col(x: &Array, col: &Array) -> Array {
    with_col(x, col, |v, c| v * c)
}

/// `x[i, j] / col[i]`.
pub fn div_col(x: &Array, col: &Array) -> Array {
    with_col(x, col, |v, c| v / c)
}

/// `a + b + c`.
pub fn add3(a: &Array, b: &Array, c: &Array) -> Array {
    assert_eq!(a.shape, c.shape, "add3 twin: shapes differ");
    let mut out = Array::zeros(a.shape.clone());
    for i in 0..a.len() {
        out.data[i] = a.data[i] + b.data[i] + c.data[i];
    }
    out
}

/// `x · exp(y)`.
pub fn exp_mul(x: &Array, y: &Array) -> Array {
    zip_with(x, y, |a, b| a * b.exp())
}

/// `(a − b) · c`.
pub fn sub_mul(a: &Array, b: &Array, c: &Array) -> Array {
    assert_eq!(a.shape, c.shape, "sub_mul twin: shapes differ");
    let mut out = Array::zeros(a.shape.clone());
    for i in 0..a.len() {
        out.data[i] = (a.data[i] - b.data[i]) * c.data[i];
    }
    out
}

/// `a + b · c`, scalar `c`.
pub fn add_scaled(a: &Array, b: &Array, c: f64) -> Array {
    zip_with(a, b, |x, y| x + y * c)
}

/// `exp(x)`.
pub fn exp(x: &Array) -> Array {
    map(x, f64::exp)
}

/// `ln(x)`.
pub fn log(x: &Array) -> Array {
    map(x, f64::ln)
}

/// `√x`.
pub fn sqrt(x: &Array) -> Array {
    map(x, f64::sqrt)
}

/// `x^p`.
pub fn pow(x: &Array, p: f64) -> Array {
    map(x, |v| v.powf(p))
}

/// `−x`.
pub fn neg(x: &Array) -> Array {
    map(x, |v| -v)
}

/// `|x|`.
pub fn abs(x: &Array) -> Array {
    map(x, f64::abs)
}

/// `min(max(x, lo), hi)`.
pub fn clamp(x: &Array, lo: f64, hi: f64) -> Array {
    map(x, |v| {
        if v < lo {
            lo
        } else if v > hi {
            hi
        } else {
            v
        }
    })
}
