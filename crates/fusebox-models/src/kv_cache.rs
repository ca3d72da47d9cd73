//! Inference through a preallocated KV cache: the prompt goes through the fused causal
//! attention in one batched pass, each new token through `decode_attention`, which
//! reads the caches in place.

use fusebox::{ComputeBackend, DType, Error, GeluForm, Result, RopeStyle, Shape, Tensor};

use crate::model::Model;

/// Per-layer key and value caches `[1, Hkv, capacity, hd]` and how much is filled.
#[derive(Debug)]
pub struct KvCache {
    /// Keys per layer, `[1, Hkv, capacity, hd]`.
    pub k: Vec<Tensor>,
    /// Values per layer, `[1, Hkv, capacity, hd]`.
    pub v: Vec<Tensor>,
    /// Positions filled so far.
    pub len: usize,
    /// Positions the caches hold.
    pub capacity: usize,
}

impl KvCache {
    /// Zeroed caches for `layers` layers.
    pub fn new(
        backend: &dyn ComputeBackend,
        layers: usize,
        kv_heads: usize,
        head_dim: usize,
        capacity: usize,
    ) -> Result<KvCache> {
        let shape = Shape::new([1, kv_heads, capacity, head_dim]);
        let alloc = || -> Result<Vec<Tensor>> { (0..layers).map(|_| backend.zeros(&shape, DType::F32)).collect() };
        Ok(KvCache { k: alloc()?, v: alloc()?, len: 0, capacity })
    }

    /// Forgets the cached positions (keeps the allocation).
    pub fn clear(&mut self) {
        self.len = 0;
    }
}

impl Model {
    /// A cache able to hold `capacity` positions (at most the model's `max_seq`).
    pub fn new_cache(&self, backend: &dyn ComputeBackend, capacity: usize) -> Result<KvCache> {
        let cfg = &self.config;
        if capacity == 0 || capacity > cfg.max_seq {
            return Err(Error::value("Model::new_cache", "capacity", format!("1..={}", cfg.max_seq), capacity));
        }
        KvCache::new(backend, cfg.n_layers, cfg.n_kv_heads, cfg.head_dim(), capacity)
    }

    /// Runs `ids` `[1, T]` at positions `cache.len..cache.len+T`, appending their keys and
    /// values to the cache; returns the logits of the last position `[V]` (f32, host).
    pub fn forward_cached(&self, b: &dyn ComputeBackend, ids: &[u32], cache: &mut KvCache) -> Result<Vec<f32>> {
        let cfg = &self.config;
        let (t, pos) = (ids.len(), cache.len);
        if t == 0 {
            return Err(Error::value("Model::forward_cached", "tokens", "at least one", 0));
        }
        if pos + t > cache.capacity {
            return Err(Error::value(
                "Model::forward_cached",
                "context",
                format!("at most {} positions (the cache size)", cache.capacity),
                format!("{} cached + {t} new", pos),
            ));
        }
        let scale = 1.0 / (cfg.head_dim() as f32).sqrt();
        let ids_t = b.upload(&Tensor::from_vec(ids.to_vec(), [1, t])?)?;
        let mut x = self.embed_at(b, &ids_t, pos)?;
        for (l, li) in self.index.layers.iter().enumerate() {
            let p = |i: usize| &self.params.tensors[i];
            let opt = |i: Option<usize>| i.map(|i| &self.params.tensors[i]);
            let h = self.norm_at(b, &x, li.norm1_w, li.norm1_b)?;
            let q = b.split_heads(&b.linear_forward(&h, p(li.wq), opt(li.bq))?, cfg.n_heads)?;
            let k = b.split_heads(&b.linear_forward(&h, p(li.wk), opt(li.bk))?, cfg.n_kv_heads)?;
            let v = b.split_heads(&b.linear_forward(&h, p(li.wv), opt(li.bv))?, cfg.n_kv_heads)?;
            let (q, k) = match self.rope_tables() {
                Some((cos, sin)) => {
                    (b.rope(&q, cos, sin, RopeStyle::HalfSplit, pos)?, b.rope(&k, cos, sin, RopeStyle::HalfSplit, pos)?)
                }
                None => (q, k),
            };
            b.write_head_cache(&mut cache.k[l], &k, pos)?;
            b.write_head_cache(&mut cache.v[l], &v, pos)?;
            let attn = if pos == 0 {
                // Prefill: one batched pass through the fused causal attention.
                b.causal_attention(&q, &k, &v, None, scale)?.output
            } else {
                b.decode_attention(&q, &cache.k[l], &cache.v[l], pos + t, None, scale)?
            };
            let o = b.linear_forward(&b.merge_heads(&attn)?, p(li.wo), opt(li.bo))?;
            let x_mid = b.add(&x, &o)?;
            let h2 = self.norm_at(b, &x_mid, li.norm2_w, li.norm2_b)?;
            let pre = b.linear_forward(&h2, p(li.w_in), opt(li.b_in))?;
            let act = match li.w_up {
                Some(w_up) => b.silu_mul(&pre, &b.linear_forward(&h2, p(w_up), None)?)?,
                None => b.gelu(&pre, GeluForm::Tanh)?,
            };
            x = b.add(&x_mid, &b.linear_forward(&act, p(li.w_out), opt(li.b_out))?)?;
        }
        cache.len = pos + t;
        let last = b.slice_rows(&x.reshape([t, cfg.d_model])?, t - 1, 1)?;
        let hf = self.norm_at(b, &last, self.index.norm_f_w, self.index.norm_f_b)?;
        let logits = b.linear_forward(&hf, self.head_weight(), None)?;
        b.to_host(&logits)?.to_vec::<f32>()
    }
}
