//! Cases of the matmul family: matmul (every transpose combination, batched, with a
//! shared 2-d b), its backward, batched_matmul, linear (+ backward) and head_prefix_matmul.
//! Sizes avoid multiples of 16 (vector tails); the large ones cross the threading threshold.

use fusebox::{ComputeBackend, DType, Op, Result as FbResult, Tensor};

use crate::array::Array;
use crate::case::{catch, Case, CaseKind, GradCase, Input, OpCase};
use crate::reference::matmul as twin;
use crate::rng::Rng;
use crate::tolerance::Tolerance;

const ALL: &[DType] = &[DType::F32, DType::F16, DType::BF16];

/// Dims of a test tensor, and the dtypes a configuration runs with (for config tables).
type Dims = &'static [usize];
type DTypes = &'static [DType];

/// A reproducible uniform [-1, 1) f32 tensor (seeded by its shape and a salt).
fn rand(dims: &[usize], salt: u64) -> Tensor {
    let seed = dims.iter().fold(salt.wrapping_mul(0x9E37_79B9), |h, &d| h.wrapping_mul(31).wrapping_add(d as u64));
    Rng::new(seed).normal_ish(dims.to_vec())
}

fn cast(t: &Tensor, dtype: DType) -> Tensor {
    Tensor::from_f32_as(&t.to_vec_f32().expect("float tensor"), t.shape().clone(), dtype).expect("float dtype")
}

type BackwardCall<B> = dyn Fn(&B, &[Tensor], &Tensor) -> FbResult<Vec<Tensor>> + Send + Sync;
type BackwardTwin = dyn Fn(&[Array], &Array) -> Vec<Array> + Send + Sync;

/// The backend's backward against the twin's at a size too large for finite differences,
/// or in F16/BF16 (inputs and d_out rounded to `dtype`; the twin sees the rounded values).
fn backward_vs_twin<B: ComputeBackend + ?Sized + 'static>(
    op: Op,
    config: String,
    inputs: Vec<Tensor>,
    d_out_dims: &[usize],
    dtype: DType,
    call: Box<BackwardCall<B>>,
    twin: Box<BackwardTwin>,
) -> Case<B> {
    let inputs: Vec<Tensor> = inputs.iter().map(|t| cast(t, dtype)).collect();
    let d_out = cast(&rand(d_out_dims, 7), dtype);
    let tol = Tolerance::for_dtype(dtype).max(Tolerance::F32_LOOSE);
    Case::custom(op, CaseKind::Backward, format!("{config} | {dtype} | backend vs twin"), move |b: &B| {
        let up: Vec<Tensor> = inputs.iter().map(|t| b.upload(t)).collect::<FbResult<_>>().map_err(|e| e.to_string())?;
        let dy = b.upload(&d_out).map_err(|e| e.to_string())?;
        let got = catch(|| call(b, &up, &dy))?.map_err(|e| format!("returned an error: {e}"))?;
        let arrays: Vec<Array> = inputs.iter().map(Array::from_tensor).collect();
        let want = twin(&arrays, &Array::from_tensor(&d_out));
        if got.len() != want.len() {
            return Err(format!("{} gradients, twin has {}", got.len(), want.len()));
        }
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            let g = Array::from_tensor(&b.to_host(g).map_err(|e| e.to_string())?);
            tol.check(&format!("gradient {i}"), &g, w)?;
        }
        Ok(())
    })
}

/// Forward cases of `matmul` (and its generated bad inputs). Growing the last dim of an
/// operand changes k (an error) unless that dim is m of a transposed a or n of a plain b.
fn matmul_forward<B: ComputeBackend + ?Sized + 'static>(
    a_dims: &[usize],
    b_dims: &[usize],
    ta: bool,
    tb: bool,
    dtypes: &[DType],
) -> Vec<Case<B>> {
    let a = Input::new(rand(a_dims, 1));
    let b = Input::new(rand(b_dims, 2));
    let a = if ta { a.shape_free() } else { a };
    let b = if tb { b } else { b.shape_free() };
    OpCase::new(Op::Matmul, format!("matmul a{a_dims:?} b{b_dims:?} transpose_a={ta} transpose_b={tb}"))
        .input(a)
        .input(b)
        .call(move |be: &B, t| Ok(vec![be.matmul(&t[0], &t[1], ta, tb)?]))
        .twin(move |x| vec![twin::matmul(&x[0], &x[1], ta, tb)])
        .tolerance(Tolerance::F32_LOOSE)
        .dtypes(dtypes)
        .build()
}

fn matmul_backward_call<B: ComputeBackend + ?Sized>(ta: bool, tb: bool) -> Box<BackwardCall<B>> {
    Box::new(move |be: &B, t: &[Tensor], d: &Tensor| {
        let g = be.matmul_backward(&t[0], &t[1], d, ta, tb)?;
        Ok(vec![g.da, g.db])
    })
}

fn matmul_backward_twin(ta: bool, tb: bool) -> Box<BackwardTwin> {
    Box::new(move |x: &[Array], d: &Array| {
        let (da, db) = twin::matmul_backward(&x[0], &x[1], d, ta, tb);
        vec![da, db]
    })
}

/// Finite-difference check of the twin's backward, backend against twin, and bad inputs.
fn matmul_grad<B: ComputeBackend + ?Sized + 'static>(
    a_dims: &[usize],
    b_dims: &[usize],
    ta: bool,
    tb: bool,
) -> Vec<Case<B>> {
    let call = matmul_backward_call::<B>(ta, tb);
    let bw = matmul_backward_twin(ta, tb);
    GradCase::new(
        Op::MatmulBackward,
        format!("matmul_backward a{a_dims:?} b{b_dims:?} transpose_a={ta} transpose_b={tb}"),
    )
    .input(rand(a_dims, 3))
    .input(rand(b_dims, 4))
    .forward(move |x| twin::matmul(&x[0], &x[1], ta, tb))
    .backward_twin(move |x, d| bw(x, d))
    .backward_call(move |be: &B, t, d| call(be, t, d))
    .build()
}

/// Backend backward against the twin only (large sizes, or F16/BF16).
fn matmul_backward_large<B: ComputeBackend + ?Sized + 'static>(
    a_dims: &[usize],
    b_dims: &[usize],
    ta: bool,
    tb: bool,
    dtype: DType,
) -> Case<B> {
    let (ra, rb) = (a_dims.len(), b_dims.len());
    let m = if ta { a_dims[ra - 1] } else { a_dims[ra - 2] };
    let n = if tb { b_dims[rb - 2] } else { b_dims[rb - 1] };
    let mut d_out = a_dims[..ra - 2].to_vec();
    d_out.extend([m, n]);
    backward_vs_twin(
        Op::MatmulBackward,
        format!("matmul_backward a{a_dims:?} b{b_dims:?} transpose_a={ta} transpose_b={tb}"),
        vec![rand(a_dims, 5), rand(b_dims, 6)],
        &d_out,
        dtype,
        matmul_backward_call::<B>(ta, tb),
        matmul_backward_twin(ta, tb),
    )
}

fn matmul_cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let mut cases = Vec::new();
    for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
        let a: &[usize] = if ta { &[7, 5] } else { &[5, 7] };
        let b: &[usize] = if tb { &[9, 7] } else { &[7, 9] };
        cases.extend(matmul_forward(a, b, ta, tb, ALL));
        // Batched with a 2-d b shared by every batch.
        let a: &[usize] = if ta { &[2, 3, 17, 13] } else { &[2, 3, 13, 17] };
        let b: &[usize] = if tb { &[19, 17] } else { &[17, 19] };
        cases.extend(matmul_forward(a, b, ta, tb, ALL));
    }
    // Batched with batched b (rank 4), and products spread over threads by batch.
    cases.extend(matmul_forward(&[2, 3, 5, 7], &[2, 3, 7, 4], false, false, ALL));
    cases.extend(matmul_forward(&[6, 33, 24], &[6, 20, 33], true, true, &[DType::F32]));
    // Large enough for gemm's own threads: one product, and a shared b folded into the rows.
    cases.extend(matmul_forward(&[100, 72], &[72, 90], false, false, ALL));
    cases.extend(matmul_forward(&[100, 72], &[90, 72], false, true, &[DType::F32]));
    cases.extend(matmul_forward(&[4, 50, 72], &[72, 90], false, false, &[DType::F32]));
    cases.extend(matmul_forward(&[3, 72, 100], &[90, 72], true, true, &[DType::F32]));
    // Degenerate sizes: k = 0 gives zeros, m = 0 an empty result.
    cases.extend(matmul_forward(&[3, 0], &[0, 4], false, false, &[DType::F32]));
    cases.extend(matmul_forward(&[2, 0, 5], &[5, 4], false, false, &[DType::F32]));

    let t = |d: &[usize]| rand(d, 9);
    cases.push(Case::expect_error(Op::Matmul, "matmul k mismatch a[4,5] b[6,3]", move |b: &B| {
        b.matmul(&t(&[4, 5]), &t(&[6, 3]), false, false).map(drop)
    }));
    cases.push(Case::expect_error(Op::Matmul, "matmul batch mismatch a[2,3,4,5] b[3,3,5,6]", move |b: &B| {
        b.matmul(&t(&[2, 3, 4, 5]), &t(&[3, 3, 5, 6]), false, false).map(drop)
    }));
    cases.push(Case::expect_error(Op::Matmul, "matmul batched b with 2-d a: a[4,5] b[2,5,3]", move |b: &B| {
        b.matmul(&t(&[4, 5]), &t(&[2, 5, 3]), false, false).map(drop)
    }));
    cases.push(Case::expect_error(Op::Matmul, "matmul rank-1 a[5] b[5,3]", move |b: &B| {
        b.matmul(&t(&[5]), &t(&[5, 3]), false, false).map(drop)
    }));
    cases.push(Case::expect_error(Op::Matmul, "matmul mixed dtypes a f32 b f16", move |b: &B| {
        b.matmul(&t(&[4, 5]), &cast(&t(&[5, 3]), DType::F16), false, false).map(drop)
    }));
    cases
}

fn matmul_backward_cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let mut cases = Vec::new();
    for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
        let a: &[usize] = if ta { &[4, 3] } else { &[3, 4] };
        let b: &[usize] = if tb { &[2, 4] } else { &[4, 2] };
        cases.extend(matmul_grad(a, b, ta, tb));
        // Batched, b shared: db sums over the batch.
        let a: &[usize] = if ta { &[2, 4, 3] } else { &[2, 3, 4] };
        let b: &[usize] = if tb { &[3, 4] } else { &[4, 3] };
        cases.extend(matmul_grad(a, b, ta, tb));
    }
    cases.extend(matmul_grad(&[2, 3, 4], &[2, 2, 4], false, true));
    // Larger, against the twin only: folded and accumulated shared-b reductions, threads.
    cases.push(matmul_backward_large(&[4, 40, 36], &[36, 30], false, false, DType::F32));
    cases.push(matmul_backward_large(&[4, 36, 40], &[30, 36], true, true, DType::F32));
    cases.push(matmul_backward_large(&[100, 72], &[72, 90], false, false, DType::F32));
    cases.push(matmul_backward_large(&[5, 60, 50], &[5, 60, 45], true, false, DType::F32));
    for dtype in [DType::F16, DType::BF16] {
        cases.push(matmul_backward_large(&[3, 9, 13], &[11, 13], false, true, dtype));
        cases.push(matmul_backward_large(&[13, 9], &[13, 11], true, false, dtype));
    }
    let t = |d: &[usize]| rand(d, 10);
    cases.push(Case::expect_error(Op::MatmulBackward, "matmul_backward d_out batch mismatch", move |b: &B| {
        b.matmul_backward(&t(&[2, 3, 4]), &t(&[4, 5]), &t(&[3, 3, 5]), false, false).map(drop)
    }));
    cases.push(Case::expect_error(
        Op::MatmulBackward,
        "matmul_backward d_out dtype f16 with f32 inputs",
        move |b: &B| {
            b.matmul_backward(&t(&[3, 4]), &t(&[4, 5]), &cast(&t(&[3, 5]), DType::F16), false, false).map(drop)
        },
    ));
    cases
}

fn batched_matmul_cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let mut cases = Vec::new();
    let configs: [(Dims, Dims, bool, bool, DTypes); 5] = [
        (&[3, 5, 7], &[3, 7, 6], false, false, ALL),
        (&[3, 7, 5], &[3, 6, 7], true, true, ALL),
        (&[2, 9, 11], &[2, 3, 11], false, true, &[DType::F32]),
        // Many small products: split over threads by batch.
        (&[8, 24, 33], &[8, 33, 20], false, false, &[DType::F32, DType::BF16]),
        // Large products: each uses gemm's threads.
        (&[2, 72, 100], &[2, 72, 90], true, false, &[DType::F32]),
    ];
    for (ad, bd, ta, tb, dtypes) in configs {
        let a = Input::new(rand(ad, 11));
        let b = Input::new(rand(bd, 12));
        let a = if ta { a.shape_free() } else { a };
        let b = if tb { b } else { b.shape_free() };
        cases.extend(
            OpCase::new(Op::BatchedMatmul, format!("batched_matmul a{ad:?} b{bd:?} transpose_a={ta} transpose_b={tb}"))
                .input(a)
                .input(b)
                .call(move |be: &B, t| Ok(vec![be.batched_matmul(&t[0], &t[1], ta, tb)?]))
                .twin(move |x| vec![twin::batched_matmul(&x[0], &x[1], ta, tb)])
                .tolerance(Tolerance::F32_LOOSE)
                .dtypes(dtypes)
                .build(),
        );
    }
    let t = |d: &[usize]| rand(d, 13);
    cases.push(Case::expect_error(
        Op::BatchedMatmul,
        "batched_matmul batch mismatch a[3,4,5] b[2,5,6]",
        move |b: &B| b.batched_matmul(&t(&[3, 4, 5]), &t(&[2, 5, 6]), false, false).map(drop),
    ));
    cases.push(Case::expect_error(Op::BatchedMatmul, "batched_matmul rank-2 b a[3,4,5] b[5,6]", move |b: &B| {
        b.batched_matmul(&t(&[3, 4, 5]), &t(&[5, 6]), false, false).map(drop)
    }));
    cases.push(Case::expect_error(Op::BatchedMatmul, "batched_matmul rank-4 a", move |b: &B| {
        b.batched_matmul(&t(&[1, 3, 4, 5]), &t(&[1, 3, 5, 6]), false, false).map(drop)
    }));
    cases
}

fn linear_forward_cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let mut cases = Vec::new();
    let configs: [(Dims, Dims, bool, DTypes); 5] = [
        (&[2, 5, 13], &[11, 13], true, ALL),
        (&[7, 19], &[21, 19], false, ALL),
        (&[13], &[5, 13], true, &[DType::F32]),
        // One product over every row, large enough for gemm's threads.
        (&[4, 25, 72], &[90, 72], true, &[DType::F32, DType::BF16]),
        (&[100, 72], &[90, 72], false, &[DType::F32]),
    ];
    for (xd, wd, with_bias, dtypes) in configs {
        let mut case = OpCase::new(Op::LinearForward, format!("linear_forward x{xd:?} w{wd:?} bias={with_bias}"))
            .input(rand(xd, 21))
            .input(rand(wd, 22));
        if with_bias {
            case = case
                .input(rand(&wd[..1], 23))
                .call(|be: &B, t| Ok(vec![be.linear_forward(&t[0], &t[1], Some(&t[2]))?]))
                .twin(|x| vec![twin::linear_forward(&x[0], &x[1], Some(&x[2]))]);
        } else {
            case = case
                .call(|be: &B, t| Ok(vec![be.linear_forward(&t[0], &t[1], None)?]))
                .twin(|x| vec![twin::linear_forward(&x[0], &x[1], None)]);
        }
        cases.extend(case.tolerance(Tolerance::F32_LOOSE).dtypes(dtypes).build());
    }
    let t = |d: &[usize]| rand(d, 24);
    cases.push(Case::expect_error(Op::LinearForward, "linear_forward bias f16 with f32 x", move |b: &B| {
        b.linear_forward(&t(&[3, 4]), &t(&[5, 4]), Some(&cast(&t(&[5]), DType::F16))).map(drop)
    }));
    cases.push(Case::expect_error(Op::LinearForward, "linear_forward w rank 3", move |b: &B| {
        b.linear_forward(&t(&[3, 4]), &t(&[1, 5, 4]), None).map(drop)
    }));
    cases.push(Case::expect_error(Op::LinearForward, "linear_forward scalar x", move |b: &B| {
        b.linear_forward(&Tensor::scalar(1.0), &t(&[5, 1]), None).map(drop)
    }));
    cases
}

fn linear_backward_call<B: ComputeBackend + ?Sized>(with_bias: bool) -> Box<BackwardCall<B>> {
    Box::new(move |be: &B, t: &[Tensor], d: &Tensor| {
        let g = be.linear_backward(&t[0], &t[1], d, with_bias)?;
        let mut out = vec![g.dx, g.dweight];
        match (with_bias, g.dbias) {
            (true, Some(db)) => out.push(db),
            (false, None) => {}
            (true, None) => return Err(fusebox::Error::value("linear_backward", "dbias", "Some", "None")),
            (false, Some(_)) => return Err(fusebox::Error::value("linear_backward", "dbias", "None", "Some")),
        }
        Ok(out)
    })
}

fn linear_backward_twin(with_bias: bool) -> Box<BackwardTwin> {
    Box::new(move |x: &[Array], d: &Array| {
        let (dx, dw, db) = twin::linear_backward(&x[0], &x[1], d, with_bias);
        let mut out = vec![dx, dw];
        out.extend(db);
        out
    })
}

fn linear_backward_cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let mut cases = Vec::new();
    for (xd, wd, with_bias) in [(&[2usize, 3, 4][..], &[3usize, 4][..], true), (&[3, 5][..], &[2, 5][..], false)] {
        let call = linear_backward_call::<B>(with_bias);
        let bw = linear_backward_twin(with_bias);
        let mut case = GradCase::new(Op::LinearBackward, format!("linear_backward x{xd:?} w{wd:?} bias={with_bias}"))
            .input(rand(xd, 31))
            .input(rand(wd, 32));
        if with_bias {
            // linear_backward does not read the bias: any bias shape or dtype is valid to it.
            case = case
                .input(Input::new(rand(&wd[..1], 33)).shape_free().dtype_free())
                .forward(|x| twin::linear_forward(&x[0], &x[1], Some(&x[2])));
        } else {
            case = case.forward(|x| twin::linear_forward(&x[0], &x[1], None));
        }
        cases
            .extend(case.backward_twin(move |x, d| bw(x, d)).backward_call(move |be: &B, t, d| call(be, t, d)).build());
    }
    let large: [(Dims, Dims, bool, DType); 5] = [
        (&[4, 30, 72], &[90, 72], true, DType::F32),
        // More than one block of columns for dbias, summed on several threads.
        (&[120, 7], &[300, 7], true, DType::F32),
        (&[100, 72], &[90, 72], false, DType::F32),
        (&[3, 7, 13], &[11, 13], true, DType::F16),
        (&[3, 7, 13], &[11, 13], true, DType::BF16),
    ];
    for (xd, wd, with_bias, dtype) in large {
        let mut dy = xd.to_vec();
        *dy.last_mut().unwrap() = wd[0];
        cases.push(backward_vs_twin(
            Op::LinearBackward,
            format!("linear_backward x{xd:?} w{wd:?} bias={with_bias}"),
            vec![rand(xd, 34), rand(wd, 35)],
            &dy,
            dtype,
            linear_backward_call::<B>(with_bias),
            linear_backward_twin(with_bias),
        ));
    }
    let t = |d: &[usize]| rand(d, 36);
    cases.push(Case::expect_error(Op::LinearBackward, "linear_backward d_out rows mismatch", move |b: &B| {
        b.linear_backward(&t(&[3, 4]), &t(&[5, 4]), &t(&[2, 5]), true).map(drop)
    }));
    cases
}

/// `linear_backward_accumulate` against its twin: the gradients start from random values
/// (so "added onto" is checked, not just "written"), with and without a bias, on one
/// size that takes the threaded GEMM.
fn linear_backward_accumulate_cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let mut cases = Vec::new();
    let configs: [(Dims, Dims, bool); 3] =
        [(&[2, 3, 4], &[3, 4], true), (&[5, 7], &[6, 7], false), (&[4, 30, 72], &[90, 72], true)];
    for (xd, wd, with_bias) in configs {
        let mut dy = xd.to_vec();
        *dy.last_mut().unwrap() = wd[0];
        let mut case = OpCase::new(
            Op::LinearBackwardAccumulate,
            format!("linear_backward_accumulate x{xd:?} w{wd:?} bias={with_bias}"),
        )
        .input(rand(xd, 41))
        .input(rand(wd, 42))
        .input(rand(&dy, 43))
        .input(rand(wd, 44));
        if with_bias {
            case = case.input(rand(&wd[..1], 45));
        }
        cases.extend(
            case.call(move |b: &B, t| {
                let mut dw = b.copy(&t[3])?;
                let mut db = t.get(4).map(|db| b.copy(db)).transpose()?;
                let dx = b.linear_backward_accumulate(&t[0], &t[1], &t[2], &mut dw, db.as_mut())?;
                Ok([dx, dw].into_iter().chain(db).collect())
            })
            .twin(|a| {
                let (dx, dw, db) = twin::linear_backward_accumulate(&a[0], &a[1], &a[2], &a[3], a.get(4));
                [dx, dw].into_iter().chain(db).collect()
            })
            .dtypes(ALL)
            .build(),
        );
    }
    let t = |d: &[usize]| rand(d, 46);
    cases.push(Case::custom(
        Op::LinearBackwardAccumulate,
        CaseKind::BadInput,
        "linear_backward_accumulate into a dweight with a live clone: Error::SharedStorage, dweight unchanged",
        move |b: &B| {
            let up = |d: &[usize]| b.upload(&t(d)).map_err(|e| e.to_string());
            let (x, w, dy) = (up(&[3, 4])?, up(&[5, 4])?, up(&[3, 5])?);
            let mut dw = up(&[5, 4])?;
            let before = b.to_host(&dw).and_then(|h| h.to_vec_f32()).map_err(|e| e.to_string())?;
            let reader = dw.clone();
            match b.linear_backward_accumulate(&x, &w, &dy, &mut dw, None) {
                Err(fusebox::Error::SharedStorage { .. }) => {}
                Err(e) => return Err(format!("expected Error::SharedStorage, got {e}")),
                Ok(_) => return Err("wrote through a tensor whose storage is shared".into()),
            }
            let after = b.to_host(&reader).and_then(|h| h.to_vec_f32()).map_err(|e| e.to_string())?;
            if after != before {
                return Err("dweight changed although the call failed".into());
            }
            Ok(())
        },
    ));
    cases
}

/// The BF16-operand linear ops against the f64 twins of the f32 ones on BF16-rounded
/// inputs (the products are exact; only the f32 accumulation differs). Finite
/// differences do not apply: rounding the operands makes the op piecewise constant in
/// them, so the backward is checked against the f32 backward's twin on the same rounded
/// values. Sizes with edge tiles in every dimension and one that takes the threads.
fn linear_bf16_cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let mut cases = Vec::new();
    let configs: [(Dims, Dims, bool); 4] = [
        (&[2, 3, 4], &[3, 4], true),
        (&[5, 7], &[6, 7], false),
        (&[4, 30, 72], &[90, 72], true),
        (&[100, 300], &[130, 300], false),
    ];
    for (xd, wd, with_bias) in configs {
        let mut dy = xd.to_vec();
        *dy.last_mut().unwrap() = wd[0];
        let mut forward =
            OpCase::new(Op::LinearForwardBf16, format!("linear_forward_bf16 x{xd:?} w{wd:?} bias={with_bias}"))
                .input(rand(xd, 51))
                .input(rand(wd, 52));
        let mut backward = OpCase::new(
            Op::LinearBackwardAccumulateBf16,
            format!("linear_backward_accumulate_bf16 x{xd:?} w{wd:?} bias={with_bias}"),
        )
        .input(rand(xd, 53))
        .input(rand(wd, 54))
        .input(rand(&dy, 55))
        .input(rand(wd, 56));
        if with_bias {
            forward = forward.input(rand(&wd[..1], 57));
            backward = backward.input(rand(&wd[..1], 58));
        }
        cases.extend(
            forward
                .call(|b: &B, t| Ok(vec![b.linear_forward_bf16(&t[0], &t[1], t.get(2))?]))
                .twin(|a| vec![twin::linear_forward_bf16(&a[0], &a[1], a.get(2))])
                .dtypes(ALL)
                .build(),
        );
        cases.extend(
            backward
                .call(move |b: &B, t| {
                    let mut dw = b.copy(&t[3])?;
                    let mut db = t.get(4).map(|db| b.copy(db)).transpose()?;
                    let dx = b.linear_backward_accumulate_bf16(&t[0], &t[1], &t[2], &mut dw, db.as_mut())?;
                    Ok([dx, dw].into_iter().chain(db).collect())
                })
                .twin(|a| {
                    let (dx, dw, db) = twin::linear_backward_accumulate_bf16(&a[0], &a[1], &a[2], &a[3], a.get(4));
                    [dx, dw].into_iter().chain(db).collect()
                })
                .dtypes(ALL)
                .build(),
        );
    }
    let t = |d: &[usize]| rand(d, 59);
    cases.push(Case::expect_error(
        Op::LinearForwardBf16,
        "linear_forward_bf16 w [5, 3] for x [.., 4]",
        move |b: &B| b.linear_forward_bf16(&t(&[2, 4]), &t(&[5, 3]), None).map(drop),
    ));
    cases.push(Case::expect_error(
        Op::LinearBackwardAccumulateBf16,
        "linear_backward_accumulate_bf16 dweight [4, 4] for w [5, 4]",
        move |b: &B| {
            let mut dw = t(&[4, 4]);
            b.linear_backward_accumulate_bf16(&t(&[3, 4]), &t(&[5, 4]), &t(&[3, 5]), &mut dw, None).map(drop)
        },
    ));
    cases
}

fn head_prefix_cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let mut cases = Vec::new();
    let configs: [(Dims, Dims, usize, DTypes); 6] = [
        // GQA group 2, a prefix of the cache.
        (&[2, 4, 3, 8], &[2, 2, 10, 8], 7, ALL),
        // MQA (one kv head), the whole cache.
        (&[1, 3, 5, 6], &[1, 1, 9, 6], 9, ALL),
        // No sharing, decode step (Tq = 1), many small products over threads.
        (&[2, 8, 1, 32], &[2, 8, 120, 32], 100, &[DType::F32, DType::F16]),
        // Large products: gemm's threads per (batch, kv head).
        (&[1, 8, 20, 72], &[1, 2, 130, 72], 117, &[DType::F32]),
        // Empty prefix.
        (&[1, 2, 3, 4], &[1, 2, 5, 4], 0, &[DType::F32]),
        (&[1, 2, 3, 4], &[1, 1, 5, 4], 1, &[DType::F32]),
    ];
    for (qd, kd, len, dtypes) in configs {
        cases.extend(
            OpCase::new(Op::HeadPrefixMatmul, format!("head_prefix_matmul q{qd:?} k_cache{kd:?} len={len}"))
                .input(rand(qd, 41))
                .input(rand(kd, 42))
                .call(move |be: &B, t| Ok(vec![be.head_prefix_matmul(&t[0], &t[1], len)?]))
                .twin(move |x| vec![twin::head_prefix_matmul(&x[0], &x[1], len)])
                .tolerance(Tolerance::F32_LOOSE)
                .dtypes(dtypes)
                .build(),
        );
    }
    let t = |d: &[usize]| rand(d, 43);
    cases.push(Case::expect_error(Op::HeadPrefixMatmul, "head_prefix_matmul len 11 > capacity 10", move |b: &B| {
        b.head_prefix_matmul(&t(&[1, 2, 3, 4]), &t(&[1, 2, 10, 4]), 11).map(drop)
    }));
    cases.push(Case::expect_error(Op::HeadPrefixMatmul, "head_prefix_matmul Hq 3 % Hkv 2 != 0", move |b: &B| {
        b.head_prefix_matmul(&t(&[1, 3, 2, 4]), &t(&[1, 2, 6, 4]), 5).map(drop)
    }));
    cases.push(Case::expect_error(Op::HeadPrefixMatmul, "head_prefix_matmul zero kv heads", move |b: &B| {
        b.head_prefix_matmul(&t(&[1, 2, 2, 4]), &t(&[1, 0, 6, 4]), 0).map(drop)
    }));
    cases.push(Case::expect_error(Op::HeadPrefixMatmul, "head_prefix_matmul batch mismatch", move |b: &B| {
        b.head_prefix_matmul(&t(&[2, 2, 2, 4]), &t(&[1, 2, 6, 4]), 3).map(drop)
    }));
    cases.push(Case::expect_error(Op::HeadPrefixMatmul, "head_prefix_matmul rank-3 q", move |b: &B| {
        b.head_prefix_matmul(&t(&[2, 2, 4]), &t(&[1, 2, 6, 4]), 3).map(drop)
    }));
    cases
}

/// Every case of the family.
pub fn cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let mut cases = matmul_cases();
    cases.extend(matmul_backward_cases());
    cases.extend(batched_matmul_cases());
    cases.extend(linear_forward_cases());
    cases.extend(linear_backward_cases());
    cases.extend(linear_backward_accumulate_cases());
    cases.extend(linear_bf16_cases());
    cases.extend(head_prefix_cases());
    cases
}
