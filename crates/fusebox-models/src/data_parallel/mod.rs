//! Data-parallel gradient averaging: gradients are gathered into buckets of a few MB in
//! the order the backward finishes them (last layer first) and each full bucket's
//! all-reduce is started at once, non-blocking, so it runs while the backward computes
//! the layers below — the bucketing of PyTorch DDP. [`GradSync::finish`] then waits for
//! every bucket and writes the averaged gradients back.
//!
//! The backward reports finished gradients through
//! [`Transformer::backward_with`](crate::transformer::Transformer::backward_with); every
//! rank's backward finishes them in the same order, so the buckets, and the order their
//! collectives start in, agree on every rank, as MPI requires.
//!
//! Under ZeRO ([`GradSync::sharded`], see [`shard`]) each bucket is reduce-scattered
//! instead: its values are packed grouped by the rank whose piece of the flat parameter
//! vector they fall in, and each rank receives the average of its own part only.

pub mod shard;

use fusebox::{ComputeBackend, Error, Result};

use self::shard::{read_range, write_range, ShardLayout};
use crate::comm::{Communicator, PendingAllReduce, ReduceOp};
use crate::params::ParamSet;

/// Default bucket size: big enough that per-message latency is small beside the transfer,
/// small enough that the first bucket starts early in the backward.
pub const DEFAULT_BUCKET_BYTES: usize = 4 << 20;

/// Averages the gradients of one backward over the ranks of a communicator (see the
/// module docs).
pub struct GradSync<'c> {
    comm: &'c dyn Communicator,
    /// Under ZeRO, the cut of the flat gradient over the ranks: buckets are
    /// reduce-scattered, not all-reduced.
    layout: Option<&'c ShardLayout>,
    bucket_bytes: usize,
    /// Parameters gathered for the next bucket, and their bytes.
    filling: Vec<usize>,
    filling_bytes: usize,
    /// Buckets in flight: their parameters and the reduction.
    in_flight: Vec<(Vec<usize>, Box<dyn PendingAllReduce>)>,
    /// Which parameters were reported (each exactly once per backward).
    seen: Vec<bool>,
}

impl<'c> GradSync<'c> {
    /// Buckets of at least `bucket_bytes` (a parameter larger than that is a bucket of its
    /// own) for `n_params` gradients.
    pub fn new(comm: &'c dyn Communicator, n_params: usize, bucket_bytes: usize) -> GradSync<'c> {
        GradSync {
            comm,
            layout: None,
            bucket_bytes: bucket_bytes.max(1),
            filling: Vec::new(),
            filling_bytes: 0,
            in_flight: Vec::new(),
            seen: vec![false; n_params],
        }
    }

    /// As [`new`](Self::new), but each bucket is reduce-scattered over `layout`'s pieces:
    /// [`finish`](Self::finish) writes the averages of this rank's piece only.
    pub fn sharded(comm: &'c dyn Communicator, layout: &'c ShardLayout, bucket_bytes: usize) -> GradSync<'c> {
        let n_params = layout.tensors();
        GradSync { layout: Some(layout), ..GradSync::new(comm, n_params, bucket_bytes) }
    }

    /// Records that the gradients `indices` of `grads` are final; starts the bucket's
    /// all-reduce once it holds `bucket_bytes`, and drives the reductions already in flight.
    pub fn ready(&mut self, b: &dyn ComputeBackend, grads: &ParamSet, indices: &[usize]) -> Result<()> {
        for &i in indices {
            match self.seen.get_mut(i) {
                Some(s) if !*s => *s = true,
                _ => {
                    return Err(Error::value(
                        "GradSync::ready",
                        "parameter index",
                        format!("each of 0..{} reported once", self.seen.len()),
                        i,
                    ))
                }
            }
            self.filling.push(i);
            self.filling_bytes += grads.tensors[i].elem_count() * 4;
        }
        if self.filling_bytes >= self.bucket_bytes {
            self.launch(b, grads)?;
        }
        for (_, p) in &mut self.in_flight {
            p.test()?;
        }
        Ok(())
    }

    fn launch(&mut self, b: &dyn ComputeBackend, grads: &ParamSet) -> Result<()> {
        if self.filling.is_empty() {
            return Ok(());
        }
        let ids = std::mem::take(&mut self.filling);
        self.filling_bytes = 0;
        let pending = match self.layout {
            None => {
                let tensors: Vec<_> = ids.iter().map(|&i| &grads.tensors[i]).collect();
                self.comm.start_all_reduce_tensors(b, &tensors, ReduceOp::Average)?
            }
            Some(layout) => {
                // Grouped by destination: rank 0's parts of the bucket's tensors, then rank 1's, …
                let mut buf = Vec::with_capacity(ids.iter().map(|&i| grads.tensors[i].elem_count()).sum());
                let mut counts = vec![0; layout.world()];
                for (r, count) in counts.iter_mut().enumerate() {
                    for &i in &ids {
                        let part = overlap(&layout.tensor_range(i), &layout.range(r));
                        let start = layout.tensor_range(i).start;
                        if !part.is_empty() {
                            buf.extend(read_range(b, &grads.tensors[i], part.start - start..part.end - start)?);
                            *count += part.len();
                        }
                    }
                }
                self.comm.start_reduce_scatter(buf, &counts, ReduceOp::Average)?
            }
        };
        self.in_flight.push((ids, pending));
        Ok(())
    }

    /// Starts what is left, waits for every bucket and writes the averages into `grads`
    /// (under ZeRO: into this rank's piece of them only; the rest keeps this rank's own
    /// unreduced values, which nothing reads). An error when a gradient was never reported
    /// (every rank would otherwise disagree).
    pub fn finish(mut self, b: &dyn ComputeBackend, grads: &mut ParamSet) -> Result<()> {
        if let Some(i) = self.seen.iter().position(|s| !s) {
            return Err(Error::value("GradSync::finish", "gradients reported", "every parameter", format!("not {i}")));
        }
        self.launch(b, grads)?;
        if let Some(layout) = self.layout {
            let mine = layout.range(self.comm.rank());
            for (ids, pending) in std::mem::take(&mut self.in_flight) {
                let piece = pending.wait()?;
                let mut at = 0;
                for &i in &ids {
                    let t = layout.tensor_range(i);
                    let part = overlap(&t, &mine);
                    if !part.is_empty() {
                        write_range(b, &mut grads.tensors[i], part.start - t.start, &piece[at..at + part.len()])?;
                        at += part.len();
                    }
                }
            }
            return Ok(());
        }
        for (ids, pending) in std::mem::take(&mut self.in_flight) {
            let mut outs: Vec<&mut fusebox::Tensor> = Vec::with_capacity(ids.len());
            // `ids` are distinct and in launch order; pick the tensors out in that order.
            let mut slots: Vec<Option<&mut fusebox::Tensor>> = grads.tensors.iter_mut().map(Some).collect();
            for &i in &ids {
                let t = slots[i].take().ok_or_else(|| Error::value("GradSync::finish", "bucket", "distinct", i))?;
                outs.push(t);
            }
            pending.finish(b, &mut outs)?;
        }
        Ok(())
    }

    /// Buckets started so far.
    pub fn buckets(&self) -> usize {
        self.in_flight.len()
    }
}

/// The common part of two ranges (empty when they do not meet).
fn overlap(a: &std::ops::Range<usize>, b: &std::ops::Range<usize>) -> std::ops::Range<usize> {
    let start = a.start.max(b.start);
    start..a.end.min(b.end).max(start)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::SingleProcess;
    use crate::params::{Init, ParamSpec};
    use fusebox::{CpuBackend, Shape};

    fn specs(sizes: &[usize]) -> Vec<ParamSpec> {
        sizes
            .iter()
            .enumerate()
            .map(|(i, &n)| ParamSpec { name: format!("p{i}"), shape: Shape::new([n]), init: Init::Ones, decay: false })
            .collect()
    }

    #[test]
    fn buckets_fill_to_the_size_and_every_gradient_is_reported_once() {
        let b = CpuBackend::with_threads(1).unwrap();
        let comm = SingleProcess;
        let mut grads = ParamSet::init(&b, &specs(&[256, 256, 1024, 8]), 1).unwrap();
        let mut sync = GradSync::new(&comm, 4, 2048);
        sync.ready(&b, &grads, &[3, 1]).unwrap();
        assert_eq!(sync.buckets(), 0, "1,056 bytes do not fill a 2,048-byte bucket");
        sync.ready(&b, &grads, &[2]).unwrap();
        assert_eq!(sync.buckets(), 1);
        let e = sync.ready(&b, &grads, &[2]).unwrap_err();
        assert!(e.to_string().contains("reported once"), "{e}");

        let mut sync = GradSync::new(&comm, 4, 2048);
        sync.ready(&b, &grads, &[0, 1]).unwrap();
        let e = sync.finish(&b, &mut grads).unwrap_err();
        assert!(e.to_string().contains("not 2"), "{e}");

        let mut sync = GradSync::new(&comm, 4, 2048);
        sync.ready(&b, &grads, &[3, 2, 1, 0]).unwrap();
        sync.finish(&b, &mut grads).unwrap();
        assert!(grads.tensors[2].to_vec::<f32>().unwrap().iter().all(|&v| v == 1.0), "one rank: unchanged");
    }

    /// Every architecture's backward reports each gradient exactly once (`ready` and
    /// `finish` check it), blocks from the last down, and the gradients equal the plain
    /// backward's.
    #[test]
    fn the_backward_reports_every_gradient_once_for_every_architecture() {
        use crate::config::{ModelConfig, Style};
        use crate::model::Model;
        use fusebox::Tensor;
        let b = CpuBackend::with_threads(1).unwrap();
        let comm = SingleProcess;
        for style in Style::ALL {
            for tied in [true, false] {
                let cfg = ModelConfig { n_layers: 2, tied_embeddings: tied, ..ModelConfig::tiny(style, 20, 8) };
                let model = Model::new(&b, cfg, 5).unwrap();
                let ids = Tensor::from_vec((0..12u32).map(|i| i % 20).collect::<Vec<_>>(), [2, 6]).unwrap();
                let targets = Tensor::from_vec((0..12u32).map(|i| (i * 7) % 20).collect::<Vec<_>>(), [2, 6]).unwrap();
                let mut plain = ParamSet::zeros(&b, &model.net.specs).unwrap();
                model.net.loss_and_grads(&b, &ids, &targets, None, 1.0, &mut plain).unwrap();
                let mut grads = ParamSet::zeros(&b, &model.net.specs).unwrap();
                let mut sync = GradSync::new(&comm, grads.tensors.len(), 1);
                let mut order = Vec::new();
                let mut ready = |g: &ParamSet, ids: &[usize]| {
                    order.push(ids.to_vec());
                    sync.ready(&b, g, ids)
                };
                model.net.loss_and_grads_with(&b, &ids, &targets, None, 1.0, &mut grads, &mut ready).unwrap();
                sync.finish(&b, &mut grads).unwrap_or_else(|e| panic!("{style:?} tied {tied}: {e}"));
                let layers = &model.net.index.layers;
                assert_eq!(order[1], layers[1].params(), "{style:?}: the last block is reported first");
                assert_eq!(order[2], layers[0].params());
                assert!(order[3].contains(&model.net.index.embed), "{style:?}: the embeddings come last");
                assert_eq!(plain.to_values(&b).unwrap(), grads.to_values(&b).unwrap());
            }
        }
    }
}
