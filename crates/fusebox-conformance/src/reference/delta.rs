//! The gated delta rule, token by token (the recurrence itself, no chunks), and its
//! backward by reverse mode through the same loop.
//!
//! Per sequence b and value head h (key head `h / (Hv/Hk)`), S (`Dk × Dv`) starts at the
//! initial state (or zeros) and for each token t:
//! `S ← e^{g_t}·S; u = Sᵀk_t; S ← S + k_t·(β_t(v_t − u))ᵀ; o_t = Sᵀ(scale·q_t)`.
//! Layouts: q, k `[B, T, Hk, Dk]`; v, out `[B, T, Hv, Dv]`; g, β `[B, T, Hv]`; states
//! `[B, Hv, Dk, Dv]`.

use crate::array::Array;

/// Sizes read from the inputs.
#[derive(Debug, Clone, Copy)]
struct Dims {
    b: usize,
    t: usize,
    hk: usize,
    hv: usize,
    dk: usize,
    dv: usize,
}

impl Dims {
    fn of(q: &Array, v: &Array) -> Dims {
        Dims { b: q.shape[0], t: q.shape[1], hk: q.shape[2], dk: q.shape[3], hv: v.shape[2], dv: v.shape[3] }
    }
    fn qk(&self, b: usize, t: usize, h: usize, i: usize) -> usize {
        ((b * self.t + t) * self.hk + h / (self.hv / self.hk)) * self.dk + i
    }
    fn v(&self, b: usize, t: usize, h: usize, j: usize) -> usize {
        ((b * self.t + t) * self.hv + h) * self.dv + j
    }
    fn gate(&self, b: usize, t: usize, h: usize) -> usize {
        (b * self.t + t) * self.hv + h
    }
    fn state(&self, b: usize, h: usize) -> usize {
        (b * self.hv + h) * self.dk * self.dv
    }
    fn state_shape(&self) -> Vec<usize> {
        vec![self.b, self.hv, self.dk, self.dv]
    }
}

/// One token's update of one head's state `s` (`[Dk, Dv]` row-major): decays it, returns
/// `u = Sᵀk` (after the decay) and δ, and writes `S + k·δᵀ` back.
fn update(s: &mut [f64], dk: usize, dv: usize, k: &[f64], v: &[f64], g: f64, beta: f64) -> (Vec<f64>, Vec<f64>) {
    s.iter_mut().for_each(|x| *x *= g.exp());
    let u: Vec<f64> = (0..dv).map(|j| (0..dk).map(|i| s[i * dv + j] * k[i]).sum()).collect();
    let delta: Vec<f64> = (0..dv).map(|j| beta * (v[j] - u[j])).collect();
    for i in 0..dk {
        for j in 0..dv {
            s[i * dv + j] += k[i] * delta[j];
        }
    }
    (u, delta)
}

fn row(a: &Array, at: usize, n: usize) -> Vec<f64> {
    a.data[at..at + n].to_vec()
}

/// `(out, final state)` of the gated delta rule.
pub fn gated_delta_rule(
    q: &Array,
    k: &Array,
    v: &Array,
    g: &Array,
    beta: &Array,
    initial_state: Option<&Array>,
    scale: f64,
) -> (Array, Array) {
    let d = Dims::of(q, v);
    let mut out = Array::zeros(v.shape.clone());
    let mut states = initial_state.cloned().unwrap_or_else(|| Array::zeros(d.state_shape()));
    for b in 0..d.b {
        for h in 0..d.hv {
            let s = &mut states.data[d.state(b, h)..d.state(b, h) + d.dk * d.dv];
            for t in 0..d.t {
                let (kt, vt) = (row(k, d.qk(b, t, h, 0), d.dk), row(v, d.v(b, t, h, 0), d.dv));
                update(s, d.dk, d.dv, &kt, &vt, g.data[d.gate(b, t, h)], beta.data[d.gate(b, t, h)]);
                for j in 0..d.dv {
                    out.data[d.v(b, t, h, j)] =
                        (0..d.dk).map(|i| s[i * d.dv + j] * scale * q.data[d.qk(b, t, h, i)]).sum();
                }
            }
        }
    }
    (out, states)
}

/// `(out, new state)` of one decode step: q, k `[B, Hk, Dk]`, v `[B, Hv, Dv]`, g, β
/// `[B, Hv]`, state `[B, Hv, Dk, Dv]` — the sequence form with T = 1.
pub fn gated_delta_rule_step(
    q: &Array,
    k: &Array,
    v: &Array,
    g: &Array,
    beta: &Array,
    state: &Array,
    scale: f64,
) -> (Array, Array) {
    let with_t = |a: &Array| {
        let mut s = a.shape.clone();
        s.insert(1, 1);
        a.reshaped(s)
    };
    let (out, state) =
        gated_delta_rule(&with_t(q), &with_t(k), &with_t(v), &with_t(g), &with_t(beta), Some(state), scale);
    (out.reshaped(v.shape.clone()), state)
}

/// Gradients of `gated_delta_rule`: `[dq, dk, dv, dg, dβ, d_initial_state]` from the
/// output gradient and the final state's (`None`: zero). The last is the gradient of the
/// initial state (of the zeros when there was none).
///
/// Reverse mode, per head, from t = T−1 down, with `A = e^{g_t}·S_{t−1}` and
/// `S_t = A + k·δᵀ`: `dS += (scale·q)·doᵀ`, `dq = scale·S_t·do`; `dδ = dSᵀk`,
/// `dk += dS·δ`; `dv = β·dδ`, `dβ = dδ·(v − u)`, `du = −β·dδ`; `dA = dS + k·duᵀ`,
/// `dk += A·du`; `dg = ⟨dA, A⟩`, `dS_{t−1} = e^{g_t}·dA`.
#[allow(clippy::too_many_arguments)]
pub fn gated_delta_rule_backward(
    q: &Array,
    k: &Array,
    v: &Array,
    g: &Array,
    beta: &Array,
    initial_state: Option<&Array>,
    d_out: &Array,
    d_state: Option<&Array>,
    scale: f64,
) -> Vec<Array> {
    let d = Dims::of(q, v);
    let (n, dk, dv) = (d.dk * d.dv, d.dk, d.dv);
    let mut dq = Array::zeros(q.shape.clone());
    let mut dkk = Array::zeros(k.shape.clone());
    let mut dvv = Array::zeros(v.shape.clone());
    let mut dg = Array::zeros(g.shape.clone());
    let mut dbeta = Array::zeros(beta.shape.clone());
    let mut d_init = d_state.cloned().unwrap_or_else(|| Array::zeros(d.state_shape()));
    for b in 0..d.b {
        for h in 0..d.hv {
            // Forward, keeping every state: before[t] = S_{t−1}, after[t] = S_t, and u, δ.
            let mut s: Vec<f64> = match initial_state {
                Some(init) => init.data[d.state(b, h)..d.state(b, h) + n].to_vec(),
                None => vec![0.0; n],
            };
            let (mut before, mut after, mut us, mut deltas) = (vec![], vec![], vec![], vec![]);
            for t in 0..d.t {
                before.push(s.clone());
                let (kt, vt) = (row(k, d.qk(b, t, h, 0), dk), row(v, d.v(b, t, h, 0), dv));
                let (u, delta) = update(&mut s, dk, dv, &kt, &vt, g.data[d.gate(b, t, h)], beta.data[d.gate(b, t, h)]);
                after.push(s.clone());
                us.push(u);
                deltas.push(delta);
            }
            let ds = &mut d_init.data[d.state(b, h)..d.state(b, h) + n];
            for t in (0..d.t).rev() {
                let (kt, vt) = (row(k, d.qk(b, t, h, 0), dk), row(v, d.v(b, t, h, 0), dv));
                let dot = row(d_out, d.v(b, t, h, 0), dv);
                let (gt, bt) = (g.data[d.gate(b, t, h)], beta.data[d.gate(b, t, h)]);
                let st = &after[t];
                for i in 0..dk {
                    let qi = scale * q.data[d.qk(b, t, h, i)];
                    let mut acc = 0.0;
                    for j in 0..dv {
                        ds[i * dv + j] += qi * dot[j];
                        acc += st[i * dv + j] * dot[j];
                    }
                    dq.data[d.qk(b, t, h, i)] += scale * acc;
                }
                let ddelta: Vec<f64> = (0..dv).map(|j| (0..dk).map(|i| ds[i * dv + j] * kt[i]).sum()).collect();
                for i in 0..dk {
                    dkk.data[d.qk(b, t, h, i)] += (0..dv).map(|j| ds[i * dv + j] * deltas[t][j]).sum::<f64>();
                }
                let mut du = vec![0.0; dv];
                for j in 0..dv {
                    dvv.data[d.v(b, t, h, j)] = bt * ddelta[j];
                    dbeta.data[d.gate(b, t, h)] += ddelta[j] * (vt[j] - us[t][j]);
                    du[j] = -bt * ddelta[j];
                }
                let a: Vec<f64> = before[t].iter().map(|x| x * gt.exp()).collect();
                for i in 0..dk {
                    dkk.data[d.qk(b, t, h, i)] += (0..dv).map(|j| a[i * dv + j] * du[j]).sum::<f64>();
                    for j in 0..dv {
                        ds[i * dv + j] += kt[i] * du[j];
                    }
                }
                dg.data[d.gate(b, t, h)] = ds.iter().zip(&a).map(|(x, y)| x * y).sum();
                ds.iter_mut().for_each(|x| *x *= gt.exp());
            }
        }
    }
    vec![dq, dkk, dvv, dg, dbeta, d_init]
}
