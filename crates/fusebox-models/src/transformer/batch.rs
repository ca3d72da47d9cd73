//! The batched decode step: one token for each of `N` sequences, each with its own KV
//! cache at its own position, in one forward pass (a server's continuous batching).
//!
//! The `N` rows go through every linear layer together (`M = N`: each weight is read
//! once per step for all sequences), and through attention with
//! `batched_decode_attention`, each row over its own cache and length.
//!
//! Bit-identity with a sequence run alone: every op here is row-wise (norms,
//! activations, rope, attention per sequence), and the CPU kernels for block-quantized
//! weights give each row of x the bits it gets alone, for up to 16 rows. A step of one
//! sequence is therefore the single-sequence path itself (`forward_cached`), and on the
//! CPU each row of a batch of up to 16 has the bits of that sequence stepped alone
//! (`tests/forward_batch.rs` checks it on SmolLM2). Dense weights go through gemm, whose
//! blocking depends on the row count: rows agree to rounding, not bit for bit.

use fusebox::{ComputeBackend, DType, Error, GeluForm, NormOutput, Result, Tensor};

use super::arch::{Mlp, Positions};
use super::{KvCache, Transformer};

impl Transformer {
    /// Runs one new token per sequence, `ids[i]` at position `caches[i].len` of its own
    /// cache, appending its key and value there; returns each sequence's logits `[V]`
    /// (f32, host). The caches may differ in length (ragged) and capacity.
    ///
    /// # Shapes
    /// `ids`: N tokens, `caches`: N caches with `len < capacity` → N × `[V]`.
    pub fn forward_batch(
        &self,
        b: &dyn ComputeBackend,
        ids: &[u32],
        caches: &mut [&mut KvCache],
    ) -> Result<Vec<Vec<f32>>> {
        const OP: &str = "Transformer::forward_batch";
        let n = ids.len();
        if n == 0 {
            return Err(Error::value(OP, "tokens", "at least one sequence", 0));
        }
        if caches.len() != n {
            return Err(Error::value(OP, "caches", format!("one per token ({n})"), caches.len()));
        }
        if self.lora.is_some() {
            return Err(Error::unsupported(
                OP,
                "LoRA adapters are attached: merge them first (Transformer::merge_lora)",
            ));
        }
        for (i, c) in caches.iter().enumerate() {
            if c.k.len() != self.arch.n_layers || c.v.len() != self.arch.n_layers {
                return Err(Error::value(
                    OP,
                    format!("cache {i}"),
                    format!("{} layers", self.arch.n_layers),
                    c.k.len(),
                ));
            }
            if c.len >= c.capacity {
                return Err(Error::value(
                    OP,
                    format!("cache {i}"),
                    format!("room for one more position (capacity {}, --ctx-size)", c.capacity),
                    format!("{} cached", c.len),
                ));
            }
        }
        if let Some(&bad) = ids.iter().find(|&&id| id as usize >= self.arch.vocab_size) {
            return Err(Error::value(OP, "token id", format!("< vocab size {}", self.arch.vocab_size), bad));
        }
        if let [cache] = caches {
            // One sequence: the single-sequence path, the same bits (see the module docs).
            return Ok(vec![self.forward_cached(b, ids, cache)?]);
        }
        let positions: Vec<usize> = caches.iter().map(|c| c.len).collect();
        let d = self.arch.d_model;
        // `[N, 1, D]`: the sequences as a batch of one-token rows.
        let ids_t = b.upload(&Tensor::from_vec(ids.to_vec(), [n, 1])?)?;
        let mut x = b.embedding(&ids_t, self.p(self.index.embed))?;
        if x.dtype() != DType::F32 {
            x = b.cast(&x, DType::F32)?;
        }
        if self.arch.embed_scale != 1.0 {
            x = b.mul_scalar(&x, self.arch.embed_scale)?;
        }
        if let Some(wpe) = self.index.pos_embed {
            let pos = b.index_select(self.p(wpe), &position_ids(b, &positions)?)?;
            x = b.add(&x, &pos.reshape([n, 1, d])?)?;
        }
        let first = self.index.layers.first().map_or(self.index.norm_f, |l| l.norm1);
        let mut h = self.norm(b, &x, first)?;
        let mut tables: Vec<(*const Tensor, Tensor, Tensor)> = Vec::new();
        for l in 0..self.arch.n_layers {
            (x, h) = self.batch_block(b, l, x, h, caches, &positions, &mut tables)?;
        }
        for c in caches.iter_mut() {
            c.len += 1;
        }
        let logits = self.linear(b, &h.output.reshape([n, d])?, self.index.head_weight(), None)?;
        let logits = b.to_host(&logits)?.to_vec::<f32>()?;
        let v = logits.len() / n;
        Ok(logits.chunks_exact(v).map(<[f32]>::to_vec).collect())
    }

    /// One decoder block over `x` `[N, 1, D]` with `h = norm1(x)`: the N rows' queries,
    /// keys and values, each key and value written into its own cache at its own
    /// position, attention per sequence, then the MLP over all rows. Returns the block
    /// output and the next norm of it.
    #[allow(clippy::type_complexity)]
    fn batch_block(
        &self,
        b: &dyn ComputeBackend,
        l: usize,
        x: Tensor,
        h: NormOutput,
        caches: &mut [&mut KvCache],
        positions: &[usize],
        tables: &mut Vec<(*const Tensor, Tensor, Tensor)>,
    ) -> Result<(Tensor, NormOutput)> {
        const OP: &str = "Transformer::forward_batch";
        let arch = &self.arch;
        let li = &self.index.layers[l];
        let n = positions.len();
        let [q, k, v]: [Tensor; 3] = self
            .base_proj(b, &h.output, &li.qkv)?
            .try_into()
            .map_err(|_| Error::value(OP, "q/k/v projections", "three", "another count"))?;
        // The N rows as the positions of one sequence, `[1, H, N, hd]`: rope then reads
        // row i's angle from row i of a gathered table.
        let heads = |t: &Tensor, h: usize| b.split_heads(&t.reshape([1, n, t.dims()[2]])?, h);
        let mut q = heads(&q, arch.n_heads)?;
        let mut k = heads(&k, arch.n_kv_heads)?;
        let v = heads(&v, arch.n_kv_heads)?;
        if let (Some(qn), Some(kn)) = (li.q_norm, li.k_norm) {
            q = b.rms_norm(&q, self.p(qn), arch.norm_eps)?.output;
            k = b.rms_norm(&k, self.p(kn), arch.norm_eps)?.output;
        }
        if arch.positions == Positions::Rope {
            // Rows `positions` of this layer's tables (global or local), gathered once per
            // table and step.
            let (cos, sin) = caches[0].rope.of(l)?;
            let key: *const Tensor = cos;
            if !tables.iter().any(|t| t.0 == key) {
                let ids = position_ids(b, positions)?;
                let mut gathered = Vec::with_capacity(2);
                for (i, base) in [cos, sin].into_iter().enumerate() {
                    // Every cache holds the same angles; a position past the first cache's
                    // table is read from its own cache's.
                    let rows: Result<Vec<Tensor>> = if positions.iter().all(|&p| p < base.dims()[0]) {
                        Ok(vec![b.index_select(base, &ids)?])
                    } else {
                        caches
                            .iter()
                            .zip(positions)
                            .map(|(c, &p)| {
                                let (cc, cs) = c.rope.of(l)?;
                                b.slice_rows(if i == 0 { cc } else { cs }, p, 1)
                            })
                            .collect()
                    };
                    let mut rows = rows?;
                    gathered.push(if rows.len() == 1 { rows.swap_remove(0) } else { b.concat(&rows, 0)? });
                }
                let s = gathered.pop().ok_or_else(|| Error::value(OP, "rope tables", "two", "one"))?;
                let c = gathered.pop().ok_or_else(|| Error::value(OP, "rope tables", "two", "none"))?;
                tables.push((key, c, s));
            }
            let (_, cos_g, sin_g) = tables
                .iter()
                .find(|t| t.0 == key)
                .ok_or_else(|| Error::value(OP, "rope tables", "gathered", "none"))?;
            let style = arch.rope_of(l).style;
            q = b.rope(&q, cos_g, sin_g, style, 0)?;
            k = b.rope(&k, cos_g, sin_g, style, 0)?;
        }
        for (i, c) in caches.iter_mut().enumerate() {
            b.write_head_cache(&mut c.k[l], &b.slice(&k, 2, i, 1)?, positions[i])?;
            b.write_head_cache(&mut c.v[l], &b.slice(&v, 2, i, 1)?, positions[i])?;
        }
        // `[1, Hq, N, hd]` → `[N, Hq, 1, hd]`: one query per sequence.
        let q = b.split_heads(&b.merge_heads(&q)?.reshape([n, 1, arch.n_heads * arch.head_dim])?, arch.n_heads)?;
        let lens: Vec<usize> = positions.iter().map(|p| p + 1).collect();
        let attn = {
            let kc: Vec<&Tensor> = caches.iter().map(|c| &c.k[l]).collect();
            let vc: Vec<&Tensor> = caches.iter().map(|c| &c.v[l]).collect();
            b.batched_decode_attention(&q, &kc, &vc, &lens, arch.window(l), arch.attn_scale)?
        };
        let merged = b.merge_heads(&attn)?;
        let mut o = self.base_proj(b, &merged, &li.o)?.remove(0);
        if let Some(nrm) = li.post_attn_norm {
            o = self.norm(b, &o, nrm)?.output;
        }
        let (x_mid, norm2) = self.add_norm(b, &x, &o, li.norm2)?;
        let up = self.base_proj(b, &norm2.output, &li.up)?;
        let act = match (arch.mlp, up.as_slice()) {
            (Mlp::Gelu, [fc]) => b.gelu(fc, GeluForm::Tanh)?,
            (Mlp::SwiGlu, [gate, up]) => b.silu_mul(gate, up)?,
            (Mlp::GeGlu, [gate, up]) => b.mul(&b.gelu(gate, GeluForm::Tanh)?, up)?,
            _ => return Err(Error::value(OP, "MLP projections", "one (gelu) or two (gated)", up.len())),
        };
        let mut m = self.base_proj(b, &act, &li.down)?.remove(0);
        if let Some(nrm) = li.post_mlp_norm {
            m = self.norm(b, &m, nrm)?.output;
        }
        let next = self.index.layers.get(l + 1).map_or(self.index.norm_f, |nx| nx.norm1);
        self.add_norm(b, &x_mid, &m, next)
    }
}

/// Positions as a `[N]` U32 tensor on `b`.
fn position_ids(b: &dyn ComputeBackend, positions: &[usize]) -> Result<Tensor> {
    let ids: Vec<u32> = positions
        .iter()
        .map(|&p| u32::try_from(p).map_err(|_| Error::value("Transformer::forward_batch", "position", "< 2³²", p)))
        .collect::<Result<_>>()?;
    b.upload(&Tensor::from_vec(ids, [positions.len()])?)
}
