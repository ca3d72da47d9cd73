//! The batched decode step: one token for each of `N` sequences, each with its own KV
//! cache at its own position, in one forward pass (a server's continuous batching),
//! through the same [`block`](super::block) as every other pass ([`Pass::Batch`]).
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

use fusebox::{ComputeBackend, Error, Result, Tensor};

use super::pass::Pass;
use super::stage::{StageInput, StageOutput};
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
        self.check_whole(OP)?;
        self.prepare_batch(OP, b, n, caches)?;
        self.check_vocab(OP, ids)?;
        if let [cache] = caches {
            // One sequence: the single-sequence path, the same bits (see the module docs).
            return Ok(vec![self.forward_cached(b, ids, cache)?]);
        }
        let positions: Vec<usize> = caches.iter().map(|c| c.len).collect();
        // `[N, 1]`: the sequences as a batch of one-token rows.
        let ids_t = b.upload(&Tensor::from_vec(ids.to_vec(), [n, 1])?)?;
        let mut rope_rows = [None, None];
        let h = {
            let mut pass = Pass::Batch { caches: &mut *caches, positions: &positions, rope: &mut rope_rows };
            let x = self.embed(b, &ids_t, &pass)?;
            self.blocks(b, x, &mut pass)?.1
        };
        for c in caches.iter_mut() {
            c.len += 1;
        }
        let logits = self.logits_to_host(b, &h.output)?.to_vec::<f32>()?;
        let v = logits.len() / n;
        Ok(logits.chunks_exact(v).map(<[f32]>::to_vec).collect())
    }

    /// A pipeline stage's batched decode step: one new position for each of `N`
    /// sequences, each at the end of its own cache, through this stage's blocks. The
    /// first stage takes `N` token ids, later ones the previous stage's `x` and `h`
    /// `[N, 1, D]`; returns this stage's `x` and `h` `[N, 1, D]` (the last stage's `h`
    /// is final-normed: [`stage_logits`](Self::stage_logits) of it with `all` gives each
    /// sequence's logits). A batch of one is [`forward_stage`](Self::forward_stage), as
    /// [`forward_batch`](Self::forward_batch) is `forward_cached`: the same bits.
    ///
    /// # Shapes
    /// `Tokens`: N ids, or `Hidden`: `x`, `h` `[N, 1, D]` f32; `caches`: N caches with
    /// `len < capacity` → `x`, `h` `[N, 1, D]`.
    pub fn forward_batch_stage(
        &self,
        b: &dyn ComputeBackend,
        input: StageInput<'_>,
        caches: &mut [&mut KvCache],
    ) -> Result<StageOutput> {
        const OP: &str = "Transformer::forward_batch_stage";
        let n = match &input {
            StageInput::Tokens(ids) => ids.len(),
            StageInput::Hidden { x, .. } => x.dims().first().copied().unwrap_or(0),
        };
        if n == 0 {
            return Err(Error::value(OP, "sequences", "at least one", 0));
        }
        self.prepare_batch(OP, b, n, caches)?;
        if let [cache] = caches {
            let input = match input {
                StageInput::Hidden { x, h } if x.rank() == 3 && h.rank() == 3 => {
                    let d = self.arch.d_model;
                    StageInput::Hidden { x: x.reshape([1, 1, d])?, h: h.reshape([1, 1, d])? }
                }
                other => other,
            };
            let out = self.forward_stage(b, input, cache)?;
            let d = self.arch.d_model;
            return Ok(StageOutput { x: out.x.reshape([1, 1, d])?, h: out.h.reshape([1, 1, d])? });
        }
        let positions: Vec<usize> = caches.iter().map(|c| c.len).collect();
        let mut rope_rows = [None, None];
        let (x, h) = {
            let mut pass = Pass::Batch { caches: &mut *caches, positions: &positions, rope: &mut rope_rows };
            let (x, h) = self.stage_entry(OP, b, input, [n, 1], &pass)?;
            self.stage_blocks(b, x, h, &mut pass)?
        };
        for c in caches.iter_mut() {
            c.len += 1;
        }
        Ok(StageOutput { x, h: h.output })
    }

    /// The checks of a batched decode step: `n` caches of every layer, each with room for
    /// one more position, and no LoRA adapters attached; then backs that position.
    fn prepare_batch(
        &self,
        op: &'static str,
        b: &dyn ComputeBackend,
        n: usize,
        caches: &mut [&mut KvCache],
    ) -> Result<()> {
        if caches.len() != n {
            return Err(Error::value(op, "caches", format!("one per sequence ({n})"), caches.len()));
        }
        if self.lora.is_some() {
            return Err(Error::unsupported(
                op,
                "LoRA adapters are attached: merge them first (Transformer::merge_lora)",
            ));
        }
        for (i, c) in caches.iter().enumerate() {
            if c.k.len() != self.arch.n_layers || c.v.len() != self.arch.n_layers {
                return Err(Error::value(
                    op,
                    format!("cache {i}"),
                    format!("{} layers", self.arch.n_layers),
                    c.k.len(),
                ));
            }
            if c.len >= c.capacity {
                return Err(Error::value(
                    op,
                    format!("cache {i}"),
                    format!("room for one more position (capacity {}, --ctx-size)", c.capacity),
                    format!("{} cached", c.len),
                ));
            }
        }
        for c in caches.iter_mut() {
            c.reserve(b, c.len + 1)?;
        }
        Ok(())
    }
}
