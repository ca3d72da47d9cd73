//! Cases of the elementwise family. Every op runs forward against its f64 twin in F32,
//! F16 and BF16 on a size with tails (7×143 = 1001 elements, rows not a multiple of 16)
//! and in F32 and F16 on one large enough for the threaded path (40×1031 = 41 240
//! elements, several chunks); bad shapes and dtypes are generated from the small case.
//! In-place ops also must refuse a tensor with a live clone and leave both unchanged, and
//! write only their own part of a partitioned buffer (16-bit parts sharing a word).

use fusebox::{ComputeBackend, DType, Error, Op, Result as FbResult, Shape, Tensor};

use crate::array::Array;
use crate::case::{Case, CaseKind, Input, OpCase};
use crate::reference::elementwise as twin;
use crate::rng::Rng;

const FLOATS: &[DType] = &[DType::F32, DType::F16, DType::BF16];
/// 1001 elements: rows of 143 leave a tail after every 16 lanes.
const SMALL: [usize; 2] = [7, 143];
/// 41 240 elements: above the serial threshold, spread over several chunks.
const LARGE: [usize; 2] = [40, 1031];

/// A half-open range input values are drawn from.
type Range = (f64, f64);
const ANY: Range = (-1.0, 1.0);
/// For log, sqrt and pow.
const POSITIVE: Range = (0.1, 2.0);
/// Denominators kept away from zero.
const DIVISOR: Range = (0.25, 2.0);

/// One tensor argument of an op, relative to the case's shape `[..., N]`.
#[derive(Clone, Copy)]
enum Arg {
    /// The full shape; must match the other full-shaped inputs.
    Full(Range),
    /// The full shape, but any shape is valid for it alone (single-input ops, the x of a
    /// column broadcast, whose last dim is free).
    Free(Range),
    /// `[N]`: a row broadcast over every row.
    Row(Range),
    /// `[rows]`: a column broadcast over every column.
    Col(Range),
}

fn make(rng: &mut Rng, shape: &[usize], arg: Arg) -> Input {
    let (last, rows) = (shape[shape.len() - 1], shape[..shape.len() - 1].iter().product::<usize>());
    match arg {
        Arg::Full((lo, hi)) => Input::new(rng.tensor(shape, lo, hi)),
        Arg::Free((lo, hi)) => Input::new(rng.tensor(shape, lo, hi)).shape_free(),
        Arg::Row((lo, hi)) => Input::new(rng.tensor([last], lo, hi)),
        Arg::Col((lo, hi)) => Input::new(rng.tensor([rows], lo, hi)),
    }
}

/// Forward cases of `op`: on [`SMALL`] in every float dtype with generated bad inputs,
/// and on [`LARGE`] in F32 and F16. `params` names the scalar parameters.
fn op_cases<B: ComputeBackend + ?Sized + 'static>(
    op: Op,
    params: &str,
    args: &[Arg],
    call: impl Fn(&B, &[Tensor]) -> FbResult<Vec<Tensor>> + Clone + Send + Sync + 'static,
    twin: impl Fn(&[Array]) -> Vec<Array> + Clone + Send + Sync + 'static,
) -> Vec<Case<B>> {
    let mut rng = Rng::new(0xE1E3_0000 ^ op as u64);
    let mut cases = Vec::new();
    let runs: [(&[usize], &[DType], bool); 2] = [(&SMALL, FLOATS, true), (&LARGE, &[DType::F32, DType::F16], false)];
    for (shape, dtypes, bad) in runs {
        let mut case = OpCase::new(op, format!("{op} x{shape:?} {params}").trim_end())
            .call(call.clone())
            .twin(twin.clone())
            .dtypes(dtypes);
        for &arg in args {
            case = case.input(make(&mut rng, shape, arg));
        }
        if !bad {
            case = case.no_bad_inputs();
        }
        cases.extend(case.build());
    }
    cases
}

/// Runs an in-place op on a fresh copy of `t[0]` (the uploaded inputs are shared, so not
/// writable themselves) and returns the copy.
fn on_copy<B: ComputeBackend + ?Sized>(
    b: &B,
    t: &[Tensor],
    op: impl FnOnce(&B, &mut Tensor) -> FbResult<()>,
) -> FbResult<Vec<Tensor>> {
    let mut a = b.copy(&t[0])?;
    op(b, &mut a)?;
    Ok(vec![a])
}

fn err(e: Error) -> String {
    e.to_string()
}

/// Property: `op` on a tensor with a live clone returns `Error::SharedStorage` and
/// leaves the tensor and its clone unchanged. `mutate` gets the tensor and a second input.
fn refuses_shared<B: ComputeBackend + ?Sized + 'static>(
    op: Op,
    mutate: impl Fn(&B, &mut Tensor, &Tensor) -> FbResult<()> + Send + Sync + 'static,
) -> Case<B> {
    let mut rng = Rng::new(0x5EA2_0000 ^ op as u64);
    let (x, y) = (rng.tensor(SMALL, POSITIVE.0, POSITIVE.1), rng.tensor(SMALL, DIVISOR.0, DIVISOR.1));
    let name = format!("{op} x{SMALL:?} with a live clone: Error::SharedStorage, both unchanged");
    Case::custom(op, CaseKind::Property, name, move |b: &B| {
        let before = x.to_vec_f32().map_err(err)?;
        let mut a = b.copy(&b.upload(&x).map_err(err)?).map_err(err)?;
        let y = b.upload(&y).map_err(err)?;
        let clone = a.clone();
        match mutate(b, &mut a, &y) {
            Err(Error::SharedStorage { .. }) => {}
            Err(e) => return Err(format!("expected Error::SharedStorage, got: {e}")),
            Ok(()) => return Err("wrote in place through a tensor with a live clone".into()),
        }
        for (what, t) in [("the tensor", &a), ("its clone", &clone)] {
            if b.to_host(t).map_err(err)?.to_vec_f32().map_err(err)? != before {
                return Err(format!("{what} changed although the op failed"));
            }
        }
        Ok(())
    })
}

/// Property: `add_assign` into one part of a partitioned buffer (a view at an offset,
/// as parameters and gradients live) writes that part and nothing else.
fn add_assign_into_partition<B: ComputeBackend + ?Sized + 'static>() -> Case<B> {
    let n = SMALL[0] * SMALL[1];
    let mut rng = Rng::new(0x9A27);
    let (first, second, y) = (rng.vec(n, -1.0, 1.0), rng.vec(n, -1.0, 1.0), rng.tensor(SMALL, -1.0, 1.0));
    let name = format!("add_assign into the second of two partitions of x{SMALL:?}");
    Case::custom(Op::AddAssign, CaseKind::Property, name, move |b: &B| {
        let big = Tensor::from_vec([first.clone(), second.clone()].concat(), [2 * n]).map_err(err)?;
        let mut parts = big.partition(&[Shape::new(SMALL), Shape::new(SMALL)]).map_err(err)?;
        b.add_assign(&mut parts[1], &y).map_err(|e| format!("returned an error: {e}"))?;
        let y = y.to_vec_f32().map_err(err)?;
        let want: Vec<f32> = second.iter().zip(&y).map(|(s, y)| s + y).collect();
        if parts[1].to_vec_f32().map_err(err)? != want {
            return Err("the written part does not hold x + y".into());
        }
        if parts[0].to_vec_f32().map_err(err)? != first {
            return Err("the neighbouring part changed".into());
        }
        Ok(())
    })
}

/// Property: `add_assign` into each of two parts of a buffer in the backend's memory, in
/// `dtype`, each part an odd number of elements: in F16/BF16 the first part ends inside
/// a storage word it shares with the second, which starts mid-word. Each write gives
/// the rounded `x + y` in its part and leaves the other part's bits as they were.
fn add_assign_into_device_partitions<B: ComputeBackend + ?Sized + 'static>(dtype: DType) -> Case<B> {
    let n = SMALL[0] * SMALL[1];
    let mut rng = Rng::new(0x9A28);
    let (first, second, y) = (rng.vec(n, -1.0, 1.0), rng.vec(n, -1.0, 1.0), rng.vec(n, -1.0, 1.0));
    let name = format!("add_assign into each of two device partitions of x{SMALL:?} (odd lengths) | {dtype}");
    Case::custom(Op::AddAssign, CaseKind::Property, name, move |b: &B| {
        let rounded = |v: &[f32]| Tensor::from_f32_as(v, [v.len()], dtype).and_then(|t| t.to_vec_f32()).map_err(err);
        let (first, second, y_host) = (rounded(&first)?, rounded(&second)?, rounded(&y)?);
        let sum = |a: &[f32]| rounded(&a.iter().zip(&y_host).map(|(a, y)| a + y).collect::<Vec<f32>>());
        let (first_sum, second_sum) = (sum(&first)?, sum(&second)?);
        let y = b.upload(&Tensor::from_f32_as(&y_host, SMALL, dtype).map_err(err)?).map_err(err)?;
        // The host tensor is a temporary, so the uploaded one (a clone on the CPU) is unique.
        let big =
            b.upload(&Tensor::from_f32_as(&[first.clone(), second.clone()].concat(), [2 * n], dtype).map_err(err)?);
        let mut parts = big.map_err(err)?.partition(&[Shape::new(SMALL), Shape::new(SMALL)]).map_err(err)?;
        let read = |t: &Tensor| b.to_host(t).and_then(|h| h.to_vec_f32()).map_err(err);
        for (k, want) in [(0, [&first_sum, &second]), (1, [&first_sum, &second_sum])] {
            b.add_assign(&mut parts[k], &y).map_err(|e| format!("part {k}: returned an error: {e}"))?;
            for (p, w) in want.iter().enumerate() {
                if read(&parts[p])? != **w {
                    let what = if p == k { "does not hold the rounded x + y" } else { "changed" };
                    return Err(format!("after the write into part {k}, part {p} {what}"));
                }
            }
        }
        Ok(())
    })
}

/// Forward cases of the row and column broadcasts on a rank-3 `x`, with the column as
/// `[rows]` and as x's shape without its last dim.
fn rank3_broadcasts<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let mut rng = Rng::new(0x3D);
    let x = rng.tensor([3, 5, 67], -1.0, 1.0);
    let row = rng.tensor([67], DIVISOR.0, DIVISOR.1);
    let col_flat = rng.tensor([15], DIVISOR.0, DIVISOR.1);
    let col_lead = rng.tensor([3, 5], DIVISOR.0, DIVISOR.1);
    let mut cases = OpCase::new(Op::MulRow, "mul_row x[3, 5, 67] row[67]")
        .input(x.clone())
        .input(row)
        .call(|b: &B, t| Ok(vec![b.mul_row(&t[0], &t[1])?]))
        .twin(|a| vec![twin::mul_row(&a[0], &a[1])])
        .dtypes(FLOATS)
        .build();
    for (col, desc) in [(col_flat, "col[15]"), (col_lead, "col[3, 5]")] {
        cases.extend(
            OpCase::new(Op::DivCol, format!("div_col x[3, 5, 67] {desc}"))
                .input(Input::new(x.clone()).shape_free())
                .input(col)
                .call(|b: &B, t| Ok(vec![b.div_col(&t[0], &t[1])?]))
                .twin(|a| vec![twin::div_col(&a[0], &a[1])])
                .dtypes(FLOATS)
                .build(),
        );
    }
    cases
}

/// `exp` over nearly all of f32's range (F32 only: the results overflow F16), and `pow`
/// through its shortcut exponents on inputs of both signs.
fn edge_values<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let mut rng = Rng::new(0xED6E);
    let mut cases = OpCase::new(Op::Exp, "exp x[1001] in [-100, 88)")
        .input(Input::new(rng.tensor([1001], -100.0, 88.0)).shape_free())
        .call(|b: &B, t| Ok(vec![b.exp(&t[0])?]))
        .twin(|a| vec![twin::exp(&a[0])])
        .no_bad_inputs()
        .build();
    for p in [1.0f32, 2.0] {
        cases.extend(
            OpCase::new(Op::Pow, format!("pow x[1001] in [-2, 2) p={p}"))
                .input(Input::new(rng.tensor([1001], -2.0, 2.0)).shape_free())
                .call(move |b: &B, t| Ok(vec![b.pow(&t[0], p)?]))
                .twin(move |a| vec![twin::pow(&a[0], p as f64)])
                .dtypes(FLOATS)
                .no_bad_inputs()
                .build(),
        );
    }
    cases
}

/// Bad values the shape/dtype generator cannot make.
fn bad_values<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let x = || Tensor::from_vec(vec![0.5f32; 12], [3, 4]).expect("12 values");
    let half = |dims: &[usize]| Tensor::from_f32_as(&vec![0.5; dims.iter().product()], dims, DType::F16);
    vec![
        Case::expect_error(Op::Clamp, "clamp lo > hi", move |b: &B| b.clamp(&x(), 1.0, -1.0).map(drop)),
        Case::expect_error(Op::Clamp, "clamp lo = NaN", move |b: &B| b.clamp(&x(), f32::NAN, 1.0).map(drop)),
        Case::expect_error(Op::Clamp, "clamp hi = NaN", move |b: &B| b.clamp(&x(), -1.0, f32::NAN).map(drop)),
        Case::expect_error(Op::ClampInplace, "clamp_inplace lo > hi", move |b: &B| {
            b.clamp_inplace(&mut b.copy(&x())?, 2.0, 1.0)
        }),
        Case::expect_error(Op::AddRow, "add_row x[3, 4] row[3] (too short)", move |b: &B| {
            b.add_row(&x(), &Tensor::from_vec(vec![1.0f32; 3], [3])?).map(drop)
        }),
        Case::expect_error(Op::AddRow, "add_row x[3, 4] row[1, 4] (rank 2)", move |b: &B| {
            b.add_row(&x(), &Tensor::from_vec(vec![1.0f32; 4], [1, 4])?).map(drop)
        }),
        Case::expect_error(Op::AddRow, "add_row x[] (scalar) row[1]", move |b: &B| {
            b.add_row(&Tensor::scalar(1.0), &Tensor::from_vec(vec![1.0f32], [1])?).map(drop)
        }),
        Case::expect_error(Op::SubCol, "sub_col x[3, 4] col[4] (length of a row, not of a column)", move |b: &B| {
            b.sub_col(&x(), &Tensor::from_vec(vec![1.0f32; 4], [4])?).map(drop)
        }),
        Case::expect_error(Op::SubCol, "sub_col x[3, 4] col[3, 1]", move |b: &B| {
            b.sub_col(&x(), &Tensor::from_vec(vec![1.0f32; 3], [3, 1])?).map(drop)
        }),
        Case::expect_error(Op::SubCol, "sub_col x[2, 3, 4] col[3, 2]", move |b: &B| {
            let x = Tensor::from_vec(vec![0.5f32; 24], [2, 3, 4])?;
            b.sub_col(&x, &Tensor::from_vec(vec![1.0f32; 6], [3, 2])?).map(drop)
        }),
        Case::expect_error(Op::Add, "add f32 + f16 (mixed dtypes)", move |b: &B| {
            b.add(&x(), &half(&[3, 4])?).map(drop)
        }),
        Case::expect_error(Op::AddAssign, "add_assign f32 += f16 (mixed dtypes)", move |b: &B| {
            b.add_assign(&mut b.copy(&x())?, &half(&[3, 4])?)
        }),
        Case::expect_error(Op::MulRow, "mul_row f32 x, f16 row (mixed dtypes)", move |b: &B| {
            b.mul_row(&x(), &half(&[4])?).map(drop)
        }),
        Case::expect_error(Op::Add3, "add3 f32, f32, f16 (mixed dtypes)", move |b: &B| {
            b.add3(&x(), &x(), &half(&[3, 4])?).map(drop)
        }),
    ]
}

/// Every case of the family.
pub fn cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    use Arg::{Col, Free, Full, Row};
    let mut c: Vec<Case<B>> = Vec::new();

    // Same-shape arithmetic.
    c.extend(op_cases(
        Op::Add,
        "",
        &[Full(ANY), Full(ANY)],
        |b: &B, t| Ok(vec![b.add(&t[0], &t[1])?]),
        |a| vec![twin::add(&a[0], &a[1])],
    ));
    c.extend(op_cases(
        Op::Sub,
        "",
        &[Full(ANY), Full(ANY)],
        |b: &B, t| Ok(vec![b.sub(&t[0], &t[1])?]),
        |a| vec![twin::sub(&a[0], &a[1])],
    ));
    c.extend(op_cases(
        Op::Mul,
        "",
        &[Full(ANY), Full(ANY)],
        |b: &B, t| Ok(vec![b.mul(&t[0], &t[1])?]),
        |a| vec![twin::mul(&a[0], &a[1])],
    ));
    c.extend(op_cases(
        Op::Div,
        "",
        &[Full(ANY), Full(DIVISOR)],
        |b: &B, t| Ok(vec![b.div(&t[0], &t[1])?]),
        |a| vec![twin::div(&a[0], &a[1])],
    ));

    // Scalar forms.
    c.extend(op_cases(
        Op::AddScalar,
        "s=-1.25",
        &[Free(ANY)],
        |b: &B, t| Ok(vec![b.add_scalar(&t[0], -1.25)?]),
        |a| vec![twin::add_scalar(&a[0], -1.25)],
    ));
    c.extend(op_cases(
        Op::SubScalar,
        "s=0.375",
        &[Free(ANY)],
        |b: &B, t| Ok(vec![b.sub_scalar(&t[0], 0.375)?]),
        |a| vec![twin::sub_scalar(&a[0], 0.375)],
    ));
    c.extend(op_cases(
        Op::MulScalar,
        "s=-3.5",
        &[Free(ANY)],
        |b: &B, t| Ok(vec![b.mul_scalar(&t[0], -3.5)?]),
        |a| vec![twin::mul_scalar(&a[0], -3.5)],
    ));
    c.extend(op_cases(
        Op::DivScalar,
        "s=0.3",
        &[Free(ANY)],
        |b: &B, t| Ok(vec![b.div_scalar(&t[0], 0.3)?]),
        |a| vec![twin::div_scalar(&a[0], 0.3f32 as f64)],
    ));

    // In place: a fresh copy of input 0 is updated and compared.
    c.extend(op_cases(
        Op::AddAssign,
        "",
        &[Full(ANY), Full(ANY)],
        |b: &B, t| on_copy(b, t, |b, a| b.add_assign(a, &t[1])),
        |a| vec![twin::add(&a[0], &a[1])],
    ));
    c.extend(op_cases(
        Op::SubAssign,
        "",
        &[Full(ANY), Full(ANY)],
        |b: &B, t| on_copy(b, t, |b, a| b.sub_assign(a, &t[1])),
        |a| vec![twin::sub(&a[0], &a[1])],
    ));
    c.extend(op_cases(
        Op::MulAssign,
        "",
        &[Full(ANY), Full(ANY)],
        |b: &B, t| on_copy(b, t, |b, a| b.mul_assign(a, &t[1])),
        |a| vec![twin::mul(&a[0], &a[1])],
    ));
    c.extend(op_cases(
        Op::DivAssign,
        "",
        &[Full(ANY), Full(DIVISOR)],
        |b: &B, t| on_copy(b, t, |b, a| b.div_assign(a, &t[1])),
        |a| vec![twin::div(&a[0], &a[1])],
    ));

    // Row and column broadcasts (x's last dim is free for a column: only its rows count).
    c.extend(op_cases(
        Op::AddRow,
        "",
        &[Full(ANY), Row(ANY)],
        |b: &B, t| Ok(vec![b.add_row(&t[0], &t[1])?]),
        |a| vec![twin::add_row(&a[0], &a[1])],
    ));
    c.extend(op_cases(
        Op::SubRow,
        "",
        &[Full(ANY), Row(ANY)],
        |b: &B, t| Ok(vec![b.sub_row(&t[0], &t[1])?]),
        |a| vec![twin::sub_row(&a[0], &a[1])],
    ));
    c.extend(op_cases(
        Op::MulRow,
        "",
        &[Full(ANY), Row(ANY)],
        |b: &B, t| Ok(vec![b.mul_row(&t[0], &t[1])?]),
        |a| vec![twin::mul_row(&a[0], &a[1])],
    ));
    c.extend(op_cases(
        Op::DivRow,
        "",
        &[Full(ANY), Row(DIVISOR)],
        |b: &B, t| Ok(vec![b.div_row(&t[0], &t[1])?]),
        |a| vec![twin::div_row(&a[0], &a[1])],
    ));
    c.extend(op_cases(
        Op::AddCol,
        "",
        &[Free(ANY), Col(ANY)],
        |b: &B, t| Ok(vec![b.add_col(&t[0], &t[1])?]),
        |a| vec![twin::add_col(&a[0], &a[1])],
    ));
    c.extend(op_cases(
        Op::SubCol,
        "",
        &[Free(ANY), Col(ANY)],
        |b: &B, t| Ok(vec![b.sub_col(&t[0], &t[1])?]),
        |a| vec![twin::sub_col(&a[0], &a[1])],
    ));
    c.extend(op_cases(
        Op::MulCol,
        "",
        &[Free(ANY), Col(ANY)],
        |b: &B, t| Ok(vec![b.mul_col(&t[0], &t[1])?]),
        |a| vec![twin::mul_col(&a[0], &a[1])],
    ));
    c.extend(op_cases(
        Op::DivCol,
        "",
        &[Free(ANY), Col(DIVISOR)],
        |b: &B, t| Ok(vec![b.div_col(&t[0], &t[1])?]),
        |a| vec![twin::div_col(&a[0], &a[1])],
    ));
    c.extend(rank3_broadcasts());

    // Fused forms.
    c.extend(op_cases(
        Op::Add3,
        "",
        &[Full(ANY), Full(ANY), Full(ANY)],
        |b: &B, t| Ok(vec![b.add3(&t[0], &t[1], &t[2])?]),
        |a| vec![twin::add3(&a[0], &a[1], &a[2])],
    ));
    c.extend(op_cases(
        Op::ExpMul,
        "y in [-3, 3)",
        &[Full(ANY), Full((-3.0, 3.0))],
        |b: &B, t| Ok(vec![b.exp_mul(&t[0], &t[1])?]),
        |a| vec![twin::exp_mul(&a[0], &a[1])],
    ));
    c.extend(op_cases(
        Op::SubMul,
        "",
        &[Full(ANY), Full(ANY), Full(ANY)],
        |b: &B, t| Ok(vec![b.sub_mul(&t[0], &t[1], &t[2])?]),
        |a| vec![twin::sub_mul(&a[0], &a[1], &a[2])],
    ));
    c.extend(op_cases(
        Op::AddScaled,
        "c=-0.7",
        &[Full(ANY), Full(ANY)],
        |b: &B, t| Ok(vec![b.add_scaled(&t[0], &t[1], -0.7)?]),
        |a| vec![twin::add_scaled(&a[0], &a[1], -0.7f32 as f64)],
    ));

    // Unary maths and their in-place forms.
    let exp_range = Free((-4.0, 4.0));
    c.extend(op_cases(
        Op::Exp,
        "x in [-4, 4)",
        &[exp_range],
        |b: &B, t| Ok(vec![b.exp(&t[0])?]),
        |a| vec![twin::exp(&a[0])],
    ));
    c.extend(op_cases(
        Op::ExpInplace,
        "x in [-4, 4)",
        &[exp_range],
        |b: &B, t| on_copy(b, t, |b, a| b.exp_inplace(a)),
        |a| vec![twin::exp(&a[0])],
    ));
    c.extend(op_cases(
        Op::Log,
        "x in [0.1, 2)",
        &[Free(POSITIVE)],
        |b: &B, t| Ok(vec![b.log(&t[0])?]),
        |a| vec![twin::log(&a[0])],
    ));
    c.extend(op_cases(
        Op::LogInplace,
        "x in [0.1, 2)",
        &[Free(POSITIVE)],
        |b: &B, t| on_copy(b, t, |b, a| b.log_inplace(a)),
        |a| vec![twin::log(&a[0])],
    ));
    c.extend(op_cases(
        Op::Sqrt,
        "x in [0.1, 2)",
        &[Free(POSITIVE)],
        |b: &B, t| Ok(vec![b.sqrt(&t[0])?]),
        |a| vec![twin::sqrt(&a[0])],
    ));
    c.extend(op_cases(
        Op::SqrtInplace,
        "x in [0.1, 2)",
        &[Free(POSITIVE)],
        |b: &B, t| on_copy(b, t, |b, a| b.sqrt_inplace(a)),
        |a| vec![twin::sqrt(&a[0])],
    ));
    for p in [2.5f32, -0.5] {
        c.extend(op_cases(
            Op::Pow,
            &format!("x in [0.1, 2) p={p}"),
            &[Free(POSITIVE)],
            move |b: &B, t| Ok(vec![b.pow(&t[0], p)?]),
            move |a| vec![twin::pow(&a[0], p as f64)],
        ));
        c.extend(op_cases(
            Op::PowInplace,
            &format!("x in [0.1, 2) p={p}"),
            &[Free(POSITIVE)],
            move |b: &B, t| on_copy(b, t, |b, a| b.pow_inplace(a, p)),
            move |a| vec![twin::pow(&a[0], p as f64)],
        ));
    }
    c.extend(op_cases(Op::Neg, "", &[Free(ANY)], |b: &B, t| Ok(vec![b.neg(&t[0])?]), |a| vec![twin::neg(&a[0])]));
    c.extend(op_cases(
        Op::NegInplace,
        "",
        &[Free(ANY)],
        |b: &B, t| on_copy(b, t, |b, a| b.neg_inplace(a)),
        |a| vec![twin::neg(&a[0])],
    ));
    c.extend(op_cases(Op::Abs, "", &[Free(ANY)], |b: &B, t| Ok(vec![b.abs(&t[0])?]), |a| vec![twin::abs(&a[0])]));
    c.extend(op_cases(
        Op::AbsInplace,
        "",
        &[Free(ANY)],
        |b: &B, t| on_copy(b, t, |b, a| b.abs_inplace(a)),
        |a| vec![twin::abs(&a[0])],
    ));
    c.extend(op_cases(
        Op::Clamp,
        "lo=-0.5 hi=0.25",
        &[Free(ANY)],
        |b: &B, t| Ok(vec![b.clamp(&t[0], -0.5, 0.25)?]),
        |a| vec![twin::clamp(&a[0], -0.5, 0.25)],
    ));
    c.extend(op_cases(
        Op::ClampInplace,
        "lo=-0.5 hi=0.25",
        &[Free(ANY)],
        |b: &B, t| on_copy(b, t, |b, a| b.clamp_inplace(a, -0.5, 0.25)),
        |a| vec![twin::clamp(&a[0], -0.5, 0.25)],
    ));
    c.extend(edge_values());

    // In-place ops refuse shared storage.
    c.push(refuses_shared(Op::AddAssign, |b: &B, a, y| b.add_assign(a, y)));
    c.push(refuses_shared(Op::SubAssign, |b: &B, a, y| b.sub_assign(a, y)));
    c.push(refuses_shared(Op::MulAssign, |b: &B, a, y| b.mul_assign(a, y)));
    c.push(refuses_shared(Op::DivAssign, |b: &B, a, y| b.div_assign(a, y)));
    c.push(refuses_shared(Op::ExpInplace, |b: &B, a, _| b.exp_inplace(a)));
    c.push(refuses_shared(Op::LogInplace, |b: &B, a, _| b.log_inplace(a)));
    c.push(refuses_shared(Op::SqrtInplace, |b: &B, a, _| b.sqrt_inplace(a)));
    c.push(refuses_shared(Op::PowInplace, |b: &B, a, _| b.pow_inplace(a, 1.5)));
    c.push(refuses_shared(Op::NegInplace, |b: &B, a, _| b.neg_inplace(a)));
    c.push(refuses_shared(Op::AbsInplace, |b: &B, a, _| b.abs_inplace(a)));
    c.push(refuses_shared(Op::ClampInplace, |b: &B, a, _| b.clamp_inplace(a, 0.5, 1.5)));
    c.push(add_assign_into_partition());
    c.extend(FLOATS.iter().map(|&d| add_assign_into_device_partitions(d)));

    c.extend(bad_values());
    c
}
