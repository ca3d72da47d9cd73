//! The decoder-only transformer (GPT-2 or Llama style) with explicit forward and
//! backward passes that call only `ComputeBackend` methods — no autograd tape.
//!
//! Per layer, as in llm.c, the forward saves just what the backward needs: the block
//! input, the norm statistics, q/k/v after rope, the attention output with its
//! logsumexp (never a T×T matrix), and the MLP's pre-activation.

use fusebox::{
    AttentionGradients, CausalAttentionResult, ComputeBackend, DType, Error, GeluForm, NormGradients, NormOutput,
    Result, RopeStyle, Shape, Tensor,
};

use crate::config::{ModelConfig, Style};
use crate::params::{Init, ParamSet, ParamSpec};

/// Indices into the parameter list of one decoder block.
#[derive(Debug, Clone)]
pub struct LayerIndex {
    /// First norm's weight (before attention).
    pub norm1_w: usize,
    /// First norm's bias (GPT-2).
    pub norm1_b: Option<usize>,
    /// Query projection `[Hq·hd, D]`.
    pub wq: usize,
    /// Query bias (GPT-2).
    pub bq: Option<usize>,
    /// Key projection `[Hkv·hd, D]`.
    pub wk: usize,
    /// Key bias (GPT-2).
    pub bk: Option<usize>,
    /// Value projection `[Hkv·hd, D]`.
    pub wv: usize,
    /// Value bias (GPT-2).
    pub bv: Option<usize>,
    /// Attention output projection `[D, Hq·hd]`.
    pub wo: usize,
    /// Output projection bias (GPT-2).
    pub bo: Option<usize>,
    /// Second norm's weight (before the MLP).
    pub norm2_w: usize,
    /// Second norm's bias (GPT-2).
    pub norm2_b: Option<usize>,
    /// GPT-2: the fc weight `[F, D]`; Llama: the gate weight `[F, D]`.
    pub w_in: usize,
    /// Bias of `w_in` (GPT-2).
    pub b_in: Option<usize>,
    /// Llama only: the up weight `[F, D]`.
    pub w_up: Option<usize>,
    /// The down/projection weight `[D, F]`.
    pub w_out: usize,
    /// Bias of `w_out` (GPT-2).
    pub b_out: Option<usize>,
}

/// Indices of every parameter.
#[derive(Debug, Clone)]
pub struct ParamIndex {
    /// Token embedding `[V, D]`.
    pub wte: usize,
    /// Learned position embedding `[max_seq, D]` (GPT-2).
    pub wpe: Option<usize>,
    /// Per decoder block.
    pub layers: Vec<LayerIndex>,
    /// Final norm's weight.
    pub norm_f_w: usize,
    /// Final norm's bias (GPT-2).
    pub norm_f_b: Option<usize>,
    /// Untied output head `[V, D]`; `None` when tied to `wte`.
    pub lm_head: Option<usize>,
}

/// The parameter specs (names, shapes, init) of a config and their indices.
pub fn param_specs(cfg: &ModelConfig) -> (Vec<ParamSpec>, ParamIndex) {
    let mut specs = Vec::new();
    let mut push = |name: String, shape: Vec<usize>, init: Init, decay: bool| {
        specs.push(ParamSpec { name, shape: Shape::new(shape), init, decay });
        specs.len() - 1
    };
    let gpt2 = cfg.style == Style::Gpt2;
    let (d, f, hd) = (cfg.d_model, cfg.d_ff, cfg.head_dim());
    let (q_out, kv_out) = (cfg.n_heads * hd, cfg.n_kv_heads * hd);
    let std = 0.02;
    // Residual projections start smaller so the residual stream's variance stays flat in depth.
    let std_res = 0.02 / (2.0 * cfg.n_layers as f32).sqrt();
    let wte = push("wte".into(), vec![cfg.vocab_size, d], Init::Normal(std), false);
    let wpe = gpt2.then(|| push("wpe".into(), vec![cfg.max_seq, d], Init::Normal(0.01), false));
    let mut layers = Vec::new();
    for l in 0..cfg.n_layers {
        let p = |s: &str| format!("h.{l}.{s}");
        let bias = |push: &mut dyn FnMut(String, Vec<usize>, Init, bool) -> usize, name: &str, n: usize| {
            gpt2.then(|| push(p(name), vec![n], Init::Zeros, false))
        };
        let norm1_w = push(p("norm1.weight"), vec![d], Init::Ones, false);
        let norm1_b = bias(&mut push, "norm1.bias", d);
        let wq = push(p("attn.q.weight"), vec![q_out, d], Init::Normal(std), true);
        let bq = bias(&mut push, "attn.q.bias", q_out);
        let wk = push(p("attn.k.weight"), vec![kv_out, d], Init::Normal(std), true);
        let bk = bias(&mut push, "attn.k.bias", kv_out);
        let wv = push(p("attn.v.weight"), vec![kv_out, d], Init::Normal(std), true);
        let bv = bias(&mut push, "attn.v.bias", kv_out);
        let wo = push(p("attn.o.weight"), vec![d, q_out], Init::Normal(std_res), true);
        let bo = bias(&mut push, "attn.o.bias", d);
        let norm2_w = push(p("norm2.weight"), vec![d], Init::Ones, false);
        let norm2_b = bias(&mut push, "norm2.bias", d);
        let w_in = push(p(if gpt2 { "mlp.fc.weight" } else { "mlp.gate.weight" }), vec![f, d], Init::Normal(std), true);
        let b_in = bias(&mut push, "mlp.fc.bias", f);
        let w_up = (!gpt2).then(|| push(p("mlp.up.weight"), vec![f, d], Init::Normal(std), true));
        let w_out =
            push(p(if gpt2 { "mlp.proj.weight" } else { "mlp.down.weight" }), vec![d, f], Init::Normal(std_res), true);
        let b_out = bias(&mut push, "mlp.proj.bias", d);
        layers.push(LayerIndex {
            norm1_w,
            norm1_b,
            wq,
            bq,
            wk,
            bk,
            wv,
            bv,
            wo,
            bo,
            norm2_w,
            norm2_b,
            w_in,
            b_in,
            w_up,
            w_out,
            b_out,
        });
    }
    let norm_f_w = push("norm_f.weight".into(), vec![d], Init::Ones, false);
    let norm_f_b = gpt2.then(|| push("norm_f.bias".into(), vec![d], Init::Zeros, false));
    let lm_head =
        (!cfg.tied_embeddings).then(|| push("lm_head.weight".into(), vec![cfg.vocab_size, d], Init::Normal(std), true));
    (specs, ParamIndex { wte, wpe, layers, norm_f_w, norm_f_b, lm_head })
}

/// What one block's forward keeps for its backward.
#[derive(Debug)]
struct LayerCache {
    x_in: Tensor,
    norm1: NormOutput,
    /// After rope, `[B, H, T, hd]`.
    q: Tensor,
    k: Tensor,
    v: Tensor,
    attn: CausalAttentionResult,
    /// Attention output with heads merged, `[B, T, Hq·hd]`.
    attn_merged: Tensor,
    x_mid: Tensor,
    norm2: NormOutput,
    /// GPT-2: fc output before GELU; Llama: the gate projection.
    mlp_pre: Tensor,
    /// Llama: the up projection.
    mlp_up: Option<Tensor>,
    /// The MLP activation fed to the output projection.
    mlp_act: Tensor,
}

/// Everything the backward needs from a forward.
#[derive(Debug)]
pub struct ForwardCache {
    ids: Tensor,
    batch: usize,
    seq: usize,
    layers: Vec<LayerCache>,
    x_final: Tensor,
    norm_f: NormOutput,
}

/// A decoder-only transformer: config, parameters (one allocation) and rope tables.
#[derive(Debug)]
pub struct Model {
    /// Sizes and choices.
    pub config: ModelConfig,
    /// Name, shape and initialisation of every parameter, in allocation order.
    pub specs: Vec<ParamSpec>,
    /// Where each parameter sits in `params`.
    pub index: ParamIndex,
    /// The parameters, one allocation.
    pub params: ParamSet,
    /// `cos`, `sin` tables `[max_seq, hd/2]` for Llama style.
    rope: Option<(Tensor, Tensor)>,
}

/// Rope tables: `cos/sin(p · θ^(−2i/hd))` for positions `p < max_seq`, pairs `i < hd/2`.
pub fn rope_tables(
    backend: &dyn ComputeBackend,
    max_seq: usize,
    head_dim: usize,
    theta: f32,
) -> Result<(Tensor, Tensor)> {
    let half = head_dim / 2;
    let mut cos = Vec::with_capacity(max_seq * half);
    let mut sin = Vec::with_capacity(max_seq * half);
    for p in 0..max_seq {
        for i in 0..half {
            let freq = (theta as f64).powf(-2.0 * i as f64 / head_dim as f64);
            let angle = p as f64 * freq;
            cos.push(angle.cos() as f32);
            sin.push(angle.sin() as f32);
        }
    }
    Ok((
        backend.upload(&Tensor::from_vec(cos, [max_seq, half])?)?,
        backend.upload(&Tensor::from_vec(sin, [max_seq, half])?)?,
    ))
}

impl Model {
    /// A freshly initialised model.
    pub fn new(backend: &dyn ComputeBackend, config: ModelConfig, seed: u64) -> Result<Model> {
        config.validate()?;
        let (specs, _) = param_specs(&config);
        let params = ParamSet::init(backend, &specs, seed)?;
        Self::from_params(backend, config, params)
    }

    /// A model around existing parameters (checked against the config's specs).
    pub fn from_params(backend: &dyn ComputeBackend, config: ModelConfig, params: ParamSet) -> Result<Model> {
        config.validate()?;
        let (specs, index) = param_specs(&config);
        if params.tensors.len() != specs.len() {
            return Err(Error::shape("Model", "parameter count", specs.len(), params.tensors.len()));
        }
        for (s, t) in specs.iter().zip(&params.tensors) {
            if t.shape() != &s.shape {
                return Err(Error::shape("Model", format!("parameter '{}'", s.name), &s.shape, t.shape()));
            }
        }
        let rope = match config.style {
            Style::Llama => Some(rope_tables(backend, config.max_seq, config.head_dim(), config.rope_theta)?),
            Style::Gpt2 => None,
        };
        Ok(Model { config, specs, index, params, rope })
    }

    fn p(&self, i: usize) -> &Tensor {
        &self.params.tensors[i]
    }

    fn opt(&self, i: Option<usize>) -> Option<&Tensor> {
        i.map(|i| &self.params.tensors[i])
    }

    /// The output head weight `[V, D]` (wte when tied).
    pub fn head_weight(&self) -> &Tensor {
        self.p(self.index.lm_head.unwrap_or(self.index.wte))
    }

    fn norm(&self, b: &dyn ComputeBackend, x: &Tensor, w: usize, bias: Option<usize>) -> Result<NormOutput> {
        match (self.config.style, bias) {
            (Style::Gpt2, Some(bi)) => b.layer_norm(x, self.p(w), self.p(bi), self.config.norm_eps),
            _ => b.rms_norm(x, self.p(w), self.config.norm_eps),
        }
    }

    fn norm_backward(
        &self,
        b: &dyn ComputeBackend,
        x: &Tensor,
        w: usize,
        stats: &NormOutput,
        dy: &Tensor,
    ) -> Result<NormGradients> {
        match &stats.mean {
            Some(mean) => b.layer_norm_backward(x, self.p(w), mean, &stats.rstd, dy),
            None => b.rms_norm_backward(x, self.p(w), &stats.rstd, dy),
        }
    }

    /// Norm output only (inference).
    pub(crate) fn norm_at(&self, b: &dyn ComputeBackend, x: &Tensor, w: usize, bias: Option<usize>) -> Result<Tensor> {
        Ok(self.norm(b, x, w, bias)?.output)
    }

    /// The rope tables (Llama style).
    pub(crate) fn rope_tables(&self) -> Option<&(Tensor, Tensor)> {
        self.rope.as_ref()
    }

    /// Embeddings of `ids` `[1, T]` at positions `offset..` (inference).
    pub(crate) fn embed_at(&self, b: &dyn ComputeBackend, ids: &Tensor, offset: usize) -> Result<Tensor> {
        self.check_ids(ids, offset)?;
        self.embed(b, ids, offset)
    }

    fn rope_fwd(&self, b: &dyn ComputeBackend, x: Tensor, offset: usize) -> Result<Tensor> {
        match &self.rope {
            Some((cos, sin)) => b.rope(&x, cos, sin, RopeStyle::HalfSplit, offset),
            None => Ok(x),
        }
    }

    /// Token (and, for GPT-2, position) embeddings of `ids` `[B, T]` at positions
    /// `offset..offset+T` → `[B, T, D]`.
    fn embed(&self, b: &dyn ComputeBackend, ids: &Tensor, offset: usize) -> Result<Tensor> {
        let (bsz, t) = (ids.dims()[0], ids.dims()[1]);
        let d = self.config.d_model;
        let x = b.embedding(ids, self.p(self.index.wte))?;
        match self.index.wpe {
            Some(wpe) => {
                let pos = b.slice_rows(self.p(wpe), offset, t)?;
                let x = b.add_row(&x.reshape([bsz, t * d])?, &pos.reshape([t * d])?)?;
                x.reshape([bsz, t, d])
            }
            None => Ok(x),
        }
    }

    fn check_ids(&self, ids: &Tensor, offset: usize) -> Result<(usize, usize)> {
        if ids.rank() != 2 || ids.dtype() != DType::U32 {
            return Err(Error::shape(
                "Model::forward",
                "ids",
                "[batch, seq] u32",
                format!("{} {}", ids.shape(), ids.dtype()),
            ));
        }
        let (bsz, t) = (ids.dims()[0], ids.dims()[1]);
        if t == 0 || offset + t > self.config.max_seq {
            return Err(Error::value(
                "Model::forward",
                "sequence length",
                format!("1..={} positions", self.config.max_seq),
                format!("{t} tokens at offset {offset}"),
            ));
        }
        Ok((bsz, t))
    }

    /// Training forward: logits `[B·T, V]` for ids `[B, T]`, and what the backward needs.
    pub fn forward(&self, b: &dyn ComputeBackend, ids: &Tensor) -> Result<(Tensor, ForwardCache)> {
        let (bsz, t) = self.check_ids(ids, 0)?;
        let cfg = &self.config;
        let (hq, hkv) = (cfg.n_heads, cfg.n_kv_heads);
        let scale = 1.0 / (cfg.head_dim() as f32).sqrt();
        let mut x = self.embed(b, ids, 0)?;
        let mut layers = Vec::with_capacity(cfg.n_layers);
        for li in &self.index.layers {
            // Attention block: x_mid = x + Wo·attn(norm1(x)).
            let norm1 = self.norm(b, &x, li.norm1_w, li.norm1_b)?;
            let h = &norm1.output;
            let q = b.split_heads(&b.linear_forward(h, self.p(li.wq), self.opt(li.bq))?, hq)?;
            let k = b.split_heads(&b.linear_forward(h, self.p(li.wk), self.opt(li.bk))?, hkv)?;
            let v = b.split_heads(&b.linear_forward(h, self.p(li.wv), self.opt(li.bv))?, hkv)?;
            let (q, k) = (self.rope_fwd(b, q, 0)?, self.rope_fwd(b, k, 0)?);
            let attn = b.causal_attention(&q, &k, &v, None, scale)?;
            let attn_merged = b.merge_heads(&attn.output)?;
            let o = b.linear_forward(&attn_merged, self.p(li.wo), self.opt(li.bo))?;
            let x_mid = b.add(&x, &o)?;
            // MLP block: x_out = x_mid + W_out·act(W_in·norm2(x_mid)).
            let norm2 = self.norm(b, &x_mid, li.norm2_w, li.norm2_b)?;
            let h2 = &norm2.output;
            let mlp_pre = b.linear_forward(h2, self.p(li.w_in), self.opt(li.b_in))?;
            let (mlp_up, mlp_act) = match li.w_up {
                Some(w_up) => {
                    let up = b.linear_forward(h2, self.p(w_up), None)?;
                    let act = b.silu_mul(&mlp_pre, &up)?;
                    (Some(up), act)
                }
                None => (None, b.gelu(&mlp_pre, GeluForm::Tanh)?),
            };
            let m = b.linear_forward(&mlp_act, self.p(li.w_out), self.opt(li.b_out))?;
            let x_out = b.add(&x_mid, &m)?;
            layers.push(LayerCache {
                x_in: x,
                norm1,
                q,
                k,
                v,
                attn,
                attn_merged,
                x_mid,
                norm2,
                mlp_pre,
                mlp_up,
                mlp_act,
            });
            x = x_out;
        }
        let norm_f = self.norm(b, &x, self.index.norm_f_w, self.index.norm_f_b)?;
        let logits = b.linear_forward(&norm_f.output.reshape([bsz * t, cfg.d_model])?, self.head_weight(), None)?;
        Ok((logits, ForwardCache { ids: ids.clone(), batch: bsz, seq: t, layers, x_final: x, norm_f }))
    }

    /// Backward from `d_logits` `[B·T, V]`: adds every parameter's gradient into `grads`.
    pub fn backward(
        &self,
        b: &dyn ComputeBackend,
        cache: ForwardCache,
        d_logits: &Tensor,
        grads: &mut ParamSet,
    ) -> Result<()> {
        let cfg = &self.config;
        let (bsz, t, d) = (cache.batch, cache.seq, cfg.d_model);
        let scale = 1.0 / (cfg.head_dim() as f32).sqrt();
        // Norm gradients are small: added in a separate pass.
        let acc = |grads: &mut ParamSet, i: usize, g: &Tensor| b.add_assign(&mut grads.tensors[i], g);
        let acc_opt = |grads: &mut ParamSet, i: Option<usize>, g: &Option<Tensor>| match (i, g) {
            (Some(i), Some(g)) => b.add_assign(&mut grads.tensors[i], g),
            _ => Ok(()),
        };

        // Output head and final norm.
        let hf = cache.norm_f.output.reshape([bsz * t, d])?;
        let head_grad = self.index.lm_head.unwrap_or(self.index.wte);
        let dhf = self.linear_grad(b, grads, &hf, self.head_weight(), (head_grad, None), d_logits)?;
        let dnf =
            self.norm_backward(b, &cache.x_final, self.index.norm_f_w, &cache.norm_f, &dhf.reshape([bsz, t, d])?)?;
        acc(grads, self.index.norm_f_w, &dnf.dweight)?;
        acc_opt(grads, self.index.norm_f_b, &dnf.dbias)?;
        let mut dx = dnf.dx;

        for (li, lc) in self.index.layers.iter().zip(cache.layers).rev() {
            // MLP block.
            let d_act = self.linear_grad(b, grads, &lc.mlp_act, self.p(li.w_out), (li.w_out, li.b_out), &dx)?;
            let h2 = &lc.norm2.output;
            let dh2 = match (li.w_up, &lc.mlp_up) {
                (Some(w_up), Some(up)) => {
                    let g = b.silu_mul_backward(&lc.mlp_pre, up, &d_act)?;
                    let d_gate = self.linear_grad(b, grads, h2, self.p(li.w_in), (li.w_in, None), &g.da)?;
                    let d_up = self.linear_grad(b, grads, h2, self.p(w_up), (w_up, None), &g.db)?;
                    b.add(&d_gate, &d_up)?
                }
                _ => {
                    let dpre = b.gelu_backward(&lc.mlp_pre, &d_act, GeluForm::Tanh)?;
                    self.linear_grad(b, grads, h2, self.p(li.w_in), (li.w_in, li.b_in), &dpre)?
                }
            };
            let dn2 = self.norm_backward(b, &lc.x_mid, li.norm2_w, &lc.norm2, &dh2)?;
            acc(grads, li.norm2_w, &dn2.dweight)?;
            acc_opt(grads, li.norm2_b, &dn2.dbias)?;
            let dx_mid = b.add(&dx, &dn2.dx)?;

            // Attention block.
            let d_merged = self.linear_grad(b, grads, &lc.attn_merged, self.p(li.wo), (li.wo, li.bo), &dx_mid)?;
            let d_attn = b.split_heads(&d_merged, cfg.n_heads)?;
            let AttentionGradients { dq, dk, dv } =
                b.causal_attention_backward(&lc.q, &lc.k, &lc.v, &lc.attn, &d_attn, None, scale)?;
            let (dq, dk) = match &self.rope {
                Some((cos, sin)) => (
                    b.rope_backward(&dq, cos, sin, RopeStyle::HalfSplit, 0)?,
                    b.rope_backward(&dk, cos, sin, RopeStyle::HalfSplit, 0)?,
                ),
                None => (dq, dk),
            };
            let h1 = &lc.norm1.output;
            let dh_q = self.linear_grad(b, grads, h1, self.p(li.wq), (li.wq, li.bq), &b.merge_heads(&dq)?)?;
            let dh_k = self.linear_grad(b, grads, h1, self.p(li.wk), (li.wk, li.bk), &b.merge_heads(&dk)?)?;
            let dh_v = self.linear_grad(b, grads, h1, self.p(li.wv), (li.wv, li.bv), &b.merge_heads(&dv)?)?;
            let dh1 = b.add3(&dh_q, &dh_k, &dh_v)?;
            let dn1 = self.norm_backward(b, &lc.x_in, li.norm1_w, &lc.norm1, &dh1)?;
            acc(grads, li.norm1_w, &dn1.dweight)?;
            acc_opt(grads, li.norm1_b, &dn1.dbias)?;
            dx = b.add(&dx_mid, &dn1.dx)?;
        }

        // Embeddings: token rows scatter-add straight into the (possibly tied) table's
        // gradient; positions sum over the batch.
        let ids = cache.ids.reshape([bsz * t])?;
        b.scatter_add_rows(&mut grads.tensors[self.index.wte], &ids, &dx.reshape([bsz * t, d])?)?;
        if let Some(wpe) = self.index.wpe {
            let dpos = b.sum(&dx.reshape([bsz, t * d])?, Some(0))?.reshape([t, d])?;
            let rows = b.upload(&Tensor::from_vec((0..t as u32).collect::<Vec<_>>(), [t])?)?;
            b.scatter_add_rows(&mut grads.tensors[wpe], &rows, &dpos)?;
        }
        Ok(())
    }

    /// Backward of one linear layer `y = x·Wᵀ (+ bias)`: adds the weight (and bias)
    /// gradient into `grads` at `(weight, bias)` indices and returns `dx`.
    fn linear_grad(
        &self,
        b: &dyn ComputeBackend,
        grads: &mut ParamSet,
        x: &Tensor,
        w: &Tensor,
        (weight, bias): (usize, Option<usize>),
        dy: &Tensor,
    ) -> Result<Tensor> {
        let (dw, db) = grads.pair_mut(weight, bias)?;
        b.linear_backward_accumulate(x, w, dy, dw, db)
    }

    /// Mean cross-entropy of next-token predictions and its gradient, added into `grads`
    /// scaled by `grad_scale` (1/accumulation steps). `targets` `[B, T]` U32; positions
    /// whose target is `ignore` do not count. Returns the loss.
    pub fn loss_and_grads(
        &self,
        b: &dyn ComputeBackend,
        ids: &Tensor,
        targets: &Tensor,
        ignore: Option<u32>,
        grad_scale: f32,
        grads: &mut ParamSet,
    ) -> Result<f32> {
        let (logits, cache) = self.forward(b, ids)?;
        let n = logits.dims()[0];
        let ce = b.cross_entropy(&logits, &targets.reshape([n])?, ignore)?;
        let loss = b.to_host(&ce.loss)?.to_vec::<f32>()?[0];
        let d_logits = if grad_scale == 1.0 { ce.d_logits } else { b.mul_scalar(&ce.d_logits, grad_scale)? };
        self.backward(b, cache, &d_logits, grads)?;
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
