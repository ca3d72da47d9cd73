//! Cases of the linear-attention family, the gated delta rule: the chunked forward
//! against the token-by-token twin at T ∈ {1, 5, 63, 64, 65, 70, 130} (inside one chunk,
//! exactly one, one and a bit, several), GQA (Hk < Hv), with and without an initial state,
//! Dk ≠ Dv; the chunked form against the backend's own step applied T times; the step
//! and the batched step against the twin, and the batched step against solo steps bit for
//! bit; the backward (every gradient, d_initial_state and d_state included) by finite
//! differences of the twin and against the twin, and with no gradient into the final
//! state; and bad input for each op.
//!
//! Inputs look like the model's: q and k rows l2-normalised, g < 0, β in (0, 1).

use fusebox::{ComputeBackend, DType, Op, Result as FbResult, Shape, Tensor};

use crate::array::Array;
use crate::case::{catch, Case, CaseKind, GradCase, Input, OpCase};
use crate::reference::delta as twin;
use crate::rng::Rng;
use crate::tolerance::Tolerance;

/// The chunked form against the recurrence: f32 rounding over up to 130 steps.
const TOL: Tolerance = Tolerance { abs: 5e-6, rel: 5e-5 };
/// Gradients sum over many tokens and pass through the triangular solve.
const GRAD_TOL: Tolerance = Tolerance { abs: 2e-5, rel: 2e-4 };

/// Sizes of a sequence case.
#[derive(Debug, Clone, Copy)]
struct Config {
    b: usize,
    t: usize,
    hk: usize,
    hv: usize,
    dk: usize,
    dv: usize,
    init: bool,
}

impl Config {
    const fn new(b: usize, t: usize, hk: usize, hv: usize, dk: usize, dv: usize, init: bool) -> Config {
        Config { b, t, hk, hv, dk, dv, init }
    }
    fn name(&self, op: &str) -> String {
        let Config { b, t, hk, hv, dk, dv, init } = *self;
        let init = if init { "initial state" } else { "zero state" };
        format!("{op} B{b} T{t} Hk{hk} Hv{hv} Dk{dk} Dv{dv}, {init}")
    }
    fn scale(&self) -> f32 {
        1.0 / (self.dk as f32).sqrt()
    }
    /// q, k, v, g, β and (when `init`) the initial state.
    fn inputs(&self, seed: u64) -> Vec<Tensor> {
        let Config { b, t, hk, hv, dk, dv, init } = *self;
        let mut rng = Rng::new(seed);
        let mut ts = vec![
            unit_rows(&mut rng, &[b, t, hk, dk]),
            unit_rows(&mut rng, &[b, t, hk, dk]),
            rng.normal_ish(vec![b, t, hv, dv]),
        ];
        ts.push(rng.tensor(vec![b, t, hv], -0.5, -0.01));
        ts.push(rng.tensor(vec![b, t, hv], 0.05, 0.95));
        if init {
            ts.push(rng.tensor(vec![b, hv, dk, dv], -0.5, 0.5));
        }
        ts
    }
    fn state_dims(&self) -> Vec<usize> {
        vec![self.b, self.hv, self.dk, self.dv]
    }
}

/// Uniform values with every last-dim row scaled to unit length (as the model's l2 norm).
fn unit_rows(rng: &mut Rng, dims: &[usize]) -> Tensor {
    let d = *dims.last().expect("rank ≥ 1");
    let mut v = rng.vec(dims.iter().product(), -1.0, 1.0);
    for row in v.chunks_mut(d) {
        let n = row.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-6);
        row.iter_mut().for_each(|x| *x /= n);
    }
    Tensor::from_vec(v, dims.to_vec()).expect("shape")
}

fn seed(s: &str) -> u64 {
    s.bytes().fold(0x5eed_de17a_u64, |h, b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3))
}

fn err(e: fusebox::Error) -> String {
    format!("returned an error: {e}")
}

/// A fresh, writable copy of host tensor `t` on backend `b` (the suite's inputs are
/// shared clones, which in-place ops rightly refuse).
fn writable<B: ComputeBackend + ?Sized>(b: &B, t: &Tensor) -> FbResult<Tensor> {
    let h = b.to_host(t)?;
    let fresh = Tensor::from_bytes(h.host_bytes()?, h.shape().clone(), h.dtype())?;
    b.upload(&fresh)
}

/// Rows `n` of each `[N, ...]` tensor as `[1, ...]` writable tensors on `b`.
fn split_rows<B: ComputeBackend + ?Sized>(b: &B, stacked: &Tensor) -> FbResult<Vec<Tensor>> {
    let h = b.to_host(stacked)?;
    let n = h.dims().first().copied().unwrap_or(0);
    let mut one = h.dims().to_vec();
    if let Some(first) = one.first_mut() {
        *first = 1;
    }
    let per = h.elem_count() / n.max(1);
    (0..n).map(|i| writable(b, &h.view(i * per, one.clone())?)).collect()
}

/// Every case of the family.
pub fn cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let mut cases = Vec::new();
    cases.extend(forward_cases());
    cases.extend(step_cases());
    cases.extend(backward_cases());
    cases.extend(bad_input_cases());
    cases
}

// ───────────────────────────── chunked forward ─────────────────────────────

const FORWARD: &[Config] = &[
    Config::new(1, 1, 1, 1, 4, 3, false),
    Config::new(2, 5, 1, 2, 4, 3, true),
    Config::new(1, 63, 2, 4, 8, 6, false),
    Config::new(1, 64, 1, 1, 8, 8, true),
    Config::new(2, 65, 2, 2, 5, 7, true),
    Config::new(1, 70, 1, 1, 32, 40, true),
    Config::new(1, 130, 1, 3, 6, 4, true),
    Config::new(1, 130, 2, 2, 16, 16, false),
];

fn forward_cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let mut cases = Vec::new();
    for (i, c) in FORWARD.iter().enumerate() {
        let name = c.name("gated_delta_rule");
        let scale = c.scale();
        let mut op = OpCase::new(Op::GatedDeltaRule, &name).tolerance(TOL);
        for (j, t) in c.inputs(seed(&name)).into_iter().enumerate() {
            // Without an initial state, v alone sets Dv: a longer v is no error.
            let free = j == 2 && !c.init;
            op = op.input(if free { Input::new(t).shape_free() } else { Input::new(t) });
        }
        // Bad variants from two descriptions are plenty (they differ only in sizes).
        if i > 1 {
            op = op.no_bad_inputs();
        }
        let init = c.init;
        cases.extend(
            op.call(move |b: &B, t| {
                let r = b.gated_delta_rule(&t[0], &t[1], &t[2], &t[3], &t[4], t.get(5).filter(|_| init), scale)?;
                Ok(vec![r.out, r.state])
            })
            .twin(move |x| {
                let (out, state) = twin::gated_delta_rule(&x[0], &x[1], &x[2], &x[3], &x[4], x.get(5), scale as f64);
                vec![out, state]
            })
            .build(),
        );
    }
    // The chunked form equals the backend's own step applied token by token.
    for c in [Config::new(1, 130, 1, 2, 8, 12, true), Config::new(2, 67, 2, 2, 5, 3, false)] {
        let name = format!("{} | chunked vs step applied T times", c.name("gated_delta_rule"));
        let inputs = c.inputs(seed(&name));
        cases.push(Case::custom(Op::GatedDeltaRule, CaseKind::Property, name, move |b: &B| {
            chunked_matches_steps(b, c, &inputs)
        }));
    }
    cases
}

fn chunked_matches_steps<B: ComputeBackend + ?Sized>(b: &B, c: Config, x: &[Tensor]) -> Result<(), String> {
    let up: Vec<Tensor> = x.iter().map(|t| b.upload(t)).collect::<FbResult<_>>().map_err(err)?;
    let init = if c.init { Some(&up[5]) } else { None };
    let chunked =
        catch(|| b.gated_delta_rule(&up[0], &up[1], &up[2], &up[3], &up[4], init, c.scale()))?.map_err(err)?;
    let mut state = match init {
        Some(s) => writable(b, s).map_err(err)?,
        None => b.upload(&Tensor::zeros(c.state_dims(), DType::F32).map_err(err)?).map_err(err)?,
    };
    let host: Vec<Vec<f32>> = x.iter().map(|t| t.to_vec_f32().expect("f32")).collect();
    let mut outs = vec![0.0f64; c.b * c.t * c.hv * c.dv];
    for t in 0..c.t {
        // Token t of every sequence: [B, H, D] (or [B, H]) cut from [B, T, H, D].
        let token = |i: usize, per: usize, tail: &[usize]| {
            let mut v = Vec::with_capacity(c.b * per);
            for bb in 0..c.b {
                v.extend_from_slice(&host[i][(bb * c.t + t) * per..(bb * c.t + t + 1) * per]);
            }
            let dims: Vec<usize> = [c.b].iter().chain(tail).copied().collect();
            b.upload(&Tensor::from_vec(v, dims).expect("shape"))
        };
        let (qk, vv) = (c.hk * c.dk, c.hv * c.dv);
        let args = [
            token(0, qk, &[c.hk, c.dk]),
            token(1, qk, &[c.hk, c.dk]),
            token(2, vv, &[c.hv, c.dv]),
            token(3, c.hv, &[c.hv]),
            token(4, c.hv, &[c.hv]),
        ];
        let a: Vec<Tensor> = args.into_iter().collect::<FbResult<_>>().map_err(err)?;
        let o = catch(|| b.gated_delta_rule_step(&a[0], &a[1], &a[2], &a[3], &a[4], &mut state, c.scale()))?
            .map_err(err)?;
        let o = Array::from_tensor(&b.to_host(&o).map_err(err)?);
        for bb in 0..c.b {
            let dst = (bb * c.t + t) * vv;
            outs[dst..dst + vv].copy_from_slice(&o.data[bb * vv..(bb + 1) * vv]);
        }
    }
    let stepped = Array::new(vec![c.b, c.t, c.hv, c.dv], outs);
    TOL.check("out", &Array::from_tensor(&b.to_host(&chunked.out).map_err(err)?), &stepped)?;
    let state = Array::from_tensor(&b.to_host(&state).map_err(err)?);
    TOL.check("state", &Array::from_tensor(&b.to_host(&chunked.state).map_err(err)?), &state)
}

// ─────────────────────────────── decode steps ──────────────────────────────

/// (B, Hk, Hv, Dk, Dv): GQA, a partial column block (Dv 40 = 32 + 8), an odd Dk, Dv > 64.
const STEP: &[(usize, usize, usize, usize, usize)] = &[(2, 1, 2, 4, 3), (1, 2, 4, 16, 40), (3, 2, 2, 33, 65)];

fn step_inputs(seed_: u64, (n, hk, hv, dk, dv): (usize, usize, usize, usize, usize)) -> Vec<Tensor> {
    let mut rng = Rng::new(seed_);
    vec![
        unit_rows(&mut rng, &[n, hk, dk]),
        unit_rows(&mut rng, &[n, hk, dk]),
        rng.normal_ish(vec![n, hv, dv]),
        rng.tensor(vec![n, hv], -0.5, -0.01),
        rng.tensor(vec![n, hv], 0.05, 0.95),
        rng.tensor(vec![n, hv, dk, dv], -0.5, 0.5),
    ]
}

fn step_cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let mut cases = Vec::new();
    for (i, &dims) in STEP.iter().enumerate() {
        let (n, hk, hv, dk, dv) = dims;
        let scale = 1.0 / (dk as f32).sqrt();
        let tw = move |x: &[Array]| {
            let (out, state) = twin::gated_delta_rule_step(&x[0], &x[1], &x[2], &x[3], &x[4], &x[5], scale as f64);
            vec![out, state]
        };
        let name = format!("gated_delta_rule_step B{n} Hk{hk} Hv{hv} Dk{dk} Dv{dv}");
        let mut op = OpCase::new(Op::GatedDeltaRuleStep, &name).tolerance(Tolerance::F32);
        for t in step_inputs(seed(&name), dims) {
            op = op.input(Input::new(t));
        }
        if i > 0 {
            op = op.no_bad_inputs();
        }
        cases.extend(
            op.call(move |b: &B, t| {
                let mut state = writable(b, &t[5])?;
                let out = b.gated_delta_rule_step(&t[0], &t[1], &t[2], &t[3], &t[4], &mut state, scale)?;
                Ok(vec![out, state])
            })
            .twin(tw)
            .build(),
        );
        // The batched form: states stacked here, one writable [1, ...] tensor per row there.
        let name = format!("batched_gated_delta_rule_step N{n} Hk{hk} Hv{hv} Dk{dk} Dv{dv}");
        let mut op = OpCase::new(Op::BatchedGatedDeltaRuleStep, &name).tolerance(Tolerance::F32);
        let inputs = step_inputs(seed(&name), dims);
        for t in &inputs {
            op = op.input(Input::new(t.clone()));
        }
        if i > 0 {
            op = op.no_bad_inputs();
        }
        cases.extend(
            op.call(move |b: &B, t| {
                let mut states = split_rows(b, &t[5])?;
                let mut refs: Vec<&mut Tensor> = states.iter_mut().collect();
                let out = b.batched_gated_delta_rule_step(&t[0], &t[1], &t[2], &t[3], &t[4], &mut refs, scale)?;
                let host = states.iter().map(|s| b.to_host(s)).collect::<FbResult<Vec<_>>>()?;
                let stacked: Vec<f32> = host.iter().flat_map(|s| s.to_vec_f32().unwrap_or_default()).collect();
                Ok(vec![out, Tensor::from_vec(stacked, t[5].shape().clone())?])
            })
            .twin(tw)
            .build(),
        );
        cases.push(Case::custom(
            Op::BatchedGatedDeltaRuleStep,
            CaseKind::Property,
            format!("{name} | each row bit for bit its solo step"),
            move |b: &B| batched_equals_solo(b, &inputs, scale),
        ));
    }
    cases
}

fn batched_equals_solo<B: ComputeBackend + ?Sized>(b: &B, x: &[Tensor], scale: f32) -> Result<(), String> {
    let up: Vec<Tensor> = x.iter().map(|t| b.upload(t)).collect::<FbResult<_>>().map_err(err)?;
    let mut states = split_rows(b, &up[5]).map_err(err)?;
    let mut refs: Vec<&mut Tensor> = states.iter_mut().collect();
    let batched = catch(|| b.batched_gated_delta_rule_step(&up[0], &up[1], &up[2], &up[3], &up[4], &mut refs, scale))?
        .map_err(err)?;
    let batched = b.to_host(&batched).map_err(err)?.to_vec::<f32>().map_err(err)?;
    let rows: Vec<Vec<Tensor>> = up[..5].iter().map(|t| split_rows(b, t)).collect::<FbResult<_>>().map_err(err)?;
    let per = batched.len() / states.len().max(1);
    for (i, state) in states.iter().enumerate() {
        let mut solo_state = split_rows(b, &up[5]).map_err(err)?.swap_remove(i);
        let r = |j: usize| &rows[j][i];
        let solo =
            catch(|| b.gated_delta_rule_step(r(0), r(1), r(2), r(3), r(4), &mut solo_state, scale))?.map_err(err)?;
        let solo = b.to_host(&solo).map_err(err)?.to_vec::<f32>().map_err(err)?;
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        if bits(&solo) != bits(&batched[i * per..(i + 1) * per]) {
            return Err(format!("row {i}: batched output differs from the solo step's"));
        }
        let (s1, s2) = (b.to_host(state).map_err(err)?, b.to_host(&solo_state).map_err(err)?);
        if bits(&s1.to_vec::<f32>().map_err(err)?) != bits(&s2.to_vec::<f32>().map_err(err)?) {
            return Err(format!("row {i}: batched state differs from the solo step's"));
        }
    }
    Ok(())
}

// ──────────────────────────────── backward ─────────────────────────────────

/// Small enough for finite differences over every input element; T 70 and 130 cross
/// chunk boundaries.
const BACKWARD: &[Config] = &[
    Config::new(1, 5, 1, 2, 3, 4, true),
    Config::new(1, 70, 1, 2, 4, 3, false),
    Config::new(2, 130, 1, 1, 3, 2, true),
];

/// The op's two outputs as one flat array (the finite-difference checks differentiate
/// `Σ d·[out, state]`, so `d_out` and `d_state` are both nonzero).
fn flat_forward(x: &[Array], init: bool, scale: f64) -> Array {
    let (out, state) = twin::gated_delta_rule(&x[0], &x[1], &x[2], &x[3], &x[4], x.get(5).filter(|_| init), scale);
    let data: Vec<f64> = out.data.into_iter().chain(state.data).collect();
    Array::new(vec![data.len()], data)
}

fn backward_cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let mut cases = Vec::new();
    for &c in BACKWARD {
        let name = c.name("gated_delta_rule_backward");
        let (scale, init) = (c.scale(), c.init);
        let out_len = c.b * c.t * c.hv * c.dv;
        let state_dims = c.state_dims();
        let mut gc = GradCase::new(Op::GatedDeltaRuleBackward, &name).tolerance(GRAD_TOL);
        for t in c.inputs(seed(&name)) {
            gc = gc.input(Input::new(t));
        }
        let sd = state_dims.clone();
        cases.extend(
            gc.forward(move |x| flat_forward(x, init, scale as f64))
                .backward_twin(move |x, d| {
                    let out = Array::new(x[2].shape.clone(), d.data[..out_len].to_vec());
                    let ds = Array::new(sd.clone(), d.data[out_len..].to_vec());
                    let mut g = twin::gated_delta_rule_backward(
                        &x[0],
                        &x[1],
                        &x[2],
                        &x[3],
                        &x[4],
                        x.get(5).filter(|_| init),
                        &out,
                        Some(&ds),
                        scale as f64,
                    );
                    if !init {
                        g.pop();
                    }
                    g
                })
                .backward_call(move |b: &B, t, d| {
                    let (d_out, d_state) = split_gradient(b, d, t[2].shape(), &state_dims, out_len)?;
                    let init_state = t.get(5).filter(|_| init);
                    let g = b.gated_delta_rule_backward(
                        &t[0],
                        &t[1],
                        &t[2],
                        &t[3],
                        &t[4],
                        init_state,
                        &d_out,
                        d_state.as_ref(),
                        scale,
                    )?;
                    Ok([g.dq, g.dk, g.dv, g.dg, g.dbeta].into_iter().chain(g.d_initial_state).collect())
                })
                .build(),
        );
    }
    // No gradient into the final state (`d_state: None`).
    let c = Config::new(1, 65, 1, 2, 4, 3, true);
    let name = format!("{} | d_state None", c.name("gated_delta_rule_backward"));
    let x = c.inputs(seed(&name));
    let d_out = Rng::new(seed(&name) ^ 7).normal_ish(vec![c.b, c.t, c.hv, c.dv]);
    cases.push(Case::custom(Op::GatedDeltaRuleBackward, CaseKind::Backward, name, move |b: &B| {
        let up: Vec<Tensor> = x.iter().chain([&d_out]).map(|t| b.upload(t)).collect::<FbResult<_>>().map_err(err)?;
        let g = catch(|| {
            b.gated_delta_rule_backward(&up[0], &up[1], &up[2], &up[3], &up[4], Some(&up[5]), &up[6], None, c.scale())
        })?
        .map_err(err)?;
        let a: Vec<Array> = x.iter().map(Array::from_tensor).collect();
        let want = twin::gated_delta_rule_backward(
            &a[0],
            &a[1],
            &a[2],
            &a[3],
            &a[4],
            Some(&a[5]),
            &Array::from_tensor(&d_out),
            None,
            c.scale() as f64,
        );
        let got = [g.dq, g.dk, g.dv, g.dg, g.dbeta].into_iter().chain(g.d_initial_state);
        let mut n = 0;
        for (i, (t, w)) in got.zip(&want).enumerate() {
            GRAD_TOL.check(&format!("gradient {i}"), &Array::from_tensor(&b.to_host(&t).map_err(err)?), w)?;
            n += 1;
        }
        if n != 6 {
            return Err(format!("{n} gradients, expected 6 (d_initial_state with an initial state)"));
        }
        Ok(())
    }));
    cases
}

/// The flat gradient `[d_out, d_state]` of the finite-difference forward split back into
/// the op's two arguments; a gradient of the wrong size or dtype (the generated bad
/// inputs) goes to the op whole as `d_out`, for the op to refuse.
fn split_gradient<B: ComputeBackend + ?Sized>(
    b: &B,
    d: &Tensor,
    out_shape: &Shape,
    state_dims: &[usize],
    out_len: usize,
) -> FbResult<(Tensor, Option<Tensor>)> {
    let state_len: usize = state_dims.iter().product();
    if d.dtype() != DType::F32 || d.elem_count() != out_len + state_len {
        return Ok((d.clone(), None));
    }
    let h = b.to_host(d)?;
    let v = h.as_slice::<f32>()?;
    let d_out = b.upload(&Tensor::from_slice(&v[..out_len], out_shape.clone())?)?;
    let d_state = b.upload(&Tensor::from_slice(&v[out_len..], state_dims.to_vec())?)?;
    Ok((d_out, Some(d_state)))
}

// ──────────────────────────────── bad input ────────────────────────────────

fn bad_input_cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let t = |dims: &[usize]| Tensor::zeros(dims.to_vec(), DType::F32).expect("shape");
    let bf = |dims: &[usize]| Tensor::zeros(dims.to_vec(), DType::BF16).expect("shape");
    let (q, v, gate) = (t(&[1, 4, 2, 8]), t(&[1, 4, 4, 6]), t(&[1, 4, 4]));
    let mut cases = Vec::new();
    type Fwd = (&'static str, [Tensor; 5], Option<Tensor>, f32);
    let forward: Vec<Fwd> = vec![
        (
            "value heads not a multiple of key heads",
            [t(&[1, 4, 3, 8]), t(&[1, 4, 3, 8]), v.clone(), gate.clone(), gate.clone()],
            None,
            1.0,
        ),
        ("v with another T", [q.clone(), q.clone(), t(&[1, 5, 4, 6]), gate.clone(), gate.clone()], None, 1.0),
        ("v with another B", [q.clone(), q.clone(), t(&[2, 4, 4, 6]), gate.clone(), gate.clone()], None, 1.0),
        ("k unlike q", [q.clone(), t(&[1, 4, 2, 7]), v.clone(), gate.clone(), gate.clone()], None, 1.0),
        ("q of rank 3", [t(&[4, 2, 8]), t(&[4, 2, 8]), v.clone(), gate.clone(), gate.clone()], None, 1.0),
        ("g per key head", [q.clone(), q.clone(), v.clone(), t(&[1, 4, 2]), gate.clone()], None, 1.0),
        ("bf16 q and k", [bf(&[1, 4, 2, 8]), bf(&[1, 4, 2, 8]), v.clone(), gate.clone(), gate.clone()], None, 1.0),
        ("bf16 beta", [q.clone(), q.clone(), v.clone(), gate.clone(), bf(&[1, 4, 4])], None, 1.0),
        (
            "initial state Dk and Dv swapped",
            [q.clone(), q.clone(), v.clone(), gate.clone(), gate.clone()],
            Some(t(&[1, 4, 6, 8])),
            1.0,
        ),
        ("NaN scale", [q.clone(), q.clone(), v.clone(), gate.clone(), gate.clone()], None, f32::NAN),
    ];
    for (what, x, init, scale) in forward {
        let (x2, init2) = (x.clone(), init.clone());
        cases.push(Case::expect_error(Op::GatedDeltaRule, format!("gated_delta_rule {what}"), move |b: &B| {
            b.gated_delta_rule(&x[0], &x[1], &x[2], &x[3], &x[4], init.as_ref(), scale).map(drop)
        }));
        let d_out = t(&[1, 4, 4, 6]);
        cases.push(Case::expect_error(
            Op::GatedDeltaRuleBackward,
            format!("gated_delta_rule_backward {what}"),
            move |b: &B| {
                let x = &x2;
                b.gated_delta_rule_backward(&x[0], &x[1], &x[2], &x[3], &x[4], init2.as_ref(), &d_out, None, scale)
                    .map(drop)
            },
        ));
    }
    let good = [q.clone(), q.clone(), v.clone(), gate.clone(), gate.clone()];
    for (what, d_out, d_state) in [
        ("d_out of another T", t(&[1, 5, 4, 6]), None),
        ("d_state of the wrong shape", t(&[1, 4, 4, 6]), Some(t(&[1, 4, 8, 5]))),
        ("bf16 d_out", bf(&[1, 4, 4, 6]), None),
    ] {
        let x = good.clone();
        cases.push(Case::expect_error(
            Op::GatedDeltaRuleBackward,
            format!("gated_delta_rule_backward {what}"),
            move |b: &B| {
                b.gated_delta_rule_backward(&x[0], &x[1], &x[2], &x[3], &x[4], None, &d_out, d_state.as_ref(), 1.0)
                    .map(drop)
            },
        ));
    }
    // Steps: q, k [B, Hk, Dk] = [2, 2, 8]; v [2, 4, 6]; g, β [2, 4]; states [2, 4, 8, 6].
    let (sq, sv, sg) = (t(&[2, 2, 8]), t(&[2, 4, 6]), t(&[2, 4]));
    type Step = (&'static str, [Tensor; 5], Vec<usize>, bool);
    let steps: Vec<Step> = vec![
        (
            "q with a T axis",
            [t(&[2, 1, 2, 8]), t(&[2, 1, 2, 8]), sv.clone(), sg.clone(), sg.clone()],
            vec![2, 4, 8, 6],
            false,
        ),
        (
            "state of the wrong shape",
            [sq.clone(), sq.clone(), sv.clone(), sg.clone(), sg.clone()],
            vec![2, 4, 6, 8],
            false,
        ),
        (
            "v rows unlike q rows",
            [sq.clone(), sq.clone(), t(&[3, 4, 6]), sg.clone(), sg.clone()],
            vec![2, 4, 8, 6],
            false,
        ),
        (
            "beta of the wrong shape",
            [sq.clone(), sq.clone(), sv.clone(), sg.clone(), t(&[2, 2])],
            vec![2, 4, 8, 6],
            false,
        ),
        (
            "a shared (not writable) state",
            [sq.clone(), sq.clone(), sv.clone(), sg.clone(), sg.clone()],
            vec![2, 4, 8, 6],
            true,
        ),
    ];
    for (what, x, state_dims, shared) in steps {
        let x2 = x.clone();
        let sd = state_dims.clone();
        cases.push(Case::expect_error(
            Op::GatedDeltaRuleStep,
            format!("gated_delta_rule_step {what}"),
            move |b: &B| {
                let mut state = writable(b, &t(&state_dims))?;
                let _keep = shared.then(|| state.clone());
                b.gated_delta_rule_step(&x[0], &x[1], &x[2], &x[3], &x[4], &mut state, 1.0).map(drop)
            },
        ));
        cases.push(Case::expect_error(
            Op::BatchedGatedDeltaRuleStep,
            format!("batched_gated_delta_rule_step {what}"),
            move |b: &B| {
                let mut states = split_rows(b, &t(&sd))?;
                let _keep = shared.then(|| states[0].clone());
                let mut refs: Vec<&mut Tensor> = states.iter_mut().collect();
                b.batched_gated_delta_rule_step(&x2[0], &x2[1], &x2[2], &x2[3], &x2[4], &mut refs, 1.0).map(drop)
            },
        ));
    }
    for (what, n_states) in [("one state fewer than rows", 1usize), ("one state more than rows", 3)] {
        let x = [sq.clone(), sq.clone(), sv.clone(), sg.clone(), sg.clone()];
        cases.push(Case::expect_error(
            Op::BatchedGatedDeltaRuleStep,
            format!("batched_gated_delta_rule_step {what}"),
            move |b: &B| {
                let mut states = split_rows(b, &t(&[n_states, 4, 8, 6]))?;
                let mut refs: Vec<&mut Tensor> = states.iter_mut().collect();
                b.batched_gated_delta_rule_step(&x[0], &x[1], &x[2], &x[3], &x[4], &mut refs, 1.0).map(drop)
            },
        ));
    }
    cases
}
