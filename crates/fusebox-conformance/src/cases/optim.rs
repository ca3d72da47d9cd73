//! Cases of the optim family: AdamW against two steps worked out by hand and against
//! its f64 twin (with weight decay, F32/F16/BF16 parameters, a threaded size), its bad
//! inputs (step 0, shared storage, wrong dtypes); the global norm over several tensors;
//! the clipping factor and its bad values.

use fusebox::{AdamWConfig, ComputeBackend, DType, Error, Op, Result as FbResult, Tensor};

use crate::array::Array;
use crate::case::{Case, CaseKind, Input, OpCase};
use crate::reference::optim as twin;
use crate::rng::Rng;
use crate::tolerance::Tolerance;

const ALL_FLOATS: &[DType] = &[DType::F32, DType::F16, DType::BF16];

/// A backend tensor with its own storage holding `t`'s bytes (so it can be updated in
/// place: no other handle shares it).
fn fresh<B: ComputeBackend + ?Sized>(b: &B, t: &Tensor) -> FbResult<Tensor> {
    let host = b.to_host(t)?;
    let copy = Tensor::from_bytes(host.host_bytes()?, host.shape().clone(), host.dtype())?;
    b.upload(&copy)
}

/// f32 values of a backend tensor.
fn values<B: ComputeBackend + ?Sized>(b: &B, t: &Tensor) -> Result<Vec<f32>, String> {
    b.to_host(t).and_then(|h| h.to_vec_f32()).map_err(|e| e.to_string())
}

/// Two AdamW steps on three numbers, every value worked out by hand.
fn adamw_by_hand<B: ComputeBackend + ?Sized + 'static>() -> Case<B> {
    Case::custom(Op::AdamwUpdate, CaseKind::Property, "adamw_update against two steps worked out by hand", |b: &B| {
        // lr = 0.1, β₁ = 0.5, β₂ = 0.75, ε = 1, λ = 0.5 (round numbers, and ε large enough to matter).
        let config = AdamWConfig { lr: 0.1, beta1: 0.5, beta2: 0.75, eps: 1.0, weight_decay: 0.5, grad_scale: 1.0 };
        let up = |v: &[f32]| Tensor::from_slice(v, [3]).and_then(|t| b.upload(&t)).map_err(|e| e.to_string());
        let (mut p, mut m, mut v) = (up(&[2.0, -1.0, 0.5])?, up(&[0.0; 3])?, up(&[0.0; 3])?);
        // Step 1, g = [1, −2, 4]:
        //   m = 0.5·0 + 0.5·g            = [0.5, −1, 2]
        //   v = 0.75·0 + 0.25·g²         = [0.25, 1, 4]
        //   m̂ = m/(1 − 0.5)              = [1, −2, 4]
        //   v̂ = v/(1 − 0.75)             = [1, 4, 16],  √v̂ = [1, 2, 4]
        //   m̂/(√v̂ + 1)                  = [1/2, −2/3, 4/5]
        //   λ·p                          = [1, −0.5, 0.25]
        //   p = p − 0.1·(sum)            = [2 − 0.15, −1 + 0.116667, 0.5 − 0.105] = [1.85, −0.883333, 0.395]
        let g1 = up(&[1.0, -2.0, 4.0])?;
        b.adamw_update(&mut p, &g1, &mut m, &mut v, &config, 1).map_err(|e| format!("step 1: {e}"))?;
        let step1 = [("p", &p, [1.85, -0.883_333_3, 0.395]), ("m", &m, [0.5, -1.0, 2.0]), ("v", &v, [0.25, 1.0, 4.0])];
        for (name, t, want) in step1 {
            close(&format!("step 1 {name}"), &values(b, t)?, &want)?;
        }
        // Step 2, g = [−1, 0, 2]:
        //   m = 0.5·m + 0.5·g            = [−0.25, −0.5, 2]
        //   v = 0.75·v + 0.25·g²         = [0.1875 + 0.25, 0.75, 3 + 1] = [0.4375, 0.75, 4]
        //   m̂ = m/(1 − 0.25)             = [−1/3, −2/3, 8/3]
        //   v̂ = v/(1 − 0.5625)           = [1, 12/7, 64/7],  √v̂ = [1, 1.309307, 3.023716]
        //   m̂/(√v̂ + 1)                  = [−1/6, −0.288687, 0.662737]
        //   λ·p                          = [0.925, −0.441667, 0.1975]
        //   sum                          = [0.758333, −0.730354, 0.860237]
        //   p = p − 0.1·sum              = [1.774167, −0.810298, 0.308976]
        let g2 = up(&[-1.0, 0.0, 2.0])?;
        b.adamw_update(&mut p, &g2, &mut m, &mut v, &config, 2).map_err(|e| format!("step 2: {e}"))?;
        let step2 = [
            ("p", &p, [1.774_166_7, -0.810_298, 0.308_976_27]),
            ("m", &m, [-0.25, -0.5, 2.0]),
            ("v", &v, [0.4375, 0.75, 4.0]),
        ];
        for (name, t, want) in step2 {
            close(&format!("step 2 {name}"), &values(b, t)?, &want)?;
        }
        Ok(())
    })
}

/// `|got − want| ≤ 1e-6` elementwise.
fn close(what: &str, got: &[f32], want: &[f32]) -> Result<(), String> {
    if got.len() == want.len() && got.iter().zip(want).all(|(g, w)| (g - w).abs() <= 1e-6) {
        Ok(())
    } else {
        Err(format!("{what}: got {got:?}, worked out by hand {want:?}"))
    }
}

/// AdamW against its twin: random state, weight decay, `step` > 1 so both bias corrections matter.
fn adamw_vs_twin<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let mut rng = Rng::new(0xada3);
    let mut cases = Vec::new();
    // (shape, step, grad_scale): a scale below 1 is how clipping reaches the step.
    let sizes: &[(&[usize], u64, f32)] = &[(&[37], 1, 1.0), (&[3, 1000], 7, 0.37), (&[10, 4099], 100, 1.0)];
    for (k, &(shape, step, grad_scale)) in sizes.iter().enumerate() {
        let config = AdamWConfig { lr: 1e-2, beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.1, grad_scale };
        let (m0, v0) = if step == 1 {
            (Tensor::zeros(shape, DType::F32).expect("shape"), Tensor::zeros(shape, DType::F32).expect("shape"))
        } else {
            (rng.tensor(shape, -0.1, 0.1), rng.tensor(shape, 0.0, 0.01))
        };
        let mut case = OpCase::<B>::new(
            Op::AdamwUpdate,
            format!(
                "adamw_update p{shape:?} step={step} lr=1e-2 β=(0.9, 0.999) eps=1e-8 wd=0.1 grad_scale={grad_scale}"
            ),
        )
        .input(rng.tensor(shape, -1.0, 1.0))
        .input(rng.tensor(shape, -1.0, 1.0))
        .input(Input::new(m0).keep_f32())
        .input(Input::new(v0).keep_f32())
        .call(move |b, t| {
            let (mut p, mut m, mut v) = (fresh(b, &t[0])?, fresh(b, &t[2])?, fresh(b, &t[3])?);
            b.adamw_update(&mut p, &t[1], &mut m, &mut v, &config, step)?;
            Ok(vec![p, m, v])
        })
        .twin(move |a| {
            let (p, m, v) = twin::adamw(&a[0], &a[1], &a[2], &a[3], &config, step);
            vec![p, m, v]
        })
        .dtypes(ALL_FLOATS);
        if k > 0 {
            case = case.no_bad_inputs();
        }
        cases.extend(case.build());
    }
    cases
}

/// Bad values the shape/dtype generator cannot make.
fn adamw_bad_values<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    /// p, g, m, v of 8 elements on the backend, with param/grad in `dtype` and m in `m_dtype`.
    fn state<B: ComputeBackend + ?Sized>(b: &B, dtype: DType, m_dtype: DType) -> FbResult<[Tensor; 4]> {
        let t = |d: DType, x: f32| b.upload(&Tensor::from_f32_as(&[x; 8], [8], d)?);
        Ok([t(dtype, 0.5)?, t(dtype, 0.1)?, t(m_dtype, 0.0)?, t(DType::F32, 0.0)?])
    }
    let config = AdamWConfig::default();
    vec![
        Case::expect_error(Op::AdamwUpdate, "adamw_update step 0 (steps count from 1)", move |b: &B| {
            let [mut p, g, mut m, mut v] = state(b, DType::F32, DType::F32)?;
            b.adamw_update(&mut p, &g, &mut m, &mut v, &config, 0)
        }),
        Case::expect_error(Op::AdamwUpdate, "adamw_update m in bf16 (must be f32)", move |b: &B| {
            let [mut p, g, mut m, mut v] = state(b, DType::F32, DType::BF16)?;
            b.adamw_update(&mut p, &g, &mut m, &mut v, &config, 1)
        }),
        Case::expect_error(Op::AdamwUpdate, "adamw_update grad f16 with f32 param", move |b: &B| {
            let [mut p, _, mut m, mut v] = state(b, DType::F32, DType::F32)?;
            let g = b.upload(&Tensor::from_f32_as(&[0.1; 8], [8], DType::F16)?)?;
            b.adamw_update(&mut p, &g, &mut m, &mut v, &config, 1)
        }),
        Case::expect_error(Op::AdamwUpdate, "adamw_update beta2 = 1 (bias correction 0)", move |b: &B| {
            let [mut p, g, mut m, mut v] = state(b, DType::F32, DType::F32)?;
            let config = AdamWConfig { beta2: 1.0, ..config };
            b.adamw_update(&mut p, &g, &mut m, &mut v, &config, 1)
        }),
        Case::expect_error(Op::AdamwUpdate, "adamw_update grad_scale NaN", move |b: &B| {
            let [mut p, g, mut m, mut v] = state(b, DType::F32, DType::F32)?;
            let config = AdamWConfig { grad_scale: f32::NAN, ..config };
            b.adamw_update(&mut p, &g, &mut m, &mut v, &config, 1)
        }),
        Case::custom(
            Op::AdamwUpdate,
            CaseKind::BadInput,
            "adamw_update param with a live clone: Error::SharedStorage, param unchanged",
            move |b: &B| {
                let [mut p, g, mut m, mut v] = state(b, DType::F32, DType::F32).map_err(|e| e.to_string())?;
                let reader = p.clone();
                match b.adamw_update(&mut p, &g, &mut m, &mut v, &config, 1) {
                    Err(Error::SharedStorage { .. }) => {}
                    Err(e) => return Err(format!("expected Error::SharedStorage, got {e}")),
                    Ok(()) => return Err("wrote through a tensor whose storage is shared".into()),
                }
                let seen = values(b, &reader)?;
                if seen.iter().any(|&x| x != 0.5) {
                    return Err(format!("the shared param changed: {seen:?}"));
                }
                Ok(())
            },
        ),
        Case::custom(
            Op::AdamwUpdate,
            CaseKind::BadInput,
            "adamw_update m with a live clone: Error::SharedStorage",
            move |b: &B| {
                let [mut p, g, mut m, mut v] = state(b, DType::F32, DType::F32).map_err(|e| e.to_string())?;
                let _reader = m.clone();
                match b.adamw_update(&mut p, &g, &mut m, &mut v, &config, 1) {
                    Err(Error::SharedStorage { .. }) => Ok(()),
                    Err(e) => Err(format!("expected Error::SharedStorage, got {e}")),
                    Ok(()) => Err("wrote through a tensor whose storage is shared".into()),
                }
            },
        ),
    ]
}

fn global_norm_cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let mut rng = Rng::new(0x9057);
    let mut cases = Vec::new();
    let sets: &[&[&[usize]]] = &[&[&[3, 1000], &[4099], &[7]], &[&[40000], &[2, 3, 5]], &[&[1]]];
    for (k, set) in sets.iter().enumerate() {
        let mut case = OpCase::<B>::new(Op::GlobalNorm, format!("global_norm over {set:?}"));
        for &shape in set.iter() {
            case = case.input(Input::new(rng.tensor(shape, -2.0, 2.0)).shape_free());
        }
        case = case
            .call(|b, t| Ok(vec![Tensor::scalar(b.global_norm(t)?)]))
            .twin(|a| vec![Array::scalar(twin::global_norm(a))])
            .dtypes(ALL_FLOATS)
            .tolerance(Tolerance { abs: 0.0, rel: 1e-6 });
        if k > 0 {
            case = case.no_bad_inputs();
        }
        cases.extend(case.build());
    }
    cases.push(Case::custom(Op::GlobalNorm, CaseKind::Property, "global_norm of no tensors is 0", |b: &B| {
        let n = b.global_norm(&[]).map_err(|e| format!("returned an error: {e}"))?;
        if n == 0.0 {
            Ok(())
        } else {
            Err(format!("got {n}"))
        }
    }));
    cases
}

fn clip_scale_cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let mut cases = vec![Case::custom(
        Op::ClipScale,
        CaseKind::Property,
        "clip_scale against min(1, max/(norm + 1e-6)) at (2, 1), (0.5, 1), (0, 1), (3, 0), (1e6, 1), (1, +inf)",
        |b: &B| {
            for (norm, max) in [(2.0f32, 1.0f32), (0.5, 1.0), (0.0, 1.0), (3.0, 0.0), (1e6, 1.0), (1.0, f32::INFINITY)]
            {
                let got = b.clip_scale(norm, max).map_err(|e| format!("({norm}, {max}): {e}"))?;
                let want = twin::clip_scale(norm as f64, max as f64);
                if (got as f64 - want).abs() > 1e-7 * want.max(1e-30) + 1e-12 {
                    return Err(format!("clip_scale({norm}, {max}) = {got}, twin {want}"));
                }
            }
            Ok(())
        },
    )];
    for (norm, max, why) in [
        (1.0, f32::NAN, "NaN max_norm"),
        (1.0, -1.0, "negative max_norm"),
        (f32::NAN, 1.0, "NaN norm"),
        (-1.0, 1.0, "negative norm"),
        (f32::INFINITY, 1.0, "infinite norm (overflowed gradients)"),
    ] {
        cases.push(Case::expect_error(Op::ClipScale, format!("clip_scale({norm}, {max}): {why}"), move |b: &B| {
            b.clip_scale(norm, max).map(|_| ())
        }));
    }
    cases
}

/// Every case of the family.
pub fn cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let mut cases = vec![adamw_by_hand()];
    cases.extend(adamw_vs_twin());
    cases.extend(adamw_bad_values());
    cases.extend(global_norm_cases());
    cases.extend(clip_scale_cases());
    cases
}
