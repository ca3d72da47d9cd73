//! THE transformer: one decoder block, configured by an [`Arch`], that every model in
//! the crate runs through — training from scratch (forward with saved activations,
//! explicit backward, no autograd tape), a prompt or a decode step over one
//! sequence's preallocated KV cache, and a server's batched decode step over many
//! sequences' caches.
//!
//! Per block (residual stream `x` `[B, T, D]`):
//! ```text
//! h  = norm1(x)                                  (fused with the previous residual add)
//! q, k, v = split(h·Wqkvᵀ + b)                   one stacked matrix or three
//! q, k = rope(qk_norm(q)), rope(qk_norm(k))      → caches at positions pos..pos+T
//! a  = attention(q, K, V; scale, window)·Woᵀ + b
//! x  = x + post_attn_norm(a);   h2 = norm2(x)     (the add fused with norm2)
//! m  = down(act(up(h2)))        act: gelu | silu(gate)·up | gelu(gate)·up
//! x  = x + post_mlp_norm(m)
//! ```
//! then `logits = norm_f(x)·Wheadᵀ`, the input `embed(ids)·embed_scale (+ wpe)`.
//!
//! Each sublayer is written once, its forward, what it saves and its backward side by
//! side: `linear.rs` (projections, LoRA), `norm.rs`, `attention.rs`, `mlp.rs`,
//! composed by `block.rs`. What differs between the passes — where positions, keys and
//! values come from and go, and whether activations are saved — is the `Pass`
//! (`pass.rs`) a sublayer is handed; `forward.rs`, `backward.rs` and `batch.rs` are the
//! entry points. As in llm.c, the training forward saves per block just what the
//! backward needs: the block input with its norm statistics, q/k/v after rope, the
//! attention output with its logsumexp (never a T×T matrix), and the MLP's
//! pre-activations.

pub mod arch;
mod attention;
mod backward;
mod batch;
mod block;
pub mod cache;
mod checkpointing;
mod counted;
mod delta;
mod experts;
mod forward;
mod hidden;
pub mod layout;
mod linear;
pub mod lora;
mod mlp;
mod norm;
mod pass;
mod stage;

use fusebox::{ComputeBackend, DType, Error, Result, Tensor};

pub use arch::{Arch, Biases, LayerAttention, LinearAttention, Mlp, Moe, NormKind, Positions, Rope, RopeScaling};
pub use backward::{GradsListener, GradsReady, LossOptions, NotListening};
pub use cache::{kv_bytes_per_position, KvCache, LinearState, RopeTables, KV_BLOCK};
pub use checkpointing::{activation_bytes, Activations};
pub use forward::ForwardCache;
pub use layout::{
    layout, ExpertBiases, ExpertIndex, Ffn, LayerIndex, LinearIndex, NormIndex, ParamIndex, Proj, SharedExpert,
    Stacking,
};
pub use linear::Precision;
pub use lora::{Adapters, LoraConfig, Target};
pub use stage::{Stage, StageInput, StageOutput};

use lora::base_rows;

use crate::params::{ParamSet, ParamSpec};

/// A decoder-only transformer: its description, the name/shape of every parameter,
/// where each sits, and the parameters.
#[derive(Debug)]
pub struct Transformer {
    /// Sizes and choices.
    pub arch: Arch,
    /// Name, shape and initialisation of every parameter, in order.
    pub specs: Vec<ParamSpec>,
    /// Where each parameter sits in `params`.
    pub index: ParamIndex,
    /// The parameters: one allocation when trainable; loaded tensors (f32, or block
    /// formats multiplied straight from their blocks) for inference.
    pub params: ParamSet,
    /// Whether the parameters are plain f32 tensors the backward may use (a loaded
    /// model's matrices are laid out by `preprocess_linear_weight` or quantized).
    trainable: bool,
    /// Whether the parameters are a frozen base in the plain `[out, in]` layout (f32 or
    /// block formats, never preprocessed): the backward computes `dx` through them but
    /// no gradient of theirs (LoRA).
    frozen: bool,
    /// LoRA adapters added to the projections (training and the KV-cache forward).
    pub lora: Option<Adapters>,
    /// The blocks this process holds (a pipeline stage; the whole model unless loaded
    /// with [`for_inference_stage`](Self::for_inference_stage)). The parameters of the
    /// others are empty tensors.
    stage: Stage,
    /// The arithmetic of the dense linear layers (f32, or BF16 mixed precision).
    precision: Precision,
    /// A tied first stage's rows of a split head, copied apart from its embedding table
    /// (which stays mapped for lookups; see [`Stage::head_share`]).
    head_rows: Option<Tensor>,
}

/// Where the backward adds gradients: every parameter's (full training), or only the
/// LoRA adapters' (the base frozen).
pub(crate) enum Sink<'a> {
    Full(&'a mut ParamSet),
    Lora(&'a mut ParamSet),
}

impl Sink<'_> {
    /// The base parameters' gradients, when they are wanted.
    fn base(&mut self) -> Option<&mut ParamSet> {
        match self {
            Sink::Full(g) => Some(g),
            Sink::Lora(_) => None,
        }
    }
}

impl Transformer {
    /// A freshly initialised trainable model (separate q/k/v and gate/up matrices).
    pub fn new(backend: &dyn ComputeBackend, arch: Arch, seed: u64) -> Result<Transformer> {
        arch.validate()?;
        let (specs, _) = layout(&arch, |_| Stacking::default());
        let params = ParamSet::init(backend, &specs, seed)?;
        Self::from_params(backend, arch, params)
    }

    /// A trainable model around existing f32 parameters in [`layout()`]'s order (no
    /// stacking), each checked against its spec.
    pub fn from_params(_backend: &dyn ComputeBackend, arch: Arch, params: ParamSet) -> Result<Transformer> {
        arch.validate()?;
        let (specs, index) = layout(&arch, |_| Stacking::default());
        Self::trainable_from(arch, specs, index, params)
    }

    /// An inference-only model from loaded tensors laid out by [`layout()`] with
    /// `stacking` (matrices dense f32 after `preprocess_linear_weight`, or quantized).
    pub fn for_inference(
        arch: Arch,
        specs: Vec<ParamSpec>,
        index: ParamIndex,
        params: ParamSet,
    ) -> Result<Transformer> {
        arch.validate()?;
        check_params(&specs, &params)?;
        let stage = Stage::whole(arch.n_layers);
        Ok(Transformer {
            arch,
            specs,
            index,
            params,
            trainable: false,
            frozen: false,
            lora: None,
            stage,
            precision: Precision::F32,
            head_rows: None,
        })
    }

    /// As [`for_inference`](Self::for_inference) for the pipeline stage `stage`: the
    /// parameters it holds ([`Stage::holds`]) have their specs' shapes, every other one
    /// is an empty tensor `[0]`.
    pub fn for_inference_stage(
        arch: Arch,
        specs: Vec<ParamSpec>,
        index: ParamIndex,
        params: ParamSet,
        stage: Stage,
    ) -> Result<Transformer> {
        arch.validate()?;
        if stage.n_layers != arch.n_layers {
            return Err(Error::value(
                "Transformer",
                "stage",
                format!("a stage of {} blocks", arch.n_layers),
                stage.n_layers,
            ));
        }
        if params.tensors.len() != specs.len() {
            return Err(Error::shape("Transformer", "parameter count", specs.len(), params.tensors.len()));
        }
        let held = stage.holds(&index, specs.len());
        // A split head holds its rows only, unless it is the first stage's (whole)
        // embedding table too.
        let head_rows = stage.head_share(arch.vocab_size).len();
        let sliced_head = stage.splits_head(arch.vocab_size) && !(arch.tied_embeddings && stage.is_first());
        for (i, ((s, t), held)) in specs.iter().zip(&params.tensors).zip(held).enumerate() {
            let want = match held {
                true if sliced_head && i == index.head_weight() => fusebox::Shape::new([head_rows, arch.d_model]),
                true => s.shape.clone(),
                false => fusebox::Shape::new([0]),
            };
            if t.shape() != &want {
                return Err(Error::shape(
                    "Transformer",
                    format!("parameter '{}' (stage {:?})", s.name, stage.layers),
                    &want,
                    t.shape(),
                ));
            }
        }
        Ok(Transformer {
            arch,
            specs,
            index,
            params,
            trainable: false,
            frozen: false,
            lora: None,
            stage,
            precision: Precision::F32,
            head_rows: None,
        })
    }

    /// A trainable model from loaded f32 tensors laid out by [`layout()`] (stacked
    /// projections as the file stores them).
    pub fn trainable_from(
        arch: Arch,
        specs: Vec<ParamSpec>,
        index: ParamIndex,
        params: ParamSet,
    ) -> Result<Transformer> {
        arch.validate()?;
        check_params(&specs, &params)?;
        if let Some((s, t)) = specs.iter().zip(&params.tensors).find(|(_, t)| t.dtype() != DType::F32) {
            return Err(Error::dtype("Transformer", format!("parameter '{}'", s.name), "f32", t.dtype()));
        }
        let stage = Stage::whole(arch.n_layers);
        Ok(Transformer {
            arch,
            specs,
            index,
            params,
            trainable: true,
            frozen: false,
            lora: None,
            stage,
            precision: Precision::F32,
            head_rows: None,
        })
    }

    /// A frozen base for LoRA from loaded tensors laid out by [`layout()`]: matrices and
    /// the embedding f32 or block formats in the plain `[out, in]` layout (never
    /// `preprocess_linear_weight`ed), everything else f32. [`attach_lora`](Self::attach_lora)
    /// then gives it something to train.
    pub fn frozen_from(arch: Arch, specs: Vec<ParamSpec>, index: ParamIndex, params: ParamSet) -> Result<Transformer> {
        arch.validate()?;
        check_params(&specs, &params)?;
        let stage = Stage::whole(arch.n_layers);
        Ok(Transformer {
            arch,
            specs,
            index,
            params,
            trainable: false,
            frozen: true,
            lora: None,
            stage,
            precision: Precision::F32,
            head_rows: None,
        })
    }

    /// Adds `adapters` (made for this architecture) to the projections; the base
    /// parameters are frozen from now on: [`lora_loss_and_grads`](Self::lora_loss_and_grads)
    /// gives only the adapters' gradients.
    pub fn attach_lora(&mut self, adapters: Adapters) -> Result<()> {
        let expected = Adapters::specs_for(&self.arch, &adapters.config)?;
        if expected != adapters.specs {
            return Err(Error::value("attach_lora", "adapters", format!("made for this {}", self.arch.name), "others"));
        }
        if !(self.trainable || self.frozen) {
            return Err(Error::unsupported(
                "attach_lora",
                "the base was loaded for inference (backend-laid-out weights); load it frozen (weights::Purpose::Frozen)",
            ));
        }
        self.lora = Some(adapters);
        Ok(())
    }

    /// `W += (α/r)·B·A` for every adapter, the adapters then removed: the plain network
    /// the adapters describe. Needs f32 base parameters (a trainable model).
    pub fn merge_lora(&mut self, b: &dyn ComputeBackend) -> Result<()> {
        const OP: &str = "Transformer::merge_lora";
        let Some(ad) = self.lora.take() else { return Ok(()) };
        if !self.trainable {
            self.lora = Some(ad);
            return Err(Error::unsupported(OP, "merging needs f32 base weights (load the base for training)"));
        }
        let scale = ad.config.scale();
        let gated = self.arch.mlp.gated();
        for (i, &(l, t)) in ad.sites().iter().enumerate() {
            let (a, bm) = (&ad.params.tensors[2 * i], &ad.params.tensors[2 * i + 1]);
            if let Some(w) = expert_weight(&self.index, l, t) {
                // W_e += s·B_e·A_e for every expert at once: [E, out, r]·[E, r, in].
                let delta = b.mul_scalar(&b.batched_matmul(bm, a, false, false)?, scale)?;
                let merged = b.add(&self.params.tensors[w], &delta)?;
                b.copy_into(&mut self.params.tensors[w], &merged)?;
                continue;
            }
            let delta = b.to_host(&b.mul_scalar(&b.matmul(bm, a, false, false)?, scale)?)?.to_vec::<f32>()?;
            let (w, start, rows) = base_rows(&self.index, l, t, gated).ok_or_else(|| {
                Error::value(OP, "adapter", "a projection of the model", format!("h.{l}.{}", t.name()))
            })?;
            let wt = &mut self.params.tensors[w];
            let cols = wt.dims()[1];
            let mut host = b.to_host(wt)?.to_vec::<f32>()?;
            for (dst, d) in host[start * cols..(start + rows) * cols].iter_mut().zip(&delta) {
                *dst += d;
            }
            let new = b.upload(&Tensor::from_vec(host, wt.shape().clone())?)?;
            b.copy_into(wt, &new)?;
        }
        Ok(())
    }

    /// Whether [`forward`](Self::forward) and [`backward`](Self::backward) may run.
    pub fn trainable(&self) -> bool {
        self.trainable
    }

    fn p(&self, i: usize) -> &Tensor {
        &self.params.tensors[i]
    }

    /// The arithmetic of the dense linear layers: the head, the projections and MLPs,
    /// LoRA's adapters, forward and backward ([`Precision`]; f32 unless set).
    pub fn precision(&self) -> Precision {
        self.precision
    }

    /// Sets [`precision`](Self::precision) (`Precision::Bf16`: mixed-precision training
    /// and evaluation). Block-quantized weights keep their own kernels.
    pub fn set_precision(&mut self, precision: Precision) {
        self.precision = precision;
    }

    /// The output head weight `[V, D]` (the embedding table when tied); of a split head
    /// this stage's rows `[rows, D]` ([`Stage::head_share`]).
    pub fn head_weight(&self) -> &Tensor {
        self.head_rows.as_ref().unwrap_or_else(|| self.p(self.index.head_weight()))
    }

    /// Gives a tied first stage its rows `[rows, D]` of a split head, held apart from the
    /// embedding table; an error unless this stage is such a stage and `rows` has its
    /// share's shape.
    pub fn set_head_rows(&mut self, rows: Tensor) -> Result<()> {
        let share = self.stage.head_share(self.arch.vocab_size);
        let want = [share.len(), self.arch.d_model];
        let apart = self.arch.tied_embeddings && self.stage.is_first() && self.stage.splits_head(self.arch.vocab_size);
        if !apart || rows.dims() != want {
            return Err(Error::value(
                "Transformer::set_head_rows",
                "head rows",
                format!("{want:?} for a tied first stage of a split head"),
                format!("{} (blocks {:?}, head rows {share:?})", rows.shape(), self.stage.layers),
            ));
        }
        self.head_rows = Some(rows);
        Ok(())
    }

    /// Gradients of every parameter are asked for: refused when the base is frozen (LoRA)
    /// and when `grads` is not laid out as the parameters.
    fn check_full_grads(&self, op: &'static str, grads: &ParamSet) -> Result<()> {
        if self.lora.is_some() || self.frozen {
            return Err(Error::unsupported(
                op,
                "the base is frozen (LoRA): its parameters have no gradient; use lora_loss_and_grads",
            ));
        }
        check_params(&self.specs, grads)
    }

    fn check_trainable(&self, op: &'static str) -> Result<()> {
        if self.trainable || self.frozen {
            Ok(())
        } else {
            Err(Error::unsupported(
                op,
                format!(
                    "this {} model was loaded for inference (quantized or backend-laid-out weights); \
                     training needs f32 parameters",
                    self.arch.name
                ),
            ))
        }
    }
}

/// An error unless `params` holds one tensor of each spec's shape, in order.
fn check_params(specs: &[ParamSpec], params: &ParamSet) -> Result<()> {
    if params.tensors.len() != specs.len() {
        return Err(Error::shape("Transformer", "parameter count", specs.len(), params.tensors.len()));
    }
    for (s, t) in specs.iter().zip(&params.tensors) {
        if t.shape() != &s.shape {
            return Err(Error::shape("Transformer", format!("parameter '{}'", s.name), &s.shape, t.shape()));
        }
    }
    Ok(())
}

/// The stacked expert weight `[E, out, in]` that target `t` adapts in layer `l`, when
/// that layer is a mixture of experts and `t` one of its MLP projections.
fn expert_weight(index: &ParamIndex, l: usize, t: Target) -> Option<usize> {
    let Ffn::Experts(e) = &index.layers.get(l)?.ffn else { return None };
    match t {
        Target::Gate => Some(e.gate),
        Target::Up => Some(e.up),
        Target::Down => Some(e.down),
        _ => None,
    }
}
