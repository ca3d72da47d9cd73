//! Cases of the mixture-of-experts family: `moe_route` under every `Routing` (one token,
//! many rows, k = 1 and k = E, exact ties, masked experts) and its backward; `expert_matmul`
//! with one x row per token (R = 1) or per chosen expert (R = k), decoding (one token) and
//! prompts where one expert is chosen by more than 16 tokens (the CPU kernel's panel-and-gemm
//! path beside its row-dot path), experts nobody chose, F32/F16/BF16 and block-format
//! weights; and its backward (dx and dw by finite differences, dw added onto what it
//! held, dx from block-format weights). Expert ids ≥ E, k = 0, k > E, R ∉ {1, k},
//! mismatched dtypes and a weight gradient of block-format weights must be errors.
//!
//! Router logits are spread out (any two of a row ≥ 0.04 apart, see `Logits::Distinct`)
//! so that F16/BF16 rounding cannot swap two experts; exact ties are tested on values
//! every dtype holds exactly.

use fusebox::{ComputeBackend, DType, Error, Op, Result as FbResult, Routing, Tensor};

use crate::array::Array;
use crate::case::{catch, Case, CaseKind, GradCase, Input, OpCase};
use crate::cases::memory::{foreign_tensor, host_bytes, host_values, ok, upload_all};
use crate::reference::moe as twin;
use crate::reference::quant as quant_twin;
use crate::rng::Rng;
use crate::tolerance::Tolerance;

const FLOATS: &[DType] = &[DType::F32, DType::F16, DType::BF16];

const ROUTINGS: [Routing; 3] = [Routing::SoftmaxTopK, Routing::SoftmaxTopKNormalized, Routing::TopKSoftmax];

/// A float tensor of `dims`, uniform in [-1, 1), seeded by `seed`.
fn data(seed: u64, dims: &[usize]) -> Tensor {
    Rng::new(seed).normal_ish(dims.to_vec())
}

/// `t`'s values rounded to `dtype`.
fn cast(t: &Tensor, dtype: DType) -> Tensor {
    Tensor::from_f32_as(&t.to_vec_f32().expect("float tensor"), t.shape().clone(), dtype).expect("float dtype")
}

/// U32 ids with exactly these values, of `dims`.
fn id_tensor(values: &[u32], dims: &[usize]) -> Tensor {
    Tensor::from_slice(values, dims.to_vec()).expect("shape")
}

// ───────────────────────────── router logits ─────────────────────────────

/// What a case's router logits look like.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Logits {
    /// Every row a shuffle of the grid j/16 (j < E) centred on 0, shifted by a row offset
    /// in [-1, 1) and jittered by less than 0.02 per element: any two logits of a row are
    /// ≥ 0.04 apart, more than twice the F16/BF16 rounding error at |l| < 8 (≤ 0.016).
    Distinct,
    /// On a grid of 0.25 in [-1, 1] (exact in every dtype): many ties, lower index first.
    Ties,
    /// `Distinct` with the experts j ≡ 1 (mod 3) at −∞ in every row, and all but expert 0
    /// at −∞ in the last row (whose later choices are then −∞ experts of weight 0).
    Masked,
}

/// Router logits of `dims` (`[..., E]`).
fn logits(seed: u64, dims: &[usize], kind: Logits) -> Tensor {
    let mut rng = Rng::new(seed);
    let n = *dims.last().expect("rank ≥ 1");
    let rows: usize = dims[..dims.len() - 1].iter().product();
    let mut v = Vec::with_capacity(rows * n);
    for r in 0..rows {
        match kind {
            Logits::Ties => v.extend((0..n).map(|_| (rng.range(-1.0, 1.0) * 4.0).round() as f32 / 4.0)),
            Logits::Distinct | Logits::Masked => {
                let mut grid: Vec<usize> = (0..n).collect();
                for i in (1..n).rev() {
                    grid.swap(i, rng.below(i + 1));
                }
                let offset = rng.range(-1.0, 1.0);
                for (j, &g) in grid.iter().enumerate() {
                    let mut l = (g as f64 - n as f64 / 2.0) / 16.0 + offset + rng.range(0.0, 0.02);
                    let last = r + 1 == rows;
                    if kind == Logits::Masked && (j % 3 == 1 || (last && j > 0)) {
                        l = f64::NEG_INFINITY;
                    }
                    v.push(l as f32);
                }
            }
        }
    }
    Tensor::from_vec(v, dims.to_vec()).expect("shape")
}

/// The experts the twin chooses for `logits` (U32, `[..., k]`).
fn chosen(logits: &Tensor, k: usize) -> Tensor {
    let (_, experts) = twin::moe_route(&Array::from_tensor(logits), k, Routing::SoftmaxTopK);
    let v: Vec<u32> = experts.data.iter().map(|&e| e as u32).collect();
    Tensor::from_vec(v, experts.shape.clone()).expect("shape")
}

/// `moe_route`'s outputs `[weights, experts]`, or an error if their dtypes are not the
/// logits' dtype and U32.
fn route<B: ComputeBackend + ?Sized>(b: &B, logits: &Tensor, k: usize, routing: Routing) -> FbResult<Vec<Tensor>> {
    let r = b.moe_route(logits, k, routing)?;
    if r.weights.dtype() != logits.dtype() {
        return Err(Error::dtype("moe_route", "weights (the logits' dtype)", logits.dtype(), r.weights.dtype()));
    }
    if r.experts.dtype() != DType::U32 {
        return Err(Error::dtype("moe_route", "experts", DType::U32, r.experts.dtype()));
    }
    Ok(vec![r.weights, r.experts])
}

// ───────────────────────────── moe_route ─────────────────────────────

fn route_cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let mut cases = Vec::new();
    // Growing E keeps k ≤ E: the logits' shape is free; a U32 dtype is generated as bad input.
    let configs: [(&[usize], usize, Logits); 12] = [
        (&[1, 8], 2, Logits::Distinct),     // one token (decoding)
        (&[7, 8], 1, Logits::Distinct),     // k = 1
        (&[7, 8], 8, Logits::Distinct),     // k = E
        (&[2, 3, 16], 4, Logits::Distinct), // rank 3
        (&[16], 3, Logits::Distinct),       // rank 1: one row
        (&[5, 1], 1, Logits::Distinct),     // one expert
        (&[9, 60], 6, Logits::Distinct),    // E = 60: OLMoE-like
        (&[300, 64], 8, Logits::Distinct),  // many rows: several tasks
        (&[6, 12], 4, Logits::Ties),        // exact ties, lower index first
        (&[3, 40], 20, Logits::Ties),       // many ties, a large k
        (&[4, 10], 3, Logits::Masked),      // −∞ logits
        (&[0, 8], 2, Logits::Distinct),     // no rows
    ];
    for (i, (dims, k, kind)) in configs.into_iter().enumerate() {
        let x = logits(3000 + i as u64, dims, kind);
        for routing in ROUTINGS {
            cases.extend(
                OpCase::new(Op::MoeRoute, format!("moe_route logits{dims:?} ({kind:?}) k={k} {routing:?}"))
                    .input(Input::new(x.clone()).shape_free())
                    .call(move |b: &B, t| route(b, &t[0], k, routing))
                    .twin(move |a| {
                        let (weights, experts) = twin::moe_route(&a[0], k, routing);
                        vec![weights, experts]
                    })
                    .dtypes(FLOATS)
                    .build(),
            );
        }
    }
    // The two names of the normalised routing are one function.
    let x = logits(3020, &[11, 24], Logits::Distinct);
    cases.push(Case::custom(
        Op::MoeRoute,
        CaseKind::Property,
        "moe_route logits[11, 24] k=5: TopKSoftmax and SoftmaxTopKNormalized give the same weights and experts",
        move |b: &B| {
            let xu = ok("upload", b.upload(&x))?;
            let a = ok("moe_route", route(b, &xu, 5, Routing::TopKSoftmax))?;
            let c = ok("moe_route", route(b, &xu, 5, Routing::SoftmaxTopKNormalized))?;
            for (what, p, q) in [("weights", &a[0], &c[0]), ("experts", &a[1], &c[1])] {
                Tolerance::EXACT.check(what, &host_values(b, p)?, &host_values(b, q)?)?;
            }
            Ok(())
        },
    ));
    let bad: Vec<(&str, Tensor, usize)> = vec![
        ("logits[3, 8] k=0", data(3030, &[3, 8]), 0),
        ("logits[3, 8] k=9 (k > E)", data(3031, &[3, 8]), 9),
        ("logits[3, 0] k=1 (no experts)", Tensor::zeros([3, 0], DType::F32).expect("zeros"), 1),
        ("logits a scalar (no expert dim)", Tensor::scalar(1.0), 1),
        ("logits u32", Rng::new(3032).ids([3, 8], 8), 2),
        ("logits q8_0", Tensor::zeros([2, 32], DType::Q8_0).expect("zeros"), 2),
    ];
    for (what, x, k) in bad {
        for routing in ROUTINGS {
            let x = x.clone();
            cases.push(Case::expect_error(Op::MoeRoute, format!("moe_route {what} {routing:?}"), move |b: &B| {
                b.moe_route(&b.upload(&x)?, k, routing).map(drop)
            }));
        }
    }
    cases.push(Case::expect_error(Op::MoeRoute, "moe_route logits on a foreign device", |b: &B| {
        b.moe_route(&foreign_tensor(&[3, 8], DType::F32), 2, Routing::SoftmaxTopK).map(drop)
    }));
    cases
}

// ───────────────────────────── moe_route_backward ─────────────────────────────

fn route_backward_cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let mut cases = Vec::new();
    // Finite differences through the twin's forward (its own choice of experts, which the
    // 0.04 spacing keeps fixed under the steps). A grown E is valid input, so the logits'
    // shape is free; a grown k no longer matches d_weights.
    let grads: [(&[usize], usize); 5] = [(&[3, 6], 2), (&[2, 2, 5], 5), (&[1, 8], 1), (&[4], 2), (&[5, 9], 4)];
    for (i, (dims, k)) in grads.into_iter().enumerate() {
        let x = logits(3100 + i as u64, dims, Logits::Distinct);
        let experts = chosen(&x, k);
        for routing in ROUTINGS {
            cases.extend(
                GradCase::new(Op::MoeRouteBackward, format!("moe_route_backward logits{dims:?} k={k} {routing:?}"))
                    .input(Input::new(x.clone()).shape_free())
                    .input(Input::new(experts.clone()))
                    .forward(move |a| twin::moe_route(&a[0], k, routing).0)
                    .backward_twin(move |a, dw| vec![twin::moe_route_backward(&a[0], &a[1], dw, routing)])
                    .backward_call(move |b: &B, t, dw| Ok(vec![b.moe_route_backward(&t[0], &t[1], dw, routing)?]))
                    .build(),
            );
        }
    }
    // Backend against the twin per dtype: decoding, many rows (several tasks), rank 3,
    // k = E, −∞ logits (their gradient is 0).
    let configs: [(&[usize], usize, Logits, &[DType]); 6] = [
        (&[1, 8], 2, Logits::Distinct, FLOATS),
        (&[7, 8], 8, Logits::Distinct, FLOATS),
        (&[2, 3, 16], 4, Logits::Distinct, FLOATS),
        (&[300, 64], 8, Logits::Distinct, FLOATS),
        (&[6, 12], 4, Logits::Ties, FLOATS),
        (&[4, 10], 3, Logits::Masked, FLOATS),
    ];
    for (i, (dims, k, kind, dtypes)) in configs.into_iter().enumerate() {
        let x = logits(3120 + i as u64, dims, kind);
        let experts = chosen(&x, k);
        let d_weights = data(3130 + i as u64, experts.dims());
        for routing in ROUTINGS {
            cases.extend(
                OpCase::new(
                    Op::MoeRouteBackward,
                    format!("moe_route_backward logits{dims:?} ({kind:?}) k={k} {routing:?}"),
                )
                .input(x.clone())
                .input(experts.clone())
                .input(d_weights.clone())
                .call(move |b: &B, t| Ok(vec![b.moe_route_backward(&t[0], &t[1], &t[2], routing)?]))
                .twin(move |a| vec![twin::moe_route_backward(&a[0], &a[1], &a[2], routing)])
                .dtypes(dtypes)
                .no_bad_inputs()
                .build(),
            );
        }
    }
    let x = logits(3140, &[3, 8], Logits::Distinct);
    let f16 = |t: &Tensor| cast(t, DType::F16);
    let g = data(3141, &[3, 2]);
    let bad: Vec<(&str, Tensor, Tensor, Tensor)> = vec![
        ("expert id 8 = E", x.clone(), id_tensor(&[0, 1, 2, 8, 4, 5], &[3, 2]), g.clone()),
        ("expert id u32::MAX", x.clone(), id_tensor(&[0, 1, 2, u32::MAX, 4, 5], &[3, 2]), g.clone()),
        ("experts f32", x.clone(), data(3142, &[3, 2]), g.clone()),
        ("experts[6] of rank 1 with logits[3, 8]", x.clone(), id_tensor(&[0, 1, 2, 3, 4, 5], &[6]), data(3143, &[6])),
        ("experts[2, 2] (rows ≠ 3)", x.clone(), id_tensor(&[0, 1, 2, 3], &[2, 2]), data(3144, &[2, 2])),
        (
            "experts[3, 0] (k = 0)",
            x.clone(),
            id_tensor(&[], &[3, 0]),
            Tensor::zeros([3, 0], DType::F32).expect("zeros"),
        ),
        ("experts[3, 9] (k > E)", x.clone(), id_tensor(&[0; 27], &[3, 9]), data(3145, &[3, 9])),
        ("d_weights[3, 3] with experts[3, 2]", x.clone(), chosen(&x, 2), data(3146, &[3, 3])),
        ("d_weights f16 with f32 logits", x.clone(), chosen(&x, 2), f16(&g)),
        ("logits f16, d_weights f32", f16(&x), chosen(&x, 2), g.clone()),
        ("logits u32", Rng::new(3147).ids([3, 8], 8), chosen(&x, 2), g.clone()),
        ("logits a scalar", Tensor::scalar(1.0), id_tensor(&[0], &[1]), data(3148, &[1])),
    ];
    for (what, x, e, g) in bad {
        for routing in ROUTINGS {
            let (x, e, g) = (x.clone(), e.clone(), g.clone());
            cases.push(Case::expect_error(
                Op::MoeRouteBackward,
                format!("moe_route_backward {what} {routing:?}"),
                move |b: &B| b.moe_route_backward(&b.upload(&x)?, &b.upload(&e)?, &b.upload(&g)?, routing).map(drop),
            ));
        }
    }
    cases.push(Case::expect_error(
        Op::MoeRouteBackward,
        "moe_route_backward d_weights on a foreign device",
        |b: &B| {
            let x = b.upload(&logits(3149, &[3, 8], Logits::Distinct))?;
            let e = b.upload(&id_tensor(&[0, 1, 2, 3, 4, 5], &[3, 2]))?;
            b.moe_route_backward(&x, &e, &foreign_tensor(&[3, 2], DType::F32), Routing::SoftmaxTopK).map(drop)
        },
    ));
    cases
}

// ───────────────────────────── expert matmul ─────────────────────────────

/// Sizes of an expert matmul: x `[tokens, rows, kin]` (rows = 1 or k), w `[experts, n, kin]`,
/// experts `[tokens, k]`.
#[derive(Debug, Clone, Copy)]
struct Sizes {
    tokens: usize,
    rows: usize,
    kin: usize,
    experts: usize,
    n: usize,
    k: usize,
}

/// Which experts the tokens choose.
#[derive(Debug, Clone, Copy)]
enum Pick {
    /// k distinct experts per token, drawn from all E.
    Any,
    /// Expert `hot` in slot t % k of every token, the others drawn (distinct) from `pool`;
    /// experts in neither are chosen by nobody.
    Hot(u32, &'static [u32]),
    /// k experts per token drawn with repeats (an expert may fill two slots of a token).
    Repeats,
}

impl Sizes {
    const fn new(tokens: usize, rows: usize, kin: usize, experts: usize, n: usize, k: usize) -> Sizes {
        Sizes { tokens, rows, kin, experts, n, k }
    }
    fn x_dims(&self) -> [usize; 3] {
        [self.tokens, self.rows, self.kin]
    }
    fn w_dims(&self) -> [usize; 3] {
        [self.experts, self.n, self.kin]
    }
    fn dy_dims(&self) -> [usize; 3] {
        [self.tokens, self.k, self.n]
    }
    /// The tokens' choices of experts, `[tokens, k]` U32.
    fn experts(&self, seed: u64, pick: Pick) -> Tensor {
        let mut rng = Rng::new(seed);
        let mut v = Vec::with_capacity(self.tokens * self.k);
        for t in 0..self.tokens {
            let (pool, hot): (Vec<u32>, Option<u32>) = match pick {
                Pick::Any => ((0..self.experts as u32).collect(), None),
                Pick::Hot(hot, pool) => (pool.to_vec(), Some(hot)),
                Pick::Repeats => {
                    v.extend((0..self.k).map(|_| rng.below(self.experts) as u32));
                    continue;
                }
            };
            let mut pool = pool;
            for i in (1..pool.len()).rev() {
                pool.swap(i, rng.below(i + 1));
            }
            let mut others = pool.into_iter();
            for j in 0..self.k {
                match hot {
                    Some(h) if j == t % self.k => v.push(h),
                    _ => v.push(others.next().expect("the pool holds k (or k − 1) experts")),
                }
            }
        }
        Tensor::from_vec(v, [self.tokens, self.k]).expect("shape")
    }
    fn describe(&self, pick: Pick) -> String {
        let Sizes { tokens, rows, kin, experts, n, k } = *self;
        let picks = match pick {
            Pick::Any => "distinct experts per token".to_string(),
            Pick::Hot(hot, pool) => {
                format!("expert {hot} chosen by all {tokens} tokens, the others from {pool:?}")
            }
            Pick::Repeats => "experts repeat within a token".to_string(),
        };
        format!("x[{tokens}, {rows}, {kin}] w[{experts}, {n}, {kin}] experts[{tokens}, {k}] ({picks})")
    }
}

/// The shapes of the float forward and backward cases, with the dtypes each runs with.
fn float_configs() -> Vec<(Sizes, Pick, &'static [DType])> {
    vec![
        // Decoding: one token, one x row shared by its k experts, or one per expert.
        (Sizes::new(1, 1, 64, 8, 24, 2), Pick::Any, FLOATS),
        (Sizes::new(1, 2, 64, 8, 24, 2), Pick::Any, FLOATS),
        // k = 1, an inner size with a vector tail.
        (Sizes::new(7, 1, 37, 4, 19, 1), Pick::Any, FLOATS),
        // k = E with one x row per chosen expert.
        (Sizes::new(5, 4, 32, 4, 16, 4), Pick::Any, FLOATS),
        // Prompts: expert 3 (or 0) takes more than 16 rows (panels and gemm), the others
        // about 10 (or 16) each (row dots); experts 4, 6, 7 (or 4, 5) nobody chose.
        (Sizes::new(40, 1, 72, 8, 50, 2), Pick::Hot(3, &[0, 1, 2, 5]), FLOATS),
        (Sizes::new(24, 3, 48, 6, 33, 3), Pick::Hot(0, &[1, 2, 3]), FLOATS),
        // One expert for every token: 17 rows (gemm, several panels of N = 200) and 16 (row dots).
        (Sizes::new(17, 1, 40, 3, 200, 1), Pick::Hot(1, &[]), &[DType::F32, DType::BF16]),
        (Sizes::new(16, 1, 40, 3, 70, 1), Pick::Hot(2, &[]), &[DType::F32]),
        // Many tokens and experts: every thread busy.
        (Sizes::new(64, 1, 128, 16, 96, 4), Pick::Any, &[DType::F32]),
        (Sizes::new(6, 1, 16, 5, 7, 3), Pick::Repeats, &[DType::F32]),
    ]
}

/// `expert_matmul`'s output, or an error if its dtype is not x's.
fn expert_matmul<B: ComputeBackend + ?Sized>(b: &B, x: &Tensor, w: &Tensor, experts: &Tensor) -> FbResult<Tensor> {
    let y = b.expert_matmul(x, w, experts)?;
    if y.dtype() != x.dtype() {
        return Err(Error::dtype("expert_matmul", "output (x's dtype)", x.dtype(), y.dtype()));
    }
    Ok(y)
}

/// Tolerance of a dot product of `len` terms of size ≤ 1 accumulated in f32, in `dtype`.
fn dot_tolerance(len: usize, dtype: DType) -> Tolerance {
    let f32_tol = Tolerance { abs: 2e-5 * (len as f64 / 32.0).max(1.0), rel: 1e-4 };
    f32_tol.max(Tolerance::for_dtype(dtype))
}

fn expert_matmul_cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let mut cases = Vec::new();
    for (i, (s, pick, dtypes)) in float_configs().into_iter().enumerate() {
        let seed = 3200 + 10 * i as u64;
        // With one x row per token, a grown k is valid (if k + 1 ≤ E, ids 0): shape free.
        let experts = Input::new(s.experts(seed + 2, pick));
        let experts = if s.rows == 1 { experts.shape_free() } else { experts };
        cases.extend(
            OpCase::new(Op::ExpertMatmul, format!("expert_matmul {}", s.describe(pick)))
                .input(data(seed, &s.x_dims()))
                .input(data(seed + 1, &s.w_dims()))
                .input(experts)
                .call(|b: &B, t| Ok(vec![expert_matmul(b, &t[0], &t[1], &t[2])?]))
                .twin(|a| vec![twin::expert_matmul(&a[0], &a[1], &a[2])])
                .tolerance(Tolerance::F32_LOOSE)
                .dtypes(dtypes)
                .build(),
        );
    }
    // No tokens: an empty [0, k, N].
    cases.extend(
        OpCase::new(Op::ExpertMatmul, "expert_matmul x[0, 1, 8] w[3, 4, 8] experts[0, 2] (no tokens)")
            .input(Tensor::zeros([0, 1, 8], DType::F32).expect("zeros"))
            .input(data(3300, &[3, 4, 8]))
            .input(Input::new(id_tensor(&[], &[0, 2])).shape_free())
            .call(|b: &B, t| Ok(vec![expert_matmul(b, &t[0], &t[1], &t[2])?]))
            .twin(|a| vec![twin::expert_matmul(&a[0], &a[1], &a[2])])
            .build(),
    );
    // K = 0: every output an empty sum.
    cases.extend(
        OpCase::new(Op::ExpertMatmul, "expert_matmul x[2, 1, 0] w[3, 4, 0] experts[2, 2] (K = 0)")
            .input(Tensor::zeros([2, 1, 0], DType::F32).expect("zeros"))
            .input(Tensor::zeros([3, 4, 0], DType::F32).expect("zeros"))
            .input(Input::new(id_tensor(&[2, 0, 1, 2], &[2, 2])).shape_free())
            .call(|b: &B, t| Ok(vec![expert_matmul(b, &t[0], &t[1], &t[2])?]))
            .twin(|a| vec![twin::expert_matmul(&a[0], &a[1], &a[2])])
            .build(),
    );
    cases.extend(quantized_forward_cases());
    cases.extend(bad_expert_matmul_cases());
    cases
}

/// The formats the block-weight cases quantize to: 32-blocks with and without integer
/// kernels, K-quants, non-linear grids (IQ4_NL, gpt-oss's MXFP4), FP8.
const WEIGHT_FORMATS: [DType; 7] =
    [DType::Q8_0, DType::Q4_0, DType::Q4K, DType::Q6K, DType::IQ4NL, DType::F8E4M3, DType::MXFP4];

/// The shapes of the block-weight cases (K = 256 suits every format), with x's dtype.
fn quantized_configs() -> Vec<(Sizes, Pick, DType)> {
    vec![
        (Sizes::new(1, 1, 256, 8, 40, 2), Pick::Any, DType::F32),
        (Sizes::new(1, 2, 256, 8, 40, 2), Pick::Any, DType::F32),
        (Sizes::new(40, 1, 256, 6, 48, 2), Pick::Hot(3, &[0, 1, 4]), DType::F32),
        (Sizes::new(24, 3, 256, 6, 33, 3), Pick::Hot(0, &[1, 2, 3]), DType::F16),
        (Sizes::new(20, 2, 256, 5, 17, 2), Pick::Hot(4, &[0, 2]), DType::BF16),
    ]
}

/// Checks `got` row by row (along its last dim) against `exact`, accepting a row that
/// matches `rounded` instead: a backend may dot the few rows of an expert with x rounded
/// to 8 bits (integer kernels, as `quantized_matmul` may) and many rows with x as it is.
fn check_rows_either(tol: Tolerance, got: &Array, exact: &Array, rounded: &Array) -> Result<(), String> {
    if got.shape != exact.shape {
        return tol.check("output", got, exact);
    }
    let n = got.last_dim();
    let row = |a: &Array, r: usize| Array::new(vec![n], a.row(r).to_vec());
    let mut want = exact.clone();
    for r in 0..got.rows() {
        if tol.check("row", &row(got, r), &row(exact, r)).is_err() {
            want.data[r * n..(r + 1) * n].copy_from_slice(rounded.row(r));
        }
    }
    tol.check("output (each row against x·Wᵀ, or x̃·Wᵀ with x rounded to 8 bits)", got, &want)
}

/// `expert_matmul` with W an f32 tensor quantized by the backend to `w_dtype`, against the
/// twin on the twin's reading of the blocks (and x rounded to 8 bits, row by row, where the
/// format has integer kernels).
fn quantized_forward_cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let mut cases = Vec::new();
    for (f, w_dtype) in WEIGHT_FORMATS.into_iter().enumerate() {
        for (i, (s, pick, x_dtype)) in quantized_configs().into_iter().enumerate() {
            let seed = 3400 + 100 * f as u64 + 10 * i as u64;
            let x = cast(&data(seed, &s.x_dims()), x_dtype);
            let w = data(seed + 1, &s.w_dims());
            let experts = s.experts(seed + 2, pick);
            let tol = dot_tolerance(s.kin, x_dtype);
            let block = fusebox::spec::quant::int_activation_block(w_dtype);
            cases.push(Case::custom(
                Op::ExpertMatmul,
                CaseKind::Forward,
                format!("expert_matmul {} | x {x_dtype}, w quantized to {w_dtype}", s.describe(pick)),
                move |b: &B| {
                    let up = upload_all(b, &[x.clone(), experts.clone()])?;
                    let q = ok("quantize", b.quantize(&ok("upload", b.upload(&w))?, w_dtype))?;
                    let wd = quant_twin::dequantize(w_dtype, &host_bytes(b, &q)?, &s.w_dims());
                    let out = catch(|| expert_matmul(b, &up[0], &q, &up[1]))?
                        .map_err(|e| format!("returned an error: {e}"))?;
                    let got = host_values(b, &out)?;
                    let (xa, ea) = (Array::from_tensor(&x), Array::from_tensor(&experts));
                    let exact = twin::expert_matmul(&xa, &wd, &ea);
                    match block {
                        None => tol.check("output", &got, &exact),
                        Some(block) => {
                            let rounded = twin::expert_matmul(&quant_twin::round_activations(&xa, block), &wd, &ea);
                            check_rows_either(tol, &got, &exact, &rounded)
                        }
                    }
                },
            ));
        }
    }
    cases
}

fn bad_expert_matmul_cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    // Valid: x[3, 1, 8], w[4, 5, 8], experts[3, 2]; each case spoils one thing.
    let x = data(3600, &[3, 1, 8]);
    let w = data(3601, &[4, 5, 8]);
    let e = id_tensor(&[0, 1, 2, 3, 3, 0], &[3, 2]);
    let bad: Vec<(&str, Tensor, Tensor, Tensor)> = vec![
        ("x[3, 8] (rank 2)", data(3602, &[3, 8]), w.clone(), e.clone()),
        ("x[3, 1, 1, 8] (rank 4)", data(3603, &[3, 1, 1, 8]), w.clone(), e.clone()),
        ("w[5, 8] (rank 2)", x.clone(), data(3604, &[5, 8]), e.clone()),
        ("w[2, 4, 5, 8] (rank 4)", x.clone(), data(3605, &[2, 4, 5, 8]), e.clone()),
        ("experts[6] (rank 1)", x.clone(), w.clone(), id_tensor(&[0, 1, 2, 3, 3, 0], &[6])),
        ("experts[3, 2, 1] (rank 3)", x.clone(), w.clone(), id_tensor(&[0, 1, 2, 3, 3, 0], &[3, 2, 1])),
        ("experts[3, 0] (k = 0)", x.clone(), w.clone(), id_tensor(&[], &[3, 0])),
        (
            "experts[3, 5] (k = 5 > E = 4)",
            x.clone(),
            w.clone(),
            id_tensor(&[0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2], &[3, 5]),
        ),
        ("experts[2, 2] (tokens ≠ 3)", x.clone(), w.clone(), id_tensor(&[0, 1, 2, 3], &[2, 2])),
        ("expert id 4 = E", x.clone(), w.clone(), id_tensor(&[0, 1, 2, 4, 3, 0], &[3, 2])),
        ("expert id u32::MAX", x.clone(), w.clone(), id_tensor(&[0, 1, u32::MAX, 3, 3, 0], &[3, 2])),
        ("x[3, 3, 8] with k = 2 (R neither 1 nor k)", data(3606, &[3, 3, 8]), w.clone(), e.clone()),
        ("x[3, 1, 9] with w[4, 5, 8] (K mismatch)", data(3607, &[3, 1, 9]), w.clone(), e.clone()),
        ("x f32, w f16", x.clone(), cast(&w, DType::F16), e.clone()),
        ("x f16, w f32", cast(&x, DType::F16), w.clone(), e.clone()),
        ("x bf16, w f16", cast(&x, DType::BF16), cast(&w, DType::F16), e.clone()),
        ("x u32", Rng::new(3608).ids([3, 1, 8], 4), w.clone(), e.clone()),
        ("w u32", x.clone(), Rng::new(3609).ids([4, 5, 8], 4), e.clone()),
        ("experts f32", x.clone(), w.clone(), data(3610, &[3, 2])),
        (
            "x q8_0 (quantized x)",
            Tensor::zeros([3, 1, 32], DType::Q8_0).expect("zeros"),
            Tensor::zeros([4, 5, 32], DType::Q8_0).expect("zeros"),
            e.clone(),
        ),
        (
            "x[3, 1, 64] with w[4, 5, 32] q8_0 (K mismatch)",
            data(3611, &[3, 1, 64]),
            Tensor::zeros([4, 5, 32], DType::Q8_0).expect("zeros"),
            e.clone(),
        ),
        (
            "x[3, 1, 48] with w[4, 5, 32] mxfp4 (K mismatch)",
            data(3613, &[3, 1, 48]),
            Tensor::zeros([4, 5, 32], DType::MXFP4).expect("zeros"),
            e.clone(),
        ),
        (
            "x f32 with w q4_k[4, 5, 256] and id 4 = E",
            data(3612, &[3, 1, 256]),
            Tensor::zeros([4, 5, 256], DType::Q4K).expect("zeros"),
            id_tensor(&[0, 1, 2, 4, 3, 0], &[3, 2]),
        ),
    ];
    let mut cases = Vec::new();
    for (what, x, w, e) in bad {
        cases.push(Case::expect_error(Op::ExpertMatmul, format!("expert_matmul {what}"), move |b: &B| {
            b.expert_matmul(&b.upload(&x)?, &b.upload(&w)?, &b.upload(&e)?).map(drop)
        }));
    }
    cases.push(Case::expect_error(Op::ExpertMatmul, "expert_matmul w on a foreign device", move |b: &B| {
        b.expert_matmul(&b.upload(&x)?, &foreign_tensor(&[4, 5, 32], DType::Q8_0), &b.upload(&e)?).map(drop)
    }));
    cases
}

// ───────────────────────────── expert_matmul_backward ─────────────────────────────

/// `expert_matmul_backward` into a fresh zero weight gradient: `[dx, dw]`.
fn backward_with_dw<B: ComputeBackend + ?Sized>(b: &B, t: &[Tensor], dy: &Tensor) -> FbResult<Vec<Tensor>> {
    let mut dw = b.zeros(t[1].shape(), t[1].dtype())?;
    let dx = b.expert_matmul_backward(&t[0], &t[1], &t[2], dy, Some(&mut dw))?;
    Ok(vec![dx, dw])
}

fn expert_matmul_backward_cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let mut cases = Vec::new();
    // dx and dw by finite differences of the twin's forward, and the backend against the twin.
    let grads: [(Sizes, Pick); 6] = [
        (Sizes::new(3, 1, 5, 4, 3, 2), Pick::Any),
        (Sizes::new(2, 2, 4, 3, 5, 2), Pick::Any),
        (Sizes::new(1, 1, 6, 5, 4, 1), Pick::Any),
        (Sizes::new(4, 3, 3, 3, 2, 3), Pick::Any),
        (Sizes::new(20, 1, 4, 4, 3, 2), Pick::Hot(1, &[0, 2])),
        (Sizes::new(4, 1, 3, 3, 2, 2), Pick::Repeats),
    ];
    for (i, (s, pick)) in grads.into_iter().enumerate() {
        let seed = 3700 + 10 * i as u64;
        cases.extend(
            GradCase::new(Op::ExpertMatmulBackward, format!("expert_matmul_backward {} with dw", s.describe(pick)))
                .input(data(seed, &s.x_dims()))
                .input(data(seed + 1, &s.w_dims()))
                .input(s.experts(seed + 2, pick))
                .forward(|a| twin::expert_matmul(&a[0], &a[1], &a[2]))
                .backward_twin(|a, dy| {
                    let (dx, dw) = twin::expert_matmul_backward(&a[0], &a[1], &a[2], dy);
                    vec![dx, dw]
                })
                .backward_call(|b: &B, t, dy| backward_with_dw(b, t, dy))
                .build(),
        );
    }
    // Without a weight gradient (w held constant): dx alone.
    let s = Sizes::new(3, 2, 5, 4, 3, 2);
    cases.extend(
        GradCase::new(Op::ExpertMatmulBackward, format!("expert_matmul_backward {} without dw", s.describe(Pick::Any)))
            .input(data(3800, &s.x_dims()))
            .input(Input::new(data(3801, &s.w_dims())).constant())
            .input(s.experts(3802, Pick::Any))
            .forward(|a| twin::expert_matmul(&a[0], &a[1], &a[2]))
            .backward_twin(|a, dy| vec![twin::expert_matmul_backward(&a[0], &a[1], &a[2], dy).0])
            .backward_call(|b: &B, t, dy| Ok(vec![b.expert_matmul_backward(&t[0], &t[1], &t[2], dy, None)?]))
            .build(),
    );
    // Per dtype and at sizes past finite differences: dw starts from random values, so
    // the gradient must be added onto them, not written over them.
    for (i, (s, pick, dtypes)) in float_configs().into_iter().enumerate() {
        let seed = 3900 + 10 * i as u64;
        let tol = dot_tolerance(s.n * s.k, DType::F32).max(dot_tolerance(s.tokens * s.k, DType::F32));
        cases.extend(
            OpCase::new(Op::ExpertMatmulBackward, format!("expert_matmul_backward {} into dw ≠ 0", s.describe(pick)))
                .input(data(seed, &s.x_dims()))
                .input(data(seed + 1, &s.w_dims()))
                .input(s.experts(seed + 2, pick))
                .input(data(seed + 3, &s.dy_dims()))
                .input(data(seed + 4, &s.w_dims()))
                .call(|b: &B, t| {
                    let mut dw = b.copy(&t[4])?;
                    let dx = b.expert_matmul_backward(&t[0], &t[1], &t[2], &t[3], Some(&mut dw))?;
                    if dx.dtype() != t[0].dtype() {
                        return Err(Error::dtype("expert_matmul_backward", "dx (x's dtype)", t[0].dtype(), dx.dtype()));
                    }
                    Ok(vec![dx, dw])
                })
                .twin(|a| {
                    let (dx, dw) = twin::expert_matmul_backward_accumulate(&a[0], &a[1], &a[2], &a[3], &a[4]);
                    vec![dx, dw]
                })
                .tolerance(tol)
                .dtypes(dtypes)
                .build(),
        );
    }
    // No tokens: dx empty, dw left as it was.
    cases.extend(
        OpCase::new(Op::ExpertMatmulBackward, "expert_matmul_backward x[0, 2, 8] w[3, 4, 8] experts[0, 2] (no tokens)")
            .input(Tensor::zeros([0, 2, 8], DType::F32).expect("zeros"))
            .input(data(4500, &[3, 4, 8]))
            .input(id_tensor(&[], &[0, 2]))
            .input(Tensor::zeros([0, 2, 4], DType::F32).expect("zeros"))
            .input(data(4501, &[3, 4, 8]))
            .call(|b: &B, t| {
                let mut dw = b.copy(&t[4])?;
                let dx = b.expert_matmul_backward(&t[0], &t[1], &t[2], &t[3], Some(&mut dw))?;
                Ok(vec![dx, dw])
            })
            .twin(|a| {
                let (dx, dw) = twin::expert_matmul_backward_accumulate(&a[0], &a[1], &a[2], &a[3], &a[4]);
                vec![dx, dw]
            })
            .build(),
    );
    cases.extend(quantized_backward_cases());
    cases.extend(bad_backward_cases());
    cases
}

/// dx of `expert_matmul_backward` with W quantized by the backend (no weight gradient),
/// against the twin on the twin's reading of the blocks.
fn quantized_backward_cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let mut cases = Vec::new();
    for (f, w_dtype) in WEIGHT_FORMATS.into_iter().enumerate() {
        for (i, (s, pick, x_dtype)) in quantized_configs().into_iter().enumerate() {
            let seed = 4000 + 100 * f as u64 + 10 * i as u64;
            let x = cast(&data(seed, &s.x_dims()), x_dtype);
            let w = data(seed + 1, &s.w_dims());
            let experts = s.experts(seed + 2, pick);
            let dy = cast(&data(seed + 3, &s.dy_dims()), x_dtype);
            let tol = dot_tolerance(s.n * s.k, x_dtype);
            cases.push(Case::custom(
                Op::ExpertMatmulBackward,
                CaseKind::Backward,
                format!("expert_matmul_backward {} | x {x_dtype}, w quantized to {w_dtype}, no dw", s.describe(pick)),
                move |b: &B| {
                    let up = upload_all(b, &[x.clone(), experts.clone(), dy.clone()])?;
                    let q = ok("quantize", b.quantize(&ok("upload", b.upload(&w))?, w_dtype))?;
                    let wd = quant_twin::dequantize(w_dtype, &host_bytes(b, &q)?, &s.w_dims());
                    let dx = catch(|| b.expert_matmul_backward(&up[0], &q, &up[1], &up[2], None))?
                        .map_err(|e| format!("returned an error: {e}"))?;
                    if dx.dtype() != x_dtype {
                        return Err(format!("dx dtype {}, expected {x_dtype}", dx.dtype()));
                    }
                    let (xa, ea, dya) = (Array::from_tensor(&x), Array::from_tensor(&experts), Array::from_tensor(&dy));
                    tol.check("dx", &host_values(b, &dx)?, &twin::expert_matmul_backward(&xa, &wd, &ea, &dya).0)
                },
            ));
        }
    }
    cases
}

fn bad_backward_cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    // Valid: x[3, 1, 8], w[4, 5, 8], experts[3, 2], dy[3, 2, 5], dw[4, 5, 8] (or none).
    let x = data(4600, &[3, 1, 8]);
    let w = data(4601, &[4, 5, 8]);
    let e = id_tensor(&[0, 1, 2, 3, 3, 0], &[3, 2]);
    let dy = data(4602, &[3, 2, 5]);
    let dw = Some(Tensor::zeros([4, 5, 8], DType::F32).expect("zeros"));
    let q8 = Tensor::zeros([4, 5, 32], DType::Q8_0).expect("zeros");
    let x32 = data(4603, &[3, 1, 32]);
    type Bad = (&'static str, Tensor, Tensor, Tensor, Tensor, Option<Tensor>);
    let bad: Vec<Bad> = vec![
        (
            "dw given with w q8_0",
            x32.clone(),
            q8.clone(),
            e.clone(),
            dy.clone(),
            Some(Tensor::zeros([4, 5, 32], DType::F32).expect("zeros")),
        ),
        (
            "dw given with w f8e4m3",
            x32.clone(),
            Tensor::zeros([4, 5, 32], DType::F8E4M3).expect("zeros"),
            e.clone(),
            dy.clone(),
            Some(Tensor::zeros([4, 5, 32], DType::F32).expect("zeros")),
        ),
        ("dw q8_0 given with w q8_0", x32.clone(), q8.clone(), e.clone(), dy.clone(), Some(q8.clone())),
        (
            "dw f16 with w f32",
            x.clone(),
            w.clone(),
            e.clone(),
            dy.clone(),
            Some(Tensor::zeros([4, 5, 8], DType::F16).expect("zeros")),
        ),
        (
            "dw[4, 5, 9] with w[4, 5, 8]",
            x.clone(),
            w.clone(),
            e.clone(),
            dy.clone(),
            Some(Tensor::zeros([4, 5, 9], DType::F32).expect("zeros")),
        ),
        (
            "dw[3, 5, 8] with w[4, 5, 8]",
            x.clone(),
            w.clone(),
            e.clone(),
            dy.clone(),
            Some(Tensor::zeros([3, 5, 8], DType::F32).expect("zeros")),
        ),
        ("dy[3, 2, 6] with N = 5", x.clone(), w.clone(), e.clone(), data(4604, &[3, 2, 6]), dw.clone()),
        ("dy[3, 1, 5] with k = 2", x.clone(), w.clone(), e.clone(), data(4605, &[3, 1, 5]), None),
        ("dy[3, 10] (rank 2)", x.clone(), w.clone(), e.clone(), data(4606, &[3, 10]), None),
        ("dy f16 with f32 x", x.clone(), w.clone(), e.clone(), cast(&dy, DType::F16), None),
        ("dy u32", x.clone(), w.clone(), e.clone(), Rng::new(4607).ids([3, 2, 5], 4), None),
        ("expert id 4 = E", x.clone(), w.clone(), id_tensor(&[0, 1, 2, 4, 3, 0], &[3, 2]), dy.clone(), dw.clone()),
        ("expert id u32::MAX", x.clone(), w.clone(), id_tensor(&[0, 1, 2, 3, u32::MAX, 0], &[3, 2]), dy.clone(), None),
        (
            "expert id 4 = E with w q8_0",
            x32.clone(),
            q8.clone(),
            id_tensor(&[4, 1, 2, 3, 3, 0], &[3, 2]),
            dy.clone(),
            None,
        ),
        (
            "experts[3, 0] (k = 0)",
            x.clone(),
            w.clone(),
            id_tensor(&[], &[3, 0]),
            Tensor::zeros([3, 0, 5], DType::F32).expect("zeros"),
            None,
        ),
        (
            "experts[3, 5] (k = 5 > E = 4)",
            x.clone(),
            w.clone(),
            id_tensor(&[0; 15], &[3, 5]),
            data(4608, &[3, 5, 5]),
            dw.clone(),
        ),
        ("experts[6] (rank 1)", x.clone(), w.clone(), id_tensor(&[0, 1, 2, 3, 3, 0], &[6]), dy.clone(), None),
        ("experts f32", x.clone(), w.clone(), data(4609, &[3, 2]), dy.clone(), None),
        (
            "x[3, 3, 8] with k = 2 (R neither 1 nor k)",
            data(4610, &[3, 3, 8]),
            w.clone(),
            e.clone(),
            dy.clone(),
            dw.clone(),
        ),
        ("x[3, 8] (rank 2)", data(4611, &[3, 8]), w.clone(), e.clone(), dy.clone(), None),
        ("w[5, 8] (rank 2)", x.clone(), data(4612, &[5, 8]), e.clone(), dy.clone(), None),
        ("x f16, w f32", cast(&x, DType::F16), w.clone(), e.clone(), cast(&dy, DType::F16), None),
        ("x f32, w bf16", x.clone(), cast(&w, DType::BF16), e.clone(), dy.clone(), None),
    ];
    let mut cases = Vec::new();
    for (what, x, w, e, dy, dw) in bad {
        cases.push(Case::expect_error(
            Op::ExpertMatmulBackward,
            format!("expert_matmul_backward {what}"),
            move |b: &B| {
                let mut dw = dw.as_ref().map(|d| b.upload(d)).transpose()?;
                b.expert_matmul_backward(&b.upload(&x)?, &b.upload(&w)?, &b.upload(&e)?, &b.upload(&dy)?, dw.as_mut())
                    .map(drop)
            },
        ));
    }
    // A refused call leaves dw as it was: an id ≥ E, and a dw whose storage is shared.
    for (what, ids, shared) in [
        ("expert id 4 = E", id_tensor(&[0, 1, 2, 3, 4, 0], &[3, 2]), false),
        ("dw shared with a live clone", e.clone(), true),
    ] {
        let (x, w, dy) = (x.clone(), w.clone(), dy.clone());
        cases.push(Case::custom(
            Op::ExpertMatmulBackward,
            CaseKind::BadInput,
            format!("expert_matmul_backward with dw ≠ 0 and {what}: an error, dw unchanged"),
            move |b: &B| {
                let up = |t: &Tensor| ok("upload", b.upload(t));
                let mut dw = up(&data(4620, &[4, 5, 8]))?;
                let before = host_values(b, &dw)?;
                let reader = shared.then(|| dw.clone());
                let (x, w, ids, dy) = (up(&x)?, up(&w)?, up(&ids)?, up(&dy)?);
                if catch(|| b.expert_matmul_backward(&x, &w, &ids, &dy, Some(&mut dw)))?.is_ok() {
                    return Err("accepted the bad input instead of returning an error".into());
                }
                let after = host_values(b, reader.as_ref().unwrap_or(&dw))?;
                Tolerance::EXACT.check("dw after the refused call", &after, &before)
            },
        ));
    }
    cases.push(Case::expect_error(
        Op::ExpertMatmulBackward,
        "expert_matmul_backward dy on a foreign device",
        move |b: &B| {
            let (x, w, e) = (b.upload(&x)?, b.upload(&w)?, b.upload(&e)?);
            b.expert_matmul_backward(&x, &w, &e, &foreign_tensor(&[3, 2, 5], DType::F32), None).map(drop)
        },
    ));
    cases
}

/// Every case of the family.
pub fn cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let mut cases = route_cases();
    cases.extend(route_backward_cases());
    cases.extend(expert_matmul_cases());
    cases.extend(expert_matmul_backward_cases());
    cases
}
