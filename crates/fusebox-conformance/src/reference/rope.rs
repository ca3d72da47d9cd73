//! f64 twins of the rope family: every pair of every row rotated by the angle of its
//! position, written out as plain loops.

use fusebox::RopeStyle;

use crate::array::Array;

/// The two elements of pair `i` in a row of `d` elements.
fn pair(style: RopeStyle, i: usize, d: usize) -> (usize, usize) {
    match style {
        RopeStyle::HalfSplit => (i, i + d / 2),
        RopeStyle::Interleaved => (2 * i, 2 * i + 1),
    }
}

/// `x` `[B, H, T, D]`; row t uses position `offset + t` of `cos`, `sin` `[P, D/2]`:
/// pair `(a, b)` → `(a·cos − b·sin, a·sin + b·cos)`.
pub fn rope(x: &Array, cos: &Array, sin: &Array, style: RopeStyle, offset: usize) -> Array {
    let (nb, nh, nt, d) = (x.shape[0], x.shape[1], x.shape[2], x.shape[3]);
    let mut y = Array::zeros(x.shape.clone());
    for b in 0..nb {
        for h in 0..nh {
            for t in 0..nt {
                for i in 0..d / 2 {
                    let (c, s) = (cos.at(&[offset + t, i]), sin.at(&[offset + t, i]));
                    let (ia, ib) = pair(style, i, d);
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
    let (nb, nh, nt, d) = (dy.shape[0], dy.shape[1], dy.shape[2], dy.shape[3]);
    let mut dx = Array::zeros(dy.shape.clone());
    for b in 0..nb {
        for h in 0..nh {
            for t in 0..nt {
                for i in 0..d / 2 {
                    let (c, s) = (cos.at(&[offset + t, i]), sin.at(&[offset + t, i]));
                    let (ia, ib) = pair(style, i, d);
                    let (ga, gb) = (dy.at(&[b, h, t, ia]), dy.at(&[b, h, t, ib]));
                    *dx.at_mut(&[b, h, t, ia]) = ga * c + gb * s;
                    *dx.at_mut(&[b, h, t, ib]) = -ga * s + gb * c;
                }
            }
        }
    }
    dx
}
