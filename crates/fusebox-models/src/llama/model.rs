//! The pretrained Llama forward pass over a preallocated KV cache, written only in
//! `ComputeBackend` calls: the prompt goes through the fused causal attention in one
//! batched pass, later tokens through `decode_attention`, which reads the caches in place.
//!
//! Per block (pre-norm, residual stream `x` `[1, T, D]`):
//! ```text
//! h  = rms_norm(x)                      (fused with the previous residual add)
//! q, k, v = rope(h·Wqᵀ), rope(h·Wkᵀ), h·Wvᵀ        → caches at positions pos..pos+T
//! x  = x + attention(q, K[..pos+T], V[..pos+T])·Woᵀ
//! h2 = rms_norm(x)                      (fused with that add)
//! x  = x + (silu(h2·Wgateᵀ) · h2·Wupᵀ)·Wdownᵀ
//! ```
//! then `logits = rms_norm(x)·Wheadᵀ` (the head is the embedding when tied).

use fusebox::{ComputeBackend, DType, Error, Result, Tensor};

use super::config::LlamaConfig;
use super::weights::{Embedding, Linear, Projections};
use crate::kv_cache::KvCache;

/// One decoder block's weights.
#[derive(Debug)]
pub struct LlamaLayer {
    /// RMS norm weight before attention `[D]`.
    pub attn_norm: Tensor,
    /// q `[Hq·hd, D]`, k and v `[Hkv·hd, D]` (stacked when they share a format).
    pub qkv: Projections,
    /// Attention output projection `[D, Hq·hd]`.
    pub wo: Linear,
    /// RMS norm weight before the MLP `[D]`.
    pub ffn_norm: Tensor,
    /// gate and up `[F, D]` (stacked when they share a format).
    pub gate_up: Projections,
    /// MLP down projection `[D, F]`.
    pub w_down: Linear,
}

impl LlamaLayer {
    /// Every weight matrix of the block.
    pub fn matrices(&self) -> Vec<&Linear> {
        let mut m = self.qkv.matrices();
        m.push(&self.wo);
        m.extend(self.gate_up.matrices());
        m.push(&self.w_down);
        m
    }
}

/// A pretrained Llama-family model ready for inference.
#[derive(Debug)]
pub struct LlamaModel {
    /// Sizes and choices.
    pub config: LlamaConfig,
    /// The token embedding.
    pub embed: Embedding,
    /// The decoder blocks.
    pub layers: Vec<LlamaLayer>,
    /// Final RMS norm weight `[D]`.
    pub norm_f: Tensor,
    /// The output head `[vocab, D]` (the embedding table when tied).
    pub head: Linear,
}

/// What one generation stream keeps: the KV caches (`[1, Hkv, ctx, hd]` per layer) and
/// the rotary tables for positions `0..ctx`.
#[derive(Debug)]
pub struct LlamaState {
    /// The KV caches.
    pub cache: KvCache,
    cos: Tensor,
    sin: Tensor,
}

impl LlamaState {
    /// Positions filled so far.
    pub fn len(&self) -> usize {
        self.cache.len
    }

    /// Whether nothing has been run yet.
    pub fn is_empty(&self) -> bool {
        self.cache.len == 0
    }

    /// Positions the caches hold (`--ctx-size`).
    pub fn capacity(&self) -> usize {
        self.cache.capacity
    }

    /// Forgets the cached positions, keeping the allocation.
    pub fn clear(&mut self) {
        self.cache.clear();
    }
}

impl LlamaModel {
    /// A state whose caches hold `ctx_size` positions (1 ..= the model's context length),
    /// allocated once.
    pub fn new_state(&self, b: &dyn ComputeBackend, ctx_size: usize) -> Result<LlamaState> {
        let cfg = &self.config;
        if ctx_size == 0 || ctx_size > cfg.context_length {
            return Err(Error::value(
                "LlamaModel::new_state",
                "context size",
                format!("1..={} (the model's context length)", cfg.context_length),
                ctx_size,
            ));
        }
        // K and V for every layer (f32) plus the cos and sin tables: all sized by the
        // file's dimensions and the requested context, so checked before allocating.
        let half = cfg.head_dim / 2;
        let need = (cfg.n_layers as u128) * 2 * (cfg.kv_dim() as u128) * (ctx_size as u128) * 4
            + 2 * (ctx_size as u128) * (half as u128) * 4;
        let too_big = |limit: String| {
            Error::value(
                "LlamaModel::new_state",
                "context size",
                format!(
                    "a KV cache that fits {limit} ({} layers × 2 × {} kv dims × f32 per position)",
                    cfg.n_layers,
                    cfg.kv_dim()
                ),
                format!("{ctx_size} positions needing {need} bytes"),
            )
        };
        if need > isize::MAX as u128 {
            return Err(too_big("in memory".into()));
        }
        if let Some(total) = physical_memory().filter(|&t| need > u128::from(t)) {
            return Err(too_big(format!("in this machine's {total} bytes of memory")));
        }
        let cache = KvCache::new(b, cfg.n_layers, cfg.n_kv_heads, cfg.head_dim, ctx_size)?;
        let freqs = cfg.rope_frequencies();
        let table = || -> Result<Vec<f32>> {
            let mut v = Vec::new();
            v.try_reserve_exact(ctx_size * half).map_err(|_| too_big("in memory".into()))?;
            Ok(v)
        };
        let mut cos = table()?;
        let mut sin = table()?;
        for p in 0..ctx_size {
            for f in &freqs {
                let angle = p as f64 * f;
                cos.push(angle.cos() as f32);
                sin.push(angle.sin() as f32);
            }
        }
        let cos = b.upload(&Tensor::from_vec(cos, [ctx_size, half])?)?;
        let sin = b.upload(&Tensor::from_vec(sin, [ctx_size, half])?)?;
        Ok(LlamaState { cache, cos, sin })
    }

    /// Runs `ids` at positions `state.len() ..`, appending their keys and values to the
    /// caches; returns the logits of the last position `[vocab]` (f32, host).
    pub fn forward(&self, b: &dyn ComputeBackend, ids: &[u32], state: &mut LlamaState) -> Result<Vec<f32>> {
        let h = self.forward_hidden(b, ids, state)?;
        let t = ids.len();
        let last = b.slice_rows(&h.reshape([t, self.config.d_model])?, t - 1, 1)?;
        let logits = self.head.forward(b, &last)?;
        b.to_host(&logits)?.to_vec::<f32>()
    }

    /// As [`forward`](Self::forward) but returns the logits of every new position `[T, vocab]`.
    pub fn forward_all(&self, b: &dyn ComputeBackend, ids: &[u32], state: &mut LlamaState) -> Result<Tensor> {
        let h = self.forward_hidden(b, ids, state)?;
        let logits = self.head.forward(b, &h.reshape([ids.len(), self.config.d_model])?)?;
        b.to_host(&logits)
    }

    /// The final-normed hidden states `[1, T, D]` of `ids` at positions `state.len() ..`.
    fn forward_hidden(&self, b: &dyn ComputeBackend, ids: &[u32], state: &mut LlamaState) -> Result<Tensor> {
        const OP: &str = "LlamaModel::forward";
        let cfg = &self.config;
        let (t, pos) = (ids.len(), state.len());
        if t == 0 {
            return Err(Error::value(OP, "tokens", "at least one", 0));
        }
        if pos + t > state.capacity() {
            return Err(Error::value(
                OP,
                "context",
                format!("at most {} positions (--ctx-size)", state.capacity()),
                format!("{pos} cached + {t} new"),
            ));
        }
        if let Some(&bad) = ids.iter().find(|&&id| id as usize >= cfg.vocab_size) {
            return Err(Error::value(OP, "token id", format!("< vocab size {}", cfg.vocab_size), bad));
        }
        let scale = 1.0 / (cfg.head_dim as f32).sqrt();
        let ids_t = b.upload(&Tensor::from_vec(ids.to_vec(), [1, t])?)?;
        let mut x = self.embed.forward(b, &ids_t)?;
        if x.dtype() != DType::F32 {
            x = b.cast(&x, DType::F32)?;
        }
        let first_norm = self.layers.first().map_or(&self.norm_f, |l| &l.attn_norm);
        let mut h = b.rms_norm(&x, first_norm, cfg.norm_eps)?.output;
        for (l, layer) in self.layers.iter().enumerate() {
            // Attention: q, k, v projections, rotary positions, cache writes.
            let [q, k, v]: [Tensor; 3] = layer
                .qkv
                .forward(b, &h)?
                .try_into()
                .map_err(|_| Error::value(OP, "q/k/v projections", "three", "another count"))?;
            let q = b.split_heads(&q, cfg.n_heads)?;
            let k = b.split_heads(&k, cfg.n_kv_heads)?;
            let v = b.split_heads(&v, cfg.n_kv_heads)?;
            let q = b.rope(&q, &state.cos, &state.sin, cfg.rope_style, pos)?;
            let k = b.rope(&k, &state.cos, &state.sin, cfg.rope_style, pos)?;
            b.write_head_cache(&mut state.cache.k[l], &k, pos)?;
            b.write_head_cache(&mut state.cache.v[l], &v, pos)?;
            let attn = if pos == 0 {
                // Prefill: the whole prompt in one fused causal pass.
                b.causal_attention(&q, &k, &v, None, scale)?.output
            } else {
                b.decode_attention(&q, &state.cache.k[l], &state.cache.v[l], pos + t, None, scale)?
            };
            let o = layer.wo.forward(b, &b.merge_heads(&attn)?)?;
            // MLP: x += down(silu(gate(h2)) · up(h2)), h2 = rms_norm(x + o).
            let (x_mid, n2) = b.add_rms_norm(&x, &o, &layer.ffn_norm, cfg.norm_eps)?;
            let [gate, up]: [Tensor; 2] = layer
                .gate_up
                .forward(b, &n2.output)?
                .try_into()
                .map_err(|_| Error::value(OP, "gate/up projections", "two", "another count"))?;
            let act = b.silu_mul(&gate, &up)?;
            let down = layer.w_down.forward(b, &act)?;
            // The next block's input norm (or the final norm) fused with the residual add.
            let next_norm = self.layers.get(l + 1).map_or(&self.norm_f, |n| &n.attn_norm);
            let (x_out, n_next) = b.add_rms_norm(&x_mid, &down, next_norm, cfg.norm_eps)?;
            x = x_out;
            h = n_next.output;
        }
        state.cache.len = pos + t;
        Ok(h)
    }
}

/// Physical memory in bytes (`MemTotal` of `/proc/meminfo`), where the system says.
fn physical_memory() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}
