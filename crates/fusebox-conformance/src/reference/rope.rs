//! f64 twins of the rope family: every pair of every row rotated by the angle of its
//! position, written out as plain loops.

use fusebox::RopeStyle;

use crate::array::Array;

/// The two elements of pair `i` when the first `r` elements of a row rotate.
fn pair(style: RopeStyle, i: usize, r: usize) -> (usize, usize) {
    match style {
        RopeStyle::HalfSplit => (i, i + r / 2),
        RopeStyle::Interleaved => (2 * i, 2 * i + 1),
    }
}

/// `x` `[B, H, T, D]`; row t uses position `offset + t` of `cos`, `sin` `[P, R/2]`:
/// pair `(a, b)` of the first R dims → `(a·cos − b·sin, a·sin + b·cos)`; dims ≥ R copied.
pub fn rope(x: &Array, cos: &Array, sin: &Array, style: RopeStyle, offset: usize) -> Array {
    let (nb, nh, nt) = (x.shape[0], x.shape[1], x.shape[2]);
    let r = 2 * cos.shape[1];
    let mut y = x.clone();
    for b in 0..nb {
        for h in 0..nh {
            for t in 0..nt {
                for i in 0..r / 2 {
                    let (c, s) = (cos.at(&[offset + t, i]), sin.at(&[offset + t, i]));
                    let (ia, ib) = pair(style, i, r);
                    let (a, bv) = (x.at(&[b, h, t, ia]), x.at(&[b, h, t, ib]));
                    *y.at_mut(&[b, h, t, ia]) = a * c - bv * s;
                    *y.at_mut(&[b, h, t, ib]) = a * s + bv * c;
                }
            }
        }
    }
    y
}

/// The gradient of `rope` with respect to `x`: the transposed rotation of each pair,
/// `(ga, gb)` → `(ga·cos + gb·sin, −ga·sin + gb·cos)`.
pub fn rope_backward(dy: &Array, cos: &Array, sin: &Array, style: RopeStyle, offset: usize) -> Array {
    let (nb, nh, nt) = (dy.shape[0], dy.shape[1], dy.shape[2]);
    let r = 2 * cos.shape[1];
    let mut dx = dy.clone();
    for b in 0..nb {
        for h in 0..nh {
            for t in 0..nt {
                for i in 0..r / 2 {
                    let (c, s) = (cos.at(&[offset + t, i]), sin.at(&[offset + t, i]));
                    let (ia, ib) = pair(style, i, r);
                    let (ga, gb) = (dy.at(&[b, h, t, ia]), dy.at(&[b, h, t, ib]));
                    *dx.at_mut(&[b, h, t, ia]) = ga * c + gb * s;
                    *dx.at_mut(&[b, h, t, ib]) = -ga * s + gb * c;
                }
            }
        }
    }
    dx
}
