//! [`Model`]: a transformer trained from scratch — a [`ModelConfig`] (the sizes and
//! style a checkpoint records) and the [`Transformer`] it describes. Forward, backward and
//! cached inference are the transformer's; this type only ties them to the config.

use fusebox::{ComputeBackend, Result, RopeStyle, Tensor};

use crate::config::{ModelConfig, Style};
use crate::params::{ParamSet, ParamSpec};
use crate::transformer::{
    layout, Arch, Biases, ForwardCache, GradsReady, LayerAttention, Mlp, NormKind, ParamIndex, Positions, Rope,
    Stacking, Transformer,
};

/// The architecture a from-scratch config describes.
pub fn arch_of(cfg: &ModelConfig) -> Arch {
    let gpt2 = cfg.style == Style::Gpt2;
    let gemma = cfg.style == Style::Gemma3;
    let mut arch = Arch {
        name: cfg.style.name().to_string(),
        vocab_size: cfg.vocab_size,
        n_layers: cfg.n_layers,
        d_model: cfg.d_model,
        n_heads: cfg.n_heads,
        n_kv_heads: cfg.n_kv_heads,
        head_dim: cfg.head_dim(),
        d_ff: cfg.d_ff,
        context_length: cfg.max_seq,
        norm: if gpt2 { NormKind::LayerNorm } else { NormKind::Rms },
        norm_eps: cfg.norm_eps,
        post_norms: false,
        qk_norm: false,
        mlp: if gpt2 { Mlp::Gelu } else { Mlp::SwiGlu },
        positions: if gpt2 { Positions::Learned } else { Positions::Rope },
        rope: Rope::plain(f64::from(cfg.rope_theta), RopeStyle::HalfSplit),
        rope_local: None,
        sliding_window: None,
        layer_attention: vec![LayerAttention::Global; cfg.n_layers],
        bias: Biases { qkv: gpt2, o: gpt2, mlp: gpt2 },
        attn_scale: 1.0 / (cfg.head_dim() as f32).sqrt(),
        embed_scale: 1.0,
        tied_embeddings: cfg.tied_embeddings,
    };
    arch.qk_norm = matches!(cfg.style, Style::Qwen3 | Style::Gemma3);
    if gemma {
        arch.post_norms = true;
        arch.mlp = Mlp::GeGlu;
        arch.embed_scale = (cfg.d_model as f32).sqrt();
        arch.sliding_window = Some(cfg.max_seq.div_ceil(2));
        arch.layer_attention = (0..cfg.n_layers)
            .map(|l| if l % 2 == 1 { LayerAttention::Global } else { LayerAttention::Local })
            .collect();
        arch.rope_local = Some(Rope::plain(10_000.0, RopeStyle::HalfSplit));
    }
    arch
}

/// The parameter specs (names, shapes, init) of a config and their indices.
pub fn param_specs(cfg: &ModelConfig) -> (Vec<ParamSpec>, ParamIndex) {
    layout(&arch_of(cfg), |_| Stacking::default())
}

/// A transformer trained from scratch, with the config its checkpoints record.
#[derive(Debug)]
pub struct Model {
    /// Sizes and choices (written beside checkpoints).
    pub config: ModelConfig,
    /// The network and its parameters (one allocation).
    pub net: Transformer,
}

impl Model {
    /// A freshly initialised model.
    pub fn new(backend: &dyn ComputeBackend, config: ModelConfig, seed: u64) -> Result<Model> {
        config.validate()?;
        let net = Transformer::new(backend, arch_of(&config), seed)?;
        Ok(Model { config, net })
    }

    /// A model around existing parameters (checked against the config's specs).
    pub fn from_params(backend: &dyn ComputeBackend, config: ModelConfig, params: ParamSet) -> Result<Model> {
        config.validate()?;
        let net = Transformer::from_params(backend, arch_of(&config), params)?;
        Ok(Model { config, net })
    }

    /// Training forward: logits `[B·T, V]` for ids `[B, T]` (see [`Transformer::forward`]).
    pub fn forward(&self, b: &dyn ComputeBackend, ids: &Tensor) -> Result<(Tensor, ForwardCache)> {
        self.net.forward(b, ids)
    }

    /// Backward from `d_logits` (see [`Transformer::backward`]).
    pub fn backward(
        &self,
        b: &dyn ComputeBackend,
        cache: ForwardCache,
        d_logits: &Tensor,
        grads: &mut ParamSet,
    ) -> Result<()> {
        self.net.backward(b, cache, d_logits, grads)
    }

    /// Loss and gradients (see [`Transformer::loss_and_grads`]).
    pub fn loss_and_grads(
        &self,
        b: &dyn ComputeBackend,
        ids: &Tensor,
        targets: &Tensor,
        ignore: Option<u32>,
        grad_scale: f32,
        grads: &mut ParamSet,
    ) -> Result<f32> {
        self.net.loss_and_grads(b, ids, targets, ignore, grad_scale, grads)
    }

    /// Loss and gradients, reporting finished gradients to `ready` (see
    /// [`Transformer::loss_and_grads_with`]).
    pub fn loss_and_grads_with(
        &self,
        b: &dyn ComputeBackend,
        ids: &Tensor,
        targets: &Tensor,
        ignore: Option<u32>,
        grad_scale: f32,
        grads: &mut ParamSet,
        ready: &mut GradsReady<'_>,
    ) -> Result<f32> {
        self.net.loss_and_grads_with(b, ids, targets, ignore, grad_scale, grads, ready)
    }

    /// Loss without gradients (see [`Transformer::loss`]).
    pub fn loss(&self, b: &dyn ComputeBackend, ids: &Tensor, targets: &Tensor, ignore: Option<u32>) -> Result<f32> {
        self.net.loss(b, ids, targets, ignore)
    }
}
