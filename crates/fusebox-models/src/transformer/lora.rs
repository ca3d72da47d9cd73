//! LoRA adapters (Hu et al. 2021) over a frozen [`Transformer`](super::Transformer):
//! each adapted projection computes `y = x·Wᵀ + s·(x·Aᵀ)·Bᵀ` with `A` `[r, in]`, `B`
//! `[out, r]` and `s = α / r`. As in PEFT, `A` starts Kaiming-uniform
//! (`U(−1/√in, 1/√in)`, PyTorch's `kaiming_uniform_(a = √5)`) and `B` at zero, so the
//! adapted model equals the base exactly before the first step.
//!
//! Adapters are per logical projection (q, k, v, o, gate, up, down) also where the
//! base stacks q/k/v or gate/up into one matrix: the stacked output is sliced into its
//! parts and each part gets its own `B·A`. In a mixture of experts' layers the MLP
//! targets adapt every routed expert with its own `B_e·A_e` (stacked `[E, r, in]`,
//! `[E, out, r]`, applied with `expert_matmul` like the experts); a shared expert is not
//! adapted.
//!
//! In a Gated DeltaNet layer (Qwen3.5, Qwen3-Next) the attention targets have no
//! projection; its own are `in_qkv`, `in_z`, `in_b`, `in_a` (the input projections,
//! transformers' `in_proj_qkv`, …, parts of Qwen3-Next's fused `in_proj_qkvz` /
//! `in_proj_ba`) and `out` (`out_proj`). A target applies in the layers that have it, and
//! one that no layer of the model has is refused.

use fusebox::{ComputeBackend, Error, Result, Shape};

use super::arch::{Arch, LinearAttention};
use super::layout::{Ffn, ParamIndex};
use crate::params::{Init, ParamSet, ParamSpec};
use crate::rng::Rng;

/// A projection LoRA can adapt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Target {
    /// Attention query.
    Q,
    /// Attention key.
    K,
    /// Attention value.
    V,
    /// Attention output.
    O,
    /// A Gated DeltaNet's q/k/v input projection (`in_proj_qkv`).
    InQkv,
    /// A Gated DeltaNet's output-gate input projection (`in_proj_z`).
    InZ,
    /// A Gated DeltaNet's β input projection (`in_proj_b`).
    InB,
    /// A Gated DeltaNet's decay input projection (`in_proj_a`).
    InA,
    /// A Gated DeltaNet's output projection (`out_proj`).
    Out,
    /// Gated MLP's gate.
    Gate,
    /// MLP up projection (GPT-2's `fc`).
    Up,
    /// MLP down projection (GPT-2's `proj`).
    Down,
}

impl Target {
    /// Every attention and MLP target, in layer order (the default).
    pub const ALL: [Target; 7] = [Target::Q, Target::K, Target::V, Target::O, Target::Gate, Target::Up, Target::Down];

    /// Every Gated DeltaNet target, in layer order.
    pub const LINEAR: [Target; 5] = [Target::InQkv, Target::InZ, Target::InB, Target::InA, Target::Out];

    /// The spellings `--lora-targets` accepts, for messages.
    const SPELLINGS: &'static str = "one of q, k, v, o, gate, up, down, in_qkv, in_z, in_b, in_a, out";

    /// The flag spelling (`q`, `k`, `v`, `o`, `gate`, `up`, `down`; `in_qkv`, `in_z`,
    /// `in_b`, `in_a`, `out`).
    pub fn name(self) -> &'static str {
        match self {
            Target::Q => "q",
            Target::K => "k",
            Target::V => "v",
            Target::O => "o",
            Target::InQkv => "in_qkv",
            Target::InZ => "in_z",
            Target::InB => "in_b",
            Target::InA => "in_a",
            Target::Out => "out",
            Target::Gate => "gate",
            Target::Up => "up",
            Target::Down => "down",
        }
    }

    /// Parses a flag spelling; PEFT's module names (`q_proj`, `in_proj_qkv`, `out_proj`,
    /// …) are accepted too.
    pub fn parse(s: &str) -> Result<Target> {
        let t = s.trim();
        let t = t.strip_suffix("_proj").unwrap_or(t);
        let t = t.strip_prefix("in_proj_").map_or_else(|| t.to_string(), |part| format!("in_{part}"));
        Target::ALL
            .into_iter()
            .chain(Target::LINEAR)
            .find(|x| x.name() == t)
            .ok_or_else(|| Error::value("--lora-targets", "target", Target::SPELLINGS, format!("'{s}'")))
    }

    /// A comma-separated list (`q,k,v`); duplicates are refused.
    pub fn parse_list(s: &str) -> Result<Vec<Target>> {
        let mut out: Vec<Target> = Vec::new();
        for part in s.split(',') {
            let t = Target::parse(part)?;
            if out.contains(&t) {
                return Err(Error::value(
                    "--lora-targets",
                    "target",
                    "each at most once",
                    format!("'{}' twice", t.name()),
                ));
            }
            out.push(t);
        }
        Ok(out)
    }

    /// The Hugging Face module path inside a decoder layer (`self_attn.q_proj`, …).
    pub fn hf_module(self) -> &'static str {
        match self {
            Target::Q => "self_attn.q_proj",
            Target::K => "self_attn.k_proj",
            Target::V => "self_attn.v_proj",
            Target::O => "self_attn.o_proj",
            Target::InQkv => "linear_attn.in_proj_qkv",
            Target::InZ => "linear_attn.in_proj_z",
            Target::InB => "linear_attn.in_proj_b",
            Target::InA => "linear_attn.in_proj_a",
            Target::Out => "linear_attn.out_proj",
            Target::Gate => "mlp.gate_proj",
            Target::Up => "mlp.up_proj",
            Target::Down => "mlp.down_proj",
        }
    }

    /// The projection group and part index this target is in a block (`linear`: a Gated
    /// DeltaNet layer, whose input projections are the q/k/v group's four parts): `(group,
    /// part)`, or `None` where the block has no such projection.
    fn site(self, gated: bool, linear: bool) -> Option<(Group, usize)> {
        Some(match (self, linear) {
            (Target::Q, false) => (Group::Qkv, 0),
            (Target::K, false) => (Group::Qkv, 1),
            (Target::V, false) => (Group::Qkv, 2),
            (Target::O, false) => (Group::O, 0),
            (Target::InQkv, true) => (Group::Qkv, 0),
            (Target::InZ, true) => (Group::Qkv, 1),
            (Target::InB, true) => (Group::Qkv, 2),
            (Target::InA, true) => (Group::Qkv, 3),
            (Target::Out, true) => (Group::O, 0),
            (Target::Gate, _) if gated => (Group::Up, 0),
            (Target::Up, _) => (Group::Up, usize::from(gated)),
            (Target::Down, _) => (Group::Down, 0),
            _ => return None,
        })
    }
}

/// A projection group of a block (see [`super::layout::LayerIndex`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Group {
    Qkv,
    O,
    /// The MLP's gate and up: a dense MLP's, or a mixture's routed experts'.
    Up,
    /// The MLP's down projection (as `Up`).
    Down,
    /// A projection no adapter is attached to (a mixture's shared expert).
    Unadapted,
}

/// Rank, scaling and targets of a LoRA run.
#[derive(Debug, Clone, PartialEq)]
pub struct LoraConfig {
    /// The rank r (≥ 1).
    pub rank: usize,
    /// α; the update is scaled by α / r.
    pub alpha: f32,
    /// The adapted projections, in [`Target::ALL`] order.
    pub targets: Vec<Target>,
}

impl LoraConfig {
    /// Rank `rank`, α = 2r, every attention and MLP projection.
    pub fn new(rank: usize) -> LoraConfig {
        LoraConfig { rank, alpha: 2.0 * rank as f32, targets: Target::ALL.to_vec() }
    }

    /// α / r.
    pub fn scale(&self) -> f32 {
        self.alpha / self.rank as f32
    }

    /// An error naming the flag unless the rank is ≥ 1, α finite and > 0, and there is a
    /// target.
    pub fn validate(&self) -> Result<()> {
        if self.rank == 0 {
            return Err(Error::value("train", "--lora-rank", "at least 1", 0));
        }
        if !(self.alpha.is_finite() && self.alpha > 0.0) {
            return Err(Error::value("train", "--lora-alpha", "a finite number > 0", self.alpha));
        }
        if self.targets.is_empty() {
            return Err(Error::value("train", "--lora-targets", format!("at least {}", Target::SPELLINGS), "none"));
        }
        Ok(())
    }

    /// `{"rank", "alpha", "targets"}` as saved in `trainer.json`.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "rank": self.rank,
            "alpha": self.alpha,
            "targets": self.targets.iter().map(|t| t.name()).collect::<Vec<_>>(),
        })
    }

    /// The inverse of [`to_json`](Self::to_json).
    pub fn from_json(v: &serde_json::Value) -> Result<LoraConfig> {
        let bad =
            |what: &str| Error::value("trainer.json", format!("finetune.lora.{what}"), "a valid value", v.to_string());
        let rank = v.get("rank").and_then(serde_json::Value::as_u64).ok_or_else(|| bad("rank"))? as usize;
        let alpha = v.get("alpha").and_then(serde_json::Value::as_f64).ok_or_else(|| bad("alpha"))? as f32;
        let targets = v
            .get("targets")
            .and_then(serde_json::Value::as_array)
            .ok_or_else(|| bad("targets"))?
            .iter()
            .map(|t| t.as_str().ok_or_else(|| bad("targets")).and_then(Target::parse))
            .collect::<Result<Vec<_>>>()?;
        let c = LoraConfig { rank, alpha, targets };
        c.validate()?;
        Ok(c)
    }
}

/// One adapter: the indices of its `A` and `B` in [`Adapters::params`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Slot {
    pub a: usize,
    pub b: usize,
}

/// One layer's adapters: per group (q/k/v, o, up, down), per part.
type LayerSlots = [Vec<Option<Slot>>; 4];

/// What [`Adapters::plan`] lays out: the specs, each layer's slots, each adapter's site.
type Plan = (Vec<ParamSpec>, Vec<LayerSlots>, Vec<(usize, Target)>);

/// The adapters of every layer: their parameters (f32, one allocation) and where each
/// applies.
#[derive(Debug)]
pub struct Adapters {
    /// Rank, α and targets.
    pub config: LoraConfig,
    /// `h.{l}.{attn.q|…|mlp.down}.lora_A` `[r, in]` and `.lora_B` `[out, r]`, per layer in
    /// [`Target::ALL`] order.
    pub specs: Vec<ParamSpec>,
    /// The adapter parameters.
    pub params: ParamSet,
    /// Per layer, per group (q/k/v, o, up, down), per part: the adapter, if any.
    slots: Vec<LayerSlots>,
    /// `(layer, target)` of each adapter, in spec order (A then B share one entry).
    sites: Vec<(usize, Target)>,
}

/// fusebox's name stem of a target (`attn.q`, `mlp.gate`, GPT-2's `mlp.fc`/`mlp.proj`,
/// `linear.qkv`): the adapted weight of layer `l` is `h.{l}.{stem}.weight`.
pub(crate) fn stem(t: Target, gated: bool) -> &'static str {
    match t {
        Target::Q => "attn.q",
        Target::K => "attn.k",
        Target::V => "attn.v",
        Target::O => "attn.o",
        Target::InQkv => "linear.qkv",
        Target::InZ => "linear.z",
        Target::InB => "linear.b",
        Target::InA => "linear.a",
        Target::Out => "linear.out",
        Target::Gate => "mlp.gate",
        Target::Up if gated => "mlp.up",
        Target::Up => "mlp.fc",
        Target::Down if gated => "mlp.down",
        Target::Down => "mlp.proj",
    }
}

impl Adapters {
    /// The specs and sites of `config` on `arch`; an error names a target no layer of the
    /// architecture has (`gate` without a gated MLP, `in_qkv` without Gated DeltaNet
    /// layers).
    fn plan(arch: &Arch, config: &LoraConfig) -> Result<Plan> {
        config.validate()?;
        let gated = arch.mlp.gated();
        let (d, f, r) = (arch.d_model, arch.d_ff, config.rank);
        // With an output gate the query projection holds each head's gate rows too.
        let (q, kv) = (arch.q_proj_width(), arch.kv_dim());
        // A Gated DeltaNet's sizes (its targets apply only where it is).
        let linear_size = |w: fn(&LinearAttention) -> usize| arch.linear_attention.as_ref().map_or(0, w);
        let mut targets = config.targets.clone();
        targets.sort();
        let mut specs = Vec::new();
        let mut slots = Vec::with_capacity(arch.n_layers);
        let mut sites = Vec::new();
        let mut used = Vec::new();
        for l in 0..arch.n_layers {
            let linear = arch.is_linear(l);
            let mut layer: LayerSlots = [
                vec![None; if linear { 4 } else { 3 }],
                vec![None; 1],
                vec![None; if gated { 2 } else { 1 }],
                vec![None; 1],
            ];
            for &t in &targets {
                let Some((group, part)) = t.site(gated, linear) else { continue };
                if !used.contains(&t) {
                    used.push(t);
                }
                // A mixture of experts' MLP targets get one adapter per expert, stacked
                // like the experts: A `[E, r, in]`, B `[E, out, r]`.
                let experts = arch.experts_at(l).filter(|_| matches!(group, Group::Up | Group::Down));
                let f = experts.map_or(f, |m| m.d_expert);
                let (out, inp) = match t {
                    Target::Q => (q, d),
                    Target::K | Target::V => (kv, d),
                    Target::O => (d, arch.q_dim()),
                    Target::InQkv => (linear_size(LinearAttention::conv_channels), d),
                    Target::InZ => (linear_size(LinearAttention::value_width), d),
                    Target::InB | Target::InA => (linear_size(|la| la.v_heads), d),
                    Target::Out => (d, linear_size(LinearAttention::value_width)),
                    Target::Gate | Target::Up => (f, d),
                    Target::Down => (d, f),
                };
                let (name, lead) = match experts {
                    Some(m) => (format!("h.{l}.mlp.experts.{}", t.name()), vec![m.experts]),
                    None => (format!("h.{l}.{}", stem(t, gated)), vec![]),
                };
                let a = specs.len();
                specs.push(ParamSpec {
                    name: format!("{name}.lora_A"),
                    shape: Shape::new([&lead[..], &[r, inp]].concat()),
                    init: Init::Zeros,
                    decay: true,
                });
                specs.push(ParamSpec {
                    name: format!("{name}.lora_B"),
                    shape: Shape::new([&lead[..], &[out, r]].concat()),
                    init: Init::Zeros,
                    decay: true,
                });
                layer[group as usize][part] = Some(Slot { a, b: a + 1 });
                sites.push((l, t));
            }
            slots.push(layer);
        }
        if let Some(t) = targets.iter().find(|t| !used.contains(t)) {
            let why = match t {
                Target::Gate => "its MLP is not gated: no 'gate'",
                Target::InQkv | Target::InZ | Target::InB | Target::InA | Target::Out => {
                    "it has no Gated DeltaNet layers"
                }
                _ => "it has no attention layers",
            };
            return Err(Error::value(
                "--lora-targets",
                "target",
                format!("a projection of {} ({why})", arch.name),
                format!("'{}'", t.name()),
            ));
        }
        Ok((specs, slots, sites))
    }

    /// Fresh adapters for `arch`: A Kaiming-uniform from a generator seeded by `seed`, B
    /// zero.
    pub fn init(b: &dyn ComputeBackend, arch: &Arch, config: LoraConfig, seed: u64) -> Result<Adapters> {
        let (specs, slots, sites) = Self::plan(arch, &config)?;
        let mut rng = Rng::new(seed);
        let mut values = Vec::new();
        for (i, s) in specs.iter().enumerate() {
            let n = s.shape.elem_count();
            if i % 2 == 0 {
                let fan_in = s.shape.dims().last().copied().unwrap_or(1);
                let bound = 1.0 / (fan_in as f32).sqrt();
                values.extend(rng.uniform_vec(n, -bound, bound));
            } else {
                values.extend(std::iter::repeat_n(0.0, n));
            }
        }
        let params = ParamSet::from_values(b, &specs, values)?;
        Ok(Adapters { config, specs, params, slots, sites })
    }

    /// Adapters for `arch` holding `params` (checked against the specs, e.g. read from a
    /// checkpoint).
    pub fn with_params(arch: &Arch, config: LoraConfig, params: ParamSet) -> Result<Adapters> {
        let (specs, slots, sites) = Self::plan(arch, &config)?;
        if params.tensors.len() != specs.len() {
            return Err(Error::shape("LoRA adapters", "tensor count", specs.len(), params.tensors.len()));
        }
        for (s, t) in specs.iter().zip(&params.tensors) {
            if t.shape() != &s.shape || t.dtype() != fusebox::DType::F32 {
                return Err(Error::shape(
                    "LoRA adapters",
                    format!("'{}'", s.name),
                    format!("{} f32", s.shape),
                    format!("{} {}", t.shape(), t.dtype()),
                ));
            }
        }
        Ok(Adapters { config, specs, params, slots, sites })
    }

    /// The specs of `config`'s adapters on `arch`.
    pub fn specs_for(arch: &Arch, config: &LoraConfig) -> Result<Vec<ParamSpec>> {
        Ok(Self::plan(arch, config)?.0)
    }

    /// The adapter of part `part` of group `group` in layer `l`.
    pub(crate) fn slot(&self, l: usize, group: Group, part: usize) -> Option<Slot> {
        self.slots.get(l).and_then(|g| g.get(group as usize)?.get(part).copied().flatten())
    }

    /// `(layer, target)` of adapter `i` (its A at spec `2i`, its B at `2i + 1`).
    pub fn sites(&self) -> &[(usize, Target)] {
        &self.sites
    }

    /// Scalars in the adapters.
    pub fn len(&self) -> usize {
        self.params.len()
    }

    /// Whether there are no adapters.
    pub fn is_empty(&self) -> bool {
        self.params.is_empty()
    }
}

/// The row range of target `t` inside the base matrix that holds it, and that matrix's
/// parameter index, in layer `l` of `index`.
pub(crate) fn base_rows(index: &ParamIndex, l: usize, t: Target, gated: bool) -> Option<(usize, usize, usize)> {
    let li = index.layers.get(l)?;
    let (group, part) = t.site(gated, li.linear.is_some())?;
    let p = match (group, &li.ffn) {
        (Group::Qkv, _) => &li.qkv,
        (Group::O, _) => &li.o,
        (Group::Up, Ffn::Dense { up, .. }) => up,
        (Group::Down, Ffn::Dense { down, .. }) => down,
        (Group::Up | Group::Down, Ffn::Experts(_)) | (Group::Unadapted, _) => return None,
    };
    if p.stacked() {
        let start: usize = p.parts[..part].iter().sum();
        Some((p.weights[0], start, p.parts[part]))
    } else {
        Some((*p.weights.get(part)?, 0, *p.parts.get(part)?))
    }
}
