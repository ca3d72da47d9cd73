//! Cases of the loss family: the fused cross-entropy (loss, d_logits and count) against
//! its f64 twin in F32, F16 and BF16 logits, with ignored rows, an ignore index inside
//! the vocabulary, all rows ignored, and a threaded size; its backward by finite
//! differences; targets ≥ V rejected with the row and value named.

use fusebox::{ComputeBackend, DType, Op, Tensor};

use crate::array::Array;
use crate::case::{Case, CaseKind, GradCase, Input, OpCase};
use crate::reference::loss as twin;
use crate::rng::Rng;
use crate::tolerance::Tolerance;

const ALL_FLOATS: &[DType] = &[DType::F32, DType::F16, DType::BF16];
/// Ignore index outside every vocabulary (the usual padding marker).
const PAD: u32 = u32::MAX;
/// F32 results: d_logits entries are ~1/(V·count), so the absolute part must be small.
const TIGHT: Tolerance = Tolerance { abs: 1e-8, rel: 1e-4 };

/// Targets for `n` rows of vocabulary `v`: rows listed in `ignored` get `ignore`, the
/// others a random id in `0..v` that is not `ignore`.
fn targets(rng: &mut Rng, n: usize, v: usize, ignored: &[usize], ignore: u32) -> Tensor {
    let mut draw = || loop {
        let t = rng.below(v) as u32;
        if t != ignore {
            return t;
        }
    };
    let ids: Vec<u32> = (0..n).map(|r| if ignored.contains(&r) { ignore } else { draw() }).collect();
    Tensor::from_vec(ids, [n]).expect("length matches")
}

/// The loss, d_logits and count as tensors the suite compares.
fn outputs(loss: f64, d: Array, count: usize) -> Vec<Array> {
    vec![Array::scalar(loss), d, Array::scalar(count as f64)]
}

fn forward_cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let mut rng = Rng::new(0xce01);
    /// (label, N, V, ignored rows, ignore index)
    type Config = (&'static str, usize, usize, &'static [usize], Option<u32>);
    let configs: &[Config] = &[
        ("rows 2 and 5 ignored (ignore=u32::MAX)", 8, 1000, &[2, 5], Some(PAD)),
        ("no ignore index", 6, 4099, &[], None),
        ("ignore=0 inside the vocabulary, rows 0, 1 ignored", 5, 37, &[0, 1], Some(0)),
        ("threaded, row 7 ignored", 40, 1000, &[7], Some(PAD)),
        ("long rows, row 1 ignored", 4, 32011, &[1], Some(PAD)),
    ];
    let mut cases = Vec::new();
    for (k, &(label, n, v, ignored, ignore)) in configs.iter().enumerate() {
        let logits = rng.tensor([n, v], -8.0, 8.0);
        let ids = targets(&mut rng, n, v, ignored, ignore.unwrap_or(PAD));
        let mut case = OpCase::<B>::new(Op::CrossEntropy, format!("cross_entropy logits[{n}, {v}] {label}"))
            .input(Input::new(logits).shape_free())
            .input(Input::new(ids).constant())
            .call(move |b, t| {
                let out = b.cross_entropy(&t[0], &t[1], ignore)?;
                Ok(vec![out.loss, out.d_logits, Tensor::scalar(out.count as f32)])
            })
            .twin(move |a| {
                let (loss, d, count) = twin::cross_entropy(&a[0], &a[1], ignore);
                outputs(loss, d, count)
            })
            .dtypes(ALL_FLOATS)
            .tolerance(TIGHT);
        if k > 0 {
            case = case.no_bad_inputs();
        }
        cases.extend(case.build());
    }
    cases.push(Case::custom(
        Op::CrossEntropy,
        CaseKind::Property,
        "cross_entropy logits[3, 11], every row ignored: loss 0, zero d_logits, count 0, no NaN",
        |b: &B| {
            let logits = b.upload(&Rng::new(5).tensor([3, 11], -4.0, 4.0)).map_err(|e| e.to_string())?;
            let ids = b.upload(&Tensor::from_vec(vec![PAD; 3], [3]).expect("3 ids")).map_err(|e| e.to_string())?;
            let out = b.cross_entropy(&logits, &ids, Some(PAD)).map_err(|e| format!("returned an error: {e}"))?;
            let loss = b.to_host(&out.loss).and_then(|t| t.to_vec_f32()).map_err(|e| e.to_string())?;
            let d = b.to_host(&out.d_logits).and_then(|t| t.to_vec_f32()).map_err(|e| e.to_string())?;
            if out.count != 0 || loss != [0.0] || out.loss.rank() != 0 || d.len() != 33 || d.iter().any(|&x| x != 0.0) {
                return Err(format!("count {}, loss {loss:?} (rank {}), d_logits {d:?}", out.count, out.loss.rank()));
            }
            Ok(())
        },
    ));
    cases
}

fn bad_value_cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let mut cases = Vec::new();
    // Row 2 has target 17 ≥ V = 10: the error must name the row and the value.
    cases.push(Case::custom(
        Op::CrossEntropy,
        CaseKind::BadInput,
        "cross_entropy logits[4, 10], row 2 target 17 ≥ V: error names row 2 and 17",
        |b: &B| {
            let logits = b.upload(&Rng::new(6).tensor([4, 10], -1.0, 1.0)).map_err(|e| e.to_string())?;
            let ids =
                b.upload(&Tensor::from_vec(vec![1u32, 9, 17, 0], [4]).expect("4 ids")).map_err(|e| e.to_string())?;
            match b.cross_entropy(&logits, &ids, Some(PAD)) {
                Ok(_) => Err("accepted target 17 with V = 10".into()),
                Err(e) if e.to_string().contains("row 2") && e.to_string().contains("17") => Ok(()),
                Err(e) => Err(format!("error does not name row 2 and value 17: {e}")),
            }
        },
    ));
    cases.push(Case::expect_error(Op::CrossEntropy, "cross_entropy target == V, no ignore index", |b: &B| {
        let logits = b.upload(&Tensor::from_vec(vec![0.0f32; 12], [3, 4])?)?;
        let ids = b.upload(&Tensor::from_vec(vec![0u32, 4, 1], [3])?)?;
        b.cross_entropy(&logits, &ids, None).map(|_| ())
    }));
    cases.push(Case::expect_error(Op::CrossEntropy, "cross_entropy logits rank 3", |b: &B| {
        let logits = b.upload(&Tensor::from_vec(vec![0.0f32; 24], [2, 3, 4])?)?;
        let ids = b.upload(&Tensor::from_vec(vec![0u32, 1], [2])?)?;
        b.cross_entropy(&logits, &ids, None).map(|_| ())
    }));
    cases.push(Case::expect_error(
        Op::CrossEntropyBackward,
        "cross_entropy_backward row 1 target 4 ≥ V = 4",
        |b: &B| {
            let logits = b.upload(&Tensor::from_vec(vec![0.0f32; 12], [3, 4])?)?;
            let ids = b.upload(&Tensor::from_vec(vec![0u32, 4, 1], [3])?)?;
            b.cross_entropy_backward(&logits, &ids, Some(PAD), 1.0).map(|_| ())
        },
    ));
    cases
}

/// The scalar value of a one-element output gradient.
fn scalar_of(t: &Tensor) -> fusebox::Result<f32> {
    let v = t.to_vec_f32()?;
    v.first()
        .copied()
        .ok_or_else(|| fusebox::Error::shape("cross_entropy_backward", "d_loss", "one element", t.shape()))
}

fn backward_cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let mut rng = Rng::new(0xce02);
    let mut cases = Vec::new();
    // Row 1 is ignored: its gradient must be zero and it must not count in the mean.
    let ids = Tensor::from_vec(vec![2u32, PAD, 0, 6, 3], [5]).expect("5 ids");
    cases.extend(
        GradCase::<B>::new(Op::CrossEntropyBackward, "cross_entropy logits[5, 7], row 1 ignored (ignore=u32::MAX)")
            .input(Input::new(rng.tensor([5, 7], -3.0, 3.0)).shape_free())
            .input(Input::new(ids).constant())
            .forward(|a| Array::scalar(twin::cross_entropy(&a[0], &a[1], Some(PAD)).0))
            .backward_twin(|a, d| vec![twin::cross_entropy_backward(&a[0], &a[1], Some(PAD), d.data[0])])
            .backward_call(|b, t, d| {
                let d_loss = scalar_of(&b.to_host(d)?)?;
                Ok(vec![b.cross_entropy_backward(&t[0], &t[1], Some(PAD), d_loss)?])
            })
            .build(),
    );
    for (n, v) in [(6usize, 4099usize), (40, 1000)] {
        let logits = rng.tensor([n, v], -8.0, 8.0);
        let ids = targets(&mut rng, n, v, &[3], PAD);
        cases.extend(
            OpCase::<B>::new(
                Op::CrossEntropyBackward,
                format!("cross_entropy_backward logits[{n}, {v}] d_loss=0.7, row 3 ignored"),
            )
            .input(Input::new(logits).shape_free())
            .input(Input::new(ids).constant())
            .call(|b, t| Ok(vec![b.cross_entropy_backward(&t[0], &t[1], Some(PAD), 0.7)?]))
            .twin(|a| vec![twin::cross_entropy_backward(&a[0], &a[1], Some(PAD), 0.7f32 as f64)])
            .dtypes(ALL_FLOATS)
            .tolerance(TIGHT)
            .no_bad_inputs()
            .build(),
        );
    }
    cases
}

/// Every case of the family.
pub fn cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let mut cases = forward_cases();
    cases.extend(bad_value_cases());
    cases.extend(backward_cases());
    cases
}
