//! THE transformer: one decoder block, configured by an [`Arch`], that every model in
//! the crate runs through — training from scratch (forward with saved activations,
//! explicit backward, no autograd tape) and inference over a preallocated KV cache
//! (the prompt through the fused causal attention, later tokens through
//! `decode_attention`, which reads the caches in place).
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
//! As in llm.c, the training forward saves per block just what the backward needs:
//! the block input with its norm statistics, q/k/v after rope, the attention output
//! with its logsumexp (never a T×T matrix), and the MLP's pre-activations.

pub mod arch;
mod batch;
pub mod cache;
mod counted;
pub mod layout;
pub mod lora;

use fusebox::{
    AttentionGradients, CausalAttentionResult, ComputeBackend, DType, Error, GeluForm, NormGradients, NormOutput,
    Result, Tensor,
};

pub use arch::{Arch, Biases, LayerAttention, Mlp, NormKind, Positions, Rope, RopeScaling};
pub use cache::{kv_bytes_per_position, KvCache, RopeTables};
pub use layout::{layout, LayerIndex, NormIndex, ParamIndex, Proj, Stacking};
pub use lora::{Adapters, LoraConfig, Target};

use lora::{base_rows, Group};

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
}

/// Where the backward adds gradients: every parameter's (full training), or only the
/// LoRA adapters' (the base frozen).
enum Sink<'a> {
    Full(&'a mut ParamSet),
    Lora(&'a mut ParamSet),
}

impl Sink<'_> {
    fn base(&mut self) -> Option<&mut ParamSet> {
        match self {
            Sink::Full(g) => Some(g),
            Sink::Lora(_) => None,
        }
    }
}

/// The backward's report that the gradients at some parameter indices are complete (see
/// [`Transformer::backward_with`]).
pub type GradsReady<'a> = dyn FnMut(&ParamSet, &[usize]) -> Result<()> + 'a;

/// What one block's training forward keeps for its backward.
#[derive(Debug)]
struct LayerSaved {
    x_in: Tensor,
    norm1: NormOutput,
    /// q and k before their per-head norms, and those norms' statistics (QK-norm).
    qk_pre: Option<(Tensor, NormOutput, Tensor, NormOutput)>,
    /// After rope, `[B, H, T, hd]`.
    q: Tensor,
    k: Tensor,
    v: Tensor,
    attn: CausalAttentionResult,
    /// Attention output with heads merged, `[B, T, Hq·hd]`.
    merged: Tensor,
    /// The attention projection's output before its post norm, and that norm.
    post_attn: Option<(Tensor, NormOutput)>,
    x_mid: Tensor,
    norm2: NormOutput,
    /// The up projections' outputs: `[fc]` or `[gate, up]`.
    up: Vec<Tensor>,
    /// The MLP activation (input of the down projection).
    act: Tensor,
    /// The MLP output before its post norm, and that norm.
    post_mlp: Option<(Tensor, NormOutput)>,
}

/// What the training forward keeps for [`Transformer::backward`].
#[derive(Debug)]
pub struct ForwardCache {
    ids: Tensor,
    batch: usize,
    seq: usize,
    rope: RopeTables,
    layers: Vec<LayerSaved>,
    x_final: Tensor,
    norm_f: NormOutput,
}

/// How a block runs: training (saving activations) or over a KV cache.
enum Pass<'a> {
    Train { rope: &'a RopeTables, saved: &'a mut Vec<LayerSaved> },
    Cached { cache: &'a mut KvCache, pos: usize },
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
        check_params(&specs, &params)?;
        if let Some((s, t)) = specs.iter().zip(&params.tensors).find(|(_, t)| t.dtype() != DType::F32) {
            return Err(Error::dtype("Transformer", format!("parameter '{}'", s.name), "f32", t.dtype()));
        }
        Ok(Transformer { arch, specs, index, params, trainable: true, frozen: false, lora: None })
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
        Ok(Transformer { arch, specs, index, params, trainable: false, frozen: false, lora: None })
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
        Ok(Transformer { arch, specs, index, params, trainable: true, frozen: false, lora: None })
    }

    /// A frozen base for LoRA from loaded tensors laid out by [`layout()`]: matrices and
    /// the embedding f32 or block formats in the plain `[out, in]` layout (never
    /// `preprocess_linear_weight`ed), everything else f32. [`attach_lora`](Self::attach_lora)
    /// then gives it something to train.
    pub fn frozen_from(arch: Arch, specs: Vec<ParamSpec>, index: ParamIndex, params: ParamSet) -> Result<Transformer> {
        arch.validate()?;
        check_params(&specs, &params)?;
        Ok(Transformer { arch, specs, index, params, trainable: false, frozen: true, lora: None })
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

    /// The output head weight `[V, D]` (the embedding table when tied).
    pub fn head_weight(&self) -> &Tensor {
        self.p(self.index.head_weight())
    }

    /// `x·Wᵀ (+ bias)`, from dense or block-quantized W.
    fn linear(&self, b: &dyn ComputeBackend, x: &Tensor, w: usize, bias: Option<usize>) -> Result<Tensor> {
        linear_with(b, x, self.p(w), bias.map(|i| self.p(i)))
    }

    /// Each part of a projection group: one matmul per matrix; for a stacked matrix one
    /// matmul sliced (up to [`BATCH_ROWS`] rows) or one per part's rows of it (a prompt).
    fn proj(&self, b: &dyn ComputeBackend, x: &Tensor, p: &Proj, site: (usize, Group)) -> Result<Vec<Tensor>> {
        let mut parts = self.base_proj(b, x, p)?;
        if let Some(ad) = &self.lora {
            // y += s·(x·Aᵀ)·Bᵀ per adapted part.
            for (i, part) in parts.iter_mut().enumerate() {
                if let Some(slot) = ad.slot(site.0, site.1, i) {
                    let xa = b.linear_forward(x, &ad.params.tensors[slot.a], None)?;
                    let d = b.linear_forward(&xa, &ad.params.tensors[slot.b], None)?;
                    *part = b.add(part, &b.mul_scalar(&d, ad.config.scale())?)?;
                }
            }
        }
        Ok(parts)
    }

    fn base_proj(&self, b: &dyn ComputeBackend, x: &Tensor, p: &Proj) -> Result<Vec<Tensor>> {
        let bias = |i: usize| p.biases.as_ref().map(|bs| bs[i]);
        if !p.stacked() {
            return p.weights.iter().enumerate().map(|(i, &w)| self.linear(b, x, w, bias(i))).collect();
        }
        let stacked = self.p(p.weights[0]);
        let rows: usize = x.dims()[..x.rank().saturating_sub(1)].iter().product();
        // A prompt: each part from its own rows of the stacked matrix (a view, no copy),
        // so its output needs no strided slice of a stacked one. A decode batch keeps one
        // GEMV (one parallel region) and slices its few rows.
        let y = if rows > BATCH_ROWS && stacked.is_host() {
            None
        } else {
            Some(self.linear(b, x, p.weights[0], bias(0))?)
        };
        let mut start = 0;
        let mut parts = Vec::with_capacity(p.parts.len());
        for &r in &p.parts {
            parts.push(match &y {
                None => {
                    let k = stacked.dims()[1];
                    let bias = bias(0).map(|i| self.p(i).view(start, [r])).transpose()?;
                    linear_with(b, x, &stacked.view(start * k, [r, k])?, bias.as_ref())?
                }
                // One row (a decode step) in host memory: each part is a contiguous run
                // of it, so a view of it, not a copy.
                Some(y) if y.is_host() && rows == 1 => {
                    let mut dims = y.dims().to_vec();
                    dims[y.rank() - 1] = r;
                    y.view(start, dims)?
                }
                Some(y) => b.slice(y, y.rank() - 1, start, r)?,
            });
            start += r;
        }
        Ok(parts)
    }

    fn norm(&self, b: &dyn ComputeBackend, x: &Tensor, n: NormIndex) -> Result<NormOutput> {
        match n.bias {
            Some(bias) => b.layer_norm(x, self.p(n.weight), self.p(bias), self.arch.norm_eps),
            None => b.rms_norm(x, self.p(n.weight), self.arch.norm_eps),
        }
    }

    /// `(x + y, norm(x + y))`, in one pass for RMS norms.
    fn add_norm(&self, b: &dyn ComputeBackend, x: &Tensor, y: &Tensor, n: NormIndex) -> Result<(Tensor, NormOutput)> {
        match n.bias {
            Some(_) => {
                let s = b.add(x, y)?;
                let out = self.norm(b, &s, n)?;
                Ok((s, out))
            }
            None => b.add_rms_norm(x, y, self.p(n.weight), self.arch.norm_eps),
        }
    }

    fn norm_backward(
        &self,
        b: &dyn ComputeBackend,
        x: &Tensor,
        n: NormIndex,
        stats: &NormOutput,
        dy: &Tensor,
        sink: &mut Sink<'_>,
    ) -> Result<Tensor> {
        let NormGradients { dx, dweight, dbias } = match &stats.mean {
            Some(mean) => b.layer_norm_backward(x, self.p(n.weight), mean, &stats.rstd, dy)?,
            None => b.rms_norm_backward(x, self.p(n.weight), &stats.rstd, dy)?,
        };
        if let Some(grads) = sink.base() {
            b.add_assign(&mut grads.tensors[n.weight], &dweight)?;
            if let (Some(i), Some(g)) = (n.bias, dbias) {
                b.add_assign(&mut grads.tensors[i], &g)?;
            }
        }
        Ok(dx)
    }

    /// Token (and learned position) embeddings of `ids` `[B, T]` at positions
    /// `offset..offset+T` → `[B, T, D]` f32.
    fn embed(&self, b: &dyn ComputeBackend, ids: &Tensor, offset: usize) -> Result<Tensor> {
        let (bsz, t) = (ids.dims()[0], ids.dims()[1]);
        let d = self.arch.d_model;
        let mut x = b.embedding(ids, self.p(self.index.embed))?;
        if x.dtype() != DType::F32 {
            x = b.cast(&x, DType::F32)?;
        }
        if self.arch.embed_scale != 1.0 {
            x = b.mul_scalar(&x, self.arch.embed_scale)?;
        }
        match self.index.pos_embed {
            Some(wpe) => {
                let pos = b.slice_rows(self.p(wpe), offset, t)?;
                let x = b.add_row(&x.reshape([bsz, t * d])?, &pos.reshape([t * d])?)?;
                x.reshape([bsz, t, d])
            }
            None => Ok(x),
        }
    }

    fn check_ids(&self, op: &'static str, ids: &Tensor, offset: usize, limit: usize) -> Result<(usize, usize)> {
        if ids.rank() != 2 || ids.dtype() != DType::U32 {
            return Err(Error::shape(op, "ids", "[batch, seq] u32", format!("{} {}", ids.shape(), ids.dtype())));
        }
        let (bsz, t) = (ids.dims()[0], ids.dims()[1]);
        if t == 0 || offset + t > limit {
            return Err(Error::value(
                op,
                "sequence length",
                format!("1..={limit} positions"),
                format!("{t} tokens at offset {offset}"),
            ));
        }
        Ok((bsz, t))
    }

    /// Attention of layer `l` over the cache: the prompt (at position 0) through the
    /// fused causal attention, later tokens through `decode_attention`.
    #[allow(clippy::too_many_arguments)]
    fn cached_attention(
        &self,
        b: &dyn ComputeBackend,
        l: usize,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        cache: &mut KvCache,
        pos: usize,
    ) -> Result<Tensor> {
        let (window, scale) = (self.arch.window(l), self.arch.attn_scale);
        b.write_head_cache(&mut cache.k[l], k, pos)?;
        b.write_head_cache(&mut cache.v[l], v, pos)?;
        if pos == 0 {
            Ok(attend(b, q, k, v, window, scale)?.output)
        } else {
            decode(b, q, &cache.k[l], &cache.v[l], pos + q.dims()[2], window, scale)
        }
    }

    /// One decoder block on `x` with `h = norm1(x)`; returns the block output and the
    /// next norm of it (the next block's `norm1`, or the final norm).
    fn block(
        &self,
        b: &dyn ComputeBackend,
        l: usize,
        x: Tensor,
        h: NormOutput,
        pass: &mut Pass<'_>,
    ) -> Result<(Tensor, NormOutput)> {
        const OP: &str = "Transformer::block";
        let arch = &self.arch;
        let li = &self.index.layers[l];
        let [q, k, v]: [Tensor; 3] = self
            .proj(b, &h.output, &li.qkv, (l, Group::Qkv))?
            .try_into()
            .map_err(|_| Error::value(OP, "q/k/v projections", "three", "another count"))?;
        let mut q = split_heads(b, &q, arch.n_heads)?;
        let mut k = split_heads(b, &k, arch.n_kv_heads)?;
        let v = split_heads(b, &v, arch.n_kv_heads)?;
        let qk_pre = match (li.q_norm, li.k_norm) {
            (Some(qn), Some(kn)) => {
                let nq = b.rms_norm(&q, self.p(qn), arch.norm_eps)?;
                let nk = b.rms_norm(&k, self.p(kn), arch.norm_eps)?;
                let pre_q = std::mem::replace(&mut q, nq.output.clone());
                let pre_k = std::mem::replace(&mut k, nk.output.clone());
                Some((pre_q, nq, pre_k, nk))
            }
            _ => None,
        };
        if arch.positions == Positions::Rope {
            let (tables, offset) = match pass {
                Pass::Train { rope, .. } => (*rope, 0),
                Pass::Cached { cache, pos } => (&cache.rope, *pos),
            };
            let (cos, sin) = tables.of(l)?;
            let style = arch.rope_of(l).style;
            q = b.rope(&q, cos, sin, style, offset)?;
            k = b.rope(&k, cos, sin, style, offset)?;
        }
        let (attn_out, attn) = match pass {
            Pass::Train { .. } => {
                let r = attend(b, &q, &k, &v, arch.window(l), arch.attn_scale)?;
                (r.output.clone(), Some(r))
            }
            Pass::Cached { cache, pos } => (self.cached_attention(b, l, &q, &k, &v, cache, *pos)?, None),
        };
        let merged = merge_heads(b, &attn_out)?;
        let o = self.proj(b, &merged, &li.o, (l, Group::O))?.remove(0);
        let (o, post_attn) = match li.post_attn_norm {
            Some(n) => {
                let no = self.norm(b, &o, n)?;
                (no.output.clone(), Some((o, no)))
            }
            None => (o, None),
        };
        let (x_mid, norm2) = self.add_norm(b, &x, &o, li.norm2)?;
        let up = self.proj(b, &norm2.output, &li.up, (l, Group::Up))?;
        let act = match (arch.mlp, up.as_slice()) {
            (Mlp::Gelu, [fc]) => b.gelu(fc, GeluForm::Tanh)?,
            (Mlp::SwiGlu, [gate, up]) => b.silu_mul(gate, up)?,
            (Mlp::GeGlu, [gate, up]) => b.mul(&b.gelu(gate, GeluForm::Tanh)?, up)?,
            _ => return Err(Error::value(OP, "MLP projections", "one (gelu) or two (gated)", up.len())),
        };
        let m = self.proj(b, &act, &li.down, (l, Group::Down))?.remove(0);
        let (m, post_mlp) = match li.post_mlp_norm {
            Some(n) => {
                let nm = self.norm(b, &m, n)?;
                (nm.output.clone(), Some((m, nm)))
            }
            None => (m, None),
        };
        let next = self.index.layers.get(l + 1).map_or(self.index.norm_f, |n| n.norm1);
        let (x_out, h_next) = self.add_norm(b, &x_mid, &m, next)?;
        if let (Pass::Train { saved, .. }, Some(attn)) = (pass, attn) {
            saved.push(LayerSaved {
                x_in: x,
                norm1: h,
                qk_pre,
                q,
                k,
                v,
                attn,
                merged,
                post_attn,
                x_mid,
                norm2,
                up,
                act,
                post_mlp,
            });
        }
        Ok((x_out, h_next))
    }

    /// Runs `ids` at positions `cache.len ..`, appending their keys and values to the
    /// caches; returns the final-normed hidden states `[1, T, D]`.
    fn forward_hidden(&self, b: &dyn ComputeBackend, ids: &[u32], cache: &mut KvCache) -> Result<Tensor> {
        const OP: &str = "Transformer::forward_cached";
        let (t, pos) = (ids.len(), cache.len);
        if t == 0 {
            return Err(Error::value(OP, "tokens", "at least one", 0));
        }
        if pos + t > cache.capacity {
            return Err(Error::value(
                OP,
                "context",
                format!("at most {} positions (the cache size, --ctx-size)", cache.capacity),
                format!("{pos} cached + {t} new"),
            ));
        }
        if cache.k.len() != self.arch.n_layers {
            return Err(Error::value(OP, "cache", format!("{} layers", self.arch.n_layers), cache.k.len()));
        }
        if let Some(&bad) = ids.iter().find(|&&id| id as usize >= self.arch.vocab_size) {
            return Err(Error::value(OP, "token id", format!("< vocab size {}", self.arch.vocab_size), bad));
        }
        let ids_t = b.upload(&Tensor::from_vec(ids.to_vec(), [1, t])?)?;
        let mut x = self.embed(b, &ids_t, pos)?;
        let first = self.index.layers.first().map_or(self.index.norm_f, |l| l.norm1);
        let mut h = self.norm(b, &x, first)?;
        let mut pass = Pass::Cached { cache, pos };
        for l in 0..self.arch.n_layers {
            (x, h) = self.block(b, l, x, h, &mut pass)?;
        }
        cache.len = pos + t;
        Ok(h.output)
    }

    /// Runs `ids` at positions `cache.len ..`, appending their keys and values to the
    /// caches; returns the logits of the last position `[V]` (f32, host).
    ///
    /// # Shapes
    /// `ids`: T tokens, `cache.len + T ≤ cache.capacity` → `[V]`.
    pub fn forward_cached(&self, b: &dyn ComputeBackend, ids: &[u32], cache: &mut KvCache) -> Result<Vec<f32>> {
        let h = self.forward_hidden(b, ids, cache)?;
        let t = ids.len();
        let last = b.slice_rows(&h.reshape([t, self.arch.d_model])?, t - 1, 1)?;
        let logits = self.linear(b, &last, self.index.head_weight(), None)?;
        b.to_host(&logits)?.to_vec::<f32>()
    }

    /// As [`forward_cached`](Self::forward_cached) but returns the logits of every new
    /// position `[T, V]` (host).
    pub fn forward_cached_all(&self, b: &dyn ComputeBackend, ids: &[u32], cache: &mut KvCache) -> Result<Tensor> {
        let h = self.forward_hidden(b, ids, cache)?;
        let logits = self.linear(b, &h.reshape([ids.len(), self.arch.d_model])?, self.index.head_weight(), None)?;
        b.to_host(&logits)
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

    /// Training forward: logits `[B·T, V]` for ids `[B, T]`, and what the backward needs.
    pub fn forward(&self, b: &dyn ComputeBackend, ids: &Tensor) -> Result<(Tensor, ForwardCache)> {
        let cache = self.forward_trunk(b, ids)?;
        let h = cache.norm_f.output.reshape([cache.batch * cache.seq, self.arch.d_model])?;
        let logits = self.linear(b, &h, self.index.head_weight(), None)?;
        Ok((logits, cache))
    }

    /// The training forward up to the final norm (the head's input is
    /// `cache.norm_f.output`).
    fn forward_trunk(&self, b: &dyn ComputeBackend, ids: &Tensor) -> Result<ForwardCache> {
        const OP: &str = "Transformer::forward";
        self.check_trainable(OP)?;
        let (bsz, t) = self.check_ids(OP, ids, 0, self.arch.context_length)?;
        let rope = RopeTables::new(b, &self.arch, t)?;
        let mut saved = Vec::with_capacity(self.arch.n_layers);
        let mut x = self.embed(b, ids, 0)?;
        let first = self.index.layers.first().map_or(self.index.norm_f, |l| l.norm1);
        let mut h = self.norm(b, &x, first)?;
        {
            let mut pass = Pass::Train { rope: &rope, saved: &mut saved };
            for l in 0..self.arch.n_layers {
                (x, h) = self.block(b, l, x, h, &mut pass)?;
            }
        }
        Ok(ForwardCache { ids: ids.clone(), batch: bsz, seq: t, rope, layers: saved, x_final: x, norm_f: h })
    }

    /// Backward of one linear layer `y = x·Wᵀ (+ bias)`: adds the weight (and bias)
    /// gradient into `grads` and returns `dx`.
    fn linear_grad(
        &self,
        b: &dyn ComputeBackend,
        sink: &mut Sink<'_>,
        x: &Tensor,
        (weight, bias): (usize, Option<usize>),
        dy: &Tensor,
    ) -> Result<Tensor> {
        if let Some(grads) = sink.base() {
            let (dw, db) = grads.pair_mut(weight, bias)?;
            return b.linear_backward_accumulate(x, self.p(weight), dy, dw, db);
        }
        // Frozen W: only dx = dy·W, straight from the blocks of a block-format W.
        let w = self.p(weight);
        if w.dtype().is_quantized() || w.dtype() == DType::F8E4M3 {
            b.quantized_matmul_backward(dy, w)
        } else {
            let rows: usize = dy.dims()[..dy.rank() - 1].iter().product();
            let mut shape = dy.dims().to_vec();
            let last = shape.len() - 1;
            shape[last] = w.dims()[1];
            b.matmul(&dy.reshape([rows, dy.dims()[last]])?, w, false, false)?.reshape(shape)
        }
    }

    /// Backward of a projection group from each part's output gradient; returns `dx`.
    fn proj_backward(
        &self,
        b: &dyn ComputeBackend,
        sink: &mut Sink<'_>,
        x: &Tensor,
        p: &Proj,
        site: (usize, Group),
        d_parts: &[Tensor],
    ) -> Result<Tensor> {
        let bias = |i: usize| p.biases.as_ref().map(|bs| bs[i]);
        let mut dx = if p.stacked() {
            let dy = b.concat(d_parts, d_parts[0].rank() - 1)?;
            self.linear_grad(b, sink, x, (p.weights[0], bias(0)), &dy)?
        } else {
            let mut dx: Option<Tensor> = None;
            for (i, (&w, dy)) in p.weights.iter().zip(d_parts).enumerate() {
                let d = self.linear_grad(b, sink, x, (w, bias(i)), dy)?;
                dx = Some(match dx {
                    Some(acc) => b.add(&acc, &d)?,
                    None => d,
                });
            }
            dx.ok_or_else(|| Error::value("Transformer::backward", "projection", "at least one matrix", 0))?
        };
        if let (Some(ad), Sink::Lora(grads)) = (&self.lora, sink) {
            // y = s·(x·Aᵀ)·Bᵀ: with u = x·Aᵀ and g = s·dy, dB += gᵀ·u, du = g·B,
            // dA += duᵀ·x, dx += du·A.
            for (i, dy) in d_parts.iter().enumerate() {
                if let Some(slot) = ad.slot(site.0, site.1, i) {
                    let (a, bm) = (&ad.params.tensors[slot.a], &ad.params.tensors[slot.b]);
                    let u = b.linear_forward(x, a, None)?;
                    let g = b.mul_scalar(dy, ad.config.scale())?;
                    let du = b.linear_backward_accumulate(&u, bm, &g, &mut grads.tensors[slot.b], None)?;
                    let dxl = b.linear_backward_accumulate(x, a, &du, &mut grads.tensors[slot.a], None)?;
                    dx = b.add(&dx, &dxl)?;
                }
            }
        }
        Ok(dx)
    }

    /// Backward from `d_logits` `[B·T, V]`: adds every parameter's gradient into `grads`.
    pub fn backward(
        &self,
        b: &dyn ComputeBackend,
        cache: ForwardCache,
        d_logits: &Tensor,
        grads: &mut ParamSet,
    ) -> Result<()> {
        self.backward_with(b, cache, d_logits, grads, &mut |_, _| Ok(()))
    }

    /// [`backward`](Self::backward), calling `ready(grads, indices)` as soon as the
    /// gradients of `indices` are complete (no later step of this backward adds to them):
    /// the final norm and an untied head first, then each block from the last down, then
    /// the embeddings. Every parameter is reported exactly once, in the same order on every
    /// call; a data-parallel trainer starts reducing them while the rest runs.
    pub fn backward_with(
        &self,
        b: &dyn ComputeBackend,
        cache: ForwardCache,
        d_logits: &Tensor,
        grads: &mut ParamSet,
        ready: &mut GradsReady<'_>,
    ) -> Result<()> {
        const OP: &str = "Transformer::backward";
        self.check_full_grads(OP, grads)?;
        self.backward_impl(b, cache, d_logits, &mut Sink::Full(grads), ready)
    }

    /// The backward from `d_logits` into `sink`: the head, then
    /// [`backward_below_head`](Self::backward_below_head).
    fn backward_impl(
        &self,
        b: &dyn ComputeBackend,
        cache: ForwardCache,
        d_logits: &Tensor,
        sink: &mut Sink<'_>,
        ready: &mut GradsReady<'_>,
    ) -> Result<()> {
        // Output head.
        let hf = cache.norm_f.output.reshape([cache.batch * cache.seq, self.arch.d_model])?;
        let dhf = self.linear_grad(b, sink, &hf, (self.index.head_weight(), None), d_logits)?;
        self.backward_below_head(b, cache, &dhf, sink, ready)
    }

    /// The backward from the head's input gradient `dhf` `[B·T, D]` (the head's own
    /// gradient already added): final norm, blocks, embeddings; `ready` as in
    /// [`backward_with`](Self::backward_with) (not called for a LoRA sink).
    fn backward_below_head(
        &self,
        b: &dyn ComputeBackend,
        cache: ForwardCache,
        dhf: &Tensor,
        sink: &mut Sink<'_>,
        ready: &mut GradsReady<'_>,
    ) -> Result<()> {
        const OP: &str = "Transformer::backward";
        self.check_trainable(OP)?;
        let arch = &self.arch;
        let (bsz, t, d) = (cache.batch, cache.seq, arch.d_model);

        // Final norm.
        let mut dx =
            self.norm_backward(b, &cache.x_final, self.index.norm_f, &cache.norm_f, &dhf.reshape([bsz, t, d])?, sink)?;
        let norm_f = self.index.norm_f;
        if let Some(grads) = sink.base() {
            let done = [Some(norm_f.weight), norm_f.bias, self.index.head].into_iter().flatten().collect::<Vec<_>>();
            ready(grads, &done)?;
        }

        for (l, s) in cache.layers.into_iter().enumerate().rev() {
            let li = &self.index.layers[l];
            // MLP: x_out = x_mid + post_mlp_norm(down(act(up(norm2(x_mid))))).
            let d_m = match (li.post_mlp_norm, &s.post_mlp) {
                (Some(n), Some((m, stats))) => self.norm_backward(b, m, n, stats, &dx, sink)?,
                _ => dx.clone(),
            };
            let d_act = self.proj_backward(b, sink, &s.act, &li.down, (l, Group::Down), &[d_m])?;
            let d_up = match (arch.mlp, s.up.as_slice()) {
                (Mlp::Gelu, [fc]) => vec![b.gelu_backward(fc, &d_act, GeluForm::Tanh)?],
                (Mlp::SwiGlu, [gate, up]) => {
                    let g = b.silu_mul_backward(gate, up, &d_act)?;
                    vec![g.da, g.db]
                }
                (Mlp::GeGlu, [gate, up]) => {
                    // out = gelu(gate)·up: d_gate = gelu'(gate)·(d·up), d_up = d·gelu(gate).
                    let d_gate = b.gelu_backward(gate, &b.mul(&d_act, up)?, GeluForm::Tanh)?;
                    let d_upv = b.mul(&d_act, &b.gelu(gate, GeluForm::Tanh)?)?;
                    vec![d_gate, d_upv]
                }
                _ => return Err(Error::value(OP, "saved MLP projections", "one (gelu) or two (gated)", s.up.len())),
            };
            let dh2 = self.proj_backward(b, sink, &s.norm2.output, &li.up, (l, Group::Up), &d_up)?;
            let dn2 = self.norm_backward(b, &s.x_mid, li.norm2, &s.norm2, &dh2, sink)?;
            let dx_mid = b.add(&dx, &dn2)?;

            // Attention: x_mid = x_in + post_attn_norm(o(attention(...))).
            let d_o = match (li.post_attn_norm, &s.post_attn) {
                (Some(n), Some((o, stats))) => self.norm_backward(b, o, n, stats, &dx_mid, sink)?,
                _ => dx_mid.clone(),
            };
            let d_merged = self.proj_backward(b, sink, &s.merged, &li.o, (l, Group::O), &[d_o])?;
            let d_attn = b.split_heads(&d_merged, arch.n_heads)?;
            let AttentionGradients { dq, dk, dv } =
                attend_backward(b, &s.q, &s.k, &s.v, &s.attn, &d_attn, arch.window(l), arch.attn_scale)?;
            let (mut dq, mut dk) = (dq, dk);
            if arch.positions == Positions::Rope {
                let (cos, sin) = cache.rope.of(l)?;
                let style = arch.rope_of(l).style;
                dq = b.rope_backward(&dq, cos, sin, style, 0)?;
                dk = b.rope_backward(&dk, cos, sin, style, 0)?;
            }
            if let (Some(qn), Some(kn), Some((q_pre, nq, k_pre, nk))) = (li.q_norm, li.k_norm, &s.qk_pre) {
                let gq = b.rms_norm_backward(q_pre, self.p(qn), &nq.rstd, &dq)?;
                let gk = b.rms_norm_backward(k_pre, self.p(kn), &nk.rstd, &dk)?;
                if let Some(grads) = sink.base() {
                    b.add_assign(&mut grads.tensors[qn], &gq.dweight)?;
                    b.add_assign(&mut grads.tensors[kn], &gk.dweight)?;
                }
                (dq, dk) = (gq.dx, gk.dx);
            }
            let d_qkv = [b.merge_heads(&dq)?, b.merge_heads(&dk)?, b.merge_heads(&dv)?];
            let dh1 = self.proj_backward(b, sink, &s.norm1.output, &li.qkv, (l, Group::Qkv), &d_qkv)?;
            let dn1 = self.norm_backward(b, &s.x_in, li.norm1, &s.norm1, &dh1, sink)?;
            dx = b.add(&dx_mid, &dn1)?;
            if let Some(grads) = sink.base() {
                ready(grads, &li.params())?;
            }
        }
        let Some(grads) = sink.base() else { return Ok(()) };

        // Embeddings: token rows scatter-add straight into the (possibly tied) table's
        // gradient (times the embedding scale); positions sum over the batch.
        let ids = cache.ids.reshape([bsz * t])?;
        let d_tok = if arch.embed_scale != 1.0 { b.mul_scalar(&dx, arch.embed_scale)? } else { dx.clone() };
        b.scatter_add_rows(&mut grads.tensors[self.index.embed], &ids, &d_tok.reshape([bsz * t, d])?)?;
        if let Some(wpe) = self.index.pos_embed {
            let dpos = b.sum(&dx.reshape([bsz, t * d])?, Some(0))?.reshape([t, d])?;
            let rows = b.upload(&Tensor::from_vec((0..t as u32).collect::<Vec<_>>(), [t])?)?;
            b.scatter_add_rows(&mut grads.tensors[wpe], &rows, &dpos)?;
        }
        ready(grads, &[Some(self.index.embed), self.index.pos_embed].into_iter().flatten().collect::<Vec<_>>())
    }

    /// Mean cross-entropy of next-token predictions and its gradient, added into `grads`
    /// scaled by `grad_scale` (1/accumulation steps). `targets` `[B, T]` U32; positions
    /// whose target is `ignore` do not count. Returns the loss. When at most half the
    /// positions count (chat data: loss on the answers only), the head's logits are
    /// computed at the counted positions only: the same loss and gradients, without
    /// the `[B·T, V]` logits.
    pub fn loss_and_grads(
        &self,
        b: &dyn ComputeBackend,
        ids: &Tensor,
        targets: &Tensor,
        ignore: Option<u32>,
        grad_scale: f32,
        grads: &mut ParamSet,
    ) -> Result<f32> {
        self.loss_and_grads_with(b, ids, targets, ignore, grad_scale, grads, &mut |_, _| Ok(()))
    }

    /// [`loss_and_grads`](Self::loss_and_grads) with the backward's `ready` callback (see
    /// [`backward_with`](Self::backward_with)).
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
        const OP: &str = "Transformer::loss_and_grads";
        self.check_full_grads(OP, grads)?;
        self.loss_and_grads_into(b, ids, targets, ignore, grad_scale, &mut Sink::Full(grads), ready)
    }

    /// LoRA training: the mean cross-entropy, and its gradient with respect to the
    /// adapters only (the base frozen), added into `grads` (laid out as the adapters'
    /// specs) scaled by `grad_scale`. `targets` as in
    /// [`loss_and_grads`](Self::loss_and_grads); chat data takes the same counted-rows
    /// path.
    pub fn lora_loss_and_grads(
        &self,
        b: &dyn ComputeBackend,
        ids: &Tensor,
        targets: &Tensor,
        ignore: Option<u32>,
        grad_scale: f32,
        grads: &mut ParamSet,
    ) -> Result<f32> {
        const OP: &str = "Transformer::lora_loss_and_grads";
        let ad = self.lora.as_ref().ok_or_else(|| Error::unsupported(OP, "no LoRA adapters are attached"))?;
        check_params(&ad.specs, grads)?;
        self.loss_and_grads_into(b, ids, targets, ignore, grad_scale, &mut Sink::Lora(grads), &mut |_, _| Ok(()))
    }

    /// The loss and its gradients into `sink`: the counted-rows path when it applies,
    /// else the dense head.
    #[allow(clippy::too_many_arguments)]
    fn loss_and_grads_into(
        &self,
        b: &dyn ComputeBackend,
        ids: &Tensor,
        targets: &Tensor,
        ignore: Option<u32>,
        grad_scale: f32,
        sink: &mut Sink<'_>,
        ready: &mut GradsReady<'_>,
    ) -> Result<f32> {
        if let Some(loss) = self.counted_loss_and_grads(b, ids, targets, ignore, grad_scale, sink, ready)? {
            return Ok(loss);
        }
        let (logits, cache) = self.forward(b, ids)?;
        let n = logits.dims()[0];
        let ce = b.cross_entropy(&logits, &targets.reshape([n])?, ignore)?;
        let loss = b.to_host(&ce.loss)?.to_vec::<f32>()?[0];
        let d_logits = if grad_scale == 1.0 { ce.d_logits } else { b.mul_scalar(&ce.d_logits, grad_scale)? };
        self.backward_impl(b, cache, &d_logits, sink, ready)?;
        Ok(loss)
    }

    /// Mean cross-entropy without gradients (evaluation).
    pub fn loss(&self, b: &dyn ComputeBackend, ids: &Tensor, targets: &Tensor, ignore: Option<u32>) -> Result<f32> {
        let (logits, _) = self.forward(b, ids)?;
        let n = logits.dims()[0];
        let ce = b.cross_entropy(&logits, &targets.reshape([n])?, ignore)?;
        Ok(b.to_host(&ce.loss)?.to_vec::<f32>()?[0])
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

/// Fused causal attention; with a `window` W, query i sees keys i − W < j ≤ i.
fn attend(
    b: &dyn ComputeBackend,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    window: Option<usize>,
    scale: f32,
) -> Result<CausalAttentionResult> {
    b.causal_attention(q, k, v, window, scale)
}

/// Backward of [`attend`].
#[allow(clippy::too_many_arguments)]
fn attend_backward(
    b: &dyn ComputeBackend,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    result: &CausalAttentionResult,
    d_out: &Tensor,
    window: Option<usize>,
    scale: f32,
) -> Result<AttentionGradients> {
    b.causal_attention_backward(q, k, v, result, d_out, window, scale)
}

/// Rows up to which a stacked projection runs as one product (a server's decode batch).
const BATCH_ROWS: usize = 16;

/// `x·Wᵀ (+ bias)`, from dense or block-quantized W.
fn linear_with(b: &dyn ComputeBackend, x: &Tensor, wt: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
    if wt.dtype().is_quantized() || wt.dtype() == DType::F8E4M3 {
        let y = b.quantized_matmul(x, wt)?;
        match bias {
            Some(bias) => b.add_row(&y, bias),
            None => Ok(y),
        }
    } else {
        b.linear_forward(x, wt, bias)
    }
}

/// `[B, T, H·D] → [B, H, T, D]`; for one position (T = 1) the two orders are the same
/// memory, so a reshape.
fn split_heads(b: &dyn ComputeBackend, x: &Tensor, heads: usize) -> Result<Tensor> {
    match *x.dims() {
        [bsz, 1, hd] if heads > 0 && hd % heads == 0 => x.reshape([bsz, heads, 1, hd / heads]),
        _ => b.split_heads(x, heads),
    }
}

/// `[B, H, T, D] → [B, T, H·D]`; a reshape for T = 1 (as [`split_heads`]).
fn merge_heads(b: &dyn ComputeBackend, x: &Tensor) -> Result<Tensor> {
    match *x.dims() {
        [bsz, h, 1, d] => x.reshape([bsz, 1, h * d]),
        _ => b.merge_heads(x),
    }
}

/// Attention of new queries over the first `kv_len` cached positions (the last `W`
/// of them for a query, with a window).
fn decode(
    b: &dyn ComputeBackend,
    q: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    kv_len: usize,
    window: Option<usize>,
    scale: f32,
) -> Result<Tensor> {
    b.decode_attention(q, k_cache, v_cache, kv_len, window, scale)
}
