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

use fusebox::{ComputeBackend, DType, Error, Result, Shape, Tensor};

use super::optimizer::{check_finite, clip_factor, hyper};
use super::{TrainConfig, Update};
use crate::checkpoint;
use crate::comm::{Communicator, ReduceOp};
use crate::data_parallel::shard::{all_gather_params, read_range, Piece, ShardLayout};
use crate::params::{ParamSet, ParamSpec};

/// Where this rank's averaged gradient lives after the reduce-scatter.
#[derive(Debug, Clone, Copy)]
pub enum GradShard<'a> {
    /// In this rank's piece of the whole gradient buffer (`--zero 1`).
    InPlace(&'a ParamSet),
    /// In the optimizer's own buffer of this rank's piece, the whole one freed (`--zero 2`,
    /// see [`ShardedAdamW::keep_gradient_piece`]).
    Kept,
}

/// AdamW over this rank's piece of the trained tensors (see the module docs).
#[derive(Debug)]
pub struct ShardedAdamW {
    layout: ShardLayout,
    rank: usize,
    /// This rank's range as parts of tensors ([`ShardLayout::pieces`]), with their `m`
    /// and `v`.
    chunks: Vec<(Piece, Tensor, Tensor)>,
    /// Under `--zero 2`, this rank's piece of the averaged gradient (flat), from the
    /// reduce-scatter to the end of the update.
    grad_piece: Option<Tensor>,
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
        for p in layout.pieces(mine.clone(), usize::MAX) {
            let at = p.flat - mine.start;
            let tensor = |x: &[f32]| b.upload(&Tensor::from_slice(&x[at..at + p.len], [p.len])?);
            chunks.push((p, tensor(&m)?, tensor(&v)?));
        }
        Ok(ShardedAdamW { layout, rank, chunks, grad_piece: None })
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

    /// Copies this rank's piece of the averaged gradient `grads` into a buffer of the
    /// optimizer's, so that the whole buffer can be freed before the update, which then
    /// reads [`GradShard::Kept`] and frees the piece too (`--zero 2`: between steps a rank
    /// holds no gradient, and the piece never adds to the backward's peak).
    pub fn keep_gradient_piece(&mut self, b: &dyn ComputeBackend, grads: &ParamSet) -> Result<()> {
        let mine = self.layout.range(self.rank);
        let piece = self.grad_piece.insert(b.zeros(&Shape::new([mine.len()]), DType::F32)?);
        for (p, _, _) in &self.chunks {
            let from = grads.tensors[p.tensor].view(p.offset, [p.len])?;
            piece.with_window_mut(p.flat - mine.start, [p.len], |to| b.copy_into(to, &from))?;
        }
        Ok(())
    }

    /// Optimizer step `step` (from 1) on every rank of `comm` together: this rank's piece
    /// of `params` (laid out as `specs`) is updated in place with its averaged gradient
    /// `grads` after a mean loss of `loss`, then every rank's pieces are gathered into
    /// `params` (see the module docs and [`AdamW::update`](super::AdamW::update), whose
    /// steps these are).
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
        // Views of the gradient's pieces, where they lie (no copy).
        let grad_views = self
            .chunks
            .iter()
            .map(|(p, _, _)| match grads {
                GradShard::InPlace(set) => set.tensors[p.tensor].view(p.offset, [p.len]),
                GradShard::Kept => match &self.grad_piece {
                    Some(t) => t.view(p.flat - mine.start, [p.len]),
                    None => Err(Error::value("ShardedAdamW::update", "gradient piece", "kept", "none")),
                },
            })
            .collect::<Result<Vec<Tensor>>>()?;
        // ‖g‖² of this piece (summed in f64 by the backend), then over the ranks.
        let piece_norm = if grad_views.is_empty() { 0.0 } else { b.global_norm(&grad_views)? as f64 };
        let mut total = [(piece_norm * piece_norm) as f32];
        comm.all_reduce(&mut total, ReduceOp::Sum)?;
        let grad_norm = (total[0] as f64).sqrt() as f32;
        check_finite(step, loss, grad_norm)?;
        let (clip, lr) = (clip_factor(b, config, grad_norm)?, config.lr_at(step));
        for ((p, m, v), grad) in self.chunks.iter_mut().zip(&grad_views) {
            let hyper = hyper(config, &specs[p.tensor], lr, clip);
            params.tensors[p.tensor]
                .with_window_mut(p.offset, [p.len], |param| b.adamw_update(param, grad, m, v, &hyper, step))?;
        }
        // The kept piece is spent (its views first).
        drop(grad_views);
        self.grad_piece = None;
        all_gather_params(b, comm, &self.layout, params)?;
        Ok(Update { grad_norm, lr })
    }
}
