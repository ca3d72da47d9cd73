//! Cases of the norm family: every op against its f64 twin in F32, F16 and BF16, with
//! rows that are not multiples of 16, a case large enough for the threaded path and
//! several eps; the backwards by finite differences (tiny shapes), against the twin
//! with explicit saved statistics (threaded, partial dweight blocks), and bad inputs.

use fusebox::{ComputeBackend, DType, Op, Result as FbResult, Tensor};

use crate::array::Array;
use crate::case::{Case, CaseKind, GradCase, Input, OpCase};
use crate::cases::gdn_fixture;
use crate::reference::norm as twin;
use crate::rng::Rng;
use crate::tolerance::Tolerance;

const FLOATS: &[DType] = &[DType::F32, DType::F16, DType::BF16];

/// Every case of the family.
pub fn cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let mut cases = Vec::new();
    cases.extend(rms_norm_cases());
    cases.extend(rms_norm_backward_cases());
    cases.extend(layer_norm_cases());
    cases.extend(layer_norm_backward_cases());
    cases.extend(add_rms_norm_cases());
    cases.extend(rms_norm_gated_cases());
    cases.extend(rms_norm_gated_backward_cases());
    cases.extend(l2_norm_cases());
    cases.extend(l2_norm_backward_cases());
    cases.extend(gdn_fixture::norm_cases());
    cases.extend(rms_norm_channel_cases());
    cases.extend(group_norm_cases());
    cases.extend(adaln_modulate_cases());
    cases.extend(normalize_cases());
    cases
}

// ──────────────────────────────── helpers ─────────────────────────────────

/// A seeded generator per case configuration.
fn rng_for(tag: &str) -> Rng {
    Rng::new(tag.bytes().fold(0x5eed_u64, |h, b| h.wrapping_mul(31).wrapping_add(b as u64)))
}

/// An f32 tensor of `shape`, uniform in `[lo, hi)`.
fn uniform(rng: &mut Rng, shape: &[usize], lo: f64, hi: f64) -> Tensor {
    rng.tensor(shape.to_vec(), lo, hi)
}

/// A weight-like vector `[d]` near 1.
fn weight(rng: &mut Rng, d: usize) -> Tensor {
    rng.tensor([d], 0.5, 1.5)
}

/// `t` with row `row` of its `[rows, D]` view set to `value`.
fn with_row(t: &Tensor, row: usize, value: f32) -> Tensor {
    let mut v = t.to_vec_f32().expect("f32 tensor");
    let d = t.shape().last_dim();
    v[row * d..(row + 1) * d].fill(value);
    Tensor::from_vec(v, t.shape().clone()).expect("same shape")
}

/// A float tensor converted to `dtype`.
fn cast(t: &Tensor, dtype: DType) -> Tensor {
    Tensor::from_f32_as(&t.to_vec_f32().expect("float tensor"), t.shape().clone(), dtype).expect("float dtype")
}

/// Uploads host tensors to the backend under test.
fn up<B: ComputeBackend + ?Sized>(b: &B, ts: &[&Tensor]) -> FbResult<Vec<Tensor>> {
    ts.iter().map(|t| b.upload(t)).collect()
}

fn arr(t: &Tensor) -> Array {
    Array::from_tensor(t)
}

// ──────────────────────────────── rms_norm ─────────────────────────────────

fn rms_norm_cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let mut cases = Vec::new();
    let configs: &[(&[usize], f32, Option<usize>)] = &[
        (&[4, 67], 1e-5, None),
        (&[3, 1000], 1e-6, None),
        (&[2, 3, 16], 1e-2, None),
        (&[67], 1e-5, None),
        (&[3, 67], 1e-5, Some(1)),
        (&[40, 1000], 1e-5, None),
    ];
    for &(shape, eps, zero_row) in configs {
        let mut name = format!("x{shape:?} eps={eps:e}");
        let mut rng = rng_for(&name);
        let d = shape[shape.len() - 1];
        let mut x = uniform(&mut rng, shape, -1.0, 1.0);
        if let Some(r) = zero_row {
            x = with_row(&x, r, 0.0);
            name += &format!(" row {r} all zero");
        }
        let w = weight(&mut rng, d);
        cases.extend(
            OpCase::<B>::new(Op::RmsNorm, name)
                .input(x)
                .input(w)
                .call(move |b, t| {
                    let o = b.rms_norm(&t[0], &t[1], eps)?;
                    Ok(vec![o.output, o.rstd])
                })
                .twin(move |a| {
                    let (y, rstd) = twin::rms_norm(&a[0], &a[1], eps as f64);
                    vec![y, rstd]
                })
                .dtypes(FLOATS)
                .build(),
        );
    }
    let x = Tensor::from_vec(vec![0.5f32; 32], [4, 8]).expect("shape");
    let w = Tensor::from_vec(vec![1.0f32; 8], [8]).expect("shape");
    let (x2, w2) = (x.clone(), w.clone());
    cases.push(Case::<B>::expect_error(Op::RmsNorm, "rms_norm eps = -1", move |b| {
        let t = up(b, &[&x2, &w2])?;
        b.rms_norm(&t[0], &t[1], -1.0).map(|_| ())
    }));
    let (x2, w2) = (x.clone(), w.clone());
    cases.push(Case::<B>::expect_error(Op::RmsNorm, "rms_norm eps = NaN", move |b| {
        let t = up(b, &[&x2, &w2])?;
        b.rms_norm(&t[0], &t[1], f32::NAN).map(|_| ())
    }));
    let (x2, w2) = (x.clone(), cast(&w, DType::F16));
    cases.push(Case::<B>::expect_error(Op::RmsNorm, "rms_norm weight f16 with x f32 (mixed dtypes)", move |b| {
        let t = up(b, &[&x2, &w2])?;
        b.rms_norm(&t[0], &t[1], 1e-5).map(|_| ())
    }));
    let (x2, w2) = (Tensor::scalar(1.0), Tensor::from_vec(vec![1.0f32], [1]).expect("shape"));
    cases.push(Case::<B>::expect_error(Op::RmsNorm, "rms_norm x of rank 0", move |b| {
        let t = up(b, &[&x2, &w2])?;
        b.rms_norm(&t[0], &t[1], 1e-5).map(|_| ())
    }));
    let (x2, w2) = (Tensor::zeros([4, 0], DType::F32).expect("shape"), Tensor::zeros([0], DType::F32).expect("shape"));
    cases.push(Case::<B>::expect_error(Op::RmsNorm, "rms_norm x[4,0] (D = 0)", move |b| {
        let t = up(b, &[&x2, &w2])?;
        b.rms_norm(&t[0], &t[1], 1e-5).map(|_| ())
    }));
    cases
}

fn rms_norm_backward_cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let mut cases = Vec::new();
    // Finite differences on a tiny shape; the stats come from the forward of the same x.
    for &(shape, eps) in &[(&[3usize, 5][..], 1e-5f32), (&[2, 7][..], 1e-2)] {
        let name = format!("x{shape:?} eps={eps:e}");
        let mut rng = rng_for(&name);
        let d = shape[shape.len() - 1];
        let (x, w) = (uniform(&mut rng, shape, -1.0, 1.0), weight(&mut rng, d));
        let e = eps as f64;
        cases.extend(
            GradCase::<B>::new(Op::RmsNormBackward, name)
                .input(x)
                .input(w)
                .forward(move |a| twin::rms_norm(&a[0], &a[1], e).0)
                .backward_twin(move |a, dy| {
                    let (_, rstd) = twin::rms_norm(&a[0], &a[1], e);
                    let (dx, dw) = twin::rms_norm_backward(&a[0], &a[1], &rstd, dy);
                    vec![dx, dw]
                })
                .backward_call(move |b, t, dy| {
                    let rstd = b.rms_norm(&t[0], &t[1], eps)?.rstd;
                    let g = b.rms_norm_backward(&t[0], &t[1], &rstd, dy)?;
                    Ok(vec![g.dx, g.dweight])
                })
                .build(),
        );
    }
    // Against the twin with explicit saved rstd: tails, F16/BF16, many partial blocks.
    for shape in [&[4usize, 67][..], &[67][..], &[300, 67][..], &[64, 1000][..]] {
        let name = format!("x{shape:?} saved rstd");
        let mut rng = rng_for(&name);
        let d = shape[shape.len() - 1];
        let (x, w, dy) =
            (uniform(&mut rng, shape, -1.0, 1.0), weight(&mut rng, d), uniform(&mut rng, shape, -1.0, 1.0));
        let rstd = twin::rms_norm(&arr(&x), &arr(&w), 1e-5).1.to_tensor();
        cases.extend(
            OpCase::<B>::new(Op::RmsNormBackward, name)
                .input(x)
                .input(w)
                .input(Input::new(rstd).keep_f32().constant())
                .input(dy)
                .call(|b, t| {
                    let g = b.rms_norm_backward(&t[0], &t[1], &t[2], &t[3])?;
                    Ok(vec![g.dx, g.dweight])
                })
                .twin(|a| {
                    let (dx, dw) = twin::rms_norm_backward(&a[0], &a[1], &a[2], &a[3]);
                    vec![dx, dw]
                })
                .tolerance(Tolerance::F32_LOOSE)
                .dtypes(FLOATS)
                .build(),
        );
    }
    cases.push(determinism_case::<B>(Op::RmsNormBackward, [96, 333], |b, t| {
        let rstd = b.rms_norm(&t[0], &t[1], 1e-5)?.rstd;
        let g = b.rms_norm_backward(&t[0], &t[1], &rstd, &t[2])?;
        Ok(vec![g.dx, g.dweight])
    }));

    let mut rng = rng_for("rms_norm_backward bad");
    let (x, w, dy) =
        (uniform(&mut rng, &[4, 8], -1.0, 1.0), weight(&mut rng, 8), uniform(&mut rng, &[4, 8], -1.0, 1.0));
    let rstd = uniform(&mut rng, &[4], 0.5, 2.0);
    let bad: Vec<(&str, [Tensor; 4])> = vec![
        ("rstd [5] for x [4, 8]", [x.clone(), w.clone(), uniform(&mut rng, &[5], 0.5, 2.0), dy.clone()]),
        ("rstd [4, 1] for x [4, 8]", [x.clone(), w.clone(), uniform(&mut rng, &[4, 1], 0.5, 2.0), dy.clone()]),
        ("rstd f16 (saved statistics are f32)", [x.clone(), w.clone(), cast(&rstd, DType::F16), dy.clone()]),
        ("d_out f16 with x f32", [x.clone(), w.clone(), rstd.clone(), cast(&dy, DType::F16)]),
        ("weight bf16 with x f32", [x.clone(), cast(&w, DType::BF16), rstd.clone(), dy.clone()]),
        ("d_out [8, 4] for x [4, 8]", [x.clone(), w.clone(), rstd.clone(), dy.reshape([8, 4]).expect("same size")]),
    ];
    for (name, ts) in bad {
        cases.push(Case::<B>::expect_error(Op::RmsNormBackward, format!("rms_norm_backward {name}"), move |b| {
            let t = up(b, &[&ts[0], &ts[1], &ts[2], &ts[3]])?;
            b.rms_norm_backward(&t[0], &t[1], &t[2], &t[3]).map(|_| ())
        }));
    }
    cases
}

/// Property: two runs of a backward on a threaded-size input give bit-identical results
/// (the partial sums are combined in a fixed order). Inputs: x `shape`, weight, d_out.
fn determinism_case<B: ComputeBackend + ?Sized + 'static>(
    op: Op,
    shape: [usize; 2],
    run: impl Fn(&B, &[Tensor]) -> FbResult<Vec<Tensor>> + Send + Sync + 'static,
) -> Case<B> {
    let name = format!("x{shape:?}: two runs give bit-identical gradients");
    let mut rng = rng_for(&name);
    let ts = [
        uniform(&mut rng, &shape, -1.0, 1.0),
        weight(&mut rng, shape[1]),
        uniform(&mut rng, &shape, -1.0, 1.0),
        weight(&mut rng, shape[1]),
    ];
    Case::custom(op, CaseKind::Property, name, move |b: &B| {
        let t = up(b, &ts.iter().collect::<Vec<_>>()).map_err(|e| e.to_string())?;
        let first = run(b, &t).map_err(|e| e.to_string())?;
        let second = run(b, &t).map_err(|e| e.to_string())?;
        for (i, (p, q)) in first.iter().zip(&second).enumerate() {
            let p = b.to_host(p).and_then(|h| h.to_vec_f32()).map_err(|e| e.to_string())?;
            let q = b.to_host(q).and_then(|h| h.to_vec_f32()).map_err(|e| e.to_string())?;
            if p.iter().zip(&q).any(|(u, v)| u.to_bits() != v.to_bits()) {
                return Err(format!("output {i} differs between two identical runs"));
            }
        }
        Ok(())
    })
}

// ─────────────────────────────── layer_norm ────────────────────────────────

fn layer_norm_cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let mut cases = Vec::new();
    let configs: &[(&[usize], f32, Option<usize>)] = &[
        (&[4, 67], 1e-5, None),
        (&[3, 1000], 1e-6, None),
        (&[2, 3, 16], 1e-2, None),
        (&[67], 1e-5, None),
        (&[3, 67], 1e-5, Some(2)),
        (&[40, 1000], 1e-5, None),
    ];
    for &(shape, eps, constant_row) in configs {
        let mut name = format!("x{shape:?} (mean ≈ 1) eps={eps:e}");
        let mut rng = rng_for(&name);
        let d = shape[shape.len() - 1];
        // Rows with a mean far from zero: the variance must not cancel.
        let mut x = uniform(&mut rng, shape, -1.0, 3.0);
        if let Some(r) = constant_row {
            x = with_row(&x, r, 0.7);
            name += &format!(" row {r} constant");
        }
        let (w, bias) = (weight(&mut rng, d), uniform(&mut rng, &[d], -0.5, 0.5));
        cases.extend(
            OpCase::<B>::new(Op::LayerNorm, name)
                .input(x)
                .input(w)
                .input(bias)
                .call(move |b, t| {
                    let o = b.layer_norm(&t[0], &t[1], &t[2], eps)?;
                    let mean = o.mean.ok_or_else(|| fusebox::Error::unsupported("layer_norm", "no mean saved"))?;
                    Ok(vec![o.output, mean, o.rstd])
                })
                .twin(move |a| {
                    let (y, mean, rstd) = twin::layer_norm(&a[0], &a[1], &a[2], eps as f64);
                    vec![y, mean, rstd]
                })
                .dtypes(FLOATS)
                .build(),
        );
    }
    let mut rng = rng_for("layer_norm bad");
    let (x, w, bias) = (uniform(&mut rng, &[4, 8], -1.0, 1.0), weight(&mut rng, 8), uniform(&mut rng, &[8], -1.0, 1.0));
    let bad: Vec<(&str, [Tensor; 3], f32)> = vec![
        ("bias f16 with x f32", [x.clone(), w.clone(), cast(&bias, DType::F16)], 1e-5),
        ("eps = -1e-5", [x.clone(), w.clone(), bias.clone()], -1e-5),
        ("eps = +inf", [x.clone(), w.clone(), bias.clone()], f32::INFINITY),
        ("x of rank 0", [Tensor::scalar(1.0), w.clone(), bias.clone()], 1e-5),
    ];
    for (name, ts, eps) in bad {
        cases.push(Case::<B>::expect_error(Op::LayerNorm, format!("layer_norm {name}"), move |b| {
            let t = up(b, &[&ts[0], &ts[1], &ts[2]])?;
            b.layer_norm(&t[0], &t[1], &t[2], eps).map(|_| ())
        }));
    }
    cases
}

fn layer_norm_backward_cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let mut cases = Vec::new();
    for &(shape, eps) in &[(&[3usize, 5][..], 1e-5f32), (&[2, 6][..], 1e-2)] {
        let name = format!("x{shape:?} eps={eps:e}");
        let mut rng = rng_for(&name);
        let d = shape[shape.len() - 1];
        let x = uniform(&mut rng, shape, -1.0, 2.0);
        let (w, bias) = (weight(&mut rng, d), uniform(&mut rng, &[d], -0.5, 0.5));
        let e = eps as f64;
        cases.extend(
            GradCase::<B>::new(Op::LayerNormBackward, name)
                .input(x)
                .input(w)
                .input(bias)
                .forward(move |a| twin::layer_norm(&a[0], &a[1], &a[2], e).0)
                .backward_twin(move |a, dy| {
                    let (_, mean, rstd) = twin::layer_norm(&a[0], &a[1], &a[2], e);
                    let (dx, dw, db) = twin::layer_norm_backward(&a[0], &a[1], &mean, &rstd, dy);
                    vec![dx, dw, db]
                })
                .backward_call(move |b, t, dy| {
                    let fwd = b.layer_norm(&t[0], &t[1], &t[2], eps)?;
                    let mean = fwd.mean.ok_or_else(|| fusebox::Error::unsupported("layer_norm", "no mean saved"))?;
                    let g = b.layer_norm_backward(&t[0], &t[1], &mean, &fwd.rstd, dy)?;
                    let db = g.dbias.ok_or_else(|| fusebox::Error::unsupported("layer_norm_backward", "no dbias"))?;
                    Ok(vec![g.dx, g.dweight, db])
                })
                .build(),
        );
    }
    for shape in [&[4usize, 67][..], &[67][..], &[300, 67][..], &[64, 1000][..]] {
        let name = format!("x{shape:?} saved mean, rstd");
        let mut rng = rng_for(&name);
        let d = shape[shape.len() - 1];
        let x = uniform(&mut rng, shape, -1.0, 3.0);
        let (w, dy) = (weight(&mut rng, d), uniform(&mut rng, shape, -1.0, 1.0));
        let zeros = Array::zeros(vec![d]);
        let (_, mean, rstd) = twin::layer_norm(&arr(&x), &arr(&w), &zeros, 1e-5);
        cases.extend(
            OpCase::<B>::new(Op::LayerNormBackward, name)
                .input(x)
                .input(w)
                .input(Input::new(mean.to_tensor()).keep_f32().constant())
                .input(Input::new(rstd.to_tensor()).keep_f32().constant())
                .input(dy)
                .call(|b, t| {
                    let g = b.layer_norm_backward(&t[0], &t[1], &t[2], &t[3], &t[4])?;
                    let db = g.dbias.ok_or_else(|| fusebox::Error::unsupported("layer_norm_backward", "no dbias"))?;
                    Ok(vec![g.dx, g.dweight, db])
                })
                .twin(|a| {
                    let (dx, dw, db) = twin::layer_norm_backward(&a[0], &a[1], &a[2], &a[3], &a[4]);
                    vec![dx, dw, db]
                })
                .tolerance(Tolerance::F32_LOOSE)
                .dtypes(FLOATS)
                .build(),
        );
    }
    cases.push(determinism_case::<B>(Op::LayerNormBackward, [96, 333], |b, t| {
        let fwd = b.layer_norm(&t[0], &t[1], &t[3], 1e-5)?;
        let mean = fwd.mean.ok_or_else(|| fusebox::Error::unsupported("layer_norm", "no mean saved"))?;
        let g = b.layer_norm_backward(&t[0], &t[1], &mean, &fwd.rstd, &t[2])?;
        let db = g.dbias.ok_or_else(|| fusebox::Error::unsupported("layer_norm_backward", "no dbias"))?;
        Ok(vec![g.dx, g.dweight, db])
    }));

    let mut rng = rng_for("layer_norm_backward bad");
    let (x, w, dy) =
        (uniform(&mut rng, &[4, 8], -1.0, 1.0), weight(&mut rng, 8), uniform(&mut rng, &[4, 8], -1.0, 1.0));
    let (mean, rstd) = (uniform(&mut rng, &[4], -0.1, 0.1), uniform(&mut rng, &[4], 0.5, 2.0));
    let bad: Vec<(&str, [Tensor; 5])> = vec![
        ("mean [5] for x [4, 8]", [x.clone(), w.clone(), uniform(&mut rng, &[5], 0.0, 1.0), rstd.clone(), dy.clone()]),
        (
            "mean f16 (saved statistics are f32)",
            [x.clone(), w.clone(), cast(&mean, DType::F16), rstd.clone(), dy.clone()],
        ),
        ("rstd [3] for x [4, 8]", [x.clone(), w.clone(), mean.clone(), uniform(&mut rng, &[3], 0.5, 2.0), dy.clone()]),
        ("rstd [4, 8] for x [4, 8]", [x.clone(), w.clone(), mean.clone(), x.clone(), dy.clone()]),
        ("d_out bf16 with x f32", [x.clone(), w.clone(), mean.clone(), rstd.clone(), cast(&dy, DType::BF16)]),
        ("weight f16 with x f32", [x.clone(), cast(&w, DType::F16), mean.clone(), rstd.clone(), dy.clone()]),
    ];
    for (name, ts) in bad {
        cases.push(Case::<B>::expect_error(Op::LayerNormBackward, format!("layer_norm_backward {name}"), move |b| {
            let t = up(b, &[&ts[0], &ts[1], &ts[2], &ts[3], &ts[4]])?;
            b.layer_norm_backward(&t[0], &t[1], &t[2], &t[3], &t[4]).map(|_| ())
        }));
    }
    cases
}

// ────────────────────────────── add_rms_norm ───────────────────────────────

fn add_rms_norm_cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let mut cases = Vec::new();
    let configs: &[(&[usize], f32)] = &[(&[4, 67], 1e-5), (&[2, 3, 16], 1e-2), (&[3, 1000], 1e-6), (&[40, 1000], 1e-5)];
    for &(shape, eps) in configs {
        let name = format!("a, b{shape:?} eps={eps:e}");
        let mut rng = rng_for(&name);
        let d = shape[shape.len() - 1];
        let (a, b, w) = (uniform(&mut rng, shape, -1.0, 1.0), uniform(&mut rng, shape, -1.0, 1.0), weight(&mut rng, d));
        cases.extend(
            OpCase::<B>::new(Op::AddRmsNorm, name)
                .input(a)
                .input(b)
                .input(w)
                .call(move |be, t| {
                    let (sum, o) = be.add_rms_norm(&t[0], &t[1], &t[2], eps)?;
                    Ok(vec![sum, o.output, o.rstd])
                })
                .twin(move |a| {
                    let (sum, y, rstd) = twin::add_rms_norm(&a[0], &a[1], &a[2], eps as f64);
                    vec![sum, y, rstd]
                })
                .dtypes(FLOATS)
                .build(),
        );
    }
    let mut rng = rng_for("add_rms_norm bad");
    let (a, b, w) =
        (uniform(&mut rng, &[2, 16], -1.0, 1.0), uniform(&mut rng, &[2, 16], -1.0, 1.0), weight(&mut rng, 16));
    let bad: Vec<(&str, [Tensor; 3], f32)> = vec![
        ("b f16 with a f32", [a.clone(), cast(&b, DType::F16), w.clone()], 1e-5),
        ("b [4, 8] with a [2, 16]", [a.clone(), b.reshape([4, 8]).expect("same size"), w.clone()], 1e-5),
        ("eps = -1", [a.clone(), b.clone(), w.clone()], -1.0),
    ];
    for (name, ts, eps) in bad {
        cases.push(Case::<B>::expect_error(Op::AddRmsNorm, format!("add_rms_norm {name}"), move |be| {
            let t = up(be, &[&ts[0], &ts[1], &ts[2]])?;
            be.add_rms_norm(&t[0], &t[1], &t[2], eps).map(|_| ())
        }));
    }
    cases
}

// ───────────────────────────── rms_norm_gated ──────────────────────────────

fn rms_norm_gated_cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let mut cases = Vec::new();
    let configs: &[(&[usize], f32)] = &[(&[4, 67], 1e-5), (&[2, 3, 16], 1e-2), (&[40, 1000], 1e-6)];
    for &(shape, eps) in configs {
        let name = format!("x, z{shape:?} eps={eps:e}");
        let mut rng = rng_for(&name);
        let d = shape[shape.len() - 1];
        // Gates over a wide range so silu sees both tails.
        let (x, z, w) = (uniform(&mut rng, shape, -1.0, 1.0), uniform(&mut rng, shape, -6.0, 6.0), weight(&mut rng, d));
        cases.extend(
            OpCase::<B>::new(Op::RmsNormGated, name)
                .input(x)
                .input(z)
                .input(w)
                .call(move |b, t| Ok(vec![b.rms_norm_gated(&t[0], &t[1], &t[2], eps)?]))
                .twin(move |a| vec![twin::rms_norm_gated(&a[0], &a[1], &a[2], eps as f64)])
                .dtypes(FLOATS)
                .build(),
        );
    }
    let mut rng = rng_for("rms_norm_gated bad");
    let (x, z, w) = (uniform(&mut rng, &[4, 8], -1.0, 1.0), uniform(&mut rng, &[4, 8], -1.0, 1.0), weight(&mut rng, 8));
    let bad: Vec<(&str, [Tensor; 3], f32)> = vec![
        ("z f16 with x f32", [x.clone(), cast(&z, DType::F16), w.clone()], 1e-5),
        ("z [8, 4] with x [4, 8]", [x.clone(), z.reshape([8, 4]).expect("same size"), w.clone()], 1e-5),
        ("eps = NaN", [x.clone(), z.clone(), w.clone()], f32::NAN),
    ];
    for (name, ts, eps) in bad {
        cases.push(Case::<B>::expect_error(Op::RmsNormGated, format!("rms_norm_gated {name}"), move |b| {
            let t = up(b, &[&ts[0], &ts[1], &ts[2]])?;
            b.rms_norm_gated(&t[0], &t[1], &t[2], eps).map(|_| ())
        }));
    }
    cases
}

fn rms_norm_gated_backward_cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let mut cases = Vec::new();
    // Finite differences on tiny shapes (gates over both silu tails).
    for &(shape, eps) in &[(&[3usize, 5][..], 1e-5f32), (&[2, 7][..], 1e-2)] {
        let name = format!("rms_norm_gated x, z{shape:?} eps={eps:e}");
        let mut rng = rng_for(&name);
        let d = shape[shape.len() - 1];
        let (x, z, w) = (uniform(&mut rng, shape, -1.0, 1.0), uniform(&mut rng, shape, -6.0, 6.0), weight(&mut rng, d));
        let e = eps as f64;
        cases.extend(
            GradCase::<B>::new(Op::RmsNormGatedBackward, name)
                .input(x)
                .input(z)
                .input(w)
                .forward(move |a| twin::rms_norm_gated(&a[0], &a[1], &a[2], e))
                .backward_twin(move |a, dy| {
                    let (dx, dz, dw) = twin::rms_norm_gated_backward(&a[0], &a[1], &a[2], dy, e);
                    vec![dx, dz, dw]
                })
                .backward_call(move |b, t, dy| {
                    let g = b.rms_norm_gated_backward(&t[0], &t[1], &t[2], dy, eps)?;
                    Ok(vec![g.dx, g.dz, g.dweight])
                })
                .build(),
        );
    }
    // Against the twin: tails, head-sized rows (D = 128), many partial blocks, F16/BF16.
    for shape in [&[4usize, 67][..], &[67][..], &[2, 300, 4, 128][..], &[64, 1000][..]] {
        let name = format!("rms_norm_gated_backward x, z, d_out{shape:?}");
        let mut rng = rng_for(&name);
        let d = shape[shape.len() - 1];
        let (x, z, w) = (uniform(&mut rng, shape, -1.0, 1.0), uniform(&mut rng, shape, -6.0, 6.0), weight(&mut rng, d));
        let dy = uniform(&mut rng, shape, -1.0, 1.0);
        cases.extend(
            OpCase::<B>::new(Op::RmsNormGatedBackward, name)
                .input(x)
                .input(z)
                .input(w)
                .input(dy)
                .call(|b, t| {
                    let g = b.rms_norm_gated_backward(&t[0], &t[1], &t[2], &t[3], 1e-6)?;
                    Ok(vec![g.dx, g.dz, g.dweight])
                })
                .twin(|a| {
                    let (dx, dz, dw) = twin::rms_norm_gated_backward(&a[0], &a[1], &a[2], &a[3], 1e-6);
                    vec![dx, dz, dw]
                })
                .tolerance(Tolerance::F32_LOOSE)
                .dtypes(FLOATS)
                .no_bad_inputs()
                .build(),
        );
    }
    cases.push(determinism_case::<B>(Op::RmsNormGatedBackward, [300, 1000], |b, t| {
        // x, z (also the upstream gradient), weight.
        let g = b.rms_norm_gated_backward(&t[0], &t[2], &t[1], &t[2], 1e-6)?;
        Ok(vec![g.dx, g.dz, g.dweight])
    }));
    let mut rng = rng_for("rms_norm_gated_backward bad");
    let (x, z, w) = (uniform(&mut rng, &[4, 8], -1.0, 1.0), uniform(&mut rng, &[4, 8], -1.0, 1.0), weight(&mut rng, 8));
    let dy = uniform(&mut rng, &[4, 8], -1.0, 1.0);
    let bad: Vec<(&str, [Tensor; 4], f32)> = vec![
        ("z [8, 4] with x [4, 8]", [x.clone(), z.reshape([8, 4]).expect("same size"), w.clone(), dy.clone()], 1e-5),
        ("d_out bf16 with x f32", [x.clone(), z.clone(), w.clone(), cast(&dy, DType::BF16)], 1e-5),
        ("d_out [4, 9] for x [4, 8]", [x.clone(), z.clone(), w.clone(), uniform(&mut rng, &[4, 9], -1.0, 1.0)], 1e-5),
        ("weight [9] for D = 8", [x.clone(), z.clone(), weight(&mut rng, 9), dy.clone()], 1e-5),
        ("eps = -1", [x.clone(), z.clone(), w.clone(), dy.clone()], -1.0),
    ];
    for (name, ts, eps) in bad {
        cases.push(Case::<B>::expect_error(
            Op::RmsNormGatedBackward,
            format!("rms_norm_gated_backward {name}"),
            move |b| {
                let t = up(b, &[&ts[0], &ts[1], &ts[2], &ts[3]])?;
                b.rms_norm_gated_backward(&t[0], &t[1], &t[2], &t[3], eps).map(|_| ())
            },
        ));
    }
    cases
}

// ───────────────────────────────── l2_norm ─────────────────────────────────

fn l2_norm_cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let mut cases = Vec::new();
    // (shape, eps, a row scaled so small that eps dominates Σx²)
    let configs: &[(&[usize], f32, Option<usize>)] = &[
        (&[4, 67], 1e-6, None),
        (&[2, 3, 4, 128], 1e-6, None),
        (&[67], 0.0, None),
        (&[3, 16], 1e-6, Some(1)),
        (&[2, 300, 4, 128], 1e-6, None),
    ];
    for (i, &(shape, eps, tiny_row)) in configs.iter().enumerate() {
        let mut name = format!("l2_norm x{shape:?} eps={eps:e}");
        let mut rng = rng_for(&name);
        let mut x = uniform(&mut rng, shape, -1.0, 1.0);
        if let Some(r) = tiny_row {
            x = with_row(&x, r, 1e-5);
            name += &format!(" row {r} all 1e-5");
        }
        let mut case = OpCase::<B>::new(Op::L2Norm, name)
            // Any D is valid on its own.
            .input(Input::new(x).shape_free())
            .call(move |b, t| {
                let o = b.l2_norm(&t[0], eps)?;
                Ok(vec![o.output, o.rstd])
            })
            .twin(move |a| {
                let (y, rnorm) = twin::l2_norm(&a[0], eps as f64);
                vec![y, rnorm]
            })
            .dtypes(FLOATS);
        if i > 0 {
            case = case.no_bad_inputs();
        }
        cases.extend(case.build());
    }
    cases.push(Case::<B>::custom(Op::L2Norm, CaseKind::Property, "l2_norm saves no mean", |b| {
        let x = b.upload(&Tensor::from_vec(vec![3.0f32, 4.0], [1, 2]).expect("shape")).map_err(|e| e.to_string())?;
        let o = b.l2_norm(&x, 0.0).map_err(|e| e.to_string())?;
        if o.mean.is_some() {
            return Err("mean is Some".into());
        }
        let y = b.to_host(&o.output).and_then(|t| t.to_vec_f32()).map_err(|e| e.to_string())?;
        Tolerance::F32.check(
            "output",
            &Array::new(vec![2], y.iter().map(|&v| v as f64).collect()),
            &Array::new(vec![2], vec![0.6, 0.8]),
        )
    }));
    for (name, eps) in [("eps = -1", -1.0f32), ("eps = NaN", f32::NAN)] {
        cases.push(Case::<B>::expect_error(Op::L2Norm, format!("l2_norm {name}"), move |b| {
            let x = b.upload(&Tensor::from_vec(vec![0.5f32; 8], [2, 4])?)?;
            b.l2_norm(&x, eps).map(|_| ())
        }));
    }
    cases.push(Case::<B>::expect_error(Op::L2Norm, "l2_norm x[4, 0] (D = 0)", |b| {
        let x = b.upload(&Tensor::zeros([4, 0], DType::F32)?)?;
        b.l2_norm(&x, 1e-6).map(|_| ())
    }));
    cases
}

fn l2_norm_backward_cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let mut cases = Vec::new();
    for &(shape, eps) in &[(&[3usize, 5][..], 1e-6f32), (&[2, 7][..], 1e-2)] {
        let name = format!("l2_norm x{shape:?} eps={eps:e}");
        let mut rng = rng_for(&name);
        let x = uniform(&mut rng, shape, -1.0, 1.0);
        let e = eps as f64;
        cases.extend(
            GradCase::<B>::new(Op::L2NormBackward, name)
                .input(x)
                .forward(move |a| twin::l2_norm(&a[0], e).0)
                .backward_twin(move |a, dy| {
                    let (_, rnorm) = twin::l2_norm(&a[0], e);
                    vec![twin::l2_norm_backward(&a[0], &rnorm, dy)]
                })
                .backward_call(move |b, t, dy| {
                    let rnorm = b.l2_norm(&t[0], eps)?.rstd;
                    Ok(vec![b.l2_norm_backward(&t[0], &rnorm, dy)?])
                })
                .build(),
        );
    }
    for shape in [&[4usize, 67][..], &[67][..], &[2, 300, 4, 128][..]] {
        let name = format!("l2_norm_backward x{shape:?} saved rnorm");
        let mut rng = rng_for(&name);
        let (x, dy) = (uniform(&mut rng, shape, -1.0, 1.0), uniform(&mut rng, shape, -1.0, 1.0));
        let rnorm = twin::l2_norm(&arr(&x), 1e-6).1.to_tensor();
        cases.extend(
            OpCase::<B>::new(Op::L2NormBackward, name)
                .input(x)
                .input(Input::new(rnorm).keep_f32().constant())
                .input(dy)
                .call(|b, t| Ok(vec![b.l2_norm_backward(&t[0], &t[1], &t[2])?]))
                .twin(|a| vec![twin::l2_norm_backward(&a[0], &a[1], &a[2])])
                .tolerance(Tolerance::F32_LOOSE)
                .dtypes(FLOATS)
                .build(),
        );
    }
    let mut rng = rng_for("l2_norm_backward bad");
    let (x, dy) = (uniform(&mut rng, &[4, 8], -1.0, 1.0), uniform(&mut rng, &[4, 8], -1.0, 1.0));
    let rnorm = uniform(&mut rng, &[4], 0.5, 2.0);
    let bad: Vec<(&str, [Tensor; 3])> = vec![
        ("rnorm [5] for x [4, 8]", [x.clone(), uniform(&mut rng, &[5], 0.5, 2.0), dy.clone()]),
        ("rnorm f16 (saved statistics are f32)", [x.clone(), cast(&rnorm, DType::F16), dy.clone()]),
        ("d_out f16 with x f32", [x.clone(), rnorm.clone(), cast(&dy, DType::F16)]),
        ("d_out [8, 4] for x [4, 8]", [x.clone(), rnorm.clone(), dy.reshape([8, 4]).expect("same size")]),
    ];
    for (name, ts) in bad {
        cases.push(Case::<B>::expect_error(Op::L2NormBackward, format!("l2_norm_backward {name}"), move |b| {
            let t = up(b, &[&ts[0], &ts[1], &ts[2]])?;
            b.l2_norm_backward(&t[0], &t[1], &t[2]).map(|_| ())
        }));
    }
    cases
}

// ──────────────────────────── rms_norm_channel ─────────────────────────────

fn rms_norm_channel_cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let mut cases = Vec::new();
    let configs: &[([usize; 3], f32)] =
        &[([2, 5, 67], 1e-5), ([3, 4, 1], 1e-2), ([2, 3, 300], 1e-6), ([1, 64, 1000], 1e-5)];
    for &(shape, eps) in configs {
        let name = format!("x{shape:?} [B, C, T] eps={eps:e}");
        let mut rng = rng_for(&name);
        let (x, w) = (uniform(&mut rng, &shape, -1.0, 1.0), weight(&mut rng, shape[1]));
        cases.extend(
            OpCase::<B>::new(Op::RmsNormChannel, name)
                // Any T is valid: growing x's last dim is no error.
                .input(Input::new(x).shape_free())
                .input(w)
                .call(move |b, t| Ok(vec![b.rms_norm_channel(&t[0], &t[1], eps)?]))
                .twin(move |a| vec![twin::rms_norm_channel(&a[0], &a[1], eps as f64)])
                .dtypes(FLOATS)
                .build(),
        );
    }
    let mut rng = rng_for("rms_norm_channel bad");
    let (x, w) = (uniform(&mut rng, &[2, 4, 8], -1.0, 1.0), weight(&mut rng, 4));
    let bad: Vec<(&str, [Tensor; 2])> = vec![
        ("x of rank 2", [x.reshape([8, 8]).expect("same size"), w.clone()]),
        ("x of rank 4", [x.reshape([2, 4, 2, 4]).expect("same size"), w.clone()]),
        ("weight [8] = [T] instead of [C]", [x.clone(), weight(&mut rng, 8)]),
        ("weight f16 with x f32", [x.clone(), cast(&w, DType::F16)]),
        (
            "C = 0",
            [Tensor::zeros([2, 0, 8], DType::F32).expect("shape"), Tensor::zeros([0], DType::F32).expect("shape")],
        ),
    ];
    for (name, ts) in bad {
        cases.push(Case::<B>::expect_error(Op::RmsNormChannel, format!("rms_norm_channel {name}"), move |b| {
            let t = up(b, &[&ts[0], &ts[1]])?;
            b.rms_norm_channel(&t[0], &t[1], 1e-5).map(|_| ())
        }));
    }
    cases
}

// ─────────────────────────────── group_norm ────────────────────────────────

fn group_norm_cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let mut cases = Vec::new();
    let configs: &[(&[usize], usize, f32)] = &[
        (&[2, 6, 5, 7], 1, 1e-5),
        (&[2, 6, 5, 7], 2, 1e-5),
        (&[2, 6, 5, 7], 6, 1e-2),
        (&[2, 8, 67], 4, 1e-6),
        (&[3, 6], 3, 1e-5),
        (&[1, 32, 40, 40], 8, 1e-5),
        (&[1, 4, 9000], 1, 1e-5),
    ];
    for &(shape, groups, eps) in configs {
        let name = format!("x{shape:?} groups={groups} eps={eps:e}");
        let mut rng = rng_for(&name);
        let c = shape[1];
        let x = uniform(&mut rng, shape, -1.0, 3.0);
        let (w, bias) = (weight(&mut rng, c), uniform(&mut rng, &[c], -0.5, 0.5));
        // With spatial dims, x's last dim is spatial and may be anything; for [B, C] it is C.
        let x_input = if shape.len() > 2 { Input::new(x).shape_free() } else { Input::new(x) };
        cases.extend(
            OpCase::<B>::new(Op::GroupNorm, name)
                .input(x_input)
                .input(w)
                .input(bias)
                .call(move |b, t| Ok(vec![b.group_norm(&t[0], groups, &t[1], &t[2], eps)?]))
                .twin(move |a| vec![twin::group_norm(&a[0], groups, &a[1], &a[2], eps as f64)])
                .dtypes(FLOATS)
                .build(),
        );
    }
    let mut rng = rng_for("group_norm bad");
    let (x, w, bias) =
        (uniform(&mut rng, &[2, 6, 5], -1.0, 1.0), weight(&mut rng, 6), uniform(&mut rng, &[6], -1.0, 1.0));
    let bad: Vec<(&str, [Tensor; 3], usize)> = vec![
        ("C = 6 not divisible by groups = 4", [x.clone(), w.clone(), bias.clone()], 4),
        ("groups = 0", [x.clone(), w.clone(), bias.clone()], 0),
        ("groups = 12 > C = 6", [x.clone(), w.clone(), bias.clone()], 12),
        ("x of rank 1", [x.reshape([60]).expect("same size"), w.clone(), bias.clone()], 2),
        ("bias f16 with x f32", [x.clone(), w.clone(), cast(&bias, DType::F16)], 2),
        ("weight [5] for C = 6", [x.clone(), weight(&mut rng, 5), bias.clone()], 2),
    ];
    for (name, ts, groups) in bad {
        cases.push(Case::<B>::expect_error(Op::GroupNorm, format!("group_norm {name}"), move |b| {
            let t = up(b, &[&ts[0], &ts[1], &ts[2]])?;
            b.group_norm(&t[0], groups, &t[1], &t[2], 1e-5).map(|_| ())
        }));
    }
    cases
}

// ───────────────────────────── adaln_modulate ──────────────────────────────

fn adaln_modulate_cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let mut cases = Vec::new();
    let configs: &[([usize; 3], f32)] = &[([2, 5, 67], 1e-5), ([1, 3, 16], 1e-2), ([2, 20, 1000], 1e-6)];
    for &(shape, eps) in configs {
        let name = format!("x{shape:?} [B, T, D] eps={eps:e}");
        let mut rng = rng_for(&name);
        let (b, d) = (shape[0], shape[2]);
        let x = uniform(&mut rng, &shape, -1.0, 1.0);
        let w = weight(&mut rng, d);
        let (scale, shift) = (uniform(&mut rng, &[b, d], -0.5, 0.5), uniform(&mut rng, &[b, d], -1.0, 1.0));
        cases.extend(
            OpCase::<B>::new(Op::AdalnModulate, name)
                .input(x)
                .input(w)
                .input(scale)
                .input(shift)
                .call(move |be, t| Ok(vec![be.adaln_modulate(&t[0], &t[1], &t[2], &t[3], eps)?]))
                .twin(move |a| vec![twin::adaln_modulate(&a[0], &a[1], &a[2], &a[3], eps as f64)])
                .dtypes(FLOATS)
                .build(),
        );
    }
    let mut rng = rng_for("adaln_modulate bad");
    let (x, w) = (uniform(&mut rng, &[2, 3, 8], -1.0, 1.0), weight(&mut rng, 8));
    let (scale, shift) = (uniform(&mut rng, &[2, 8], -0.5, 0.5), uniform(&mut rng, &[2, 8], -1.0, 1.0));
    let bad: Vec<(&str, [Tensor; 4])> = vec![
        ("x of rank 2", [x.reshape([6, 8]).expect("same size"), w.clone(), scale.clone(), shift.clone()]),
        ("scale [3, 8] for B = 2", [x.clone(), w.clone(), uniform(&mut rng, &[3, 8], -0.5, 0.5), shift.clone()]),
        ("shift [8] instead of [B, D]", [x.clone(), w.clone(), scale.clone(), uniform(&mut rng, &[8], -1.0, 1.0)]),
        ("shift f16 with x f32", [x.clone(), w.clone(), scale.clone(), cast(&shift, DType::F16)]),
    ];
    for (name, ts) in bad {
        cases.push(Case::<B>::expect_error(Op::AdalnModulate, format!("adaln_modulate {name}"), move |b| {
            let t = up(b, &[&ts[0], &ts[1], &ts[2], &ts[3]])?;
            b.adaln_modulate(&t[0], &t[1], &t[2], &t[3], 1e-5).map(|_| ())
        }));
    }
    cases
}

// ──────────────────────────────── normalize ────────────────────────────────

fn normalize_cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let mut cases = Vec::new();
    let configs: &[(&[usize], f32, Option<usize>)] =
        &[(&[4, 67], 1e-5, None), (&[3, 1000], 1e-6, None), (&[2, 3, 16], 1e-2, Some(1)), (&[40, 1000], 1e-5, None)];
    for &(shape, eps, constant_row) in configs {
        let mut name = format!("x{shape:?} (mean ≈ 1) eps={eps:e}");
        let mut rng = rng_for(&name);
        let mut x = uniform(&mut rng, shape, -1.0, 3.0);
        if let Some(r) = constant_row {
            x = with_row(&x, r, -2.5);
            name += &format!(" row {r} constant");
        }
        cases.extend(
            OpCase::<B>::new(Op::Normalize, name)
                .input(Input::new(x).shape_free())
                .call(move |b, t| Ok(vec![b.normalize(&t[0], eps)?]))
                .twin(move |a| vec![twin::normalize(&a[0], eps as f64)])
                .dtypes(FLOATS)
                .build(),
        );
    }
    let x = Tensor::from_vec(vec![0.25f32; 32], [4, 8]).expect("shape");
    let bad: Vec<(&str, Tensor, f32)> = vec![
        ("eps = -1", x.clone(), -1.0),
        ("eps = NaN", x.clone(), f32::NAN),
        ("x of rank 0", Tensor::scalar(1.0), 1e-5),
        ("x [3, 0] (D = 0)", Tensor::zeros([3, 0], DType::F32).expect("shape"), 1e-5),
    ];
    for (name, x, eps) in bad {
        cases.push(Case::<B>::expect_error(Op::Normalize, format!("normalize {name}"), move |b| {
            let t = b.upload(&x)?;
            b.normalize(&t, eps).map(|_| ())
        }));
    }
    cases
}
