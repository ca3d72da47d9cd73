//! ZeRO-sharded AdamW ([`ShardedAdamW`]): each rank keeps the two moments of its own
//! consecutive piece of the trained tensors (flattened in spec order, see
//! [`ShardLayout`]) and updates only that piece of the parameters; an all-gather then gives
//! every rank the whole updated parameters. The moments per rank are `1/world_size` of
//! plain AdamW's. Parameters are f32 and are themselves the master weights, so there is no
//! separate master copy to shard.
//!
//! The step is plain AdamW's: the global norm is `sqrt(Σ_ranks Σ_piece g²)` (each rank's sum
//! of squares all-reduced), so clipping and the non-finite guard see every gradient; the
//! update of an element depends on that element alone, so updating pieces gives what
//! updating whole tensors gives.

use fusebox::{ComputeBackend, Result, Tensor};

use super::optimizer::{check_finite, clip_factor, hyper};
use super::{TrainConfig, Update};
use crate::checkpoint;
use crate::comm::{Communicator, ReduceOp};
use crate::data_parallel::shard::{all_gather_params, read_range, write_range, Piece, ShardLayout};
use crate::params::{ParamSet, ParamSpec};

/// Elements per moment tensor (and per update call): 4 MiB of f32, so the update's
/// temporary copies of a parameter piece and its gradient stay small.
const CHUNK: usize = 1 << 20;

/// Where this rank's averaged gradient lives after the reduce-scatter.
#[derive(Debug, Clone, Copy)]
pub enum GradShard<'a> {
    /// In this rank's piece of the whole gradient buffer (`--zero 1`).
    InPlace(&'a ParamSet),
    /// In a buffer of this rank's piece only, the whole one freed (`--zero 2`).
    Flat(&'a [f32]),
}

/// AdamW over this rank's piece of the trained tensors (see the module docs).
#[derive(Debug)]
pub struct ShardedAdamW {
    layout: ShardLayout,
    rank: usize,
    /// This rank's range in pieces of at most [`CHUNK`] elements, with their `m` and `v`.
    chunks: Vec<(Piece, Tensor, Tensor)>,
}

impl ShardedAdamW {
    /// Zero moments of rank `rank`'s piece of `layout` (a fresh run).
    pub fn zeros(b: &dyn ComputeBackend, layout: ShardLayout, rank: usize) -> Result<ShardedAdamW> {
        let n = layout.range(rank).len();
        ShardedAdamW::from_values(b, layout, rank, vec![0.0; n], vec![0.0; n])
    }

    /// The moments of rank `rank`'s piece of `layout`, read from checkpoint directory `dir`
    /// (sharded at any world size, or whole).
    pub fn load(
        b: &dyn ComputeBackend,
        dir: &std::path::Path,
        specs: &[ParamSpec],
        layout: ShardLayout,
        rank: usize,
    ) -> Result<ShardedAdamW> {
        let (m, v) = checkpoint::load_moment_range(dir, specs, layout.range(rank))?;
        ShardedAdamW::from_values(b, layout, rank, m, v)
    }

    fn from_values(
        b: &dyn ComputeBackend,
        layout: ShardLayout,
        rank: usize,
        m: Vec<f32>,
        v: Vec<f32>,
    ) -> Result<ShardedAdamW> {
        let mine = layout.range(rank);
        let mut chunks = Vec::new();
        for p in layout.pieces(mine.clone(), CHUNK) {
            let at = p.flat - mine.start;
            let tensor = |x: &[f32]| b.upload(&Tensor::from_slice(&x[at..at + p.len], [p.len])?);
            chunks.push((p, tensor(&m)?, tensor(&v)?));
        }
        Ok(ShardedAdamW { layout, rank, chunks })
    }

    /// The cut of the trained tensors over the ranks.
    pub fn layout(&self) -> &ShardLayout {
        &self.layout
    }

    /// Bytes the two moments of this rank's piece hold.
    pub fn byte_len(&self) -> u64 {
        self.chunks.iter().map(|(_, m, v)| (m.byte_len() + v.byte_len()) as u64).sum()
    }

    /// `(m, v)` of this rank's piece, flat, as a sharded checkpoint writes them.
    pub fn values(&self, b: &dyn ComputeBackend) -> Result<(Vec<f32>, Vec<f32>)> {
        let n = self.layout.range(self.rank).len();
        let (mut m, mut v) = (Vec::with_capacity(n), Vec::with_capacity(n));
        for (_, cm, cv) in &self.chunks {
            m.extend(read_range(b, cm, 0..cm.elem_count())?);
            v.extend(read_range(b, cv, 0..cv.elem_count())?);
        }
        Ok((m, v))
    }

    /// Optimizer step `step` (from 1) on every rank of `comm` together: this rank's piece
    /// of `params` (laid out as `specs`) is updated with its averaged gradient `grads` after
    /// a mean loss of `loss`, then every rank's pieces are gathered (see the module docs and
    /// [`AdamW::update`](super::AdamW::update), whose steps these are).
    #[allow(clippy::too_many_arguments)]
    pub fn update(
        &mut self,
        b: &dyn ComputeBackend,
        comm: &dyn Communicator,
        config: &TrainConfig,
        step: u64,
        loss: f32,
        specs: &[ParamSpec],
        params: &mut ParamSet,
        grads: GradShard<'_>,
    ) -> Result<Update> {
        let mine = self.layout.range(self.rank);
        let grad_of = |p: &Piece| -> Result<Vec<f32>> {
            match grads {
                GradShard::InPlace(set) => read_range(b, &set.tensors[p.tensor], p.offset..p.offset + p.len),
                GradShard::Flat(flat) => Ok(flat[p.flat - mine.start..p.flat - mine.start + p.len].to_vec()),
            }
        };
        // ‖g‖² of this piece in f64 (as the whole-tensor norm sums), then over the ranks.
        let mut sum_squares = 0.0f64;
        for (p, _, _) in &self.chunks {
            sum_squares += grad_of(p)?.iter().map(|&g| (g as f64) * (g as f64)).sum::<f64>();
        }
        let mut total = [sum_squares as f32];
        comm.all_reduce(&mut total, ReduceOp::Sum)?;
        let grad_norm = (total[0] as f64).sqrt() as f32;
        check_finite(step, loss, grad_norm)?;
        let (clip, lr) = (clip_factor(b, config, grad_norm)?, config.lr_at(step));
        for (p, m, v) in &mut self.chunks {
            let t = &mut params.tensors[p.tensor];
            let mut param = b.upload(&Tensor::from_slice(&read_range(b, t, p.offset..p.offset + p.len)?, [p.len])?)?;
            let grad = b.upload(&Tensor::from_slice(&grad_of(p)?, [p.len])?)?;
            b.adamw_update(&mut param, &grad, m, v, &hyper(config, &specs[p.tensor], lr, clip), step)?;
            write_range(b, t, p.offset, &read_range(b, &param, 0..p.len)?)?;
        }
        all_gather_params(b, comm, &self.layout, params)?;
        Ok(Update { grad_norm, lr })
    }
}
