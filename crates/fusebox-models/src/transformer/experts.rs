//! The mixture-of-experts MLP, forward and backward side by side, and its
//! load-balancing loss. Per token (rows `x` of `[N, D]`):
//!
//! ```text
//! l = x·Wrᵀ (+ br)                           router logits [N, E]
//! (w, e) = route(l)                          the k chosen experts, their weights [N, k]
//! g_j, u_j = x·Wgate[e_j]ᵀ, x·Wup[e_j]ᵀ      [N, k, F]   (+ bgate[e_j], bup[e_j])
//! y_j = act(g_j, u_j) · Wdown[e_j]ᵀ          [N, k, D]   (+ bdown[e_j])
//! m = Σ_j w_j·y_j                            [N, D]
//! ```
//!
//! The bracketed biases are gpt-oss's; an expert's bias row is gathered per slot
//! (`embedding` of the chosen ids) and its gradient scattered back
//! (`embedding_backward`).
//!
//! Training adds `coef · E · Σ_e f_e·P_e` (transformers' `load_balancing_loss_func`) over
//! every sparse layer's rows together: `f_e` the share of (row, choice) picks that went
//! to expert e, `P_e` the mean router probability `softmax(l)_e`. Only `P` carries a
//! gradient: `∂aux/∂p_{r,e} = coef·E·f_e / rows`, through the softmax into `l`.

use fusebox::{ComputeBackend, Error, MatmulGradients, Result, Routed, Tensor};

use super::checkpointing::SavedLayers;
use super::layout::{ExpertBiases, ExpertIndex};
use super::lora::Group;
use super::mlp::{gated, gated_backward, MlpSaved};
use super::{Sink, Transformer};

/// The shared expert takes no LoRA adapters.
const UNADAPTED: (Group, Group) = (Group::Unadapted, Group::Unadapted);

/// What the experts keep for their backward (the input is the block's saved `norm2`).
#[derive(Debug)]
pub(super) struct ExpertsSaved {
    /// Router logits `[N, E]`.
    pub(super) logits: Tensor,
    /// The chosen experts and their weights `[N, k]`.
    pub(super) routed: Routed,
    /// Each chosen expert's gate and up outputs and the activation, `[N, k, F]`.
    gate: Tensor,
    up: Tensor,
    act: Tensor,
    /// Each chosen expert's output before weighting, `[N, k, D]`.
    y: Tensor,
    /// The load-balancing loss's gradient with respect to the router probabilities and
    /// those probabilities, `[N, E]` each, when training with it.
    pub(super) aux: Option<(Tensor, Tensor)>,
    /// The shared expert's activations, its output `s` `[N, D]` and its gate `σ(x·gᵀ)`
    /// `[N]`, when there is one.
    shared: Option<(MlpSaved, Tensor, Tensor)>,
}

/// `(rows, D)` of `h` `[.., D]`.
fn rows_of(h: &Tensor) -> (usize, usize) {
    let d = h.dims().last().copied().unwrap_or(0);
    (h.dims()[..h.rank().saturating_sub(1)].iter().product(), d)
}

impl Transformer {
    /// The experts of layer `l` on `h` `[.., D]` → `[.., D]`.
    pub(super) fn experts(
        &self,
        b: &dyn ComputeBackend,
        l: usize,
        e: &ExpertIndex,
        h: &Tensor,
    ) -> Result<(Tensor, ExpertsSaved)> {
        let moe =
            self.arch.experts_at(l).ok_or_else(|| Error::value("Transformer::mlp", "layer", "a sparse layer", l))?;
        let (n, d) = rows_of(h);
        let x = h.reshape([n, d])?;
        let logits = self.linear(b, &x, e.router, e.router_bias)?;
        let routed = b.moe_route(&logits, moe.top_k, moe.routing)?;
        let x3 = x.reshape([n, 1, d])?;
        let bias = |t: Tensor, pick: fn(&ExpertBiases) -> usize| match &e.biases {
            Some(bi) => b.add(&t, &b.embedding(&routed.experts, self.p(pick(bi)))?),
            None => Ok(t),
        };
        let gate = b.expert_matmul(&x3, self.p(e.gate), &routed.experts)?;
        let gate = bias(self.expert_lora(b, (l, Group::Up, 0), &x3, &routed.experts, gate)?, |bi| bi.gate)?;
        let up = b.expert_matmul(&x3, self.p(e.up), &routed.experts)?;
        let up = bias(self.expert_lora(b, (l, Group::Up, 1), &x3, &routed.experts, up)?, |bi| bi.up)?;
        let act = gated(b, self.arch.mlp, &gate, &up)?;
        let y = b.expert_matmul(&act, self.p(e.down), &routed.experts)?;
        let y = bias(self.expert_lora(b, (l, Group::Down, 0), &act, &routed.experts, y)?, |bi| bi.down)?;
        // m[r] = Σ_j w[r, j]·y[r, j]: one [1, k]·[k, D] product per row.
        let w = routed.weights.reshape([n, 1, moe.top_k])?;
        let mut m = b.batched_matmul(&w, &y, false, false)?.reshape([n, d])?;
        // m += σ(x·gᵀ)·shared(x)
        let shared = match &e.shared {
            Some(sh) => {
                let (s_out, s_saved) = self.dense_mlp(b, l, &x, (&sh.up, &sh.down), UNADAPTED)?;
                let g = b.sigmoid(&self.linear(b, &x, sh.gate, None)?.reshape([n])?)?;
                m = b.add(&m, &b.mul_col(&s_out, &g)?)?;
                Some((s_saved, s_out, g))
            }
            None => None,
        };
        let m = m.reshape(h.dims().to_vec())?;
        Ok((m, ExpertsSaved { logits, routed, gate, up, act, y, aux: None, shared }))
    }

    /// Backward of [`experts`](Self::experts) at input `h` from `dm`; returns `dh`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn experts_backward(
        &self,
        b: &dyn ComputeBackend,
        l: usize,
        e: &ExpertIndex,
        h: &Tensor,
        s: &ExpertsSaved,
        dm: &Tensor,
        sink: &mut Sink<'_>,
    ) -> Result<Tensor> {
        let moe = self
            .arch
            .experts_at(l)
            .ok_or_else(|| Error::value("Transformer::backward", "layer", "a sparse layer", l))?;
        let (n, d) = rows_of(h);
        let k = moe.top_k;
        let experts = &s.routed.experts;
        let w = s.routed.weights.reshape([n, 1, k])?;
        let MatmulGradients { da: d_w, db: dy } = b.matmul_backward(&w, &s.y, &dm.reshape([n, 1, d])?, false, false)?;
        let x3 = h.reshape([n, 1, d])?;
        // The experts' weight gradients (full training), or their LoRA adapters' (a frozen base).
        let (dx_gate, dx_up) = match &mut *sink {
            Sink::Full(g) => {
                let [down, gate, up] = g.tensors.get_disjoint_mut([e.down, e.gate, e.up]).map_err(|_| {
                    Error::value("Transformer::backward", "expert parameters", "three distinct indices", l)
                })?;
                let d_act = b.expert_matmul_backward(&s.act, self.p(e.down), experts, &dy, Some(down))?;
                let (dg, du) = gated_backward(b, self.arch.mlp, &s.gate, &s.up, &d_act)?;
                let dx = (
                    b.expert_matmul_backward(&x3, self.p(e.gate), experts, &dg, Some(gate))?,
                    b.expert_matmul_backward(&x3, self.p(e.up), experts, &du, Some(up))?,
                );
                if let Some(bi) = &e.biases {
                    // d bias[e] = Σ of the slots that chose e.
                    for (idx, d) in [(bi.down, &dy), (bi.gate, &dg), (bi.up, &du)] {
                        b.add_assign(&mut g.tensors[idx], &b.embedding_backward(experts, d, moe.experts)?)?;
                    }
                }
                dx
            }
            Sink::Lora(_) => {
                let plus_lora = |base: Tensor, lora: Option<Tensor>| match lora {
                    Some(d) => b.add(&base, &d),
                    None => Ok(base),
                };
                let d_act = b.expert_matmul_backward(&s.act, self.p(e.down), experts, &dy, None)?;
                let lora = self.expert_lora_backward(b, (l, Group::Down, 0), &s.act, experts, &dy, sink)?;
                let d_act = plus_lora(d_act, lora)?;
                let (dg, du) = gated_backward(b, self.arch.mlp, &s.gate, &s.up, &d_act)?;
                let dx_gate = b.expert_matmul_backward(&x3, self.p(e.gate), experts, &dg, None)?;
                let lora = self.expert_lora_backward(b, (l, Group::Up, 0), &x3, experts, &dg, sink)?;
                let dx_up = b.expert_matmul_backward(&x3, self.p(e.up), experts, &du, None)?;
                let lora_up = self.expert_lora_backward(b, (l, Group::Up, 1), &x3, experts, &du, sink)?;
                (plus_lora(dx_gate, lora)?, plus_lora(dx_up, lora_up)?)
            }
        };
        let mut d_logits = b.moe_route_backward(&s.logits, experts, &d_w.reshape([n, k])?, moe.routing)?;
        if let Some((d_probs, probs)) = &s.aux {
            d_logits = b.add(&d_logits, &b.softmax_backward(probs, d_probs, 1)?)?;
        }
        let x = h.reshape([n, d])?;
        let dx_router = self.linear_grad(b, sink, &x, (e.router, e.router_bias), &d_logits)?;
        let mut dx = b.add3(&dx_gate.reshape([n, d])?, &dx_up.reshape([n, d])?, &dx_router)?;
        if let (Some(sh), Some((s_saved, s_out, g))) = (&e.shared, &s.shared) {
            // m = σ(z)·s with z = x·gᵀ: ds = dm·σ(z); dσ = Σ_d dm·s; dz = dσ·σ(1 − σ).
            let dm = dm.reshape([n, d])?;
            let ds = b.mul_col(&dm, g)?;
            let d_sig = b.sum(&b.mul(&dm, s_out)?, Some(1))?;
            let one_minus_g = b.add_scalar(&b.mul_scalar(g, -1.0)?, 1.0)?;
            let dz = b.mul(&d_sig, &b.mul(g, &one_minus_g)?)?.reshape([n, 1])?;
            dx = b.add(&dx, &self.linear_grad(b, sink, &x, (sh.gate, None), &dz)?)?;
            let d_shared = self.dense_mlp_backward(b, l, &x, (&sh.up, &sh.down), UNADAPTED, s_saved, &ds, sink)?;
            dx = b.add(&dx, &d_shared)?;
        }
        dx.reshape(h.dims().to_vec())
    }

    /// `y + s·(x·A_eᵀ)·B_eᵀ` per slot with e its expert, when LoRA adapts the expert
    /// projection at `(layer, group, part)`; else `y`.
    fn expert_lora(
        &self,
        b: &dyn ComputeBackend,
        (l, group, part): (usize, Group, usize),
        x: &Tensor,
        experts: &Tensor,
        y: Tensor,
    ) -> Result<Tensor> {
        let Some(ad) = &self.lora else { return Ok(y) };
        let Some(slot) = ad.slot(l, group, part) else { return Ok(y) };
        let u = b.expert_matmul(x, &ad.params.tensors[slot.a], experts)?;
        let delta = b.expert_matmul(&u, &ad.params.tensors[slot.b], experts)?;
        b.add(&y, &b.mul_scalar(&delta, ad.config.scale())?)
    }

    /// Backward of [`expert_lora`](Self::expert_lora) from `dy` into a LoRA sink: with
    /// `u = x·A_eᵀ` and `g = s·dy`, `dB_e += gᵀ·u`, `du = g·B_e`, `dA_e += duᵀ·x`; returns
    /// the adapter's share of `dx` (none without an adapter or a LoRA sink).
    fn expert_lora_backward(
        &self,
        b: &dyn ComputeBackend,
        (l, group, part): (usize, Group, usize),
        x: &Tensor,
        experts: &Tensor,
        dy: &Tensor,
        sink: &mut Sink<'_>,
    ) -> Result<Option<Tensor>> {
        let (Some(ad), Sink::Lora(grads)) = (&self.lora, sink) else { return Ok(None) };
        let Some(slot) = ad.slot(l, group, part) else { return Ok(None) };
        let (a, bm) = (&ad.params.tensors[slot.a], &ad.params.tensors[slot.b]);
        let u = b.expert_matmul(x, a, experts)?;
        let g = b.mul_scalar(dy, ad.config.scale())?;
        let du = b.expert_matmul_backward(&u, bm, experts, &g, Some(&mut grads.tensors[slot.b]))?;
        Ok(Some(b.expert_matmul_backward(x, a, experts, &du, Some(&mut grads.tensors[slot.a]))?))
    }

    /// The load-balancing loss of a training forward's sparse layers (see the module
    /// docs), times its coefficient; stores each layer's share of its gradient (times
    /// `grad_scale`) for the backward. 0 when the model has no such loss.
    pub(super) fn router_aux_loss(
        &self,
        b: &dyn ComputeBackend,
        layers: &mut SavedLayers,
        grad_scale: f32,
    ) -> Result<f32> {
        let Some(moe) = self.arch.moe.as_ref().filter(|m| m.aux_loss_coef > 0.0) else { return Ok(0.0) };
        let n_experts = moe.experts;
        let (mut picks, mut prob_sums, mut rows) = (vec![0f64; n_experts], vec![0f64; n_experts], 0usize);
        let mut probs = Vec::new();
        let mut routers = layers.routers_mut();
        for s in &routers {
            let p = b.softmax(s.logits, 1)?;
            let host = b.to_host(&p)?.to_vec_f32()?;
            for row in host.chunks_exact(n_experts) {
                for (sum, &v) in prob_sums.iter_mut().zip(row) {
                    *sum += f64::from(v);
                }
            }
            for &ex in b.to_host(s.experts)?.as_slice::<u32>()? {
                picks[ex as usize] += 1.0;
            }
            rows += host.len() / n_experts;
            probs.push(p);
        }
        if rows == 0 {
            return Ok(0.0);
        }
        let total = rows as f64;
        let e = n_experts as f64;
        let aux: f64 = e * picks.iter().zip(&prob_sums).map(|(f, p)| (f / total) * (p / total)).sum::<f64>();
        // ∂(coef·aux)/∂p_{r,e} = coef·E·f_e/rows, the same for every row.
        let coef = f64::from(moe.aux_loss_coef);
        let per_expert: Vec<f32> =
            picks.iter().map(|f| (coef * e * (f / total) / total * f64::from(grad_scale)) as f32).collect();
        let mut probs = probs.into_iter();
        for s in &mut routers {
            let p =
                probs.next().ok_or_else(|| Error::value("Transformer::loss", "sparse layers", "a stable count", 0))?;
            let n = p.dims()[0];
            let d_probs: Vec<f32> = (0..n).flat_map(|_| per_expert.iter().copied()).collect();
            *s.aux = Some((b.upload(&Tensor::from_vec(d_probs, [n, n_experts])?)?, p));
        }
        Ok((coef * aux) as f32)
    }
}
