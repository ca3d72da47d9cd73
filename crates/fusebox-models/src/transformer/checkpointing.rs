//! What a training forward keeps of each block for the backward, and activation
//! checkpointing: keeping only each block's input and recomputing the block in the
//! backward.
//!
//! | [`Activations`] | the forward keeps per block | the backward, block `l` (last to first) |
//! |---|---|---|
//! | `Saved` | every activation the backward reads | reads them |
//! | `Recomputed` | its input `x` `[B, T, D]` and `norm1(x)` (output and statistics) | runs block `l`'s forward again from them, then its backward |
//!
//! Peak activation memory with `Recomputed` is the block inputs (`2·D + 1` floats per
//! token and layer) plus one block's saved activations, against every block's with
//! `Saved`, at the price of one more forward of the blocks (not of the head).
//!
//! The gradients are bit-identical to the saved run's: the recompute calls the same
//! [`block`](Transformer::block) with the same tensors (the input and the `norm1` output
//! the first forward computed, not a norm computed again, which the first forward fused
//! with the previous block's residual add), on the same backend with the same threads,
//! so every kernel sees the same operands in the same order and writes the same bits.
//! A mixture of experts' load-balancing loss needs every sparse layer's routing before
//! the backward starts; those layers keep their router logits and choices (`[N, E]` and
//! `[N, k]`), and the recompute takes the loss's gradient from them.
//!
//! Evaluation keeps nothing (`Keep::Nothing`): its forward frees each block's
//! activations as soon as the block is done.

use fusebox::{ComputeBackend, Error, NormOutput, Result, Tensor};

use super::arch::{Arch, NormKind};
use super::block::LayerSaved;
use super::cache::RopeTables;
use super::mlp::MlpSaved;
use super::pass::Pass;
use super::Transformer;

/// What a training forward keeps for the backward (PyTorch's activation, or gradient,
/// checkpointing is [`Activations::Recomputed`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Activations {
    /// Every block's activations, saved in the forward (the fastest).
    #[default]
    Saved,
    /// Each block's input only; the backward recomputes the block's forward from it
    /// (about one more forward of the blocks per step; the same gradients, bit for bit).
    Recomputed,
}

/// What a forward keeps (the training modes of [`Activations`], and evaluation's nothing).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Keep {
    /// Every block's activations.
    All,
    /// Each block's input and `norm1` of it.
    Inputs,
    /// Nothing: a forward for its output only.
    Nothing,
}

impl From<Activations> for Keep {
    fn from(a: Activations) -> Keep {
        match a {
            Activations::Saved => Keep::All,
            Activations::Recomputed => Keep::Inputs,
        }
    }
}

/// A sparse layer's routing, kept for the load-balancing loss: the router logits `[N, E]`,
/// the chosen experts `[N, k]`, and the loss's gradient with respect to the router
/// probabilities with those probabilities (set by the loss; see `experts.rs`).
#[derive(Debug)]
pub(super) struct Routing {
    logits: Tensor,
    experts: Tensor,
    aux: Option<(Tensor, Tensor)>,
}

/// What a checkpointed forward keeps of one block.
#[derive(Debug)]
pub(super) struct BlockInput {
    /// The block input `[B, T, D]`.
    x: Tensor,
    /// `norm1(x)` as the forward computed it (output and statistics).
    norm1: NormOutput,
    /// A sparse layer's routing.
    routing: Option<Routing>,
}

/// One sparse layer's routing as the load-balancing loss reads it, and where the loss
/// puts its gradient (`(∂loss/∂probabilities, probabilities)`).
pub(super) struct RouterSlot<'a> {
    pub(super) logits: &'a Tensor,
    pub(super) experts: &'a Tensor,
    pub(super) aux: &'a mut Option<(Tensor, Tensor)>,
}

/// What a training forward has kept of its blocks, in layer order.
#[derive(Debug)]
pub(super) enum SavedLayers {
    /// Every block's activations.
    All(Vec<LayerSaved>),
    /// Each block's input (activation checkpointing).
    Inputs(Vec<BlockInput>),
    /// Nothing (evaluation).
    Nothing,
}

impl SavedLayers {
    /// An empty record for `layers` blocks kept as `keep` says.
    pub(super) fn new(keep: Keep, layers: usize) -> SavedLayers {
        match keep {
            Keep::All => SavedLayers::All(Vec::with_capacity(layers)),
            Keep::Inputs => SavedLayers::Inputs(Vec::with_capacity(layers)),
            Keep::Nothing => SavedLayers::Nothing,
        }
    }

    /// Records the next block's activations: all of them, its input only (the rest freed
    /// here), or nothing.
    pub(super) fn push(&mut self, saved: LayerSaved) {
        match self {
            SavedLayers::All(v) => v.push(saved),
            SavedLayers::Inputs(v) => {
                let LayerSaved { x_in, norm1, mlp, .. } = saved;
                let routing = match mlp {
                    MlpSaved::Experts(e) => Some(Routing { logits: e.logits, experts: e.routed.experts, aux: None }),
                    MlpSaved::Dense { .. } => None,
                };
                v.push(BlockInput { x: x_in, norm1, routing });
            }
            SavedLayers::Nothing => {}
        }
    }

    /// Every sparse layer's routing, in layer order.
    pub(super) fn routers_mut(&mut self) -> Vec<RouterSlot<'_>> {
        match self {
            SavedLayers::All(v) => v
                .iter_mut()
                .filter_map(|s| match &mut s.mlp {
                    MlpSaved::Experts(e) => {
                        Some(RouterSlot { logits: &e.logits, experts: &e.routed.experts, aux: &mut e.aux })
                    }
                    MlpSaved::Dense { .. } => None,
                })
                .collect(),
            SavedLayers::Inputs(v) => v
                .iter_mut()
                .filter_map(|i| i.routing.as_mut())
                .map(|r| RouterSlot { logits: &r.logits, experts: &r.experts, aux: &mut r.aux })
                .collect(),
            SavedLayers::Nothing => Vec::new(),
        }
    }

    /// The last block not yet handed out, `(l, its activations)`: as saved, or recomputed
    /// from its input; `None` when every block has been.
    pub(super) fn pop(
        &mut self,
        net: &Transformer,
        b: &dyn ComputeBackend,
        rope: &RopeTables,
    ) -> Option<Result<(usize, LayerSaved)>> {
        match self {
            SavedLayers::All(v) => v.pop().map(|s| Ok((v.len(), s))),
            SavedLayers::Inputs(v) => v.pop().map(|input| Ok((v.len(), net.recompute_block(b, v.len(), input, rope)?))),
            SavedLayers::Nothing => None,
        }
    }
}

impl Transformer {
    /// Logits `[B·T, V]` of `ids` `[B, T]` by the training forward, keeping nothing for a
    /// backward: each block's activations are freed as soon as the block is done
    /// (evaluation).
    pub fn forward_logits(&self, b: &dyn ComputeBackend, ids: &Tensor) -> Result<Tensor> {
        let cache = self.forward_trunk(b, ids, Keep::Nothing)?;
        let h = cache.norm_f.output.reshape([cache.batch * cache.seq, self.arch.d_model])?;
        self.linear(b, &h, self.index.head_weight(), None)
    }

    /// Block `l`'s activations, recomputed from its kept input by the training forward's
    /// own [`block`](Self::block) (its output is not needed and is dropped).
    fn recompute_block(
        &self,
        b: &dyn ComputeBackend,
        l: usize,
        input: BlockInput,
        rope: &RopeTables,
    ) -> Result<LayerSaved> {
        const OP: &str = "Transformer::backward";
        let BlockInput { x, norm1, routing } = input;
        let mut saved = SavedLayers::new(Keep::All, 1);
        self.block(b, l, x, norm1, &mut Pass::Train { rope, saved: &mut saved })?;
        let recomputed = match saved {
            SavedLayers::All(mut v) => v.pop(),
            _ => None,
        };
        let mut s = recomputed.ok_or_else(|| Error::value(OP, "recomputed block", "its activations", "none"))?;
        // The load-balancing loss's gradient, computed from the first forward's routing
        // (which the recompute reproduced).
        if let (MlpSaved::Experts(e), Some(r)) = (&mut s.mlp, routing) {
            e.aux = r.aux;
        }
        Ok(s)
    }
}

/// Floats layer `l`'s training forward saves per token (what its backward reads), by
/// the sublayers' `*Saved` records; `None` on overflow.
fn saved_floats_per_token(arch: &Arch, l: usize) -> Option<u64> {
    let u = |x: usize| u64::try_from(x).ok();
    let sum = |xs: &[Option<u64>]| xs.iter().try_fold(0u64, |acc, x| acc.checked_add((*x)?));
    let d = u(arch.d_model)?;
    // A norm's output and statistics (rstd; and the mean for a LayerNorm).
    let stats = if arch.norm == NormKind::LayerNorm { 2 } else { 1 };
    let norm_out = d.checked_add(stats)?;
    // x_in, norm1, x_mid, norm2; each post-norm keeps its input and output.
    let post = if arch.post_norms { 2 * d.checked_add(norm_out)? } else { 0 };
    let block = sum(&[Some(2 * d), Some(2 * norm_out), Some(post)])?;
    let mixer = if arch.is_linear(l) {
        let la = arch.linear_attention.as_ref()?;
        let (c, kw, vw) = (u(la.conv_channels())?, u(la.key_width())?, u(la.value_width())?);
        let (hk, hv) = (u(la.k_heads)?, u(la.v_heads)?);
        // The convolution's input and output; q, k before and after their L2 norms (with
        // the norms' statistics); a, b, g, β per value head; the rule's output, z and the
        // gated norm's output.
        sum(&[c.checked_mul(2), kw.checked_mul(4), hk.checked_mul(2), hv.checked_mul(4), vw.checked_mul(3)])?
    } else {
        let (q, kv, hq, hkv) = (u(arch.q_dim())?, u(arch.kv_dim())?, u(arch.n_heads)?, u(arch.n_kv_heads)?);
        // q, k before their QK-norms and the norms' outputs with statistics.
        let qk_norm = if arch.qk_norm { sum(&[q.checked_mul(2), kv.checked_mul(2), Some(hq), Some(hkv)])? } else { 0 };
        // The gate before its sigmoid and the attention output it multiplies.
        let gate = if arch.attn_output_gate { q.checked_mul(2)? } else { 0 };
        // q, k, v after rope; the attention output and logsumexp; the merged heads.
        sum(&[Some(qk_norm), Some(gate), q.checked_mul(3), kv.checked_mul(2), Some(hq)])?
    };
    let mlp = match arch.experts_at(l) {
        Some(moe) => {
            let (e, k, f) = (u(moe.experts)?, u(moe.top_k)?, u(moe.d_expert)?);
            // Router logits (and the load-balancing loss's probabilities and gradient),
            // the choices and weights, each chosen expert's gate, up, activation and output.
            let shared = moe.d_shared.map_or(Some(0), |s| sum(&[u(s)?.checked_mul(3), Some(d), Some(1)]))?;
            sum(&[
                e.checked_mul(3),
                k.checked_mul(2),
                k.checked_mul(f)?.checked_mul(3),
                k.checked_mul(d),
                Some(shared),
            ])?
        }
        // The up projections' outputs (one, or gate and up) and the activation.
        None => u(arch.d_ff)?.checked_mul(if arch.mlp.gated() { 3 } else { 2 })?,
    };
    sum(&[Some(block), Some(mixer), Some(mlp)])
}

/// Bytes (f32) a training forward of `tokens` tokens (batch × sequence) keeps for its
/// backward, estimated from the sublayers' saved records: every block's activations
/// (`Saved`), or each block's input and `norm1` of it plus the one block the backward
/// recomputes at a time (`Recomputed`). The logits and their gradient (`tokens × V`
/// each) are not included. `None` on overflow.
pub fn activation_bytes(arch: &Arch, tokens: usize, activations: Activations) -> Option<u64> {
    let per_layer = (0..arch.n_layers).map(|l| saved_floats_per_token(arch, l)).collect::<Option<Vec<u64>>>()?;
    let floats_per_token = match activations {
        Activations::Saved => per_layer.iter().try_fold(0u64, |acc, &x| acc.checked_add(x))?,
        Activations::Recomputed => {
            let stats = if arch.norm == NormKind::LayerNorm { 2 } else { 1 };
            let input = u64::try_from(arch.d_model).ok()?.checked_mul(2)?.checked_add(stats)?;
            // A sparse layer also keeps its router logits, choices and weights.
            let routing = arch.moe.as_ref().map_or(Some(0), |m| {
                u64::try_from(m.experts.checked_mul(3)?.checked_add(m.top_k.checked_mul(2)?)?).ok()
            })?;
            let sparse = u64::try_from((0..arch.n_layers).filter(|&l| arch.experts_at(l).is_some()).count()).ok()?;
            let kept =
                u64::try_from(arch.n_layers).ok()?.checked_mul(input)?.checked_add(sparse.checked_mul(routing)?)?;
            kept.checked_add(per_layer.iter().copied().max().unwrap_or(0))?
        }
    };
    u64::try_from(tokens).ok()?.checked_mul(floats_per_token)?.checked_mul(4)
}

#[cfg(test)]
mod tests {
    use fusebox::{ComputeBackend, CpuBackend, Tensor};

    use super::{activation_bytes, Activations, Keep, SavedLayers};
    use crate::config::{ModelConfig, Style};
    use crate::model::arch_of;
    use crate::params::ParamSet;
    use crate::rng::Rng;
    use crate::train::{Task, TrainConfig, Trainer};
    use crate::transformer::{Adapters, LoraConfig, LossOptions, NotListening, Transformer};

    fn bits(set: &ParamSet) -> Vec<Vec<u32>> {
        set.tensors.iter().map(|t| t.to_vec_f32().unwrap().iter().map(|x| x.to_bits()).collect()).collect()
    }

    /// Three optimizer steps (two micro-batches each, two threads) of every preset
    /// architecture — GPT-2, Llama, Qwen3, a mixture of experts with its load-balancing
    /// loss, Gemma 3's post-norms, gpt-oss's sinks, Qwen3.5's linear-attention layers —
    /// with and without checkpointing: the same losses, gradient norms and parameters,
    /// bit for bit.
    #[test]
    fn checkpointed_training_is_bit_identical_for_every_architecture() {
        let b = CpuBackend::with_threads(2).unwrap();
        for style in Style::ALL {
            let run = |checkpoint_activations| {
                let config = TrainConfig {
                    steps: 3,
                    batch: 2,
                    accumulation: 2,
                    seq_len: 12,
                    lr: 1e-2,
                    warmup: 1,
                    eval_every: 0,
                    checkpoint_activations,
                    ..TrainConfig::default()
                };
                let model = ModelConfig { n_layers: 4, ..ModelConfig::tiny(style, 64, 16) };
                let mut t = Trainer::scratch(&b, model, config, Task::Random { vocab_size: 64 }).unwrap();
                let steps: Vec<(u32, u32)> = (0..3)
                    .map(|_| {
                        let s = t.train_step(&b).unwrap();
                        (s.loss.to_bits(), s.grad_norm.to_bits())
                    })
                    .collect();
                (steps, bits(&t.model.net.params))
            };
            let (saved, recomputed) = (run(false), run(true));
            assert!(saved.0.iter().all(|&(l, _)| f32::from_bits(l).is_finite()), "{}", style.name());
            assert!(saved == recomputed, "{}: {:?} vs {:?}", style.name(), saved.0, recomputed.0);
        }
    }

    /// The checkpointed forward keeps each block's input only, and evaluation nothing.
    #[test]
    fn the_forward_keeps_what_its_mode_says() {
        let b = CpuBackend::with_threads(1).unwrap();
        let net = Transformer::new(&b, arch_of(&ModelConfig::tiny(Style::Llama, 64, 16)), 1).unwrap();
        let ids = Tensor::from_vec((0..12u32).collect(), [2, 6]).unwrap();
        for (keep, want) in [(Keep::All, "All"), (Keep::Inputs, "Inputs"), (Keep::Nothing, "Nothing")] {
            let cache = net.forward_trunk(&b, &ids, keep).unwrap();
            let (kind, len) = match &cache.layers {
                SavedLayers::All(v) => ("All", v.len()),
                SavedLayers::Inputs(v) => ("Inputs", v.len()),
                SavedLayers::Nothing => ("Nothing", 0),
            };
            assert_eq!(kind, want);
            assert_eq!(len, if keep == Keep::Nothing { 0 } else { net.arch.n_layers });
        }
        let logits = net.forward_logits(&b, &ids).unwrap().to_vec_f32().unwrap();
        let (full, _) = net.forward(&b, &ids).unwrap();
        assert_eq!(logits, full.to_vec_f32().unwrap());
    }

    /// LoRA over a frozen base and full training, each on dense targets and on chat-like
    /// targets (the counted-rows head): the checkpointed gradients equal the saved ones
    /// bit for bit.
    #[test]
    fn checkpointed_gradients_match_for_lora_and_counted_rows() {
        let b = CpuBackend::with_threads(2).unwrap();
        for lora in [false, true] {
            let arch = arch_of(&ModelConfig { n_layers: 3, ..ModelConfig::tiny(Style::Llama, 64, 16) });
            let mut net = Transformer::new(&b, arch, 5).unwrap();
            if lora {
                let mut ad = Adapters::init(&b, &net.arch, LoraConfig::new(2), 4).unwrap();
                let mut rng = Rng::new(5);
                for i in 0..ad.sites().len() {
                    let t = &mut ad.params.tensors[2 * i + 1];
                    let v = rng.uniform_vec(t.elem_count(), -0.3, 0.3);
                    b.copy_into(t, &Tensor::from_vec(v, t.shape().clone()).unwrap()).unwrap();
                }
                net.attach_lora(ad).unwrap();
            }
            let specs = net.lora.as_ref().map_or(&net.specs, |a| &a.specs).clone();
            let (bsz, t) = (2, 8);
            let ids = Tensor::from_vec((0..(bsz * t) as u32).map(|i| (i * 7 + 3) % 64).collect(), [bsz, t]).unwrap();
            const IGNORE: u32 = u32::MAX;
            for sparse in [false, true] {
                let targets: Vec<u32> = (0..(bsz * t) as u32)
                    .map(|i| if sparse && i % 4 != 3 { IGNORE } else { (i * 5 + 1) % 64 })
                    .collect();
                let targets = Tensor::from_vec(targets, [bsz, t]).unwrap();
                let run = |activations| {
                    let mut grads = ParamSet::zeros(&b, &specs).unwrap();
                    let opts = LossOptions { ignore: Some(IGNORE), grad_scale: 0.5, activations };
                    let loss =
                        net.train_loss_and_grads(&b, &ids, &targets, opts, &mut grads, &mut NotListening).unwrap();
                    (loss.to_bits(), bits(&grads))
                };
                let saved = run(Activations::Saved);
                assert!(saved.1.iter().flatten().any(|&x| x != 0), "lora {lora} sparse {sparse}: zero gradients");
                assert!(saved == run(Activations::Recomputed), "lora {lora} sparse {sparse}");
            }
        }
    }

    /// Checkpointing keeps a fraction of the activations of a deep model (SmolLM2-135M's
    /// shape: 30 layers of width 576), and the same for one layer plus its input.
    #[test]
    fn the_estimate_shrinks_with_depth() {
        let cfg = ModelConfig {
            n_layers: 30,
            d_model: 576,
            n_heads: 9,
            n_kv_heads: 3,
            d_ff: 1536,
            ..ModelConfig::tiny(Style::Llama, 49152, 1024)
        };
        let arch = arch_of(&cfg);
        let saved = activation_bytes(&arch, 1024, Activations::Saved).unwrap();
        let kept = activation_bytes(&arch, 1024, Activations::Recomputed).unwrap();
        assert!(kept * 5 < saved, "{kept} of {saved}");
        let one = arch_of(&ModelConfig { n_layers: 1, ..cfg });
        let one_layer = activation_bytes(&one, 1024, Activations::Saved).unwrap();
        assert_eq!(kept, one_layer + 30 * 1024 * (2 * 576 + 1) * 4);
        assert_eq!(activation_bytes(&arch, usize::MAX, Activations::Saved), None);
    }
}
