//! Where every parameter of a [`Arch`] sits in the parameter list: names, shapes and
//! initialisation ([`ParamSpec`]) and the indices the block reads ([`ParamIndex`]).
//!
//! Names are fusebox's own (`h.{l}.attn.q.weight`, ...), the same for every
//! architecture; the loaders map each file's names onto them.

use fusebox::Shape;

use super::arch::{Arch, NormKind, Positions};
use crate::params::{Init, ParamSpec};

/// A norm's weight and (LayerNorm) bias.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NormIndex {
    /// The weight `[n]`.
    pub weight: usize,
    /// The bias `[n]` (LayerNorm).
    pub bias: Option<usize>,
}

/// Projections of one input whose outputs are consecutive parts (q, k, v; gate, up):
/// either one matrix per part, or one stacked matrix whose output is sliced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Proj {
    /// Weights `[out, in]`: one per part, or one stacked `[Σ parts, in]`.
    pub weights: Vec<usize>,
    /// Biases, one per weight, when the projection has them.
    pub biases: Option<Vec<usize>>,
    /// The output width of each part.
    pub parts: Vec<usize>,
}

impl Proj {
    /// Whether the parts are computed by one stacked matrix.
    pub fn stacked(&self) -> bool {
        self.weights.len() == 1 && self.parts.len() > 1
    }
}

/// The MLP of one block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ffn {
    /// Dense projections.
    Dense {
        /// Gated: gate and up `[F, D]`; else the one up (`fc`) projection.
        up: Proj,
        /// Down projection `[D, F]`.
        down: Proj,
    },
    /// A mixture of experts.
    Experts(ExpertIndex),
}

/// Indices of a mixture-of-experts MLP's parameters (E experts of hidden width F).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpertIndex {
    /// The router `[E, D]`.
    pub router: usize,
    /// The router's bias `[E]` (gpt-oss).
    pub router_bias: Option<usize>,
    /// Every expert's gate, up and down biases, `[E, F]`, `[E, F]`, `[E, D]` (gpt-oss).
    pub biases: Option<ExpertBiases>,
    /// Every expert's gate `[E, F, D]`.
    pub gate: usize,
    /// Every expert's up projection `[E, F, D]`.
    pub up: usize,
    /// Every expert's down projection `[E, D, F]`.
    pub down: usize,
    /// The shared expert, when there is one.
    pub shared: Option<SharedExpert>,
}

/// The biases of every expert's projections: row `e` is expert e's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExpertBiases {
    /// Gate biases `[E, F]`.
    pub gate: usize,
    /// Up biases `[E, F]`.
    pub up: usize,
    /// Down biases `[E, D]`.
    pub down: usize,
}

/// A shared expert: a gated MLP of width `Fs` every token uses, scaled by `σ(x·gᵀ)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedExpert {
    /// Gate and up `[Fs, D]` (one matrix each).
    pub up: Proj,
    /// Down `[D, Fs]`.
    pub down: Proj,
    /// The gate's weight `[1, D]`.
    pub gate: usize,
}

/// The parameters of a linear-attention layer's Gated DeltaNet besides its projections
/// (which sit in [`LayerIndex::qkv`] and [`LayerIndex::o`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinearIndex {
    /// The depthwise convolution `[C, K]` over the q, k, v channels.
    pub conv: usize,
    /// `dt_bias` `[Hv]`.
    pub dt_bias: usize,
    /// `a_log` `[Hv]` (the decay rate is `exp(a_log)`).
    pub a_log: usize,
    /// The gated RMS norm's weight `[dv]`, per value head.
    pub norm: usize,
}

/// Indices of one decoder block's parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerIndex {
    /// Norm before attention.
    pub norm1: NormIndex,
    /// q `[Hq·hd, D]` (`[Hq·2·hd, D]` with an output gate), k and v `[Hkv·hd, D]`. In a
    /// linear-attention layer its input projections instead: qkv `[C, D]`, z
    /// `[Hv·dv, D]`, b and a `[Hv, D]`.
    pub qkv: Proj,
    /// Per-head q norm `[hd]` (QK-norm).
    pub q_norm: Option<usize>,
    /// Per-head k norm `[hd]` (QK-norm).
    pub k_norm: Option<usize>,
    /// One sink logit per query head `[Hq]` (gpt-oss).
    pub sinks: Option<usize>,
    /// Attention output projection `[D, Hq·hd]` (a linear layer's `[D, Hv·dv]`).
    pub o: Proj,
    /// A linear-attention layer's other parameters.
    pub linear: Option<LinearIndex>,
    /// Norm of the attention output before the residual add (Gemma).
    pub post_attn_norm: Option<NormIndex>,
    /// Norm before the MLP.
    pub norm2: NormIndex,
    /// The MLP's weights.
    pub ffn: Ffn,
    /// Norm of the MLP output before the residual add (Gemma).
    pub post_mlp_norm: Option<NormIndex>,
}

impl LayerIndex {
    /// Every parameter index of the block.
    pub fn params(&self) -> Vec<usize> {
        let norm = |n: &NormIndex| [Some(n.weight), n.bias];
        let proj = |p: &Proj| p.weights.iter().chain(p.biases.iter().flatten()).copied().collect::<Vec<_>>();
        let mut v: Vec<usize> = norm(&self.norm1).into_iter().flatten().collect();
        v.extend(proj(&self.qkv));
        v.extend([self.q_norm, self.k_norm, self.sinks].into_iter().flatten());
        v.extend(proj(&self.o));
        v.extend(self.linear.iter().flat_map(|x| [x.conv, x.dt_bias, x.a_log, x.norm]));
        v.extend(self.post_attn_norm.iter().flat_map(norm).flatten());
        v.extend(norm(&self.norm2).into_iter().flatten());
        match &self.ffn {
            Ffn::Dense { up, down } => {
                v.extend(proj(up));
                v.extend(proj(down));
            }
            Ffn::Experts(e) => {
                v.extend([Some(e.router), e.router_bias].into_iter().flatten());
                v.extend([e.gate, e.up, e.down]);
                v.extend(e.biases.iter().flat_map(|b| [b.gate, b.up, b.down]));
                if let Some(s) = &e.shared {
                    v.extend(proj(&s.up));
                    v.extend(proj(&s.down));
                    v.push(s.gate);
                }
            }
        }
        v.extend(self.post_mlp_norm.iter().flat_map(norm).flatten());
        v
    }
}

/// Indices of every parameter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamIndex {
    /// Token embedding `[V, D]`.
    pub embed: usize,
    /// Learned position embedding `[context_length, D]`.
    pub pos_embed: Option<usize>,
    /// Per block.
    pub layers: Vec<LayerIndex>,
    /// Final norm.
    pub norm_f: NormIndex,
    /// Untied output head `[V, D]`; `None` when tied to the embedding.
    pub head: Option<usize>,
}

impl ParamIndex {
    /// The output head's index (the embedding when tied).
    pub fn head_weight(&self) -> usize {
        self.head.unwrap_or(self.embed)
    }
}

/// Which groups of projections are one stacked matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Stacking {
    /// q, k, v in one `[Hq·hd + 2·Hkv·hd, D]` matrix (`attn.qkv`).
    pub qkv: bool,
    /// gate and up in one `[2F, D]` matrix (`mlp.gate_up`).
    pub gate_up: bool,
}

/// The parameter specs of `arch` with `stacking(layer)`, and their indices. The order is
/// the checkpoint order: embeddings, per block (norm1, q, k, v, qk-norms, sinks, o,
/// post norm, norm2, MLP, post norm), final norm, head.
pub fn layout(arch: &Arch, stacking: impl Fn(usize) -> Stacking) -> (Vec<ParamSpec>, ParamIndex) {
    let mut specs = Vec::new();
    let mut push = |name: String, shape: Vec<usize>, init: Init, decay: bool| {
        specs.push(ParamSpec { name, shape: Shape::new(shape), init, decay });
        specs.len() - 1
    };
    let (d, f, hd) = (arch.d_model, arch.d_ff, arch.head_dim);
    let (q, kv) = (arch.q_dim(), arch.kv_dim());
    let std = 0.02;
    // Residual projections start smaller so the residual stream's variance stays flat in depth.
    let std_res = 0.02 / (2.0 * arch.n_layers as f32).sqrt();
    let layer_norm = arch.norm == NormKind::LayerNorm;
    let embed = push("wte".into(), vec![arch.vocab_size, d], Init::Normal(std), false);
    let pos_embed = (arch.positions == Positions::Learned)
        .then(|| push("wpe".into(), vec![arch.context_length, d], Init::Normal(0.01), false));
    let mut layers = Vec::with_capacity(arch.n_layers);
    for l in 0..arch.n_layers {
        let p = |s: &str| format!("h.{l}.{s}");
        let norm = |push: &mut dyn FnMut(String, Vec<usize>, Init, bool) -> usize, name: &str| NormIndex {
            weight: push(p(&format!("{name}.weight")), vec![d], Init::Ones, false),
            bias: layer_norm.then(|| push(p(&format!("{name}.bias")), vec![d], Init::Zeros, false)),
        };
        // A projection group: `(name, out)` per part; stacked under `stack_name` when `stack`.
        let proj = |push: &mut dyn FnMut(String, Vec<usize>, Init, bool) -> usize,
                    parts: &[(&str, usize)],
                    stack: Option<&str>,
                    inp: usize,
                    init: f32,
                    bias: bool| {
            let mut weights = Vec::new();
            let mut biases = Vec::new();
            let groups: Vec<(String, usize)> = match stack {
                Some(name) => vec![(name.to_string(), parts.iter().map(|p| p.1).sum())],
                None => parts.iter().map(|(n, o)| (n.to_string(), *o)).collect(),
            };
            for (name, out) in groups {
                weights.push(push(p(&format!("{name}.weight")), vec![out, inp], Init::Normal(init), true));
                if bias {
                    biases.push(push(p(&format!("{name}.bias")), vec![out], Init::Zeros, false));
                }
            }
            Proj { weights, biases: bias.then_some(biases), parts: parts.iter().map(|p| p.1).collect() }
        };
        let stacking = stacking(l);
        let norm1 = norm(&mut push, "norm1");
        let (qkv, q_norm, k_norm, sinks, o, linear) = match (&arch.linear_attention, arch.is_linear(l)) {
            (Some(la), true) => {
                let (c, vw, hv) = (la.conv_channels(), la.value_width(), la.v_heads);
                let parts = [("linear.qkv", c), ("linear.z", vw), ("linear.b", hv), ("linear.a", hv)];
                let qkv = proj(&mut push, &parts, None, d, std, false);
                let o = proj(&mut push, &[("linear.out", d)], None, vw, std_res, false);
                // As PyTorch's Conv1d (U(±1/√K), std 1/√(3K)); dt_bias 1 and a_log 0
                // (decay rate 1) as transformers starts them, but for A_log's random draw.
                let linear = LinearIndex {
                    conv: push(
                        p("linear.conv.weight"),
                        vec![c, la.conv_kernel],
                        Init::Normal((3.0 * la.conv_kernel as f32).sqrt().recip()),
                        false,
                    ),
                    dt_bias: push(p("linear.dt_bias"), vec![hv], Init::Ones, false),
                    a_log: push(p("linear.a_log"), vec![hv], Init::Zeros, false),
                    norm: push(p("linear.norm.weight"), vec![la.v_dim], Init::Ones, false),
                };
                (qkv, None, None, None, o, Some(linear))
            }
            _ => {
                let qkv = proj(
                    &mut push,
                    &[("attn.q", arch.q_proj_width()), ("attn.k", kv), ("attn.v", kv)],
                    stacking.qkv.then_some("attn.qkv"),
                    d,
                    std,
                    arch.bias.qkv,
                );
                let (qn, kn) = if arch.qk_norm_whole { (q, kv) } else { (hd, hd) };
                let q_norm = arch.qk_norm.then(|| push(p("attn.q_norm.weight"), vec![qn], Init::Ones, false));
                let k_norm = arch.qk_norm.then(|| push(p("attn.k_norm.weight"), vec![kn], Init::Ones, false));
                let sinks = arch.attn_sinks.then(|| push(p("attn.sinks"), vec![arch.n_heads], Init::Zeros, false));
                let o = proj(&mut push, &[("attn.o", d)], None, q, std_res, arch.bias.o);
                (qkv, q_norm, k_norm, sinks, o, None)
            }
        };
        let post_attn_norm = arch.post_norms.then(|| norm(&mut push, "post_attn_norm"));
        let norm2 = norm(&mut push, "norm2");
        let ffn = if let Some(moe) = arch.experts_at(l) {
            let (e, fe) = (moe.experts, moe.d_expert);
            let biased = arch.bias.experts;
            let router = push(p("mlp.router.weight"), vec![e, d], Init::Normal(std), true);
            let router_bias = biased.then(|| push(p("mlp.router.bias"), vec![e], Init::Zeros, false));
            let gate = push(p("mlp.experts.gate.weight"), vec![e, fe, d], Init::Normal(std), true);
            let up = push(p("mlp.experts.up.weight"), vec![e, fe, d], Init::Normal(std), true);
            let down = push(p("mlp.experts.down.weight"), vec![e, d, fe], Init::Normal(std_res), true);
            let biases = biased.then(|| ExpertBiases {
                gate: push(p("mlp.experts.gate.bias"), vec![e, fe], Init::Zeros, false),
                up: push(p("mlp.experts.up.bias"), vec![e, fe], Init::Zeros, false),
                down: push(p("mlp.experts.down.bias"), vec![e, d], Init::Zeros, false),
            });
            let shared = moe.d_shared.map(|fs| SharedExpert {
                up: proj(&mut push, &[("mlp.shared.gate", fs), ("mlp.shared.up", fs)], None, d, std, false),
                down: proj(&mut push, &[("mlp.shared.down", d)], None, fs, std_res, false),
                gate: push(p("mlp.shared_gate.weight"), vec![1, d], Init::Normal(std), true),
            });
            Ffn::Experts(ExpertIndex { router, router_bias, biases, gate, up, down, shared })
        } else if arch.mlp.gated() {
            let up = proj(
                &mut push,
                &[("mlp.gate", f), ("mlp.up", f)],
                stacking.gate_up.then_some("mlp.gate_up"),
                d,
                std,
                arch.bias.mlp,
            );
            Ffn::Dense { up, down: proj(&mut push, &[("mlp.down", d)], None, f, std_res, arch.bias.mlp) }
        } else {
            let up = proj(&mut push, &[("mlp.fc", f)], None, d, std, arch.bias.mlp);
            Ffn::Dense { up, down: proj(&mut push, &[("mlp.proj", d)], None, f, std_res, arch.bias.mlp) }
        };
        let post_mlp_norm = arch.post_norms.then(|| norm(&mut push, "post_mlp_norm"));
        layers.push(LayerIndex {
            norm1,
            qkv,
            q_norm,
            k_norm,
            sinks,
            o,
            linear,
            post_attn_norm,
            norm2,
            ffn,
            post_mlp_norm,
        });
    }
    let norm_f = NormIndex {
        weight: push("norm_f.weight".into(), vec![d], Init::Ones, false),
        bias: layer_norm.then(|| push("norm_f.bias".into(), vec![d], Init::Zeros, false)),
    };
    let head = (!arch.tied_embeddings)
        .then(|| push("lm_head.weight".into(), vec![arch.vocab_size, d], Init::Normal(std), true));
    (specs, ParamIndex { embed, pos_embed, layers, norm_f, head })
}

/// The number of parameters of `arch` with `stacking(layer)` if it had `n_layers`
/// blocks, counted from its layout without building more than the blocks it has:
/// block `l` is counted as block `l mod arch.n_layers` (the blocks repeat their
/// pattern of kinds); `None` when `arch` has no block or the count overflows 64 bits.
pub fn param_count(arch: &Arch, stacking: impl Fn(usize) -> Stacking, n_layers: usize) -> Option<u64> {
    let (specs, index) = layout(arch, stacking);
    let elems = |i: usize| specs[i].shape.dims().iter().try_fold(1u64, |n, &d| n.checked_mul(u64::try_from(d).ok()?));
    let per_block = index
        .layers
        .iter()
        .map(|li| li.params().iter().try_fold(0u64, |n, &i| n.checked_add(elems(i)?)))
        .collect::<Option<Vec<u64>>>()?;
    if per_block.is_empty() {
        return None;
    }
    let in_blocks: std::collections::HashSet<usize> = index.layers.iter().flat_map(LayerIndex::params).collect();
    let global = (0..specs.len()).filter(|i| !in_blocks.contains(i)).try_fold(0u64, |n, i| n.checked_add(elems(i)?))?;
    // Block l counts as block l mod len: block i repeats ⌊n/len⌋ times, once more when i < n mod len.
    let len = per_block.len();
    per_block.iter().enumerate().try_fold(global, |n, (i, &count)| {
        let repeats = u64::try_from(n_layers / len + usize::from(i < n_layers % len)).ok()?;
        n.checked_add(count.checked_mul(repeats)?)
    })
}
