//! Layout ops: reshape, permute, transpose, slice (and its backward), select, concat,
//! expand. They move elements without arithmetic, so they take every plain dtype (F32,
//! F16, BF16, U32, F8E4M3 — one element per storage unit); block formats are an error
//! except for `reshape`, which keeps whole blocks. (The attention head layouts,
//! `split_heads` and `merge_heads`, are in [`spec::attention`](crate::spec::attention);
//! the row gathers and scatters in [`spec::embedding`](crate::spec::embedding).)

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::shape::Shape;
use crate::spec::check;
use crate::tensor::Tensor;

/// Bytes per element of a plain (one element per storage unit) dtype; block formats are an error.
pub fn plain_elem_bytes(op: &'static str, what: &str, t: &Tensor) -> Result<usize> {
    if t.dtype().block_elems() == 1 {
        Ok(t.dtype().block_bytes())
    } else {
        Err(Error::dtype(op, what, "a plain dtype (f32, f16, bf16, u32 or f8e4m3)", t.dtype()))
    }
}

/// A validated movement of a plain-dtype tensor into a new one of `out_dims`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MoveSpec {
    /// The output's dims.
    pub out_dims: Vec<usize>,
    /// Bytes per element (the dtype is plain).
    pub elem_bytes: usize,
    /// The dtype, kept by the output.
    pub dtype: DType,
}

/// A validated permutation of axes: output dim i is input dim `perm[i]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PermuteSpec {
    /// The permutation of `0..rank`.
    pub perm: Vec<usize>,
    /// The output's dims (`x.dims()[perm[i]]`).
    pub out_dims: Vec<usize>,
    /// Bytes per element (the dtype is plain).
    pub elem_bytes: usize,
    /// The dtype, kept by the output.
    pub dtype: DType,
}

/// `reshape(x, shape)`: the same number of elements, and for a block format a last dim
/// of whole blocks. Any dtype.
pub fn reshape(x: &Tensor, shape: &Shape) -> Result<()> {
    const OP: &str = "reshape";
    if shape.elem_count() != x.elem_count() {
        return Err(Error::shape(
            OP,
            "target",
            format!("{} elements", x.elem_count()),
            format!("{shape} ({} elements)", shape.elem_count()),
        ));
    }
    let be = x.dtype().block_elems();
    if be > 1 && !shape.last_dim().is_multiple_of(be) {
        let what = format!("last dimension for {} blocks", x.dtype());
        return Err(Error::shape(OP, what, format!("a multiple of {be}"), shape));
    }
    Ok(())
}

/// `permute(x, perm)`: x of a plain dtype, `perm` a permutation of `0..rank`.
pub fn permute(x: &Tensor, perm: &[usize]) -> Result<PermuteSpec> {
    permutation("permute", x, perm.to_vec())
}

/// `transpose(x, dim0, dim1)`: x of a plain dtype, both dims `< rank` (equal dims give a
/// copy). Described as the permutation swapping them.
pub fn transpose(x: &Tensor, dim0: usize, dim1: usize) -> Result<PermuteSpec> {
    const OP: &str = "transpose";
    check::axis(OP, dim0, x.rank())?;
    check::axis(OP, dim1, x.rank())?;
    let mut perm: Vec<usize> = (0..x.rank()).collect();
    perm.swap(dim0, dim1);
    permutation(OP, x, perm)
}

fn permutation(op: &'static str, x: &Tensor, perm: Vec<usize>) -> Result<PermuteSpec> {
    let elem_bytes = plain_elem_bytes(op, "x", x)?;
    let rank = x.rank();
    let mut seen = vec![false; rank];
    let valid = perm.len() == rank && perm.iter().all(|&p| p < rank && !std::mem::replace(&mut seen[p], true));
    if !valid {
        return Err(Error::value(op, "perm", format!("a permutation of 0..{rank}"), format!("{perm:?}")));
    }
    let out_dims = perm.iter().map(|&p| x.dims()[p]).collect();
    Ok(PermuteSpec { perm, out_dims, elem_bytes, dtype: x.dtype() })
}

/// `start + len ≤ n`, else an error naming the range and the axis.
fn range(op: &'static str, axis: usize, start: usize, len: usize, n: usize) -> Result<()> {
    match start.checked_add(len) {
        Some(end) if end <= n => Ok(()),
        _ => Err(Error::value(op, "start + len", format!("≤ {n} (size of axis {axis})"), format!("{start} + {len}"))),
    }
}

/// `slice(x, axis, start, len)`: x of a plain dtype, `axis < rank`, `start + len` within
/// the axis.
pub fn slice(x: &Tensor, axis: usize, start: usize, len: usize) -> Result<MoveSpec> {
    const OP: &str = "slice";
    let elem_bytes = plain_elem_bytes(OP, "x", x)?;
    check::axis(OP, axis, x.rank())?;
    range(OP, axis, start, len, x.dims()[axis])?;
    let mut out_dims = x.dims().to_vec();
    out_dims[axis] = len;
    Ok(MoveSpec { out_dims, elem_bytes, dtype: x.dtype() })
}

/// `slice_backward(d_out, input_shape, axis, start)`: d_out float with `input_shape`'s
/// dims except `len` along `axis < rank`, and `start + len` within the axis. The output
/// is `input_shape`.
pub fn slice_backward(d_out: &Tensor, input_shape: &Shape, axis: usize, start: usize) -> Result<MoveSpec> {
    const OP: &str = "slice_backward";
    check::float(OP, "d_out", d_out)?;
    let elem_bytes = plain_elem_bytes(OP, "d_out", d_out)?;
    let dims = input_shape.dims();
    check::axis(OP, axis, dims.len())?;
    let len = d_out.dims().get(axis).copied().unwrap_or(0);
    let mut expected = dims.to_vec();
    expected[axis] = len;
    check::shape(OP, "d_out", d_out, &expected)?;
    range(OP, axis, start, len, dims[axis])?;
    Ok(MoveSpec { out_dims: dims.to_vec(), elem_bytes, dtype: d_out.dtype() })
}

/// `select(x, axis, index)`: x of a plain dtype, `axis < rank`, `index` below the axis'
/// size. The output drops the axis.
pub fn select(x: &Tensor, axis: usize, index: usize) -> Result<MoveSpec> {
    const OP: &str = "select";
    let elem_bytes = plain_elem_bytes(OP, "x", x)?;
    check::axis(OP, axis, x.rank())?;
    let n = x.dims()[axis];
    if index >= n {
        return Err(Error::value(OP, "index", format!("< {n} (size of axis {axis})"), index));
    }
    let mut out_dims = x.dims().to_vec();
    out_dims.remove(axis);
    Ok(MoveSpec { out_dims, elem_bytes, dtype: x.dtype() })
}

/// `concat(xs, axis)`: at least one tensor, all of the first one's plain dtype and rank,
/// `axis < rank`, and every dim but `axis` equal to the first one's.
pub fn concat(xs: &[Tensor], axis: usize) -> Result<MoveSpec> {
    const OP: &str = "concat";
    let Some(first) = xs.first() else {
        return Err(Error::value(OP, "xs", "at least one tensor", "an empty list"));
    };
    let elem_bytes = plain_elem_bytes(OP, "xs[0]", first)?;
    check::axis(OP, axis, first.rank())?;
    let mut total = 0usize;
    for (i, x) in xs.iter().enumerate() {
        check::same_dtype(OP, &format!("xs[{i}]"), first, x)?;
        let agrees = x.rank() == first.rank()
            && x.dims().iter().zip(first.dims()).enumerate().all(|(a, (m, n))| a == axis || m == n);
        if !agrees {
            let mut want: Vec<String> = first.dims().iter().map(|d| d.to_string()).collect();
            want[axis] = "*".into();
            return Err(Error::shape(OP, format!("xs[{i}]"), format!("[{}]", want.join(", ")), x.shape()));
        }
        total += x.dims()[axis];
    }
    let mut out_dims = first.dims().to_vec();
    out_dims[axis] = total;
    Ok(MoveSpec { out_dims, elem_bytes, dtype: first.dtype() })
}

/// Source strides (in elements) that broadcast `from` to `to` (numpy rules: `from` is
/// aligned to the right, missing leading dims and size-1 dims repeat with stride 0), or
/// `None` when `from` does not broadcast to `to`.
pub fn broadcast_strides(from: &Shape, to: &[usize]) -> Option<Vec<usize>> {
    let lead = to.len().checked_sub(from.rank())?;
    let from_strides = from.strides();
    let mut strides = vec![0usize; to.len()];
    for (a, (&d, &s)) in from.dims().iter().zip(&from_strides).enumerate() {
        let target = to[lead + a];
        if d == target {
            strides[lead + a] = s;
        } else if d != 1 {
            return None;
        }
    }
    Some(strides)
}

/// A validated broadcast of x to a target shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpandSpec {
    /// x's stride (in elements) along each target axis, 0 where x repeats.
    pub strides: Vec<usize>,
    /// Bytes per element (the dtype is plain).
    pub elem_bytes: usize,
    /// The dtype, kept by the output.
    pub dtype: DType,
}

/// `expand(x, shape)`: x of a plain dtype that broadcasts to `shape` (numpy rules).
pub fn expand(x: &Tensor, shape: &Shape) -> Result<ExpandSpec> {
    const OP: &str = "expand";
    let elem_bytes = plain_elem_bytes(OP, "x", x)?;
    let strides = broadcast_strides(x.shape(), shape.dims())
        .ok_or_else(|| Error::shape(OP, "target", format!("a shape that {} broadcasts to", x.shape()), shape))?;
    Ok(ExpandSpec { strides, elem_bytes, dtype: x.dtype() })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(dims: &[usize], dtype: DType) -> Tensor {
        Tensor::zeros(dims.to_vec(), dtype).unwrap()
    }

    #[test]
    fn permutations_and_moves_describe_their_output() {
        let x = t(&[2, 3, 4], DType::F16);
        let p = transpose(&x, 0, 2).unwrap();
        assert_eq!((p.perm, p.out_dims, p.elem_bytes), (vec![2, 1, 0], vec![4, 3, 2], 2));
        assert_eq!(slice(&x, 1, 1, 2).unwrap().out_dims, [2, 2, 4]);
        assert_eq!(select(&x, 2, 3).unwrap().out_dims, [2, 3]);
        let y = t(&[2, 5, 4], DType::F16);
        assert_eq!(concat(&[x.clone(), y], 1).unwrap().out_dims, [2, 8, 4]);
        let e = expand(&t(&[3, 1], DType::U32), &Shape::new(vec![2, 3, 5])).unwrap();
        assert_eq!((e.strides, e.elem_bytes), (vec![0, 1, 0], 4));
        let d = slice_backward(&t(&[2, 1, 4], DType::F32), &Shape::new(vec![2, 3, 4]), 1, 2).unwrap();
        assert_eq!(d.out_dims, [2, 3, 4]);
    }

    #[test]
    fn bad_layouts_name_the_argument() {
        let x = t(&[2, 3], DType::F32);
        let e = permute(&x, &[0, 0]).unwrap_err().to_string();
        assert!(e.contains("permute") && e.contains("perm"), "{e}");
        let e = transpose(&x, 0, 2).unwrap_err().to_string();
        assert!(e.contains("transpose") && e.contains("axis"), "{e}");
        let e = slice(&x, 1, 2, 2).unwrap_err().to_string();
        assert!(e.contains("slice") && e.contains("start + len"), "{e}");
        let e = select(&x, 0, 2).unwrap_err().to_string();
        assert!(e.contains("select") && e.contains("index"), "{e}");
        let e = concat(&[x.clone(), t(&[3, 3], DType::F32)], 0).map(|_| ());
        assert!(e.is_ok());
        let e = concat(&[x.clone(), t(&[2, 4], DType::F32)], 0).unwrap_err().to_string();
        assert!(e.contains("concat") && e.contains("xs[1]"), "{e}");
        assert!(concat(&[], 0).is_err());
        let e = expand(&x, &Shape::new(vec![3, 3])).unwrap_err().to_string();
        assert!(e.contains("expand") && e.contains("broadcasts"), "{e}");
        let e = permute(&t(&[2, 32], DType::Q8_0), &[1, 0]).unwrap_err().to_string();
        assert!(e.contains("plain dtype"), "{e}");
        let e = slice_backward(&t(&[2, 1], DType::U32), &Shape::new(vec![2, 3]), 1, 0).unwrap_err();
        assert!(e.to_string().contains("d_out"), "{e}");
    }

    #[test]
    fn reshape_keeps_the_element_count_and_whole_blocks() {
        assert!(reshape(&t(&[2, 6], DType::F32), &Shape::new(vec![3, 4])).is_ok());
        let e = reshape(&t(&[2, 6], DType::F32), &Shape::new(vec![5])).unwrap_err().to_string();
        assert!(e.contains("reshape") && e.contains("12 elements"), "{e}");
        let e = reshape(&t(&[2, 32], DType::Q8_0), &Shape::new(vec![4, 16])).unwrap_err().to_string();
        assert!(e.contains("blocks"), "{e}");
    }
}
