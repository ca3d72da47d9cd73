//! Cases of the attention family.
//!
//! Sizes are chosen to hit the kernels' edges: GQA ratios 1, 3, 4, 8 (and 24, 70 for
//! the decode-style blocks that hold a whole group); query lengths below 16 (blocks of
//! a GQA group's queries) and above (blocks of 64 queries of a head), lengths that are
//! not multiples of any block or tile (1, 3, 17, 67, 130); head dims 32, 64, 80, 128,
//! and 0, 24, 40 (rows padded to whole registers); Tq < Tk; large logits; fully masked
//! rows; empty key sets; caches whose unused rows hold NaN (read one and the output
//! turns NaN). Sliding windows: 1 (each query sees only itself), ≥ T (full causal),
//! lengths that are no multiple of any block (so a window starts and ends inside key
//! blocks of the forward, the backward and decode), with GQA, Tq < Tk, and decode over
//! caches longer than the window whose rows before it hold NaN. Attention sinks (one
//! logit per query head in each row's denominator, in [−1, 3): from negligible to
//! dominant) with every path of the causal ops: both block layouts, GQA, windows,
//! decode with split keys, F16/BF16 caches, ragged batched decode, finite differences
//! of dsinks, and bad sinks (length, dtype, rank).

use fusebox::{AttentionMask, CausalAttentionResult, ComputeBackend, DType, Op, Shape, Tensor};

use crate::array::Array;
use crate::case::{Case, CaseKind, GradCase, Input, OpCase};
use crate::reference::attention::{self as twin, TwinMask};
use crate::rng::Rng;
use crate::tolerance::Tolerance;

const FLOATS: &[DType] = &[DType::F32, DType::F16, DType::BF16];

/// Every case of the family.
pub fn cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let mut v = Vec::new();
    v.extend(attention_cases());
    v.extend(sdpa_cases());
    v.extend(causal_attention_cases());
    v.extend(backward_cases());
    v.extend(decode_cases());
    v.extend(batched_decode_cases());
    v.extend(cache_cases());
    v.extend(mask_and_softmax_cases());
    v.extend(layout_cases());
    v.push(supports_case());
    v.extend(bad_value_cases());
    v.extend(bad_sinks_cases());
    v
}

/// Sizes of one attention configuration; q and k uniform in `[−amp, amp)` (large
/// logits for amp > 1), v in `[−1, 1)`.
#[derive(Debug, Clone, Copy)]
struct Cfg {
    b: usize,
    hq: usize,
    hkv: usize,
    tq: usize,
    tk: usize,
    d: usize,
    amp: f64,
    /// The sliding window of the causal ops (`None`: full causal).
    window: Option<usize>,
    /// Whether the causal ops get attention sinks ([`Cfg::sinks_tensor`]).
    sinks: bool,
}

impl Cfg {
    fn new(b: usize, hq: usize, hkv: usize, tq: usize, tk: usize, d: usize) -> Cfg {
        Cfg { b, hq, hkv, tq, tk, d, amp: 1.0, window: None, sinks: false }
    }
    fn with_sinks(self) -> Cfg {
        Cfg { sinks: true, ..self }
    }
    /// The attention sinks `[Hq]` f32, in [−1, 3): against scores of order ±1 over a few
    /// to hundreds of keys, from a small share of each row's denominator to most of it.
    fn sinks_tensor(&self) -> Tensor {
        Rng::new(97).tensor(Shape::new([self.hq]), -1.0, 3.0)
    }
    /// The sinks as a constant f32 input of a case (the generated bad inputs give them
    /// one logit too many and a U32 dtype).
    fn sinks_input(&self) -> Input {
        Input::new(self.sinks_tensor()).keep_f32()
    }
    fn amp(self, amp: f64) -> Cfg {
        Cfg { amp, ..self }
    }
    fn window(self, w: usize) -> Cfg {
        Cfg { window: Some(w), ..self }
    }
    fn scale(&self) -> f32 {
        1.0 / (self.d.max(1) as f32).sqrt()
    }
    fn name(&self) -> String {
        let amp = if self.amp == 1.0 { String::new() } else { format!(" q,k×{}", self.amp) };
        let window = self.window.map(|w| format!(" window={w}")).unwrap_or_default();
        let sinks = if self.sinks { " sinks" } else { "" };
        format!(
            "B{} Hq{} Hkv{} (GQA {}) Tq{} Tk{} D{}{amp}{window}{sinks} scale={}",
            self.b,
            self.hq,
            self.hkv,
            self.hq / self.hkv.max(1),
            self.tq,
            self.tk,
            self.d,
            self.scale()
        )
    }
    fn q_shape(&self) -> Shape {
        Shape::new([self.b, self.hq, self.tq, self.d])
    }
    fn kv_shape(&self) -> Shape {
        Shape::new([self.b, self.hkv, self.tk, self.d])
    }
    /// Random q, k, v.
    fn qkv(&self, seed: u64) -> (Tensor, Tensor, Tensor) {
        let mut rng = Rng::new(seed);
        let a = self.amp;
        (rng.tensor(self.q_shape(), -a, a), rng.tensor(self.kv_shape(), -a, a), rng.tensor(self.kv_shape(), -1.0, 1.0))
    }
}

fn arrays(ts: &[&Tensor]) -> Vec<Array> {
    ts.iter().map(|t| Array::from_tensor(t)).collect()
}

fn rounded(t: &Tensor, dtype: DType) -> Tensor {
    Tensor::from_f32_as(&t.to_vec_f32().expect("float tensor"), t.shape().clone(), dtype).expect("float dtype")
}

fn err(e: fusebox::Error) -> String {
    format!("returned an error: {e}")
}

// ─────────────────────────────── attention ───────────────────────────────

fn attention_case<B: ComputeBackend + ?Sized + 'static>(
    c: Cfg,
    causal: bool,
    dtypes: &[DType],
    bad: bool,
) -> Vec<Case<B>> {
    let (q, k, v) = c.qkv(11);
    let scale = c.scale();
    let case = OpCase::new(Op::Attention, format!("attention {} causal={causal}", c.name()))
        .input(q)
        .input(k)
        .input(v)
        .call(move |b: &B, t: &[Tensor]| Ok(vec![b.attention(&t[0], &t[1], &t[2], scale, causal)?]))
        .twin(move |a| vec![twin::attention(&a[0], &a[1], &a[2], scale as f64, causal)])
        .tolerance(Tolerance::F32_LOOSE)
        .dtypes(dtypes);
    if bad {
        case.build()
    } else {
        case.no_bad_inputs().build()
    }
}

fn attention_cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let mut v = Vec::new();
    v.extend(attention_case(Cfg::new(1, 4, 2, 20, 45, 32), false, FLOATS, true));
    v.extend(attention_case(Cfg::new(2, 6, 2, 40, 9, 64), false, &[DType::F32], false)); // Tq > Tk, non-causal
    v.extend(attention_case(Cfg::new(1, 3, 1, 3, 17, 80), false, &[DType::F32], false)); // group blocks
    v.extend(attention_case(Cfg::new(1, 8, 2, 67, 130, 64), true, &[DType::F32, DType::BF16], false));
    v.extend(attention_case(Cfg::new(2, 4, 4, 1, 1, 32), true, &[DType::F32], false));
    // Few queries of large GQA groups: blocks of several heads × several rows, and a
    // group wider than one block.
    v.extend(attention_case(Cfg::new(1, 24, 2, 5, 19, 16), true, &[DType::F32], false));
    v.extend(attention_case(Cfg::new(1, 70, 1, 2, 9, 8), false, &[DType::F32], false));
    // No keys at all: every row sees nothing and gives zeros (both block layouts).
    v.extend(attention_case(Cfg::new(1, 2, 2, 20, 0, 8), false, &[DType::F32], false));
    v.extend(attention_case(Cfg::new(1, 2, 2, 3, 0, 8), false, &[DType::F32], false));
    v
}

// ─────────────────────────────────── sdpa ───────────────────────────────────

/// Which mask an sdpa case passes.
#[derive(Debug, Clone, Copy, PartialEq)]
enum MaskKind {
    Unmasked,
    Additive,
    Boolean,
}

/// A random mask of `shape`: additive values in [−3, 0] with about a fifth of the
/// scores at −∞, or keep flags with about a third dropped; row `dead_row` of every
/// [Tq, Tk] slice is masked entirely.
fn random_mask(kind: MaskKind, shape: &[usize], dead_row: usize, seed: u64) -> Tensor {
    let mut rng = Rng::new(seed);
    let (tq, tk) = (shape[shape.len() - 2], shape[shape.len() - 1]);
    let n: usize = shape.iter().product();
    let row_of = |idx: usize| (idx / tk) % tq;
    match kind {
        MaskKind::Boolean => {
            let v: Vec<u32> = (0..n).map(|i| u32::from(row_of(i) != dead_row && rng.uniform() > 0.33)).collect();
            Tensor::from_vec(v, Shape::new(shape.to_vec())).expect("shape")
        }
        _ => {
            let v: Vec<f32> = (0..n)
                .map(|i| {
                    let x = rng.uniform();
                    if row_of(i) == dead_row || x < 0.2 {
                        f32::NEG_INFINITY
                    } else {
                        (-3.0 * x) as f32
                    }
                })
                .collect();
            Tensor::from_vec(v, Shape::new(shape.to_vec())).expect("shape")
        }
    }
}

fn sdpa_case<B: ComputeBackend + ?Sized + 'static>(
    c: Cfg,
    kind: MaskKind,
    per_head: bool,
    causal: bool,
    dtypes: &[DType],
    bad: bool,
) -> Vec<Case<B>> {
    let (q, k, v) = c.qkv(23);
    let scale = c.scale();
    let mask_shape = if per_head { vec![c.b, c.hq, c.tq, c.tk] } else { vec![c.tq, c.tk] };
    let dead_row = c.tq / 2;
    let mut case = OpCase::new(
        Op::Sdpa,
        format!(
            "sdpa {} mask={kind:?}{} causal={causal} (row {dead_row} fully masked)",
            c.name(),
            if per_head { " [B,Hq,Tq,Tk]" } else { " [Tq,Tk]" }
        ),
    )
    .input(q)
    .input(k)
    .input(v);
    if kind != MaskKind::Unmasked {
        case = case.input(Input::new(random_mask(kind, &mask_shape, dead_row, 5)).keep_f32().constant());
    }
    let case = case
        .call(move |b: &B, t: &[Tensor]| {
            let mask = match kind {
                MaskKind::Unmasked => None,
                MaskKind::Additive => Some(AttentionMask::Additive(&t[3])),
                MaskKind::Boolean => Some(AttentionMask::Boolean(&t[3])),
            };
            Ok(vec![b.sdpa(&t[0], &t[1], &t[2], mask, scale, causal)?])
        })
        .twin(move |a| {
            let mask = match kind {
                MaskKind::Unmasked => None,
                MaskKind::Additive => Some(TwinMask::Additive(&a[3])),
                MaskKind::Boolean => Some(TwinMask::Boolean(&a[3])),
            };
            vec![twin::sdpa(&a[0], &a[1], &a[2], mask, scale as f64, causal)]
        })
        .tolerance(Tolerance::F32_LOOSE)
        .dtypes(dtypes);
    if bad {
        case.build()
    } else {
        case.no_bad_inputs().build()
    }
}

fn sdpa_cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    use MaskKind::*;
    let mut v = Vec::new();
    // Per-head blocks (Tq ≥ 16) and group blocks (Tq < 16), both mask kinds and shapes.
    v.extend(sdpa_case(Cfg::new(1, 4, 2, 20, 33, 32), Additive, false, false, FLOATS, true));
    v.extend(sdpa_case(Cfg::new(2, 4, 1, 5, 9, 32), Boolean, true, true, FLOATS, true));
    v.extend(sdpa_case(Cfg::new(1, 2, 2, 3, 17, 64), Boolean, false, false, &[DType::F32], false));
    v.extend(sdpa_case(Cfg::new(1, 6, 2, 70, 70, 64), Additive, true, true, &[DType::F32], false));
    v.extend(sdpa_case(Cfg::new(2, 3, 3, 67, 80, 32), Boolean, false, true, &[DType::F32], false));
    v.extend(sdpa_case(Cfg::new(1, 4, 2, 17, 30, 32), Unmasked, false, true, &[DType::F32], false));
    v.extend(sdpa_case(Cfg::new(1, 2, 1, 24, 50, 40), Additive, false, false, &[DType::F32], false)); // D 40
    v
}

// ───────────────────────────── causal attention ─────────────────────────────

fn causal_case<B: ComputeBackend + ?Sized + 'static>(c: Cfg, dtypes: &[DType], bad: bool) -> Vec<Case<B>> {
    let (q, k, v) = c.qkv(31);
    let (scale, window, sinks) = (c.scale(), c.window, c.sinks);
    let mut case =
        OpCase::new(Op::CausalAttention, format!("causal_attention {}", c.name())).input(q).input(k).input(v);
    if sinks {
        case = case.input(c.sinks_input());
    }
    let case = case
        .call(move |b: &B, t: &[Tensor]| {
            let r = b.causal_attention(&t[0], &t[1], &t[2], window, t.get(3), scale)?;
            Ok(vec![r.output, r.logsumexp])
        })
        .twin(move |a| {
            let (o, lse) = twin::causal_attention(&a[0], &a[1], &a[2], window, a.get(3), scale as f64);
            vec![o, lse]
        })
        .tolerance(Tolerance::F32_LOOSE)
        .dtypes(dtypes);
    if bad {
        case.build()
    } else {
        case.no_bad_inputs().build()
    }
}

fn causal_attention_cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let f32_only = &[DType::F32];
    let mut v = Vec::new();
    v.extend(causal_case(Cfg::new(2, 4, 4, 17, 17, 32), FLOATS, true)); // GQA 1
    v.extend(causal_case(Cfg::new(1, 1, 1, 1, 1, 32), f32_only, false));
    v.extend(causal_case(Cfg::new(1, 6, 2, 67, 67, 80), f32_only, false)); // GQA 3, D 80
    v.extend(causal_case(Cfg::new(1, 8, 2, 130, 130, 64), FLOATS, false)); // GQA 4, threads
    v.extend(causal_case(Cfg::new(1, 8, 1, 1, 67, 128), f32_only, false)); // GQA 8, Tq = 1
    v.extend(causal_case(Cfg::new(2, 4, 1, 17, 130, 64), f32_only, false)); // Tq < Tk, per-head blocks
    v.extend(causal_case(Cfg::new(1, 2, 1, 5, 130, 128), f32_only, false)); // Tq < Tk, group blocks
    v.extend(causal_case(Cfg::new(1, 3, 3, 64, 128, 64), f32_only, false)); // exact block multiples
    v.extend(causal_case(Cfg::new(2, 4, 2, 128, 128, 64), f32_only, false)); // GQA 2, every gradient in place
    v.extend(causal_case(Cfg::new(1, 2, 1, 64, 70, 32), f32_only, false)); // dQ in place, a partial key tile
    v.extend(causal_case(Cfg::new(1, 2, 1, 33, 33, 24), &[DType::F32, DType::F16], false)); // D 24: padded rows
    v.extend(causal_case(Cfg::new(1, 2, 1, 20, 21, 0), f32_only, false)); // D 0: lse = ln(keys seen)
                                                                          // Large logits: scale·q·k of order ±80; the online max keeps exp in range.
    v.extend(causal_case(Cfg::new(1, 2, 2, 67, 67, 64).amp(15.0), &[DType::F32, DType::BF16], false));
    v.extend(causal_case(Cfg::new(1, 2, 1, 3, 20, 32).amp(30.0), f32_only, false));
    v.push(long_sequence_case(None));
    // Sliding windows.
    v.extend(causal_case(Cfg::new(1, 4, 2, 150, 150, 64).window(37), FLOATS, true)); // GQA 2, inside key blocks
    v.extend(causal_case(Cfg::new(1, 2, 1, 20, 20, 32).window(1), f32_only, false)); // each query sees itself
    v.extend(causal_case(Cfg::new(1, 2, 2, 17, 17, 32).window(17), f32_only, false)); // W = T: full causal
    v.extend(causal_case(Cfg::new(1, 2, 2, 17, 17, 32).window(1000), f32_only, false)); // W > T
    v.extend(causal_case(Cfg::new(1, 8, 2, 300, 300, 64).window(64), f32_only, false)); // W = the key block
    v.extend(causal_case(Cfg::new(1, 6, 2, 130, 130, 80).window(65), f32_only, false)); // GQA 3, D 80
    v.extend(causal_case(Cfg::new(2, 4, 1, 17, 130, 64).window(50), f32_only, false)); // Tq < Tk, per-head blocks
    v.extend(causal_case(Cfg::new(1, 8, 2, 5, 130, 128).window(20), f32_only, false)); // Tq < Tk, group blocks
    v.extend(causal_case(Cfg::new(1, 8, 1, 1, 67, 128).window(10), f32_only, false)); // Tq = 1
    v.extend(causal_case(Cfg::new(1, 2, 1, 70, 70, 24).window(9), &[DType::F32, DType::F16], false)); // D 24
    v.extend(causal_case(Cfg::new(1, 2, 2, 100, 100, 64).amp(15.0).window(30), f32_only, false)); // large logits
    v.push(long_sequence_case(Some(300)));
    // Attention sinks: per-head blocks and group blocks, GQA, Tq = 1 (the single-query
    // path), Tq < Tk, windows, D 24 (padded rows), large logits, D 0 (lse = ln(e^s + keys)).
    v.extend(causal_case(Cfg::new(2, 4, 2, 67, 67, 64).with_sinks(), FLOATS, true)); // GQA 2, per-head blocks
    v.extend(causal_case(Cfg::new(1, 8, 2, 5, 130, 128).with_sinks(), f32_only, false)); // group blocks, Tq < Tk
    v.extend(causal_case(Cfg::new(1, 8, 1, 1, 67, 128).with_sinks(), f32_only, false)); // GQA 8, Tq = 1
    v.extend(causal_case(Cfg::new(1, 4, 1, 1, 1100, 64).with_sinks(), f32_only, false)); // Tq = 1, split keys
    v.extend(causal_case(Cfg::new(1, 6, 2, 130, 130, 80).window(65).with_sinks(), f32_only, false)); // GQA 3, W
    v.extend(causal_case(Cfg::new(1, 2, 1, 20, 20, 32).window(1).with_sinks(), f32_only, false)); // W 1
    v.extend(causal_case(Cfg::new(2, 4, 1, 17, 130, 64).window(50).with_sinks(), f32_only, false)); // Tq < Tk, W
    v.extend(causal_case(Cfg::new(1, 2, 1, 33, 33, 24).with_sinks(), &[DType::F32, DType::F16], false)); // D 24
    v.extend(causal_case(Cfg::new(1, 2, 2, 67, 67, 64).amp(15.0).with_sinks(), &[DType::F32, DType::BF16], false));
    v.extend(causal_case(Cfg::new(1, 2, 1, 20, 21, 0).with_sinks(), f32_only, false)); // D 0
    v
}

/// T = 4096, H = 1, D = 64, forward and backward, full causal or over a sliding
/// `window`. The fused kernels keep O(T) memory (blocks of 64×64 scores per thread; a
/// T×T f32 matrix would be 64 MiB): that cannot be measured from here, so this case
/// checks what it can without an O(T²·D) f64 twin: sampled output and dq rows against
/// f64 rows, every value finite, and two identities of the backward: `Σ_j dv_j = Σ_i
/// dO_i` (rows of P sum to 1) and `Σ_j dk_j = 0` (rows of dS sum to 0).
fn long_sequence_case<B: ComputeBackend + ?Sized + 'static>(window: Option<usize>) -> Case<B> {
    let c = Cfg { window, ..Cfg::new(1, 1, 1, 4096, 4096, 64) };
    Case::custom(
        Op::CausalAttentionBackward,
        CaseKind::Property,
        format!("causal_attention fwd+bwd {}", c.name()),
        move |b: &B| {
            let (q, k, v) = c.qkv(41);
            let d_out = Rng::new(42).tensor(c.q_shape(), -1.0, 1.0);
            let up = |t: &Tensor| b.upload(t).map_err(err);
            let scale = c.scale();
            let r = b.causal_attention(&up(&q)?, &up(&k)?, &up(&v)?, window, None, scale).map_err(err)?;
            let g = b
                .causal_attention_backward(&up(&q)?, &up(&k)?, &up(&v)?, &r, &up(&d_out)?, window, None, scale)
                .map_err(err)?;
            let host = |t: &Tensor| b.to_host(t).map(|h| Array::from_tensor(&h)).map_err(err);
            let (out, lse, dq, dk, dv) =
                (host(&r.output)?, host(&r.logsumexp)?, host(&g.dq)?, host(&g.dk)?, host(&g.dv)?);
            for (name, a) in [("output", &out), ("logsumexp", &lse), ("dq", &dq), ("dk", &dk), ("dv", &dv)] {
                if let Some(i) = a.data.iter().position(|x| !x.is_finite()) {
                    return Err(format!("{name}[{i}] = {} is not finite", a.data[i]));
                }
            }
            let [q, k, v, d_out] = [&q, &k, &v, &d_out].map(Array::from_tensor);
            let d = c.d;
            let tol = Tolerance::F32_LOOSE;
            for i in [0, 1, 63, 64, 65, 299, 300, 301, 2047, 4095] {
                let (o_row, dq_row) = single_row_attention(&q, &k, &v, &d_out, window, scale as f64, i);
                tol.check(
                    &format!("output row {i}"),
                    &Array::new(vec![d], out.data[i * d..(i + 1) * d].to_vec()),
                    &o_row,
                )?;
                tol.check(&format!("dq row {i}"), &Array::new(vec![d], dq.data[i * d..(i + 1) * d].to_vec()), &dq_row)?;
            }
            let column_sums = |a: &Array| {
                let mut s = vec![0.0; d];
                for (i, x) in a.data.iter().enumerate() {
                    s[i % d] += x;
                }
                Array::new(vec![d], s)
            };
            let sum_tol = Tolerance { abs: 5e-3, rel: 1e-3 };
            sum_tol.check("Σ_j dv_j vs Σ_i dO_i", &column_sums(&dv), &column_sums(&d_out))?;
            sum_tol.check("Σ_j dk_j vs 0", &column_sums(&dk), &Array::zeros(vec![d]))?;
            Ok(())
        },
    )
}

/// Output row `i` and dq row `i` of single-head causal self-attention (over the last
/// `window` keys), in f64 (O(T·D)).
fn single_row_attention(
    q: &Array,
    k: &Array,
    v: &Array,
    d_out: &Array,
    window: Option<usize>,
    scale: f64,
    i: usize,
) -> (Array, Array) {
    let d = q.shape[3];
    let first = window.map_or(0, |w| (i + 1).saturating_sub(w));
    fn row(a: &Array, j: usize) -> &[f64] {
        let d = a.shape[3];
        &a.data[j * d..(j + 1) * d]
    }
    let dot = |x: &[f64], y: &[f64]| x.iter().zip(y).map(|(a, b)| a * b).sum::<f64>();
    let s: Vec<f64> = (first..=i).map(|j| scale * dot(row(q, i), row(k, j))).collect();
    let max = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let sum: f64 = s.iter().map(|x| (x - max).exp()).sum();
    let p: Vec<f64> = s.iter().map(|x| (x - max).exp() / sum).collect();
    let mut o = vec![0.0; d];
    for (j, pj) in (first..=i).zip(&p) {
        for (o_e, v_e) in o.iter_mut().zip(row(v, j)) {
            *o_e += pj * v_e;
        }
    }
    let dp: Vec<f64> = (first..=i).map(|j| dot(row(d_out, i), row(v, j))).collect();
    let delta: f64 = p.iter().zip(&dp).map(|(a, b)| a * b).sum();
    let mut dq = vec![0.0; d];
    for (n, j) in (first..=i).enumerate() {
        let ds = p[n] * (dp[n] - delta);
        for (dq_e, k_e) in dq.iter_mut().zip(row(k, j)) {
            *dq_e += scale * ds * k_e;
        }
    }
    (Array::new(vec![d], o), Array::new(vec![d], dq))
}

// ───────────────────────── causal attention backward ─────────────────────────

/// Twin backward against finite differences (tiny sizes), backend against twin, and
/// generated bad inputs. The saved output and logsumexp come from the twin forward.
fn grad_case<B: ComputeBackend + ?Sized + 'static>(c: Cfg) -> Vec<Case<B>> {
    let (q, k, v) = c.qkv(53);
    let (scale, window) = (c.scale(), c.window);
    let s = scale as f64;
    let sinks = c.sinks.then(|| c.sinks_input());
    let a = arrays(&[&q, &k, &v]);
    let sinks_a = sinks.as_ref().map(|i| Array::from_tensor(&i.tensor));
    let (o, lse) = twin::causal_attention(&a[0], &a[1], &a[2], window, sinks_a.as_ref(), s);
    // Inputs: q, k, v, the saved output and logsumexp (constants), then the sinks
    // (differentiated: their gradient comes after dv).
    let mut case = GradCase::new(Op::CausalAttentionBackward, format!("causal_attention_backward {}", c.name()))
        .input(q)
        .input(k)
        .input(v)
        .input(Input::new(o.to_tensor()).constant())
        .input(Input::new(lse.to_tensor()).constant().keep_f32());
    if let Some(sinks) = sinks {
        case = case.input(sinks);
    }
    case.forward(move |a| twin::causal_attention(&a[0], &a[1], &a[2], window, a.get(5), s).0)
        .backward_twin(move |a, d_out| {
            let g = twin::causal_attention_backward(&a[0], &a[1], &a[2], d_out, window, a.get(5), s);
            [g.dq, g.dk, g.dv].into_iter().chain(g.dsinks).collect()
        })
        .backward_call(move |b: &B, t: &[Tensor], d_out: &Tensor| {
            let saved = CausalAttentionResult { output: t[3].clone(), logsumexp: t[4].clone() };
            let g = b.causal_attention_backward(&t[0], &t[1], &t[2], &saved, d_out, window, t.get(5), scale)?;
            Ok([g.dq, g.dk, g.dv].into_iter().chain(g.dsinks).collect())
        })
        .tolerance(Tolerance::F32_LOOSE)
        .build()
}

/// The backend's forward then backward (in `dtype`) against the twin backward on the
/// same (rounded) inputs.
fn backward_vs_twin<B: ComputeBackend + ?Sized + 'static>(c: Cfg, dtype: DType) -> Case<B> {
    let (q, k, v) = c.qkv(61);
    let d_out = Rng::new(62).tensor(c.q_shape(), -1.0, 1.0);
    let [q, k, v, d_out] = [&q, &k, &v, &d_out].map(|t| rounded(t, dtype));
    let (scale, window) = (c.scale(), c.window);
    let sinks = c.sinks.then(|| c.sinks_tensor());
    let tol = Tolerance::F32_LOOSE.max(Tolerance::for_dtype(dtype));
    let name = format!("causal_attention fwd+bwd {} | {dtype} | backend vs twin", c.name());
    Case::custom(Op::CausalAttentionBackward, CaseKind::Backward, name, move |b: &B| {
        let up = |t: &Tensor| b.upload(t).map_err(err);
        let (qu, ku, vu) = (up(&q)?, up(&k)?, up(&v)?);
        let su = sinks.as_ref().map(up).transpose()?;
        let r = b.causal_attention(&qu, &ku, &vu, window, su.as_ref(), scale).map_err(err)?;
        let g =
            b.causal_attention_backward(&qu, &ku, &vu, &r, &up(&d_out)?, window, su.as_ref(), scale).map_err(err)?;
        let a = arrays(&[&q, &k, &v, &d_out]);
        let sinks_a = sinks.as_ref().map(Array::from_tensor);
        let want = twin::causal_attention_backward(&a[0], &a[1], &a[2], &a[3], window, sinks_a.as_ref(), scale as f64);
        for (name, got, want) in [("dq", &g.dq, want.dq), ("dk", &g.dk, want.dk), ("dv", &g.dv, want.dv)] {
            let h = b.to_host(got).map_err(err)?;
            if h.dtype() != dtype {
                return Err(format!("{name} has dtype {}, expected {dtype}", h.dtype()));
            }
            tol.check(name, &Array::from_tensor(&h), &want)?;
        }
        match (&g.dsinks, want.dsinks) {
            (None, None) => {}
            (Some(got), Some(want)) => {
                let h = b.to_host(got).map_err(err)?;
                if h.dtype() != DType::F32 {
                    return Err(format!("dsinks has dtype {}, expected f32", h.dtype()));
                }
                tol.check("dsinks", &Array::from_tensor(&h), &want)?;
            }
            (got, _) => {
                return Err(format!("dsinks is {}, expected it exactly when there are sinks", got.is_some()));
            }
        }
        Ok(())
    })
}

fn backward_cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let mut v = Vec::new();
    v.extend(grad_case(Cfg::new(1, 1, 1, 3, 3, 4)));
    v.extend(grad_case(Cfg::new(1, 2, 1, 2, 4, 3))); // GQA 2, Tq < Tk
    v.extend(grad_case(Cfg::new(1, 4, 1, 3, 3, 2))); // GQA 4
    v.extend(grad_case(Cfg::new(2, 3, 1, 1, 3, 2))); // GQA 3, Tq = 1
    v.push(backward_vs_twin(Cfg::new(1, 8, 2, 130, 130, 64), DType::F32)); // GQA 4, threads
    v.push(backward_vs_twin(Cfg::new(1, 3, 1, 17, 67, 80), DType::F32)); // GQA 3, Tq < Tk
    v.push(backward_vs_twin(Cfg::new(2, 2, 2, 1, 17, 32), DType::F32)); // Tq = 1
    v.push(backward_vs_twin(Cfg::new(1, 8, 1, 67, 67, 128), DType::F32)); // GQA 8
    v.push(backward_vs_twin(Cfg::new(1, 4, 4, 64, 128, 64), DType::F32)); // block multiples
    v.push(backward_vs_twin(Cfg::new(1, 2, 2, 67, 67, 64).amp(10.0), DType::F32)); // large logits
    v.push(backward_vs_twin(Cfg::new(1, 2, 1, 20, 21, 0), DType::F32)); // D 0: empty gradients
    v.push(backward_vs_twin(Cfg::new(1, 4, 2, 40, 70, 32), DType::F16));
    v.push(backward_vs_twin(Cfg::new(1, 4, 2, 40, 70, 32), DType::BF16));
    // Sliding windows: finite differences on tiny sizes, then the backend at sizes that
    // start and end windows inside the backward's key (128) and query (64) blocks.
    v.extend(grad_case(Cfg::new(1, 1, 1, 4, 4, 3).window(2)));
    v.extend(grad_case(Cfg::new(1, 2, 1, 3, 5, 2).window(2))); // GQA 2, Tq < Tk
    v.extend(grad_case(Cfg::new(1, 2, 2, 4, 4, 2).window(1))); // each query sees itself
    v.extend(grad_case(Cfg::new(1, 1, 1, 3, 3, 2).window(5))); // W > T
    v.push(backward_vs_twin(Cfg::new(1, 8, 2, 130, 130, 64).window(37), DType::F32)); // GQA 4, threads
    v.push(backward_vs_twin(Cfg::new(1, 3, 1, 17, 67, 80).window(20), DType::F32)); // GQA 3, Tq < Tk
    v.push(backward_vs_twin(Cfg::new(1, 2, 2, 300, 300, 64).window(129), DType::F32)); // key block + 1
    v.push(backward_vs_twin(Cfg::new(1, 2, 1, 300, 300, 64).window(128), DType::F32)); // W = the key block
    v.push(backward_vs_twin(Cfg::new(1, 2, 1, 70, 70, 24).window(1), DType::F32)); // W 1, D 24
    v.push(backward_vs_twin(Cfg::new(1, 2, 1, 1, 17, 32).window(4), DType::F32)); // Tq = 1
    v.push(backward_vs_twin(Cfg::new(1, 4, 2, 40, 70, 32).window(7), DType::F16));
    v.push(backward_vs_twin(Cfg::new(1, 4, 2, 40, 70, 32).window(7), DType::BF16));
    // Attention sinks: finite differences of dq, dk, dv and dsinks on tiny sizes (GQA,
    // Tq < Tk, Tq = 1, windows), then the backend (threads, split key ranges, GQA,
    // windows inside blocks, D 24, Tq = 1, 16-bit).
    v.extend(grad_case(Cfg::new(1, 1, 1, 3, 3, 4).with_sinks()));
    v.extend(grad_case(Cfg::new(1, 2, 1, 2, 4, 3).with_sinks())); // GQA 2, Tq < Tk
    v.extend(grad_case(Cfg::new(2, 3, 1, 1, 3, 2).with_sinks())); // GQA 3, Tq = 1, B 2
    v.extend(grad_case(Cfg::new(1, 2, 1, 3, 5, 2).window(2).with_sinks())); // GQA 2, window
    v.extend(grad_case(Cfg::new(1, 2, 2, 4, 4, 2).window(1).with_sinks())); // each query sees itself
    v.push(backward_vs_twin(Cfg::new(1, 8, 2, 130, 130, 64).with_sinks(), DType::F32)); // GQA 4, threads
    v.push(backward_vs_twin(Cfg::new(2, 3, 1, 17, 67, 80).with_sinks(), DType::F32)); // GQA 3, Tq < Tk, B 2
    v.push(backward_vs_twin(Cfg::new(1, 2, 1, 300, 300, 64).window(129).with_sinks(), DType::F32)); // split keys
    v.push(backward_vs_twin(Cfg::new(1, 2, 1, 70, 70, 24).window(9).with_sinks(), DType::F32)); // D 24
    v.push(backward_vs_twin(Cfg::new(1, 2, 2, 1, 17, 32).with_sinks(), DType::F32)); // Tq = 1
    v.push(backward_vs_twin(Cfg::new(1, 4, 2, 40, 70, 32).with_sinks(), DType::F16));
    v.push(backward_vs_twin(Cfg::new(1, 4, 2, 40, 70, 32).window(7).with_sinks(), DType::BF16));
    v
}

// ───────────────────────────── decode attention ─────────────────────────────

/// A `[B, H, capacity, D]` cache: random rows below `filled`, NaN from there on.
fn nan_tail_cache(b: usize, h: usize, capacity: usize, d: usize, filled: usize, seed: u64) -> Tensor {
    nan_outside_cache(b, h, capacity, d, 0, filled, seed)
}

/// A `[B, H, capacity, D]` cache: random rows `first .. filled`, NaN elsewhere.
fn nan_outside_cache(b: usize, h: usize, capacity: usize, d: usize, first: usize, filled: usize, seed: u64) -> Tensor {
    let mut rng = Rng::new(seed);
    let mut data = rng.vec(b * h * capacity * d, -1.0, 1.0);
    for (i, x) in data.iter_mut().enumerate() {
        let row = (i / d.max(1)) % capacity;
        if row < first || row >= filled {
            *x = f32::NAN;
        }
    }
    Tensor::from_vec(data, Shape::new([b, h, capacity, d])).expect("shape")
}

/// `c.tk` is kv_len; the caches hold `capacity` rows, NaN past kv_len (and, with a
/// window, NaN before the first row any of the queries sees: the kernels must not read
/// them).
fn decode_case<B: ComputeBackend + ?Sized + 'static>(
    c: Cfg,
    capacity: usize,
    dtypes: &[DType],
    bad: bool,
) -> Vec<Case<B>> {
    let q = Rng::new(71).tensor(c.q_shape(), -1.0, 1.0);
    let (scale, kv_len, window) = (c.scale(), c.tk, c.window);
    // The first query (position kv_len − Tq) sees rows from kv_len − Tq + 1 − W on.
    let first = window.map_or(0, |w| (kv_len - c.tq + 1).saturating_sub(w));
    let kc = nan_outside_cache(c.b, c.hkv, capacity, c.d, first, c.tk, 72);
    let vc = nan_outside_cache(c.b, c.hkv, capacity, c.d, first, c.tk, 73);
    let nan = if first > 0 { format!("NaN before row {first} and past kv_len") } else { "NaN past kv_len".into() };
    let mut case = OpCase::new(
        Op::DecodeAttention,
        format!("decode_attention {} kv_len={kv_len} capacity={capacity} ({nan})", c.name()),
    )
    .input(q)
    .input(kc)
    .input(vc);
    if c.sinks {
        case = case.input(c.sinks_input());
    }
    let case = case
        .call(move |b: &B, t: &[Tensor]| {
            Ok(vec![b.decode_attention(&t[0], &t[1], &t[2], kv_len, window, t.get(3), scale)?])
        })
        .twin(move |a| vec![twin::decode_attention(&a[0], &a[1], &a[2], kv_len, window, a.get(3), scale as f64)])
        .tolerance(Tolerance::F32_LOOSE)
        .dtypes(dtypes);
    if bad {
        case.build()
    } else {
        case.no_bad_inputs().build()
    }
}

/// `batched_decode_attention` of `lens.len()` sequences with `c`'s heads, `Tq` and D
/// (`c.tk` unused): sequence `i` holds `lens[i]` rows of a cache of `caps[i]` (NaN past
/// them, and before the first row a window lets any query see).
fn batched_decode_case<B: ComputeBackend + ?Sized + 'static>(
    c: Cfg,
    lens: &[usize],
    caps: &[usize],
    dtypes: &[DType],
    bad: bool,
) -> Vec<Case<B>> {
    let n = lens.len();
    let q = Rng::new(171).tensor(Shape::new([n, c.hq, c.tq, c.d]), -1.0, 1.0);
    let (scale, window, lens_v) = (c.scale(), c.window, lens.to_vec());
    let sinks = if c.sinks { " sinks" } else { "" };
    let mut case = OpCase::new(
        Op::BatchedDecodeAttention,
        format!(
            "batched_decode_attention Hq{} Hkv{} Tq{} D{} kv_lens={lens:?} capacities={caps:?} window={window:?}{sinks}",
            c.hq, c.hkv, c.tq, c.d
        ),
    )
    .input(q);
    for (i, (&len, &cap)) in lens.iter().zip(caps).enumerate() {
        let first = window.map_or(0, |w| (len - c.tq + 1).saturating_sub(w));
        case = case
            .input(nan_outside_cache(1, c.hkv, cap, c.d, first, len, 172 + 2 * i as u64))
            .input(nan_outside_cache(1, c.hkv, cap, c.d, first, len, 173 + 2 * i as u64));
    }
    // The sinks, if any, come last: inputs 1 ..= 2N are the cache pairs.
    if c.sinks {
        case = case.input(c.sinks_input());
    }
    let (l1, l2) = (lens_v.clone(), lens_v);
    let case = case
        .call(move |b: &B, t: &[Tensor]| {
            let k: Vec<&Tensor> = t[1..=2 * n].iter().step_by(2).collect();
            let v: Vec<&Tensor> = t[2..=2 * n].iter().step_by(2).collect();
            Ok(vec![b.batched_decode_attention(&t[0], &k, &v, &l1, window, t.get(2 * n + 1), scale)?])
        })
        .twin(move |a| {
            let k: Vec<&Array> = a[1..=2 * n].iter().step_by(2).collect();
            let v: Vec<&Array> = a[2..=2 * n].iter().step_by(2).collect();
            vec![twin::batched_decode_attention(&a[0], &k, &v, &l2, window, a.get(2 * n + 1), scale as f64)]
        })
        .tolerance(Tolerance::F32_LOOSE)
        .dtypes(dtypes);
    if bad {
        case.build()
    } else {
        case.no_bad_inputs().build()
    }
}

/// Each sequence of a batched call gives exactly (bit for bit) what `decode_attention`
/// gives it alone, where both run the same implementation (both native or both on the
/// CPU; else to 1e-5): a server's answer does not depend on its neighbours. With or
/// without attention sinks.
fn batched_equals_single<B: ComputeBackend + ?Sized + 'static>(with_sinks: bool) -> Case<B> {
    let sinks_name = if with_sinks { ", sinks" } else { "" };
    let name = format!(
        "batched_decode_attention row i == decode_attention of sequence i, bit for bit (Hq9 Hkv3 D64{sinks_name})"
    );
    let sinks = with_sinks.then(|| Cfg::new(1, 9, 3, 1, 1, 64).sinks_tensor());
    Case::custom(Op::BatchedDecodeAttention, CaseKind::Property, name, move |b: &B| {
        let err = |e: fusebox::Error| e.to_string();
        let sinks = sinks.as_ref().map(|s| b.upload(s)).transpose().map_err(err)?;
        let sinks = sinks.as_ref();
        let lens = [5usize, 130, 1, 64];
        let q = Rng::new(181).tensor(Shape::new([lens.len(), 9, 1, 64]), -1.0, 1.0);
        let caches: Vec<(Tensor, Tensor)> = lens
            .iter()
            .enumerate()
            .map(|(i, &l)| {
                let k = nan_tail_cache(1, 3, l + 7, 64, l, 182 + i as u64);
                let v = nan_tail_cache(1, 3, l + 7, 64, l, 190 + i as u64);
                Ok((b.upload(&k)?, b.upload(&v)?))
            })
            .collect::<fusebox::Result<_>>()
            .map_err(err)?;
        let k: Vec<&Tensor> = caches.iter().map(|c| &c.0).collect();
        let v: Vec<&Tensor> = caches.iter().map(|c| &c.1).collect();
        let all = b
            .to_host(
                &b.batched_decode_attention(&b.upload(&q).map_err(err)?, &k, &v, &lens, None, sinks, 0.125)
                    .map_err(err)?,
            )
            .map_err(err)?;
        let all = all.to_vec::<f32>().map_err(err)?;
        let row = 9 * 64;
        // Bits are compared where both ops run the same implementation.
        let exact = b.supports(Op::DecodeAttention) == b.supports(Op::BatchedDecodeAttention);
        for (i, &l) in lens.iter().enumerate() {
            let qi = q.view(i * row, [1, 9, 1, 64]).map_err(err)?;
            let one =
                b.decode_attention(&b.upload(&qi).map_err(err)?, k[i], v[i], l, None, sinks, 0.125).map_err(err)?;
            let one = b.to_host(&one).map_err(err)?.to_vec::<f32>().map_err(err)?;
            let got = &all[i * row..(i + 1) * row];
            if exact {
                if !one.iter().zip(got).all(|(a, b)| a.to_bits() == b.to_bits()) {
                    return Err(format!("sequence {i} (kv_len {l}) differs from its decode_attention"));
                }
            } else {
                // One op native and the other on the CPU: the same maths, other rounding.
                let worst = one.iter().zip(got).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
                if worst > 1e-5 {
                    return Err(format!("sequence {i} (kv_len {l}) off its decode_attention by {worst:e}"));
                }
            }
        }
        Ok(())
    })
}

fn batched_decode_cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let f32_only = &[DType::F32];
    let mut v = Vec::new();
    // SmolLM2's heads: ragged lengths, each its own capacity, a first token among them.
    v.extend(batched_decode_case(Cfg::new(1, 9, 3, 1, 1, 64), &[1, 70, 300], &[16, 80, 320], FLOATS, true));
    v.extend(batched_decode_case(Cfg::new(1, 8, 2, 1, 1, 64).window(16), &[67, 3, 40], &[80, 8, 40], f32_only, false));
    v.extend(batched_decode_case(Cfg::new(1, 4, 2, 3, 1, 32), &[17, 3], &[32, 4], f32_only, false)); // 3 new queries
    v.extend(batched_decode_case(Cfg::new(1, 4, 1, 1, 1, 128), &[9], &[9], f32_only, false)); // one sequence
                                                                                              // Sinks: ragged lengths (one long enough to split its keys), windows, new queries.
    let sinks = Cfg::new(1, 9, 3, 1, 1, 64).with_sinks();
    v.extend(batched_decode_case(sinks, &[1, 70, 1100], &[16, 80, 1200], FLOATS, true));
    v.extend(batched_decode_case(sinks.window(16), &[67, 3, 40], &[80, 8, 40], f32_only, false));
    v.extend(batched_decode_case(Cfg::new(1, 4, 2, 3, 1, 32).with_sinks(), &[17, 3], &[32, 4], f32_only, false));
    v.push(batched_equals_single(false));
    v.push(batched_equals_single(true));
    v
}

fn decode_cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let f32_only = &[DType::F32];
    let mut v = Vec::new();
    v.extend(decode_case(Cfg::new(1, 8, 2, 1, 67, 64), 80, FLOATS, true)); // GQA 4
    v.extend(decode_case(Cfg::new(2, 4, 4, 3, 17, 32), 32, f32_only, false)); // 3 new queries
    v.extend(decode_case(Cfg::new(2, 8, 1, 1, 130, 128), 150, &[DType::F32, DType::BF16], false)); // GQA 8
                                                                                                   // GQA 3 (SmolLM2's 9/3 heads), two softmax blocks of keys, a partial score tile.
    v.extend(decode_case(Cfg::new(1, 9, 3, 1, 300, 64), 320, f32_only, false));
    v.extend(decode_case(Cfg::new(1, 6, 1, 1, 275, 128), 280, f32_only, false)); // GQA 6, D 128
                                                                                 // Few kv heads, long cache: each head's keys are split over tasks and merged.
    v.extend(decode_case(Cfg::new(1, 4, 1, 1, 1100, 64), 1200, f32_only, false));
    v.extend(decode_case(Cfg::new(1, 6, 2, 1, 2051, 80), 2051, f32_only, false)); // D 80: portable kernels
    v.extend(decode_case(Cfg::new(1, 6, 2, 1, 1, 80), 9, f32_only, false)); // first token
    v.extend(decode_case(Cfg::new(1, 4, 2, 16, 40, 32), 50, f32_only, false)); // per-head blocks over a cache
    v.extend(decode_case(Cfg::new(1, 3, 3, 20, 20, 64), 33, f32_only, false)); // kv_len = Tq
    v.extend(decode_case(Cfg::new(1, 4, 2, 18, 30, 24), 40, f32_only, false)); // per-head blocks, D 24
                                                                               // Sliding windows over caches longer than the window.
    v.extend(decode_case(Cfg::new(1, 8, 2, 1, 67, 64).window(16), 80, FLOATS, false)); // GQA 4
    v.extend(decode_case(Cfg::new(1, 9, 3, 1, 300, 64).window(257), 320, f32_only, false)); // BLOCK_K + 1
    v.extend(decode_case(Cfg::new(1, 4, 1, 1, 2100, 64).window(1100), 2200, f32_only, false)); // split keys
    v.extend(decode_case(Cfg::new(1, 6, 2, 1, 500, 80).window(37), 512, f32_only, false)); // D 80
    v.extend(decode_case(Cfg::new(1, 4, 2, 1, 40, 128).window(1), 40, f32_only, false)); // only itself
    v.extend(decode_case(Cfg::new(1, 4, 2, 1, 10, 32).window(50), 12, f32_only, false)); // W > kv_len
    v.extend(decode_case(Cfg::new(2, 4, 4, 3, 17, 32).window(5), 32, f32_only, false)); // 3 new queries
    v.extend(decode_case(Cfg::new(1, 4, 2, 16, 140, 32).window(70), 150, &[DType::F32, DType::F16], false)); // per-head blocks
                                                                                                             // Attention sinks: GQA groups (several head chunks), split keys (the sink counted once,
                                                                                                             // in the first range), D 80 (portable kernels), a window, new queries, a first token.
    v.extend(decode_case(Cfg::new(1, 8, 2, 1, 67, 64).with_sinks(), 80, FLOATS, true));
    v.extend(decode_case(Cfg::new(1, 9, 3, 1, 300, 64).with_sinks(), 320, f32_only, false));
    v.extend(decode_case(Cfg::new(1, 4, 1, 1, 1100, 64).with_sinks(), 1200, f32_only, false));
    v.extend(decode_case(Cfg::new(1, 6, 2, 1, 2051, 80).with_sinks(), 2051, f32_only, false));
    v.extend(decode_case(Cfg::new(1, 4, 1, 1, 2100, 64).window(1100).with_sinks(), 2200, f32_only, false));
    v.extend(decode_case(Cfg::new(2, 4, 4, 3, 17, 32).window(5).with_sinks(), 32, f32_only, false));
    v.extend(decode_case(Cfg::new(1, 6, 2, 1, 1, 80).with_sinks(), 9, f32_only, false));
    v.extend(decode_case(Cfg::new(1, 4, 2, 16, 140, 32).window(70).with_sinks(), 150, f32_only, false));
    v.extend(half_cache_decode_cases());
    v
}

/// Decode with f32 queries over caches stored in `cache_dtype` (F16 or BF16): the caches
/// are random rows rounded to that dtype (NaN outside the rows the queries see), and
/// the twin runs in f64 on those rounded values.
fn half_cache_decode_case<B: ComputeBackend + ?Sized + 'static>(
    c: Cfg,
    capacity: usize,
    cache_dtype: DType,
    bad: bool,
) -> Vec<Case<B>> {
    let q = Rng::new(74).tensor(c.q_shape(), -1.0, 1.0);
    let (scale, kv_len, window) = (c.scale(), c.tk, c.window);
    let first = window.map_or(0, |w| (kv_len - c.tq + 1).saturating_sub(w));
    let kc = rounded(&nan_outside_cache(c.b, c.hkv, capacity, c.d, first, c.tk, 75), cache_dtype);
    let vc = rounded(&nan_outside_cache(c.b, c.hkv, capacity, c.d, first, c.tk, 76), cache_dtype);
    let mut case = OpCase::new(
        Op::DecodeAttention,
        format!("decode_attention {} kv_len={kv_len} capacity={capacity}, f32 q over {cache_dtype} caches", c.name()),
    )
    .input(q)
    .input(Input::new(kc).keep_f32())
    .input(Input::new(vc).keep_f32());
    if c.sinks {
        case = case.input(c.sinks_input());
    }
    let case = case
        .call(move |b: &B, t: &[Tensor]| {
            Ok(vec![b.decode_attention(&t[0], &t[1], &t[2], kv_len, window, t.get(3), scale)?])
        })
        .twin(move |a| vec![twin::decode_attention(&a[0], &a[1], &a[2], kv_len, window, a.get(3), scale as f64)])
        .tolerance(Tolerance::F32_LOOSE);
    if bad {
        case.build()
    } else {
        case.no_bad_inputs().build()
    }
}

fn half_cache_decode_cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let mut v = Vec::new();
    for dtype in [DType::F16, DType::BF16] {
        v.extend(half_cache_decode_case(Cfg::new(1, 9, 3, 1, 300, 64), 320, dtype, dtype == DType::F16)); // SmolLM2's GQA 3
        v.extend(half_cache_decode_case(Cfg::new(1, 4, 1, 1, 1100, 64), 1200, dtype, false)); // split keys
        v.extend(half_cache_decode_case(Cfg::new(2, 8, 1, 1, 130, 128), 150, dtype, false)); // GQA 8, D 128
        v.extend(half_cache_decode_case(Cfg::new(1, 6, 2, 1, 67, 80), 80, dtype, false)); // D 80
        v.extend(half_cache_decode_case(Cfg::new(1, 4, 2, 1, 40, 24), 41, dtype, false)); // D 24: portable
        v.extend(half_cache_decode_case(Cfg::new(1, 4, 2, 1, 1, 64), 9, dtype, false)); // first token
        v.extend(half_cache_decode_case(Cfg::new(2, 4, 4, 3, 17, 32), 32, dtype, false)); // 3 new queries
        v.extend(half_cache_decode_case(Cfg::new(1, 4, 2, 18, 30, 64), 40, dtype, false)); // a prompt chunk
        v.extend(half_cache_decode_case(Cfg::new(1, 4, 1, 1, 600, 64).window(257), 640, dtype, false));
        v.extend(half_cache_decode_case(Cfg::new(1, 4, 2, 16, 140, 32).window(70), 150, dtype, false));
        // Sinks: the AVX-512/AVX2 16-bit kernels (D 64, 128), split keys, the portable
        // kernels (D 24), a prompt chunk (the blocked forward over widened rows).
        let sinks = |c: Cfg| c.with_sinks();
        v.extend(half_cache_decode_case(sinks(Cfg::new(1, 9, 3, 1, 300, 64)), 320, dtype, dtype == DType::BF16));
        v.extend(half_cache_decode_case(sinks(Cfg::new(1, 4, 1, 1, 1100, 64)), 1200, dtype, false));
        v.extend(half_cache_decode_case(sinks(Cfg::new(2, 8, 1, 1, 130, 128)), 150, dtype, false));
        v.extend(half_cache_decode_case(sinks(Cfg::new(1, 4, 2, 1, 40, 24)), 41, dtype, false));
        v.extend(half_cache_decode_case(sinks(Cfg::new(1, 4, 2, 18, 30, 64)), 40, dtype, false));
        v.extend(half_cache_decode_case(sinks(Cfg::new(1, 4, 1, 1, 600, 64).window(257)), 640, dtype, false));
    }
    v
}

// ──────────────────────────────── KV caches ────────────────────────────────

/// `a` and `b` `[B, H, T, D]` concatenated along T.
fn concat_rows(a: &Array, b: &Array) -> Array {
    let (bs, h, ta, d) = (a.shape[0], a.shape[1], a.shape[2], a.shape[3]);
    let tb = b.shape[2];
    let mut out = Array::zeros(vec![bs, h, ta + tb, d]);
    for bi in 0..bs {
        for hi in 0..h {
            for t in 0..ta + tb {
                for e in 0..d {
                    *out.at_mut(&[bi, hi, t, e]) =
                        if t < ta { a.at(&[bi, hi, t, e]) } else { b.at(&[bi, hi, t - ta, e]) };
                }
            }
        }
    }
    out
}

fn write_cache_case<B: ComputeBackend + ?Sized + 'static>(
    b: usize,
    h: usize,
    capacity: usize,
    t: usize,
    d: usize,
    pos: usize,
    bad: bool,
) -> Vec<Case<B>> {
    let mut rng = Rng::new(81);
    let cache = rng.tensor(Shape::new([b, h, capacity, d]), -1.0, 1.0);
    let new = rng.tensor(Shape::new([b, h, t, d]), -1.0, 1.0);
    let case = OpCase::new(
        Op::WriteHeadCache,
        format!("write_head_cache cache[{b},{h},{capacity},{d}] new[{b},{h},{t},{d}] pos={pos}"),
    )
    .input(cache)
    .input(new)
    .call(move |be: &B, t: &[Tensor]| {
        // A fresh, uniquely owned copy of the cache input, written in place.
        let host = be.to_host(&t[0])?;
        let fresh = Tensor::from_bytes(host.host_bytes()?, host.shape().clone(), host.dtype())?;
        let mut cache = be.upload(&fresh)?;
        drop(fresh);
        be.write_head_cache(&mut cache, &t[1], pos)?;
        Ok(vec![cache])
    })
    .twin(move |a| vec![twin::write_head_cache(&a[0], &a[1], pos)])
    .tolerance(Tolerance::EXACT)
    .dtypes(FLOATS);
    if bad {
        case.build()
    } else {
        case.no_bad_inputs().build()
    }
}

/// F32 rows written into a cache stored in `cache_dtype` (F16 or BF16): each value is
/// rounded to the cache's dtype (to nearest, ties to even), the rest of the cache kept.
fn write_half_cache_case<B: ComputeBackend + ?Sized + 'static>(
    cache_dtype: DType,
    (b, h, capacity, t, d, pos): (usize, usize, usize, usize, usize, usize),
    bad: bool,
) -> Vec<Case<B>> {
    let mut rng = Rng::new(82);
    let cache = rounded(&rng.tensor(Shape::new([b, h, capacity, d]), -1.0, 1.0), cache_dtype);
    // Values near the top of f16's range and below its normal range too, and exact ties.
    let mut values = rng.vec(b * h * t * d, -3.0, 3.0);
    for (i, x) in values.iter_mut().enumerate() {
        match i % 7 {
            0 => *x *= 2.0e4,
            1 => *x *= 1.0e-6,
            2 => *x = 1.0 + (i % 3) as f32 * 2.0f32.powi(-11), // f16 ties and halfway points
            _ => {}
        }
    }
    let new = Tensor::from_vec(values, Shape::new([b, h, t, d])).expect("shape");
    let case = OpCase::new(
        Op::WriteHeadCache,
        format!("write_head_cache f32 new[{b},{h},{t},{d}] into {cache_dtype} cache[{b},{h},{capacity},{d}] pos={pos}"),
    )
    .input(Input::new(cache).keep_f32())
    .input(new)
    .call(move |be: &B, t: &[Tensor]| {
        let host = be.to_host(&t[0])?;
        let fresh = Tensor::from_bytes(host.host_bytes()?, host.shape().clone(), host.dtype())?;
        let mut cache = be.upload(&fresh)?;
        drop(fresh);
        be.write_head_cache(&mut cache, &t[1], pos)?;
        Ok(vec![cache])
    })
    .twin(move |a| {
        // Inputs are f32 values. F16 by `half` (round to nearest, ties to even); BF16 by
        // hand: keep the high 16 bits of the f32, adding half an ulp less one plus the
        // kept lowest bit (ties go to the even neighbour).
        let round = |x: f64| match cache_dtype {
            DType::F16 => half::f16::from_f32(x as f32).to_f64(),
            _ => {
                let bits = (x as f32).to_bits();
                let kept = bits.wrapping_add(0x7FFF + ((bits >> 16) & 1)) & 0xFFFF_0000;
                f32::from_bits(kept) as f64
            }
        };
        let mut new = a[1].clone();
        new.data.iter_mut().for_each(|x| *x = round(*x));
        vec![twin::write_head_cache(&a[0], &new, pos)]
    })
    .tolerance(Tolerance::EXACT);
    if bad {
        case.build()
    } else {
        case.no_bad_inputs().build()
    }
}

/// Two appends into NaN-filled caches, then decode over the filled prefix: equals
/// causal attention over the concatenated rows.
fn write_then_decode_case<B: ComputeBackend + ?Sized + 'static>() -> Case<B> {
    let c = Cfg::new(2, 4, 2, 3, 0, 32);
    let (t0, t1, capacity) = (37, 3, 64);
    let name =
        format!("write_head_cache {t0} rows at 0, {t1} at {t0}, then decode_attention (Hq4 Hkv2 D32, NaN cache)");
    Case::custom(Op::WriteHeadCache, CaseKind::Property, name, move |be: &B| {
        let mut rng = Rng::new(91);
        let kv = |t: usize, rng: &mut Rng| rng.tensor(Shape::new([c.b, c.hkv, t, c.d]), -1.0, 1.0);
        let (k0, v0, k1, v1) = (kv(t0, &mut rng), kv(t0, &mut rng), kv(t1, &mut rng), kv(t1, &mut rng));
        let q = rng.tensor(Shape::new([c.b, c.hq, t1, c.d]), -1.0, 1.0);
        let nan_cache = || nan_tail_cache(c.b, c.hkv, capacity, c.d, 0, 0);
        let (kn, vn) = (nan_cache(), nan_cache());
        let mut kc = be.upload(&kn).map_err(err)?;
        let mut vc = be.upload(&vn).map_err(err)?;
        drop((kn, vn));
        let up = |t: &Tensor| be.upload(t).map_err(err);
        be.write_head_cache(&mut kc, &up(&k0)?, 0).map_err(err)?;
        be.write_head_cache(&mut vc, &up(&v0)?, 0).map_err(err)?;
        be.write_head_cache(&mut kc, &up(&k1)?, t0).map_err(err)?;
        be.write_head_cache(&mut vc, &up(&v1)?, t0).map_err(err)?;
        let out = be.decode_attention(&up(&q)?, &kc, &vc, t0 + t1, None, None, c.scale()).map_err(err)?;
        let got = Array::from_tensor(&be.to_host(&out).map_err(err)?);
        let a = arrays(&[&q, &k0, &v0, &k1, &v1]);
        let want =
            twin::attention(&a[0], &concat_rows(&a[1], &a[3]), &concat_rows(&a[2], &a[4]), c.scale() as f64, true);
        Tolerance::F32_LOOSE.check("output", &got, &want)
    })
}

fn cache_cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let mut v = Vec::new();
    v.extend(write_cache_case(2, 3, 20, 5, 17, 7, true));
    v.extend(write_cache_case(1, 2, 9, 9, 8, 0, false)); // fills the whole cache
    v.extend(write_cache_case(2, 4, 300, 130, 64, 170, false)); // threads
    v.push(write_then_decode_case());
    for dtype in [DType::F16, DType::BF16] {
        v.extend(write_half_cache_case(dtype, (2, 3, 20, 5, 17, 7), dtype == DType::F16));
        v.extend(write_half_cache_case(dtype, (2, 4, 300, 130, 64, 170), false)); // threads
        v.push(write_then_decode_half_case(dtype));
    }
    v
}

/// As [`write_then_decode_case`] with F32 rows written into F16/BF16 caches: the twin
/// attends over the rows rounded to the cache's dtype.
fn write_then_decode_half_case<B: ComputeBackend + ?Sized + 'static>(cache_dtype: DType) -> Case<B> {
    let c = Cfg::new(1, 9, 3, 1, 0, 64);
    let (t0, t1, capacity) = (300, 1, 320);
    let name = format!(
        "write_head_cache f32 rows into {cache_dtype} caches ({t0} at 0, {t1} at {t0}), then decode_attention \
         (Hq9 Hkv3 D64, NaN cache)"
    );
    Case::custom(Op::WriteHeadCache, CaseKind::Property, name, move |be: &B| {
        let mut rng = Rng::new(92);
        let kv = |t: usize, rng: &mut Rng| rng.tensor(Shape::new([c.b, c.hkv, t, c.d]), -1.0, 1.0);
        let (k0, v0, k1, v1) = (kv(t0, &mut rng), kv(t0, &mut rng), kv(t1, &mut rng), kv(t1, &mut rng));
        let q = rng.tensor(Shape::new([c.b, c.hq, t1, c.d]), -1.0, 1.0);
        let nan_cache = || rounded(&nan_tail_cache(c.b, c.hkv, capacity, c.d, 0, 0), cache_dtype);
        let (kn, vn) = (nan_cache(), nan_cache());
        let mut kc = be.upload(&kn).map_err(err)?;
        let mut vc = be.upload(&vn).map_err(err)?;
        drop((kn, vn));
        let up = |t: &Tensor| be.upload(t).map_err(err);
        be.write_head_cache(&mut kc, &up(&k0)?, 0).map_err(err)?;
        be.write_head_cache(&mut vc, &up(&v0)?, 0).map_err(err)?;
        be.write_head_cache(&mut kc, &up(&k1)?, t0).map_err(err)?;
        be.write_head_cache(&mut vc, &up(&v1)?, t0).map_err(err)?;
        if kc.dtype() != cache_dtype {
            return Err(format!("the cache came back as {} instead of {cache_dtype}", kc.dtype()));
        }
        let out = be.decode_attention(&up(&q)?, &kc, &vc, t0 + t1, None, None, c.scale()).map_err(err)?;
        let got = Array::from_tensor(&be.to_host(&out).map_err(err)?);
        let r = |t: &Tensor| rounded(t, cache_dtype);
        let a = arrays(&[&q, &r(&k0), &r(&v0), &r(&k1), &r(&v1)]);
        let want =
            twin::attention(&a[0], &concat_rows(&a[1], &a[3]), &concat_rows(&a[2], &a[4]), c.scale() as f64, true);
        Tolerance::F32_LOOSE.check("output", &got, &want)
    })
}

// ──────────────────────────── mask and softmax ────────────────────────────

fn mask_and_softmax_cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let mut v = Vec::new();
    for (seq, kv_len) in [(5, 9), (7, 7), (1, 130)] {
        v.extend(
            OpCase::new(Op::CausalMask, format!("causal_mask seq={seq} kv_len={kv_len}"))
                .call(move |b: &B, _: &[Tensor]| Ok(vec![b.causal_mask(seq, kv_len)?]))
                .twin(move |_| vec![twin::causal_mask(seq, kv_len)])
                .tolerance(Tolerance::EXACT)
                .build(),
        );
    }
    let softmax_configs: [(&[usize], f32, f64); 3] =
        [(&[2, 3, 5, 9], 0.7, 1.0), (&[67, 67], 0.125, 200.0), (&[4, 130, 130], 1.0, 2.0)];
    for (shape, scale, amp) in softmax_configs {
        let scores = Rng::new(101).tensor(Shape::new(shape.to_vec()), -amp, amp);
        v.extend(
            OpCase::new(Op::CausalSoftmax, format!("causal_softmax scores{shape:?} ×{amp} scale={scale}"))
                .input(Input::new(scores).shape_free())
                .call(move |b: &B, t: &[Tensor]| Ok(vec![b.causal_softmax(&t[0], scale)?]))
                .twin(move |a| vec![twin::causal_softmax(&a[0], scale as f64)])
                .dtypes(FLOATS)
                .build(),
        );
    }
    v
}

// ─────────────────────────────── head layouts ───────────────────────────────

fn layout_cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let mut v = Vec::new();
    for (shape, heads) in [([2usize, 5, 24], 4usize), ([2, 130, 512], 8)] {
        let x = Rng::new(111).tensor(Shape::new(shape.to_vec()), -1.0, 1.0);
        v.extend(
            OpCase::new(Op::SplitHeads, format!("split_heads x{shape:?} heads={heads}"))
                .input(Input::new(x).dtype_free())
                .call(move |b: &B, t: &[Tensor]| Ok(vec![b.split_heads(&t[0], heads)?]))
                .twin(move |a| vec![twin::split_heads(&a[0], heads)])
                .tolerance(Tolerance::EXACT)
                .dtypes(FLOATS)
                .build(),
        );
    }
    let ids = Rng::new(112).ids(Shape::new([1, 3, 8]), 1000);
    v.extend(
        OpCase::new(Op::SplitHeads, "split_heads u32 x[1,3,8] heads=2")
            .input(Input::new(ids).dtype_free())
            .call(|b: &B, t: &[Tensor]| Ok(vec![b.split_heads(&t[0], 2)?]))
            .twin(|a| vec![twin::split_heads(&a[0], 2)])
            .tolerance(Tolerance::EXACT)
            .no_bad_inputs()
            .build(),
    );
    for shape in [[2usize, 4, 5, 6], [2, 8, 130, 64]] {
        let x = Rng::new(113).tensor(Shape::new(shape.to_vec()), -1.0, 1.0);
        v.extend(
            OpCase::new(Op::MergeHeads, format!("merge_heads x{shape:?}"))
                .input(Input::new(x).dtype_free().shape_free())
                .call(|b: &B, t: &[Tensor]| Ok(vec![b.merge_heads(&t[0])?]))
                .twin(|a| vec![twin::merge_heads(&a[0])])
                .tolerance(Tolerance::EXACT)
                .dtypes(FLOATS)
                .build(),
        );
    }
    v
}

// ──────────────────────────────── capability ────────────────────────────────

/// The CPU backend has a native fused path; any backend must answer without panicking
/// and, when it says yes, run `causal_attention` on those inputs.
fn supports_case<B: ComputeBackend + ?Sized + 'static>() -> Case<B> {
    let c = Cfg::new(1, 4, 2, 17, 17, 32);
    Case::custom(
        Op::SupportsCausalAttention,
        CaseKind::Property,
        format!("supports_causal_attention {}", c.name()),
        move |b: &B| {
            let (q, k, v) = c.qkv(121);
            let up = |t: &Tensor| b.upload(t).map_err(err);
            let (q, k, v) = (up(&q)?, up(&k)?, up(&v)?);
            let sinks = up(&c.sinks_tensor())?;
            for (window, sinks) in [(None, None), (Some(5), None), (None, Some(&sinks)), (Some(5), Some(&sinks))] {
                let native = b.supports_causal_attention(&q, &k, &v, window, sinks, c.scale());
                if b.name() == "cpu" && !native {
                    return Err(format!(
                        "the CPU backend has a native fused causal attention but answered false (window {window:?}, \
                         sinks {})",
                        sinks.is_some()
                    ));
                }
                if native {
                    b.causal_attention(&q, &k, &v, window, sinks, c.scale()).map_err(err)?;
                }
            }
            Ok(())
        },
    )
}

// ──────────────────────────────── bad values ────────────────────────────────

/// A bad-input case whose call passes `window = Some(0)`: it must fail with an error
/// that names the op and the window.
fn window_zero<B: ComputeBackend + ?Sized + 'static>(
    op: Op,
    call: impl Fn(&B) -> fusebox::Result<()> + Send + Sync + 'static,
) -> Case<B> {
    let name = format!("{} window Some(0)", op.name());
    Case::custom(op, CaseKind::BadInput, name, move |b: &B| match call(b) {
        Ok(()) => Err("accepted window Some(0) instead of returning an error".into()),
        Err(e) => {
            let msg = e.to_string();
            if msg.contains(op.name()) && msg.contains("window") {
                Ok(())
            } else {
                Err(format!("the error does not name the op and the window: {msg}"))
            }
        }
    })
}

/// Bad attention sinks for `hq` query heads: a logit too many, one too few, F16 and BF16
/// (sinks are f32 whatever q's dtype), rank 2 (`[1, Hq]`) and rank 0.
fn bad_sinks(hq: usize) -> Vec<(String, Tensor)> {
    let t = |shape: Vec<usize>| Rng::new(133).tensor(Shape::new(shape), -1.0, 1.0);
    vec![
        (format!("sinks [{}] for Hq {hq}", hq + 1), t(vec![hq + 1])),
        (format!("sinks [{}] for Hq {hq}", hq - 1), t(vec![hq - 1])),
        ("sinks in f16".into(), rounded(&t(vec![hq]), DType::F16)),
        ("sinks in bf16".into(), rounded(&t(vec![hq]), DType::BF16)),
        (format!("sinks of rank 2 [1, {hq}]"), t(vec![1, hq])),
        ("sinks of rank 0".into(), t(vec![])),
    ]
}

/// A bad-input case whose call passes bad `sinks`: it must fail with an error that names
/// the op and the sinks.
fn sinks_rejected<B: ComputeBackend + ?Sized + 'static>(
    op: Op,
    what: &str,
    sinks: Tensor,
    call: impl Fn(&B, &Tensor) -> fusebox::Result<()> + Send + Sync + 'static,
) -> Case<B> {
    let name = format!("{} {what}", op.name());
    Case::custom(op, CaseKind::BadInput, name, move |b: &B| match b.upload(&sinks).and_then(|s| call(b, &s)) {
        Ok(()) => Err("accepted the bad sinks instead of returning an error".into()),
        Err(e) => {
            let msg = e.to_string();
            if msg.contains(op.name()) && msg.contains("sinks") {
                Ok(())
            } else {
                Err(format!("the error does not name the op and the sinks: {msg}"))
            }
        }
    })
}

/// Bad sinks for every op that takes them.
fn bad_sinks_cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let mut v: Vec<Case<B>> = Vec::new();
    let t = |shape: &[usize]| Rng::new(132).tensor(Shape::new(shape.to_vec()), -1.0, 1.0);
    // Hq 3 over Hkv 1; the caches hold 10 rows of which 6 are filled.
    let (q, kv, cache) = (t(&[2, 3, 4, 8]), t(&[2, 1, 6, 8]), t(&[2, 1, 10, 8]));
    for (what, sinks) in bad_sinks(3) {
        let (q1, kv1) = (q.clone(), kv.clone());
        v.push(sinks_rejected(Op::CausalAttention, &what, sinks.clone(), move |b: &B, s| {
            let (qu, ku) = (b.upload(&q1)?, b.upload(&kv1)?);
            b.causal_attention(&qu, &ku, &ku, None, Some(s), 0.3).map(drop)
        }));
        let (q1, kv1) = (q.clone(), kv.clone());
        v.push(sinks_rejected(Op::CausalAttentionBackward, &what, sinks.clone(), move |b: &B, s| {
            let (qu, ku) = (b.upload(&q1)?, b.upload(&kv1)?);
            let saved = b.causal_attention(&qu, &ku, &ku, None, None, 0.3)?;
            b.causal_attention_backward(&qu, &ku, &ku, &saved, &qu, None, Some(s), 0.3).map(drop)
        }));
        let (q1, cache1) = (q.clone(), cache.clone());
        v.push(sinks_rejected(Op::DecodeAttention, &what, sinks, move |b: &B, s| {
            let (qu, cu) = (b.upload(&q1)?, b.upload(&cache1)?);
            b.decode_attention(&qu, &cu, &cu, 6, None, Some(s), 0.3).map(drop)
        }));
    }
    // Two sequences of Hq 3, one query each, over their own caches.
    let (q2, one) = (t(&[2, 3, 1, 8]), t(&[1, 1, 10, 8]));
    for (what, sinks) in bad_sinks(3) {
        let (q2, one) = (q2.clone(), one.clone());
        v.push(sinks_rejected(Op::BatchedDecodeAttention, &what, sinks, move |b: &B, s| {
            let c = b.upload(&one)?;
            b.batched_decode_attention(&b.upload(&q2)?, &[&c, &c], &[&c, &c], &[3, 6], None, Some(s), 0.3).map(drop)
        }));
    }
    v
}

fn bad_value_cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let mut v: Vec<Case<B>> = Vec::new();
    let t = |shape: &[usize]| Rng::new(131).tensor(Shape::new(shape.to_vec()), -1.0, 1.0);
    let q3 = t(&[1, 3, 4, 8]);
    let kv2 = t(&[1, 2, 4, 8]);
    let (q_long, kv_short) = (t(&[1, 2, 6, 8]), t(&[1, 2, 4, 8]));
    let (q, kv) = (t(&[2, 2, 4, 8]), t(&[2, 1, 6, 8]));
    let kv_d16 = t(&[2, 1, 6, 16]);
    {
        let (q3, kv2) = (q3.clone(), kv2.clone());
        v.push(Case::expect_error(Op::Attention, "attention Hq 3 % Hkv 2 != 0", move |b: &B| {
            b.attention(&b.upload(&q3)?, &b.upload(&kv2)?, &b.upload(&kv2)?, 0.3, false).map(drop)
        }));
    }
    {
        let (ql, ks) = (q_long.clone(), kv_short.clone());
        v.push(Case::expect_error(Op::Attention, "attention causal with Tq 6 > Tk 4", move |b: &B| {
            b.attention(&b.upload(&ql)?, &b.upload(&ks)?, &b.upload(&ks)?, 0.3, true).map(drop)
        }));
    }
    {
        let (q3, kv2) = (q3.clone(), kv2.clone());
        v.push(Case::expect_error(Op::Sdpa, "sdpa Hq 3 % Hkv 2 != 0", move |b: &B| {
            b.sdpa(&b.upload(&q3)?, &b.upload(&kv2)?, &b.upload(&kv2)?, None, 0.3, false).map(drop)
        }));
    }
    {
        let (ql, ks) = (q_long.clone(), kv_short.clone());
        v.push(Case::expect_error(Op::Sdpa, "sdpa causal with Tq 6 > Tk 4", move |b: &B| {
            b.sdpa(&b.upload(&ql)?, &b.upload(&ks)?, &b.upload(&ks)?, None, 0.3, true).map(drop)
        }));
    }
    for (what, mask) in [
        ("rank-3 mask [B,Hq,Tq]", t(&[2, 2, 4])),
        ("mask [1,Hq,Tq,Tk] for B = 2", t(&[1, 2, 4, 6])),
        ("mask [Tk,Tq] (transposed)", t(&[6, 4])),
        ("additive mask in f16", rounded(&t(&[4, 6]), DType::F16)),
    ] {
        let (q, kv) = (q.clone(), kv.clone());
        v.push(Case::expect_error(Op::Sdpa, format!("sdpa {what}"), move |b: &B| {
            let m = b.upload(&mask)?;
            b.sdpa(&b.upload(&q)?, &b.upload(&kv)?, &b.upload(&kv)?, Some(AttentionMask::Additive(&m)), 0.3, false)
                .map(drop)
        }));
    }
    {
        let (q, kv) = (q.clone(), kv.clone());
        v.push(Case::expect_error(Op::Sdpa, "sdpa boolean mask given as f32", move |b: &B| {
            let m = b.upload(&t(&[4, 6]))?;
            b.sdpa(&b.upload(&q)?, &b.upload(&kv)?, &b.upload(&kv)?, Some(AttentionMask::Boolean(&m)), 0.3, false)
                .map(drop)
        }));
    }
    let causal_bad: [(&str, Tensor, Tensor, Tensor); 5] = [
        ("Hq 3 % Hkv 2 != 0", q3.clone(), kv2.clone(), kv2.clone()),
        ("Tq 6 > Tk 4", q_long.clone(), kv_short.clone(), kv_short.clone()),
        ("head_dim 8 vs 16", q.clone(), kv_d16.clone(), kv_d16.clone()),
        ("k and v of different lengths", q.clone(), kv.clone(), t(&[2, 1, 5, 8])),
        ("batch 2 vs 1", q.clone(), t(&[1, 1, 6, 8]), t(&[1, 1, 6, 8])),
    ];
    for (what, q, k, vv) in causal_bad.clone() {
        v.push(Case::expect_error(Op::CausalAttention, format!("causal_attention {what}"), move |b: &B| {
            b.causal_attention(&b.upload(&q)?, &b.upload(&k)?, &b.upload(&vv)?, None, None, 0.3).map(drop)
        }));
    }
    for (what, q, k, vv) in causal_bad {
        v.push(Case::expect_error(
            Op::CausalAttentionBackward,
            format!("causal_attention_backward {what}"),
            move |b: &B| {
                let saved = CausalAttentionResult { output: b.upload(&q)?, logsumexp: b.upload(&t(&q.dims()[..3]))? };
                let (qu, ku, vu) = (b.upload(&q)?, b.upload(&k)?, b.upload(&vv)?);
                b.causal_attention_backward(&qu, &ku, &vu, &saved, &qu, None, None, 0.3).map(drop)
            },
        ));
    }
    {
        let (q, kv) = (q.clone(), kv.clone());
        v.push(Case::expect_error(
            Op::CausalAttentionBackward,
            "causal_attention_backward logsumexp in f16",
            move |b: &B| {
                let saved = CausalAttentionResult {
                    output: b.upload(&q)?,
                    logsumexp: b.upload(&rounded(&t(&[2, 2, 4]), DType::F16))?,
                };
                let (qu, ku) = (b.upload(&q)?, b.upload(&kv)?);
                b.causal_attention_backward(&qu, &ku, &ku, &saved, &qu, None, None, 0.3).map(drop)
            },
        ));
    }
    {
        let (q, kv) = (q.clone(), kv.clone());
        v.push(Case::expect_error(
            Op::CausalAttentionBackward,
            "causal_attention_backward d_out in f16, q in f32",
            move |b: &B| {
                let saved = CausalAttentionResult { output: b.upload(&q)?, logsumexp: b.upload(&t(&[2, 2, 4]))? };
                let (qu, ku) = (b.upload(&q)?, b.upload(&kv)?);
                b.causal_attention_backward(
                    &qu,
                    &ku,
                    &ku,
                    &saved,
                    &b.upload(&rounded(&q, DType::F16))?,
                    None,
                    None,
                    0.3,
                )
                .map(drop)
            },
        ));
    }
    // Window 0: a query that sees no key, not even itself.
    {
        let (q, kv) = (q.clone(), kv.clone());
        v.push(window_zero(Op::CausalAttention, move |b: &B| {
            let (qu, ku) = (b.upload(&q)?, b.upload(&kv)?);
            b.causal_attention(&qu, &ku, &ku, Some(0), None, 0.3).map(drop)
        }));
    }
    {
        let (q, kv) = (q.clone(), kv.clone());
        v.push(window_zero(Op::CausalAttentionBackward, move |b: &B| {
            let (qu, ku) = (b.upload(&q)?, b.upload(&kv)?);
            let saved = b.causal_attention(&qu, &ku, &ku, None, None, 0.3)?;
            b.causal_attention_backward(&qu, &ku, &ku, &saved, &qu, Some(0), None, 0.3).map(drop)
        }));
    }
    {
        let (q, kv) = (q.clone(), kv.clone());
        v.push(window_zero(Op::DecodeAttention, move |b: &B| {
            let (qu, ku) = (b.upload(&q)?, b.upload(&kv)?);
            b.decode_attention(&qu, &ku, &ku, 6, Some(0), None, 0.3).map(drop)
        }));
    }
    let cache = t(&[2, 1, 10, 8]);
    for (what, qd, kv_len) in [
        ("kv_len 11 > capacity 10", q.clone(), 11),
        ("Tq 4 > kv_len 3", q.clone(), 3),
        ("Hq 3 % Hkv 2 != 0", t(&[2, 3, 1, 8]), 5),
    ] {
        let cache = if what.starts_with("Hq") { t(&[2, 2, 10, 8]) } else { cache.clone() };
        v.push(Case::expect_error(Op::DecodeAttention, format!("decode_attention {what}"), move |b: &B| {
            let c = b.upload(&cache)?;
            b.decode_attention(&b.upload(&qd)?, &c, &c, kv_len, None, None, 0.3).map(drop)
        }));
    }
    {
        let (q, kv) = (q.clone(), kv.clone());
        v.push(window_zero(Op::BatchedDecodeAttention, move |b: &B| {
            let (qu, ku) = (b.upload(&q)?, b.upload(&kv)?);
            let ks: Vec<&Tensor> = vec![&ku; q.dims()[0]];
            b.batched_decode_attention(&qu, &ks, &ks, &vec![6; q.dims()[0]], Some(0), None, 0.3).map(drop)
        }));
    }
    // One cache per sequence, each of batch 1; lengths within each capacity.
    let one = t(&[1, 1, 10, 8]);
    let q2 = t(&[2, 1, 1, 8]);
    for (what, caches, lens) in [
        ("kv_len 11 > capacity 10 in sequence 1", 2, vec![3, 11]),
        ("one cache for two sequences", 1, vec![3, 3]),
        ("two lengths, three caches", 3, vec![3, 3]),
        ("kv_len 0 < Tq 1", 2, vec![0, 4]),
    ] {
        let (one, q2) = (one.clone(), q2.clone());
        v.push(Case::expect_error(
            Op::BatchedDecodeAttention,
            format!("batched_decode_attention {what}"),
            move |b: &B| {
                let c = b.upload(&one)?;
                let cs: Vec<&Tensor> = vec![&c; caches];
                b.batched_decode_attention(&b.upload(&q2)?, &cs, &cs, &lens, None, None, 0.3).map(drop)
            },
        ));
    }
    {
        let (whole, q2) = (t(&[2, 1, 10, 8]), q2.clone());
        v.push(Case::expect_error(
            Op::BatchedDecodeAttention,
            "batched_decode_attention a batch-2 cache as one sequence's",
            move |b: &B| {
                let c = b.upload(&whole)?;
                b.batched_decode_attention(&b.upload(&q2)?, &[&c, &c], &[&c, &c], &[3, 3], None, None, 0.3).map(drop)
            },
        ));
    }
    for (what, new, pos) in [
        ("pos 8 + T 3 > capacity 10", t(&[2, 1, 3, 8]), 8),
        ("pos overflowing usize", t(&[2, 1, 3, 8]), usize::MAX),
        ("batch 1 into a batch-2 cache", t(&[1, 1, 3, 8]), 0),
        ("head_dim 16 into a head_dim-8 cache", t(&[2, 1, 3, 16]), 0),
    ] {
        v.push(Case::expect_error(Op::WriteHeadCache, format!("write_head_cache {what}"), move |b: &B| {
            let fresh = t(&[2, 1, 10, 8]);
            let mut cache = b.upload(&fresh)?;
            drop(fresh);
            b.write_head_cache(&mut cache, &b.upload(&new)?, pos)
        }));
    }
    // A cache's dtype is its storage format: the two caches must agree, and rows come in
    // the cache's dtype or as f32.
    {
        let q = q.clone();
        v.push(Case::expect_error(
            Op::DecodeAttention,
            "decode_attention f16 k_cache with a bf16 v_cache",
            move |b: &B| {
                let (kc, vc) = (rounded(&t(&[2, 1, 10, 8]), DType::F16), rounded(&t(&[2, 1, 10, 8]), DType::BF16));
                b.decode_attention(&b.upload(&q)?, &b.upload(&kc)?, &b.upload(&vc)?, 5, None, None, 0.3).map(drop)
            },
        ));
    }
    for (what, cache_dtype, new_dtype) in [
        ("bf16 rows into an f16 cache", DType::F16, DType::BF16),
        ("f16 rows into an f32 cache", DType::F32, DType::F16),
    ] {
        v.push(Case::expect_error(Op::WriteHeadCache, format!("write_head_cache {what}"), move |b: &B| {
            let fresh = rounded(&t(&[2, 1, 10, 8]), cache_dtype);
            let mut cache = b.upload(&fresh)?;
            drop(fresh);
            b.write_head_cache(&mut cache, &b.upload(&rounded(&t(&[2, 1, 3, 8]), new_dtype))?, 0)
        }));
    }
    v.push(Case::expect_error(
        Op::WriteHeadCache,
        "write_head_cache into a cache whose storage is shared",
        move |b: &B| {
            let mut cache = b.upload(&t(&[2, 1, 10, 8]))?;
            let _other_handle = cache.clone();
            b.write_head_cache(&mut cache, &b.upload(&t(&[2, 1, 3, 8]))?, 0)
        },
    ));
    v.push(Case::expect_error(Op::CausalMask, "causal_mask seq 5 > kv_len 4", |b: &B| b.causal_mask(5, 4).map(drop)));
    v.push(Case::expect_error(Op::CausalSoftmax, "causal_softmax Tq 5 > Tk 3", move |b: &B| {
        b.causal_softmax(&b.upload(&t(&[2, 5, 3]))?, 1.0).map(drop)
    }));
    v.push(Case::expect_error(Op::CausalSoftmax, "causal_softmax rank 1", move |b: &B| {
        b.causal_softmax(&b.upload(&t(&[5]))?, 1.0).map(drop)
    }));
    for (what, heads) in [("heads 0", 0), ("heads 5 not dividing 24", 5)] {
        v.push(Case::expect_error(Op::SplitHeads, format!("split_heads {what}"), move |b: &B| {
            b.split_heads(&b.upload(&t(&[2, 3, 24]))?, heads).map(drop)
        }));
    }
    v.push(Case::expect_error(Op::SplitHeads, "split_heads rank 2", move |b: &B| {
        b.split_heads(&b.upload(&t(&[3, 24]))?, 4).map(drop)
    }));
    v.push(Case::expect_error(Op::MergeHeads, "merge_heads rank 3", move |b: &B| {
        b.merge_heads(&b.upload(&t(&[2, 3, 24]))?).map(drop)
    }));
    v.push(Case::expect_error(Op::MergeHeads, "merge_heads of a q8_0 tensor", |b: &B| {
        b.merge_heads(&b.upload(&Tensor::zeros(Shape::new([1, 2, 3, 32]), DType::Q8_0)?)?).map(drop)
    }));
    v
}
