//! Cases of the softmax family: softmax and log-softmax along the last dim (the fast
//! path) and along inner dims (the strided path, with partial column tiles), in F32,
//! F16 and BF16, rows and columns of all −∞, the backward by finite differences along
//! the last dim and dim 0, and bad axes.

use fusebox::{ComputeBackend, DType, Op, Tensor};

use crate::case::{Case, GradCase, Input, OpCase};
use crate::reference::softmax as twin;
use crate::rng::Rng;
use crate::tolerance::Tolerance;

const ALL_FLOATS: &[DType] = &[DType::F32, DType::F16, DType::BF16];
/// F32 results: probabilities of long rows are ~1e-3, so the absolute part must be small.
const TIGHT: Tolerance = Tolerance { abs: 1e-7, rel: 1e-4 };

/// `(shape, dim)`: last dim with a 16-lane tail, an odd last dim, an inner dim of 13, two
/// column tiles (64 + 36), a 3-d middle dim, and two sizes > 32768 elements (threaded),
/// one per path.
const LAYOUTS: &[(&[usize], usize)] = &[
    (&[4, 1000], 1),
    (&[3, 4099], 1),
    (&[5, 7, 13], 1),
    (&[70, 100], 0),
    (&[2, 3, 40], 2),
    (&[2, 9, 33], 1),
    (&[40, 1000], 1),
    (&[300, 200], 0),
];

/// `x[4, 37]` with row 1 all −∞ and row 2 half −∞ (masked attention-like rows).
fn masked_rows() -> Tensor {
    let mut rng = Rng::new(0x3a5c);
    let mut v = rng.vec(4 * 37, -5.0, 5.0);
    for j in 0..37 {
        v[37 + j] = f32::NEG_INFINITY;
        if j % 2 == 0 {
            v[2 * 37 + j] = f32::NEG_INFINITY;
        }
    }
    Tensor::from_vec(v, [4, 37]).expect("length matches")
}

/// `x[37, 70]` with column 3 and column 66 all −∞ and column 5 half −∞ (the strided path).
fn masked_columns() -> Tensor {
    let mut rng = Rng::new(0x3a5d);
    let mut v = rng.vec(37 * 70, -5.0, 5.0);
    for i in 0..37 {
        v[i * 70 + 3] = f32::NEG_INFINITY;
        v[i * 70 + 66] = f32::NEG_INFINITY;
        if i % 2 == 1 {
            v[i * 70 + 5] = f32::NEG_INFINITY;
        }
    }
    Tensor::from_vec(v, [37, 70]).expect("length matches")
}

fn forward_cases<B: ComputeBackend + ?Sized + 'static>(log: bool) -> Vec<Case<B>> {
    let (op, name) = if log { (Op::LogSoftmax, "log_softmax") } else { (Op::Softmax, "softmax") };
    let mut rng = Rng::new(if log { 0x1050 } else { 0x5050 });
    let mut inputs: Vec<(String, Tensor, usize)> = LAYOUTS
        .iter()
        .map(|&(shape, dim)| (format!("{name} x{shape:?} dim={dim} in [-10, 10)"), rng.tensor(shape, -10.0, 10.0), dim))
        .collect();
    inputs.push((format!("{name} x[4, 37] dim=1, row 1 all -inf, row 2 half -inf"), masked_rows(), 1));
    inputs.push((format!("{name} x[37, 70] dim=0, columns 3, 66 all -inf, column 5 half -inf"), masked_columns(), 0));
    let mut cases = Vec::new();
    for (k, (config, x, dim)) in inputs.into_iter().enumerate() {
        let mut case = OpCase::<B>::new(op, config)
            .input(Input::new(x).shape_free())
            .call(move |b, t| Ok(vec![if log { b.log_softmax(&t[0], dim)? } else { b.softmax(&t[0], dim)? }]))
            .twin(move |a| vec![if log { twin::log_softmax(&a[0], dim) } else { twin::softmax(&a[0], dim) }])
            .dtypes(ALL_FLOATS)
            .tolerance(TIGHT);
        if k > 0 {
            case = case.no_bad_inputs();
        }
        cases.extend(case.build());
    }
    cases.push(Case::expect_error(op, format!("{name} x[4, 5] dim=2 (rank 2)"), move |b: &B| {
        let x = b.upload(&Tensor::from_vec(vec![0.0f32; 20], [4, 5])?)?;
        if log { b.log_softmax(&x, 2) } else { b.softmax(&x, 2) }.map(|_| ())
    }));
    cases.push(Case::expect_error(op, format!("{name} scalar x, dim=0"), move |b: &B| {
        let x = b.upload(&Tensor::scalar(1.0))?;
        if log { b.log_softmax(&x, 0) } else { b.softmax(&x, 0) }.map(|_| ())
    }));
    cases
}

fn backward_cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let mut rng = Rng::new(0xbac5);
    let mut cases = Vec::new();
    for (shape, dim) in [([3usize, 8usize], 1usize), ([5, 4], 0)] {
        cases.extend(
            GradCase::<B>::new(Op::SoftmaxBackward, format!("softmax x{shape:?} dim={dim} (y = backend softmax)"))
                .input(rng.tensor(shape, -3.0, 3.0))
                .forward(move |a| twin::softmax(&a[0], dim))
                .backward_twin(move |a, d| vec![twin::softmax_backward(&twin::softmax(&a[0], dim), d, dim)])
                .backward_call(move |b, t, d| {
                    let y = b.softmax(&t[0], dim)?;
                    Ok(vec![b.softmax_backward(&y, d, dim)?])
                })
                .build(),
        );
    }
    // The backward on its own at large sizes: any y satisfies the formula, softmax output or not.
    for &(shape, dim) in &[(&[40usize, 1000usize][..], 1usize), (&[300, 200], 0), (&[3, 4099], 1), (&[5, 7, 13], 1)] {
        cases.extend(
            OpCase::<B>::new(Op::SoftmaxBackward, format!("softmax_backward y{shape:?} dy{shape:?} dim={dim}"))
                .input(rng.tensor(shape, 0.0, 0.05))
                .input(rng.tensor(shape, -1.0, 1.0))
                .call(move |b, t| Ok(vec![b.softmax_backward(&t[0], &t[1], dim)?]))
                .twin(move |a| vec![twin::softmax_backward(&a[0], &a[1], dim)])
                .dtypes(ALL_FLOATS)
                .tolerance(TIGHT)
                .no_bad_inputs()
                .build(),
        );
    }
    cases.push(Case::expect_error(Op::SoftmaxBackward, "softmax_backward y[4, 5] dim=2 (rank 2)", |b: &B| {
        let y = b.upload(&Tensor::from_vec(vec![0.2f32; 20], [4, 5])?)?;
        b.softmax_backward(&y, &y, 2).map(|_| ())
    }));
    cases
}

/// Every case of the family.
pub fn cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let mut cases = forward_cases(false);
    cases.extend(forward_cases(true));
    cases.extend(backward_cases());
    cases
}
