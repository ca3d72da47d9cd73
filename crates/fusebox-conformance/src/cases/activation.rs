//! Cases of the activation family: every activation against its f64 twin in F32, F16
//! and BF16 at sizes with SIMD tails and one large enough for the threaded path, at
//! extreme inputs, and every backward by finite differences and against its twin.

use std::sync::Arc;

use fusebox::{ComputeBackend, DType, GeluForm, Op, Result as FbResult, Tensor};

use crate::array::Array;
use crate::case::{Case, CaseKind, GradCase, Input, OpCase};
use crate::cases::gdn_fixture;
use crate::reference::activation as twin;
use crate::rng::Rng;
use crate::tolerance::Tolerance;

const ALL_FLOATS: &[DType] = &[DType::F32, DType::F16, DType::BF16];
/// Forward sizes: a 16-lane tail (1000 = 62·16 + 8), an odd row length, and > 32768
/// elements (the threaded path).
const SIZES: &[&[usize]] = &[&[1000], &[3, 4099], &[2, 20011]];
/// Backward sizes beyond the small finite-difference ones.
const BACKWARD_SIZES: &[&[usize]] = &[&[3, 4099], &[2, 20011]];
/// Inputs where the maths saturates, underflows or switches formula.
const EXTREMES: &[f32] = &[
    -1e4, -100.0, -88.5, -87.0, -30.0, -20.0, -9.0, -5.0, -1.0, -0.31, -0.29, -1e-3, -1e-8, 0.0, 1e-8, 1e-3, 0.29,
    0.31, 1.0, 5.0, 9.0, 20.0, 30.0, 87.0, 88.5, 100.0, 1e4,
];

type Forward<B> = Arc<dyn Fn(&B, &Tensor) -> FbResult<Tensor> + Send + Sync>;
type Backward<B> = Arc<dyn Fn(&B, &Tensor, &Tensor) -> FbResult<Tensor> + Send + Sync>;
/// The backward op, the backend call and the twin.
type BackwardOf<B> = (Op, Backward<B>, fn(&Array, &Array) -> Array);

/// One unary activation: its forward, its backward (if any) and their twins.
struct Unary<B: ?Sized> {
    name: &'static str,
    op: Op,
    forward: Forward<B>,
    twin: fn(&Array) -> Array,
    backward: Option<BackwardOf<B>>,
    /// Keep gradient inputs away from 0 (relu's kink, where finite differences lie).
    kink_at_zero: bool,
}

fn unaries<B: ComputeBackend + ?Sized + 'static>() -> Vec<Unary<B>> {
    vec![
        Unary {
            name: "silu",
            op: Op::Silu,
            forward: Arc::new(|b: &B, x: &Tensor| b.silu(x)),
            twin: twin::silu,
            backward: Some((
                Op::SiluBackward,
                Arc::new(|b: &B, x: &Tensor, d: &Tensor| b.silu_backward(x, d)),
                twin::silu_backward,
            )),
            kink_at_zero: false,
        },
        Unary {
            name: "gelu tanh",
            op: Op::Gelu,
            forward: Arc::new(|b: &B, x: &Tensor| b.gelu(x, GeluForm::Tanh)),
            twin: |x| twin::gelu(x, GeluForm::Tanh),
            backward: Some((
                Op::GeluBackward,
                Arc::new(|b: &B, x: &Tensor, d: &Tensor| b.gelu_backward(x, d, GeluForm::Tanh)),
                |x, d| twin::gelu_backward(x, d, GeluForm::Tanh),
            )),
            kink_at_zero: false,
        },
        Unary {
            name: "gelu erf",
            op: Op::Gelu,
            forward: Arc::new(|b: &B, x: &Tensor| b.gelu(x, GeluForm::Erf)),
            twin: |x| twin::gelu(x, GeluForm::Erf),
            backward: Some((
                Op::GeluBackward,
                Arc::new(|b: &B, x: &Tensor, d: &Tensor| b.gelu_backward(x, d, GeluForm::Erf)),
                |x, d| twin::gelu_backward(x, d, GeluForm::Erf),
            )),
            kink_at_zero: false,
        },
        Unary {
            name: "relu",
            op: Op::Relu,
            forward: Arc::new(|b: &B, x: &Tensor| b.relu(x)),
            twin: twin::relu,
            backward: Some((
                Op::ReluBackward,
                Arc::new(|b: &B, x: &Tensor, d: &Tensor| b.relu_backward(x, d)),
                twin::relu_backward,
            )),
            kink_at_zero: true,
        },
        Unary {
            name: "sigmoid",
            op: Op::Sigmoid,
            forward: Arc::new(|b: &B, x: &Tensor| b.sigmoid(x)),
            twin: twin::sigmoid,
            backward: Some((
                Op::SigmoidBackward,
                Arc::new(|b: &B, x: &Tensor, d: &Tensor| b.sigmoid_backward(x, d)),
                twin::sigmoid_backward,
            )),
            kink_at_zero: false,
        },
        Unary {
            name: "tanh",
            op: Op::Tanh,
            forward: Arc::new(|b: &B, x: &Tensor| b.tanh(x)),
            twin: twin::tanh,
            backward: Some((
                Op::TanhBackward,
                Arc::new(|b: &B, x: &Tensor, d: &Tensor| b.tanh_backward(x, d)),
                twin::tanh_backward,
            )),
            kink_at_zero: false,
        },
        Unary {
            name: "stable_softplus",
            op: Op::StableSoftplus,
            forward: Arc::new(|b: &B, x: &Tensor| b.stable_softplus(x)),
            twin: twin::stable_softplus,
            backward: None,
            kink_at_zero: false,
        },
    ]
}

/// A forward case of `u` on `x` (per dtype), with the generated bad inputs when `bad`.
fn unary_forward<B: ComputeBackend + ?Sized + 'static>(
    u: &Unary<B>,
    config: String,
    x: Tensor,
    dtypes: &[DType],
    tolerance: Option<Tolerance>,
    bad: bool,
) -> Vec<Case<B>> {
    let (f, t) = (u.forward.clone(), u.twin);
    let mut case = OpCase::<B>::new(u.op, config)
        .input(Input::new(x).shape_free())
        .call(move |b, x| Ok(vec![f(b, &x[0])?]))
        .twin(move |a| vec![t(&a[0])])
        .dtypes(dtypes);
    if let Some(tol) = tolerance {
        case = case.tolerance(tol);
    }
    if !bad {
        case = case.no_bad_inputs();
    }
    case.build()
}

/// Values in `[−3, 3)`, or `±[0.05, 3)` when the op has a kink at 0.
fn grad_input(rng: &mut Rng, shape: &[usize], kink_at_zero: bool) -> Tensor {
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n)
        .map(|_| {
            let x = rng.range(-3.0, 3.0) as f32;
            if kink_at_zero {
                x.signum() * (0.05 + x.abs() * 0.98)
            } else {
                x
            }
        })
        .collect();
    Tensor::from_vec(v, shape).expect("length matches")
}

fn unary_cases<B: ComputeBackend + ?Sized + 'static>(u: &Unary<B>) -> Vec<Case<B>> {
    let mut rng = Rng::new(u.name.len() as u64 * 7919 + u.op as u64);
    let mut cases = Vec::new();
    for (k, &shape) in SIZES.iter().enumerate() {
        let x = rng.tensor(shape, -8.0, 8.0);
        cases.extend(unary_forward(u, format!("{} x{shape:?} in [-8, 8)", u.name), x, ALL_FLOATS, None, k == 0));
    }
    let extremes = Tensor::from_slice(EXTREMES, [EXTREMES.len()]).expect("length matches");
    cases.extend(unary_forward(
        u,
        format!("{} extreme inputs ±1e4, ±88.5, ±1e-8, 0", u.name),
        extremes,
        &[DType::F32],
        None,
        false,
    ));

    let Some((bwd_op, backward, twin_backward)) = u.backward.clone() else { return cases };
    let x = grad_input(&mut rng, &[3, 7], u.kink_at_zero);
    let (fwd_twin, call) = (u.twin, backward.clone());
    cases.extend(
        GradCase::<B>::new(bwd_op, format!("{} x[3, 7]", u.name))
            .input(x)
            .forward(move |a| fwd_twin(&a[0]))
            .backward_twin(move |a, d| vec![twin_backward(&a[0], d)])
            .backward_call(move |b, t, d| Ok(vec![call(b, &t[0], d)?]))
            .build(),
    );
    for &shape in BACKWARD_SIZES {
        let x = grad_input(&mut rng, shape, u.kink_at_zero);
        let d = rng.tensor(shape, -1.0, 1.0);
        let call = backward.clone();
        cases.extend(
            OpCase::<B>::new(bwd_op, format!("{} backward x{shape:?}, d_out{shape:?}", u.name))
                .input(x)
                .input(d)
                .call(move |b, t| Ok(vec![call(b, &t[0], &t[1])?]))
                .twin(move |a| vec![twin_backward(&a[0], &a[1])])
                .dtypes(ALL_FLOATS)
                .no_bad_inputs()
                .build(),
        );
    }
    cases
}

/// GELU erf form on a dense grid, held to 1e-6: the kernel's erfc fit is the accuracy claim.
fn gelu_erf_accuracy<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let n = 4099;
    let grid: Vec<f32> = (0..n).map(|i| -8.0 + 16.0 * i as f32 / (n - 1) as f32).collect();
    let x = Tensor::from_vec(grid, [n]).expect("length matches");
    let u = Unary {
        name: "gelu erf",
        op: Op::Gelu,
        forward: Arc::new(|b: &B, x: &Tensor| b.gelu(x, GeluForm::Erf)),
        twin: |x| twin::gelu(x, GeluForm::Erf),
        backward: None,
        kink_at_zero: false,
    };
    let tight = Tolerance { abs: 1e-6, rel: 1e-6 };
    unary_forward(
        &u,
        "gelu erf dense grid x[4099] in [-8, 8], abs/rel 1e-6".into(),
        x,
        &[DType::F32],
        Some(tight),
        false,
    )
}

/// The twin's erf against tabulated values (Abramowitz & Stegun table 7.1, and erfc(3), erfc(5)).
fn twin_erf_table<B: ComputeBackend + ?Sized + 'static>() -> Case<B> {
    Case::custom(Op::Gelu, CaseKind::Property, "twin erf matches tabulated values to 1e-14", |_b: &B| {
        let table = [
            (0.0, 0.0),
            (0.1, 0.112_462_916_018_284_9),
            (0.5, 0.520_499_877_813_046_5),
            (1.0, 0.842_700_792_949_714_9),
            (2.0, 0.995_322_265_018_952_7),
            (-1.5, -0.966_105_146_475_310_7),
        ];
        for (x, want) in table {
            let got = twin::erf(x);
            if (got - want).abs() > 1e-14 {
                return Err(format!("erf({x}) = {got}, table {want}"));
            }
        }
        // The continued-fraction branch: erfc(3) = 2.209049699858544e-5, erfc(5) = 1.537459794428035e-12.
        for (x, want) in [(3.0, 2.209_049_699_858_544e-5), (5.0, 1.537_459_794_428_035e-12)] {
            let got = 1.0 - twin::erf(x);
            if (got - want).abs() > 1e-14 + 1e-6 * want {
                return Err(format!("erfc({x}) = {got}, table {want}"));
            }
        }
        Ok(())
    })
}

fn silu_mul_cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let mut rng = Rng::new(0x5111_u64);
    let mut cases = Vec::new();
    for (k, &shape) in SIZES.iter().enumerate() {
        let mut case = OpCase::<B>::new(Op::SiluMul, format!("silu_mul gate{shape:?}, up{shape:?}"))
            .input(rng.tensor(shape, -8.0, 8.0))
            .input(rng.tensor(shape, -2.0, 2.0))
            .call(|b, t| Ok(vec![b.silu_mul(&t[0], &t[1])?]))
            .twin(|a| vec![twin::silu_mul(&a[0], &a[1])])
            .dtypes(ALL_FLOATS);
        if k > 0 {
            case = case.no_bad_inputs();
        }
        cases.extend(case.build());
    }
    cases.extend(
        GradCase::<B>::new(Op::SiluMulBackward, "silu_mul gate[3, 7], up[3, 7]")
            .input(rng.tensor([3, 7], -3.0, 3.0))
            .input(rng.tensor([3, 7], -2.0, 2.0))
            .forward(|a| twin::silu_mul(&a[0], &a[1]))
            .backward_twin(|a, d| {
                let (dg, du) = twin::silu_mul_backward(&a[0], &a[1], d);
                vec![dg, du]
            })
            .backward_call(|b, t, d| {
                let g = b.silu_mul_backward(&t[0], &t[1], d)?;
                Ok(vec![g.da, g.db])
            })
            .build(),
    );
    for &shape in BACKWARD_SIZES {
        cases.extend(
            OpCase::<B>::new(Op::SiluMulBackward, format!("silu_mul backward gate, up, d_out {shape:?}"))
                .input(rng.tensor(shape, -8.0, 8.0))
                .input(rng.tensor(shape, -2.0, 2.0))
                .input(rng.tensor(shape, -1.0, 1.0))
                .call(|b, t| {
                    let g = b.silu_mul_backward(&t[0], &t[1], &t[2])?;
                    Ok(vec![g.da, g.db])
                })
                .twin(|a| {
                    let (dg, du) = twin::silu_mul_backward(&a[0], &a[1], &a[2]);
                    vec![dg, du]
                })
                .dtypes(ALL_FLOATS)
                .no_bad_inputs()
                .build(),
        );
    }
    cases.push(Case::expect_error(Op::SiluMulBackward, "silu_mul_backward d_out f16 with f32 gate/up", |b: &B| {
        let x = b.upload(&Tensor::from_vec(vec![0.5f32; 8], [8])?)?;
        let d = b.upload(&Tensor::from_f32_as(&[1.0; 8], [8], DType::F16)?)?;
        b.silu_mul_backward(&x, &x, &d).map(|_| ())
    }));
    cases.push(Case::expect_error(Op::SiluBackward, "silu_backward d_out bf16 with f32 x", |b: &B| {
        let x = b.upload(&Tensor::from_vec(vec![0.5f32; 8], [8])?)?;
        let d = b.upload(&Tensor::from_f32_as(&[1.0; 8], [8], DType::BF16)?)?;
        b.silu_backward(&x, &d).map(|_| ())
    }));
    cases
}

/// GeGLU, both forms: forward per dtype over the sizes (gate over the GELU's curved
/// range and its tails), the backward against finite differences and against the twin,
/// and mixed dtypes refused.
fn gelu_mul_cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let mut rng = Rng::new(0x6e61_u64);
    let mut cases = Vec::new();
    for form in [GeluForm::Tanh, GeluForm::Erf] {
        for (k, &shape) in SIZES.iter().enumerate() {
            let mut case = OpCase::<B>::new(Op::GeluMul, format!("gelu_mul {form:?} gate{shape:?}, up{shape:?}"))
                .input(rng.tensor(shape, -8.0, 8.0))
                .input(rng.tensor(shape, -2.0, 2.0))
                .call(move |b, t| Ok(vec![b.gelu_mul(&t[0], &t[1], form)?]))
                .twin(move |a| vec![twin::gelu_mul(&a[0], &a[1], form)])
                .dtypes(ALL_FLOATS);
            if k > 0 {
                case = case.no_bad_inputs();
            }
            cases.extend(case.build());
        }
        cases.extend(
            GradCase::<B>::new(Op::GeluMulBackward, format!("gelu_mul {form:?} gate[3, 7], up[3, 7]"))
                .input(rng.tensor([3, 7], -3.0, 3.0))
                .input(rng.tensor([3, 7], -2.0, 2.0))
                .forward(move |a| twin::gelu_mul(&a[0], &a[1], form))
                .backward_twin(move |a, d| {
                    let (dg, du) = twin::gelu_mul_backward(&a[0], &a[1], d, form);
                    vec![dg, du]
                })
                .backward_call(move |b, t, d| {
                    let g = b.gelu_mul_backward(&t[0], &t[1], d, form)?;
                    Ok(vec![g.da, g.db])
                })
                .build(),
        );
        for &shape in BACKWARD_SIZES {
            cases.extend(
                OpCase::<B>::new(Op::GeluMulBackward, format!("gelu_mul {form:?} backward gate, up, d_out {shape:?}"))
                    .input(rng.tensor(shape, -8.0, 8.0))
                    .input(rng.tensor(shape, -2.0, 2.0))
                    .input(rng.tensor(shape, -1.0, 1.0))
                    .call(move |b, t| {
                        let g = b.gelu_mul_backward(&t[0], &t[1], &t[2], form)?;
                        Ok(vec![g.da, g.db])
                    })
                    .twin(move |a| {
                        let (dg, du) = twin::gelu_mul_backward(&a[0], &a[1], &a[2], form);
                        vec![dg, du]
                    })
                    .dtypes(ALL_FLOATS)
                    .no_bad_inputs()
                    .build(),
            );
        }
    }
    cases.push(Case::expect_error(Op::GeluMul, "gelu_mul up bf16 with f32 gate", |b: &B| {
        let x = b.upload(&Tensor::from_vec(vec![0.5f32; 8], [8])?)?;
        let u = b.upload(&Tensor::from_f32_as(&[1.0; 8], [8], DType::BF16)?)?;
        b.gelu_mul(&x, &u, GeluForm::Tanh).map(|_| ())
    }));
    cases.push(Case::expect_error(Op::GeluMulBackward, "gelu_mul_backward d_out f16 with f32 gate/up", |b: &B| {
        let x = b.upload(&Tensor::from_vec(vec![0.5f32; 8], [8])?)?;
        let d = b.upload(&Tensor::from_f32_as(&[1.0; 8], [8], DType::F16)?)?;
        b.gelu_mul_backward(&x, &x, &d, GeluForm::Erf).map(|_| ())
    }));
    cases.push(Case::expect_error(Op::GeluMulBackward, "gelu_mul_backward d_out [7] with gate/up [8]", |b: &B| {
        let x = b.upload(&Tensor::from_vec(vec![0.5f32; 8], [8])?)?;
        let d = b.upload(&Tensor::from_vec(vec![1.0f32; 7], [7])?)?;
        b.gelu_mul_backward(&x, &x, &d, GeluForm::Tanh).map(|_| ())
    }));
    cases
}

/// Every case of the family.
pub fn cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let mut cases = Vec::new();
    for u in unaries::<B>() {
        cases.extend(unary_cases(&u));
    }
    cases.extend(gelu_erf_accuracy());
    cases.push(twin_erf_table());
    cases.extend(silu_mul_cases());
    cases.extend(gelu_mul_cases());
    cases.extend(clamped_swiglu_cases());
    cases.extend(gdn_gates_cases());
    cases.extend(gdn_gates_backward_cases());
    cases.extend(gdn_fixture::gates_cases());
    cases
}

/// Inputs of the Gated DeltaNet gates for `[..., H]` rows: a and b spread over `±spread`,
/// a_log in [ln 0.01, ln 16] (transformers' initialisation) and dt_bias in [−1, 2], both F32.
fn gate_inputs(rng: &mut Rng, shape: &[usize], spread: f64) -> [Tensor; 4] {
    let h = shape[shape.len() - 1];
    [
        rng.tensor(shape.to_vec(), -spread, spread),
        rng.tensor(shape.to_vec(), -spread, spread),
        rng.tensor([h], 0.01f64.ln(), 16f64.ln()),
        rng.tensor([h], -1.0, 2.0),
    ]
}

/// `gdn_gates` against its twin: a + dt_bias through softplus' linear range (> 20, > 88)
/// and its exponential tail (< −20), F16/BF16 a and b with F32 parameters, a threaded size.
fn gdn_gates_cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let mut rng = Rng::new(0x6a7e);
    let mut cases = Vec::new();
    let configs: [(&[usize], f64); 4] = [(&[2, 5, 4], 100.0), (&[7, 16], 30.0), (&[3], 8.0), (&[5000, 16], 30.0)];
    for (i, (shape, spread)) in configs.into_iter().enumerate() {
        let [a, b, a_log, dt_bias] = gate_inputs(&mut rng, shape, spread);
        let mut case =
            OpCase::<B>::new(Op::GdnGates, format!("gdn_gates a, b{shape:?} in ±{spread}, a_log, dt_bias f32"))
                .input(a)
                .input(b)
                .input(Input::new(a_log).keep_f32())
                .input(Input::new(dt_bias).keep_f32())
                .call(|be, t| {
                    let o = be.gdn_gates(&t[0], &t[1], &t[2], &t[3])?;
                    Ok(vec![o.g, o.beta])
                })
                .twin(|x| {
                    let (g, beta) = twin::gdn_gates(&x[0], &x[1], &x[2], &x[3]);
                    vec![g, beta]
                })
                .dtypes(ALL_FLOATS);
        if i > 0 {
            case = case.no_bad_inputs();
        }
        cases.extend(case.build());
    }
    cases.push(Case::custom(
        Op::GdnGates,
        CaseKind::Property,
        "gdn_gates gives F32 g and beta for bf16 a, b",
        |be: &B| {
            let run = || -> FbResult<_> {
                let a = be.upload(&Tensor::from_f32_as(&[0.5; 4], [2, 2], DType::BF16)?)?;
                let p = be.upload(&Tensor::from_vec(vec![0.0f32; 2], [2])?)?;
                be.gdn_gates(&a, &a, &p, &p)
            };
            let o = run().map_err(|e| e.to_string())?;
            match (o.g.dtype(), o.beta.dtype()) {
                (DType::F32, DType::F32) => Ok(()),
                other => Err(format!("g, beta dtypes {other:?}")),
            }
        },
    ));
    let bad: [(&str, [Tensor; 4]); 4] = [
        ("a_log [3] for H = 4", gates_with(&mut rng, &[2, 4], 2, Tensor::zeros([3], DType::F32).expect("zeros"))),
        ("dt_bias [5] for H = 4", gates_with(&mut rng, &[2, 4], 3, Tensor::zeros([5], DType::F32).expect("zeros"))),
        ("b [4, 2] for a [2, 4]", gates_with(&mut rng, &[2, 4], 1, Tensor::zeros([4, 2], DType::F32).expect("zeros"))),
        (
            "dt_bias bf16 with a_log f32",
            gates_with(&mut rng, &[2, 4], 3, Tensor::zeros([4], DType::BF16).expect("zeros")),
        ),
    ];
    for (what, t) in bad {
        cases.push(Case::expect_error(Op::GdnGates, format!("gdn_gates {what}"), move |be: &B| {
            let u: Vec<Tensor> = t.iter().map(|x| be.upload(x)).collect::<FbResult<_>>()?;
            be.gdn_gates(&u[0], &u[1], &u[2], &u[3]).map(drop)
        }));
    }
    cases
}

/// Gate inputs for `[..., H]` with input `which` replaced by `bad`.
fn gates_with(rng: &mut Rng, shape: &[usize], which: usize, bad: Tensor) -> [Tensor; 4] {
    let mut t = gate_inputs(rng, shape, 4.0);
    t[which] = bad;
    t
}

/// g stacked over β: the one output the gradient cases differentiate, `[2, ..., H]`.
fn stacked_gates(x: &[Array]) -> Array {
    let (g, beta) = twin::gdn_gates(&x[0], &x[1], &x[2], &x[3]);
    let mut shape = vec![2];
    shape.extend_from_slice(&g.shape);
    Array::new(shape, g.data.into_iter().chain(beta.data).collect())
}

/// `gdn_gates_backward`: the twin by finite differences and the backend against it
/// (upstream gradients of g and β stacked, see `stacked_gates`), a threaded size with
/// many rows summed into da_log, ddt_bias, and bad upstream gradients.
fn gdn_gates_backward_cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let mut rng = Rng::new(0x6a7f);
    let mut cases = Vec::new();
    for shape in [&[2usize, 3, 4][..], &[5, 2][..]] {
        let [a, b, a_log, dt_bias] = gate_inputs(&mut rng, shape, 5.0);
        cases.extend(
            GradCase::<B>::new(Op::GdnGatesBackward, format!("gdn_gates a, b{shape:?}: g and beta stacked"))
                .input(a)
                .input(b)
                .input(a_log)
                .input(dt_bias)
                .forward(stacked_gates)
                .backward_twin(|x, d| {
                    let n = d.len() / 2;
                    let dg = Array::new(x[0].shape.clone(), d.data[..n].to_vec());
                    let dbeta = Array::new(x[0].shape.clone(), d.data[n..].to_vec());
                    let (da, db, da_log, ddt_bias) = twin::gdn_gates_backward(&x[0], &x[1], &x[2], &x[3], &dg, &dbeta);
                    vec![da, db, da_log, ddt_bias]
                })
                .backward_call(|be: &B, t, d| {
                    let (dg, dbeta) = (be.select(d, 0, 0)?, be.select(d, 0, 1)?);
                    let g = be.gdn_gates_backward(&t[0], &t[1], &t[2], &t[3], &dg, &dbeta)?;
                    Ok(vec![g.da, g.db, g.da_log, g.ddt_bias])
                })
                .build(),
        );
    }
    for (shape, spread) in [(&[7usize, 16][..], 30.0), (&[5000, 16][..], 30.0)] {
        let [a, b, a_log, dt_bias] = gate_inputs(&mut rng, shape, spread);
        cases.extend(
            OpCase::<B>::new(Op::GdnGatesBackward, format!("gdn_gates_backward a, b, dg, dbeta{shape:?} in ±{spread}"))
                .input(a)
                .input(b)
                .input(Input::new(a_log).keep_f32())
                .input(Input::new(dt_bias).keep_f32())
                .input(Input::new(rng.tensor(shape.to_vec(), -1.0, 1.0)).keep_f32())
                .input(Input::new(rng.tensor(shape.to_vec(), -1.0, 1.0)).keep_f32())
                .call(|be, t| {
                    let g = be.gdn_gates_backward(&t[0], &t[1], &t[2], &t[3], &t[4], &t[5])?;
                    Ok(vec![g.da, g.db, g.da_log, g.ddt_bias])
                })
                .twin(|x| {
                    let (da, db, da_log, ddt_bias) = twin::gdn_gates_backward(&x[0], &x[1], &x[2], &x[3], &x[4], &x[5]);
                    vec![da, db, da_log, ddt_bias]
                })
                .tolerance(Tolerance::F32_LOOSE)
                .dtypes(ALL_FLOATS)
                .no_bad_inputs()
                .build(),
        );
    }
    for (what, bad_dg) in [
        ("dg bf16 (g is F32)", Tensor::from_f32_as(&[0.5; 8], [2, 4], DType::BF16).expect("bf16")),
        ("dg [2, 5] for a [2, 4]", Tensor::zeros([2, 5], DType::F32).expect("zeros")),
    ] {
        let t = gate_inputs(&mut rng, &[2, 4], 4.0);
        cases.push(Case::expect_error(Op::GdnGatesBackward, format!("gdn_gates_backward {what}"), move |be: &B| {
            let u: Vec<Tensor> = t.iter().map(|x| be.upload(x)).collect::<FbResult<_>>()?;
            let (dg, dbeta) = (be.upload(&bad_dg)?, be.upload(&Tensor::zeros([2, 4], DType::F32)?)?);
            be.gdn_gates_backward(&u[0], &u[1], &u[2], &u[3], &dg, &dbeta).map(drop)
        }));
    }
    cases
}

/// gpt-oss's clamped SwiGLU (α = 1.702, limit 7): forward and backward per dtype with
/// gate and up over both sides of the clamps (±10), the backward against finite
/// differences away from the clamps' kinks, and bad parameters and mixed dtypes refused.
fn clamped_swiglu_cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    const ALPHA: f32 = 1.702;
    const LIMIT: f32 = 7.0;
    let (a, l) = (f64::from(ALPHA), f64::from(LIMIT));
    let mut rng = Rng::new(0x5715);
    let mut cases = Vec::new();
    for (k, &shape) in SIZES.iter().enumerate() {
        let mut case = OpCase::<B>::new(Op::ClampedSwiglu, format!("clamped_swiglu gate{shape:?}, up{shape:?}"))
            .input(rng.tensor(shape, -10.0, 10.0))
            .input(rng.tensor(shape, -10.0, 10.0))
            .call(move |b, t| Ok(vec![b.clamped_swiglu(&t[0], &t[1], ALPHA, LIMIT)?]))
            .twin(move |x| vec![twin::clamped_swiglu(&x[0], &x[1], a, l)])
            .dtypes(ALL_FLOATS);
        if k > 0 {
            case = case.no_bad_inputs();
        }
        cases.extend(case.build());
    }
    cases.extend(
        GradCase::<B>::new(Op::ClampedSwigluBackward, "clamped_swiglu gate[3, 7], up[3, 7] (inside the clamps)")
            .input(rng.tensor([3, 7], -3.0, 3.0))
            .input(rng.tensor([3, 7], -3.0, 3.0))
            .forward(move |x| twin::clamped_swiglu(&x[0], &x[1], a, l))
            .backward_twin(move |x, d| {
                let (dg, du) = twin::clamped_swiglu_backward(&x[0], &x[1], d, a, l);
                vec![dg, du]
            })
            .backward_call(move |b, t, d| {
                let g = b.clamped_swiglu_backward(&t[0], &t[1], d, ALPHA, LIMIT)?;
                Ok(vec![g.da, g.db])
            })
            .build(),
    );
    for &shape in BACKWARD_SIZES {
        cases.extend(
            OpCase::<B>::new(Op::ClampedSwigluBackward, format!("clamped_swiglu backward gate, up, d_out {shape:?}"))
                .input(rng.tensor(shape, -10.0, 10.0))
                .input(rng.tensor(shape, -10.0, 10.0))
                .input(rng.tensor(shape, -1.0, 1.0))
                .call(move |b, t| {
                    let g = b.clamped_swiglu_backward(&t[0], &t[1], &t[2], ALPHA, LIMIT)?;
                    Ok(vec![g.da, g.db])
                })
                .twin(move |x| {
                    let (dg, du) = twin::clamped_swiglu_backward(&x[0], &x[1], &x[2], a, l);
                    vec![dg, du]
                })
                .dtypes(ALL_FLOATS)
                .no_bad_inputs()
                .build(),
        );
    }
    for (what, alpha, limit) in
        [("alpha NaN", f32::NAN, LIMIT), ("limit 0", ALPHA, 0.0), ("limit ∞", ALPHA, f32::INFINITY)]
    {
        cases.push(Case::expect_error(Op::ClampedSwiglu, format!("clamped_swiglu {what}"), move |b: &B| {
            let x = b.upload(&Tensor::from_vec(vec![0.5f32; 8], [8])?)?;
            b.clamped_swiglu(&x, &x, alpha, limit).map(|_| ())
        }));
        cases.push(Case::expect_error(
            Op::ClampedSwigluBackward,
            format!("clamped_swiglu_backward {what}"),
            move |b: &B| {
                let x = b.upload(&Tensor::from_vec(vec![0.5f32; 8], [8])?)?;
                b.clamped_swiglu_backward(&x, &x, &x, alpha, limit).map(|_| ())
            },
        ));
    }
    cases.push(Case::expect_error(Op::ClampedSwiglu, "clamped_swiglu up bf16 with f32 gate", |b: &B| {
        let x = b.upload(&Tensor::from_vec(vec![0.5f32; 8], [8])?)?;
        let u = b.upload(&Tensor::from_f32_as(&[1.0; 8], [8], DType::BF16)?)?;
        b.clamped_swiglu(&x, &u, ALPHA, LIMIT).map(|_| ())
    }));
    cases
}
