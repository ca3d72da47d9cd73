//! Cases of the reduce family: sum, mean, max, var, sum_abs (along an axis and over
//! everything), argmax, topk, max_backward, sum_to_shape. Shapes cover contiguous rows
//! (reduced axis last), strided columns (an inner axis), inner axes wider than one column
//! block, long rows split into blocks, and sizes large enough to run threaded; max and
//! argmax also see NaN, ±∞ and ties.

use fusebox::{ComputeBackend, DType, Op, Shape, Tensor};

use crate::array::Array;
use crate::case::{Case, GradCase, Input, OpCase};
use crate::reference::layout as layout_twin;
use crate::reference::reduce as twin;
use crate::rng::Rng;
use crate::tolerance::Tolerance;

const FLOATS: &[DType] = &[DType::F32, DType::F16, DType::BF16];

/// A float tensor of `dims`, uniform in [-1, 1), seeded by `seed`.
fn data(seed: u64, dims: &[usize]) -> Tensor {
    Rng::new(seed).normal_ish(dims.to_vec())
}

/// Values on a grid of 0.25 in [-1, 1]: many exact ties (first-index rules are exercised).
fn coarse(seed: u64, dims: &[usize]) -> Tensor {
    let v: Vec<f32> = data(seed, dims).to_vec_f32().expect("f32").iter().map(|x| (x * 4.0).round() / 4.0).collect();
    Tensor::from_vec(v, dims.to_vec()).expect("shape")
}

/// Distinct values (a shuffled grid 0.05 apart), for finite differences through a max.
fn distinct(seed: u64, dims: &[usize]) -> Tensor {
    let n: usize = dims.iter().product();
    let mut rng = Rng::new(seed);
    let mut v: Vec<f32> = (0..n).map(|i| i as f32 * 0.05 - 1.0).collect();
    for i in (1..n).rev() {
        v.swap(i, rng.below(i + 1));
    }
    Tensor::from_vec(v, dims.to_vec()).expect("shape")
}

/// Tolerance of a sum of `n` terms of size ≤ 1 accumulated in f32.
fn sum_tolerance(n: usize) -> Tolerance {
    Tolerance { abs: 1e-5_f64.max(4e-8 * n as f64), rel: 1e-4 }
}

/// The reduction shapes: (dims, axis, dtypes).
fn reduction_configs() -> Vec<(Vec<usize>, Option<usize>, &'static [DType])> {
    vec![
        (vec![7, 37], Some(1), FLOATS),
        (vec![5, 19, 13], Some(1), FLOATS),
        (vec![5, 19, 13], Some(0), FLOATS),
        (vec![5, 19, 13], Some(2), FLOATS),
        (vec![5, 19, 13], None, FLOATS),
        (vec![23], Some(0), FLOATS),
        (vec![3, 1100], Some(0), FLOATS),
        (vec![2, 20011], Some(1), &[DType::F32]),
        (vec![20011, 3], Some(0), &[DType::F32]),
        (vec![96, 401], None, &[DType::F32]),
        (vec![64, 700], Some(0), &[DType::F32]),
    ]
}

type ReduceCall<B> = fn(&B, &Tensor, Option<usize>) -> fusebox::Result<Tensor>;

/// Forward cases of one axis reduction over every configuration, plus bad axes.
fn axis_reduction<B: ComputeBackend + ?Sized + 'static>(
    op: Op,
    call: ReduceCall<B>,
    reference: fn(&Array, Option<usize>) -> Array,
    tolerance: fn(usize) -> Tolerance,
) -> Vec<Case<B>> {
    let mut cases = Vec::new();
    for (i, (dims, axis, dtypes)) in reduction_configs().into_iter().enumerate() {
        let n = axis.map_or(dims.iter().product(), |a| dims[a]);
        cases.extend(
            OpCase::new(op, format!("{} x{dims:?} axis={axis:?}", op.name()))
                .input(Input::new(data(1000 + i as u64, &dims)).shape_free())
                .call(move |b: &B, t| Ok(vec![call(b, &t[0], axis)?]))
                .twin(move |a| vec![reference(&a[0], axis)])
                .tolerance(tolerance(n))
                .dtypes(dtypes)
                .build(),
        );
    }
    cases.push(Case::expect_error(op, format!("{} x[3,4] axis=Some(2) (axis ≥ rank)", op.name()), move |b: &B| {
        call(b, &data(1100, &[3, 4]), Some(2))?;
        Ok(())
    }));
    cases
}

fn argmax_cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let mut cases = Vec::new();
    let configs: [(&[usize], usize, &[DType], bool); 8] = [
        (&[7, 37], 1, FLOATS, false),
        (&[5, 19, 13], 1, FLOATS, false),
        (&[5, 19, 13], 0, FLOATS, false),
        (&[6, 29], 1, &[DType::F32], true),
        (&[9, 2, 1100], 0, &[DType::F32], true),
        (&[40011], 0, &[DType::F32], false),
        (&[3000, 20], 0, &[DType::F32], false),
        // Long rows of ties: the first maximum must win across blocks of a row.
        (&[2, 40000], 1, &[DType::F32], true),
    ];
    for (i, (dims, axis, dtypes, ties)) in configs.into_iter().enumerate() {
        let x = if ties { coarse(1200 + i as u64, dims) } else { data(1200 + i as u64, dims) };
        cases.extend(
            OpCase::new(Op::Argmax, format!("x{dims:?} axis={axis}{}", if ties { " with ties" } else { "" }))
                .input(Input::new(x).shape_free())
                .call(move |b: &B, t| Ok(vec![b.argmax(&t[0], axis)?]))
                .twin(move |a| vec![twin::argmax(&a[0], axis)])
                .tolerance(Tolerance::EXACT)
                .dtypes(dtypes)
                .build(),
        );
    }
    cases.push(Case::expect_error(Op::Argmax, "x[3,4] axis=2 (axis ≥ rank)", |b: &B| {
        b.argmax(&data(1210, &[3, 4]), 2)?;
        Ok(())
    }));
    cases.push(Case::expect_error(Op::Argmax, "x[3,0] axis=1 (empty axis)", |b: &B| {
        b.argmax(&Tensor::zeros([3, 0], DType::F32)?, 1)?;
        Ok(())
    }));
    cases
}

/// Values of a topk input.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Values {
    Random,
    /// On a coarse grid: many ties.
    Ties,
    /// Increasing along each row: every element beats the current k-th (the worst case
    /// of a scan, which falls back to selection).
    Ascending,
}

fn topk_input(seed: u64, dims: &[usize], values: Values) -> Tensor {
    match values {
        Values::Random => data(seed, dims),
        Values::Ties => coarse(seed, dims),
        Values::Ascending => {
            let n = dims[dims.len() - 1];
            let v: Vec<f32> = (0..dims.iter().product::<usize>()).map(|i| (i % n) as f32 / n as f32).collect();
            Tensor::from_vec(v, dims.to_vec()).expect("shape")
        }
    }
}

fn topk_cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let mut cases = Vec::new();
    let configs: [(&[usize], usize, &[DType], Values); 12] = [
        (&[5, 37], 3, FLOATS, Values::Random),
        (&[5, 37], 37, FLOATS, Values::Random),
        (&[4, 9], 0, FLOATS, Values::Random),
        (&[4, 200], 40, FLOATS, Values::Random),
        (&[2, 3, 50], 5, FLOATS, Values::Random),
        (&[6, 45], 10, &[DType::F32], Values::Ties),
        (&[3, 80], 50, &[DType::F32], Values::Ties),
        (&[3, 600], 300, FLOATS, Values::Random),
        (&[2, 700], 257, &[DType::F32], Values::Ties),
        (&[2, 3000], 100, &[DType::F32], Values::Ascending),
        (&[2, 1000], 1, &[DType::F32], Values::Ascending),
        (&[40, 1000], 8, &[DType::F32], Values::Random),
    ];
    for (i, (dims, k, dtypes, values)) in configs.into_iter().enumerate() {
        let x = topk_input(1300 + i as u64, dims, values);
        cases.extend(
            OpCase::new(Op::Topk, format!("x{dims:?} k={k} values {values:?}"))
                .input(Input::new(x).shape_free())
                .call(move |b: &B, t| {
                    let r = b.topk(&t[0], k)?;
                    Ok(vec![r.values, r.indices])
                })
                .twin(move |a| {
                    let (values, indices) = twin::topk(&a[0], k);
                    vec![values, indices]
                })
                .tolerance(Tolerance::EXACT)
                .dtypes(dtypes)
                .build(),
        );
    }
    cases.push(Case::expect_error(Op::Topk, "x[3,5] k=6 (k > N)", |b: &B| {
        b.topk(&data(1310, &[3, 5]), 6)?;
        Ok(())
    }));
    cases.push(Case::expect_error(Op::Topk, "x[] k=1 (a scalar has no last dim)", |b: &B| {
        b.topk(&data(1311, &[]), 1)?;
        Ok(())
    }));
    cases
}

fn max_backward_cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let mut cases = Vec::new();
    // Gradient checks on distinct values; the axis is not the last so that a grown input
    // no longer matches d_out.
    for (i, (dims, axis)) in [(vec![3, 5, 4], 1), (vec![4, 6], 0)].into_iter().enumerate() {
        cases.extend(
            GradCase::new(Op::MaxBackward, format!("x{dims:?} axis={axis} (distinct values)"))
                .input(distinct(1400 + i as u64, &dims))
                .forward(move |a| twin::max(&a[0], Some(axis)))
                .backward_twin(move |a, dy| vec![twin::max_backward(&a[0], dy, axis)])
                .backward_call(move |b: &B, t, dy| Ok(vec![b.max_backward(&t[0], dy, axis)?]))
                .tolerance(Tolerance::EXACT)
                .build(),
        );
    }
    // Forward checks per dtype with ties (first arg-max wins), the last axis, a threaded size.
    let configs: [(&[usize], usize, &[DType]); 4] = [
        (&[6, 29], 1, FLOATS),
        (&[4, 7, 9], 1, FLOATS),
        (&[5, 3, 1100], 0, &[DType::F32]),
        (&[300, 200], 1, &[DType::F32]),
    ];
    for (i, (dims, axis, dtypes)) in configs.into_iter().enumerate() {
        let mut dy_dims = dims.to_vec();
        dy_dims.remove(axis);
        cases.extend(
            OpCase::new(Op::MaxBackward, format!("x{dims:?} axis={axis} with ties"))
                .input(coarse(1410 + i as u64, dims))
                .input(data(1420 + i as u64, &dy_dims))
                .call(move |b: &B, t| Ok(vec![b.max_backward(&t[0], &t[1], axis)?]))
                .twin(move |a| vec![twin::max_backward(&a[0], &a[1], axis)])
                .tolerance(Tolerance::EXACT)
                .dtypes(dtypes)
                .no_bad_inputs()
                .build(),
        );
    }
    cases.push(Case::expect_error(Op::MaxBackward, "x[3,4] axis=2 (axis ≥ rank)", |b: &B| {
        b.max_backward(&data(1430, &[3, 4]), &data(1431, &[3]), 2)?;
        Ok(())
    }));
    cases.push(Case::expect_error(Op::MaxBackward, "x[3,4] axis=1 d_out[4] (d_out shape)", |b: &B| {
        b.max_backward(&data(1432, &[3, 4]), &data(1433, &[4]), 1)?;
        Ok(())
    }));
    cases
}

fn sum_to_shape_cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let mut cases = Vec::new();
    // Gradient checks: sum_to_shape is the backward of expand.
    let grads: [(&[usize], &[usize]); 3] = [(&[3, 1, 5], &[2, 3, 4, 5]), (&[4], &[3, 2, 4]), (&[1, 6], &[4, 6])];
    for (i, (small, big)) in grads.into_iter().enumerate() {
        cases.extend(
            GradCase::new(Op::SumToShape, format!("x{small:?} expanded to {big:?}"))
                .input(Input::new(data(1500 + i as u64, small)).dtype_free())
                .forward(move |a| layout_twin::expand(&a[0], big))
                .backward_twin(|a, dy| vec![twin::sum_to_shape(dy, &a[0].shape)])
                .backward_call(|b: &B, t, dy| Ok(vec![b.sum_to_shape(dy, t[0].shape())?]))
                .build(),
        );
    }
    // Forward checks per dtype; a target whose last dim is 1 accepts a grown input, so
    // those configurations generate no bad inputs.
    let configs: [(&[usize], &[usize], &[DType]); 9] = [
        (&[2, 3, 4, 5], &[3, 1, 5], FLOATS),
        (&[7, 9], &[1], FLOATS),
        (&[7, 9], &[7, 1], FLOATS),
        (&[4, 5], &[5], FLOATS),
        (&[4, 5], &[4, 5], FLOATS),
        (&[3, 4, 5, 6], &[3, 1, 5, 1], FLOATS),
        (&[200, 300], &[300], &[DType::F32]),
        (&[200, 300], &[200, 1], &[DType::F32]),
        (&[3000, 20], &[1, 20], &[DType::F32]),
    ];
    for (i, (from, to, dtypes)) in configs.into_iter().enumerate() {
        let target = Shape::new(to.to_vec());
        let summed = from.iter().product::<usize>() / to.iter().product::<usize>().max(1);
        let case = OpCase::new(Op::SumToShape, format!("x{from:?} -> {to:?}"))
            .input(data(1510 + i as u64, from))
            .call(move |b: &B, t| Ok(vec![b.sum_to_shape(&t[0], &target)?]))
            .twin(move |a| vec![twin::sum_to_shape(&a[0], to)])
            .tolerance(sum_tolerance(summed))
            .dtypes(dtypes);
        cases.extend(if to.last() == Some(&1) { case.no_bad_inputs() } else { case }.build());
    }
    let bad: [(&[usize], &[usize]); 3] = [(&[4, 5], &[3]), (&[5], &[2, 5]), (&[4, 5], &[2, 5])];
    for (from, to) in bad {
        cases.push(Case::expect_error(
            Op::SumToShape,
            format!("x{from:?} -> {to:?} (target does not broadcast to x)"),
            move |b: &B| {
                b.sum_to_shape(&data(1520, from), &Shape::new(to.to_vec()))?;
                Ok(())
            },
        ));
    }
    cases
}

/// `max` and `argmax` over fibres holding NaN (skipped), ±∞ and tied maxima, along rows
/// (the reduced axis last) and columns. No fibre's maximum is −∞ with a NaN before it
/// (the CPU's row and column paths differ there).
fn special_value_cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let (rows, cols) = (6, 9);
    let mut v = data(1500, &[rows, cols]).to_vec_f32().expect("f32");
    v[3] = f32::NAN; // row 0: one NaN
    v[cols..2 * cols].fill(f32::NAN); // row 1: all NaN (max −∞, arg-max 0)
    v[2 * cols + 5] = f32::INFINITY; // row 2: +∞ twice (the first wins)
    v[2 * cols + 7] = f32::INFINITY;
    v[3 * cols] = f32::NEG_INFINITY; // row 3: −∞ among finite values
    v[4 * cols + 2] = f32::NAN; // row 4: NaN and −∞ before a finite maximum
    v[4 * cols + 4] = f32::NEG_INFINITY;
    let x = Tensor::from_vec(v, [rows, cols]).expect("shape");
    let mut cases = Vec::new();
    for axis in [0, 1] {
        let config = format!("x[{rows}, {cols}] axis={axis} with NaN (skipped), ±inf and ties");
        cases.extend(
            OpCase::new(Op::Max, format!("max {config}"))
                .input(Input::new(x.clone()).shape_free())
                .call(move |b: &B, t| Ok(vec![b.max(&t[0], Some(axis))?]))
                .twin(move |a| vec![twin::max(&a[0], Some(axis))])
                .tolerance(Tolerance::EXACT)
                .dtypes(FLOATS)
                .no_bad_inputs()
                .build(),
        );
        cases.extend(
            OpCase::new(Op::Argmax, format!("argmax {config}"))
                .input(Input::new(x.clone()).shape_free())
                .call(move |b: &B, t| Ok(vec![b.argmax(&t[0], axis)?]))
                .twin(move |a| vec![twin::argmax(&a[0], axis)])
                .tolerance(Tolerance::EXACT)
                .dtypes(FLOATS)
                .no_bad_inputs()
                .build(),
        );
    }
    cases
}

/// Every case of the family.
pub fn cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let mut cases = Vec::new();
    cases.extend(axis_reduction::<B>(Op::Sum, |b, x, a| b.sum(x, a), twin::sum, sum_tolerance));
    cases.extend(axis_reduction::<B>(Op::Mean, |b, x, a| b.mean(x, a), twin::mean, |_| Tolerance::F32));
    cases.extend(axis_reduction::<B>(Op::Max, |b, x, a| b.max(x, a), twin::max, |_| Tolerance::EXACT));
    cases.extend(axis_reduction::<B>(Op::Var, |b, x, a| b.var(x, a), twin::var, |_| Tolerance::F32));
    cases.extend(axis_reduction::<B>(Op::SumAbs, |b, x, a| b.sum_abs(x, a), twin::sum_abs, sum_tolerance));
    cases.extend(argmax_cases());
    cases.extend(special_value_cases());
    cases.extend(topk_cases());
    cases.extend(max_backward_cases());
    cases.extend(sum_to_shape_cases());
    cases
}
