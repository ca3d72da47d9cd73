//! Data-parallel gradient averaging: gradients are gathered into buckets of a few MB in
//! the order the backward finishes them (the head first, then the last layer down) and
//! each full bucket's all-reduce is started at once, non-blocking, so it runs while the
//! backward computes the layers below — the bucketing of PyTorch DDP. A gradient larger
//! than a bucket's room is cut into windows, each in its own bucket, so the first bucket
//! of a large head starts as soon as the head's gradient is in. [`GradSync::finish`] then
//! waits for every bucket and writes the averaged gradients back.
//!
//! The embedding tables are the exception (`data_parallel/rows.rs`): the backward
//! reports their dense part (for a table tied to the head, the head's `dW`, finished at
//! the very start of the backward) with the head, and hands over the lookups' gradient
//! rows at the end; those are exchanged as rows (every rank all-gathers every rank's
//! `(ids, rows)`) and added in rank order, so the full table is reduced while the
//! backward runs and only the rows of the batch's tokens are left for after it.
//!
//! The backward reports finished gradients through
//! [`Transformer::backward_with`](crate::transformer::Transformer::backward_with) (this
//! sync's [`listener`](GradSync::listener)); every rank's backward finishes them in the
//! same order, so the buckets, and the order their collectives start in, agree on every
//! rank, as MPI requires.
//!
//! Under ZeRO ([`GradSync::sharded`], see [`shard`]) each bucket is reduce-scattered
//! instead: its values are packed grouped by the rank whose piece of the flat parameter
//! vector they fall in, and each rank receives the average of its own part only; the
//! exchanged rows are added into the whole table, of which the rank's piece is read.

mod rows;
pub mod shard;

use std::ops::Range;

use fusebox::{ComputeBackend, Error, Result, Tensor};

use self::rows::LocalRows;
use self::shard::{read_range, write_range, ShardLayout};
use crate::comm::{Communicator, PendingAllReduce, ReduceOp};
use crate::params::ParamSet;
use crate::transformer::GradsListener;

/// Default bucket size: big enough that per-message latency is small beside the transfer,
/// small enough that the first bucket starts early in the backward.
pub const DEFAULT_BUCKET_BYTES: usize = 4 << 20;

/// Elements `range` of gradient `tensor`, in its flat order: the whole tensor, or a window
/// of one larger than a bucket's room.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Window {
    tensor: usize,
    range: Range<usize>,
}

/// Averages the gradients of one backward over the ranks of a communicator (see the
/// module docs).
pub struct GradSync<'c> {
    comm: &'c dyn Communicator,
    /// Under ZeRO, the cut of the flat gradient over the ranks: buckets are
    /// reduce-scattered, not all-reduced.
    layout: Option<&'c ShardLayout>,
    bucket_elems: usize,
    /// Windows gathered for the next bucket, and their elements.
    filling: Vec<Window>,
    filling_elems: usize,
    /// Buckets in flight: their windows and the reduction.
    in_flight: Vec<(Vec<Window>, Box<dyn PendingAllReduce>)>,
    /// Which parameters were reported (each exactly once per backward).
    seen: Vec<bool>,
    /// This rank's embedding rows, exchanged at `finish`.
    rows: Vec<LocalRows>,
}

impl<'c> GradSync<'c> {
    /// Buckets of at least `bucket_bytes` for `n_params` gradients. In a world of more than
    /// one rank a host gradient is cut into windows to fill buckets exactly; otherwise (and
    /// for gradients off the host, which the communicator reduces where they live) a
    /// gradient larger than that is a bucket of its own.
    pub fn new(comm: &'c dyn Communicator, n_params: usize, bucket_bytes: usize) -> GradSync<'c> {
        GradSync {
            comm,
            layout: None,
            bucket_elems: (bucket_bytes / 4).max(1),
            filling: Vec::new(),
            filling_elems: 0,
            in_flight: Vec::new(),
            seen: vec![false; n_params],
            rows: Vec::new(),
        }
    }

    /// As [`new`](Self::new), but each bucket is reduce-scattered over `layout`'s pieces:
    /// [`finish`](Self::finish) writes the averages of this rank's piece only.
    pub fn sharded(comm: &'c dyn Communicator, layout: &'c ShardLayout, bucket_bytes: usize) -> GradSync<'c> {
        let n_params = layout.tensors();
        GradSync { layout: Some(layout), ..GradSync::new(comm, n_params, bucket_bytes) }
    }

    /// The backward's listener feeding this sync ([`ready`](Self::ready), and the
    /// embedding rows in a world of more than one rank).
    pub fn listener<'s>(&'s mut self, b: &'s dyn ComputeBackend) -> Listener<'s, 'c> {
        Listener { sync: self, b }
    }

    /// Records that the gradients `indices` of `grads` are final; starts each bucket's
    /// all-reduce once it holds `bucket_bytes`, and drives the reductions already in flight.
    pub fn ready(&mut self, b: &dyn ComputeBackend, grads: &ParamSet, indices: &[usize]) -> Result<()> {
        let cut = self.comm.world_size() > 1;
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
            let t = &grads.tensors[i];
            let n = t.elem_count();
            if !(cut && t.is_host()) {
                self.filling.push(Window { tensor: i, range: 0..n });
                self.filling_elems += n;
                continue;
            }
            let mut at = 0;
            while at < n {
                let len = self.bucket_elems.saturating_sub(self.filling_elems).max(1).min(n - at);
                self.filling.push(Window { tensor: i, range: at..at + len });
                self.filling_elems += len;
                at += len;
                if self.filling_elems >= self.bucket_elems {
                    self.launch(b, grads)?;
                }
            }
        }
        if self.filling_elems >= self.bucket_elems {
            self.launch(b, grads)?;
        }
        for (_, p) in &mut self.in_flight {
            p.test()?;
        }
        Ok(())
    }

    /// Records this rank's gradient rows of embedding table `index` (see the module docs): the
    /// table itself was reported [`ready`](Self::ready) with its dense part.
    ///
    /// # Shapes
    /// `ids`: `[n]` U32; `rows`: `[n, D]`, the table `[V, D]`.
    pub fn rows(
        &mut self,
        b: &dyn ComputeBackend,
        grads: &ParamSet,
        index: usize,
        ids: &Tensor,
        rows: &Tensor,
    ) -> Result<()> {
        let table = grads.tensors.get(index).ok_or_else(|| {
            Error::value("GradSync::rows", "table index", format!("< {}", grads.tensors.len()), index)
        })?;
        if self.rows.iter().any(|r| r.tensor == index) {
            return Err(Error::value("GradSync::rows", "table index", "each table's rows once", index));
        }
        self.rows.push(LocalRows::new(b, index, table, ids, rows)?);
        for (_, p) in &mut self.in_flight {
            p.test()?;
        }
        Ok(())
    }

    fn launch(&mut self, b: &dyn ComputeBackend, grads: &ParamSet) -> Result<()> {
        if self.filling.is_empty() {
            return Ok(());
        }
        let windows = std::mem::take(&mut self.filling);
        let elems = std::mem::replace(&mut self.filling_elems, 0);
        let pending = match self.layout {
            None if windows.iter().all(|w| is_whole(w, grads)) => {
                let tensors: Vec<_> = windows.iter().map(|w| &grads.tensors[w.tensor]).collect();
                self.comm.start_all_reduce_tensors(b, &tensors, ReduceOp::Average)?
            }
            None => {
                let mut buf = Vec::with_capacity(elems);
                for w in &windows {
                    append_range(b, &grads.tensors[w.tensor], w.range.clone(), &mut buf)?;
                }
                self.comm.start_all_reduce(buf, ReduceOp::Average)?
            }
            Some(layout) => {
                // Grouped by destination: rank 0's parts of the bucket's windows, then rank 1's, …
                let mut buf = Vec::with_capacity(elems);
                let mut counts = vec![0; layout.world()];
                for (r, count) in counts.iter_mut().enumerate() {
                    for w in &windows {
                        let start = layout.tensor_range(w.tensor).start;
                        let flat = start + w.range.start..start + w.range.end;
                        let part = overlap(&flat, &layout.range(r));
                        if !part.is_empty() {
                            append_range(b, &grads.tensors[w.tensor], part.start - start..part.end - start, &mut buf)?;
                            *count += part.len();
                        }
                    }
                }
                self.comm.start_reduce_scatter(buf, &counts, ReduceOp::Average)?
            }
        };
        self.in_flight.push((windows, pending));
        Ok(())
    }

    /// Starts what is left, waits for every bucket and writes the averages into `grads`
    /// (under ZeRO: into this rank's piece of them only; the rest keeps this rank's own
    /// unreduced values, which nothing reads), then adds every rank's embedding rows. An
    /// error when a gradient was never reported (every rank would otherwise disagree).
    pub fn finish(mut self, b: &dyn ComputeBackend, grads: &mut ParamSet) -> Result<()> {
        if let Some(i) = self.seen.iter().position(|s| !s) {
            return Err(Error::value("GradSync::finish", "gradients reported", "every parameter", format!("not {i}")));
        }
        self.launch(b, grads)?;
        // The rows are exchanged while the buckets are still in flight (MPI progresses them
        // inside the exchange's calls too); they are added after the dense averages land.
        let rows = rows::exchange(self.comm, std::mem::take(&mut self.rows))?;
        let in_flight = std::mem::take(&mut self.in_flight);
        match self.layout {
            Some(layout) => {
                let mine = layout.range(self.comm.rank());
                for (windows, pending) in in_flight {
                    let piece = pending.wait()?;
                    let mut at = 0;
                    for w in &windows {
                        let start = layout.tensor_range(w.tensor).start;
                        let part = overlap(&(start + w.range.start..start + w.range.end), &mine);
                        if !part.is_empty() {
                            write_range(
                                b,
                                &mut grads.tensors[w.tensor],
                                part.start - start,
                                &piece[at..at + part.len()],
                            )?;
                            at += part.len();
                        }
                    }
                }
            }
            None => {
                for (windows, pending) in in_flight {
                    if windows.iter().all(|w| is_whole(w, grads)) {
                        // The windows are distinct whole tensors in launch order; pick them out in that order.
                        let mut slots: Vec<Option<&mut Tensor>> = grads.tensors.iter_mut().map(Some).collect();
                        let mut outs: Vec<&mut Tensor> = Vec::with_capacity(windows.len());
                        for w in &windows {
                            let t = slots[w.tensor]
                                .take()
                                .ok_or_else(|| Error::value("GradSync::finish", "bucket", "distinct", w.tensor))?;
                            outs.push(t);
                        }
                        pending.finish(b, &mut outs)?;
                        continue;
                    }
                    let flat = pending.wait()?;
                    let total: usize = windows.iter().map(|w| w.range.len()).sum();
                    if flat.len() != total {
                        return Err(Error::shape("GradSync::finish", "bucket", format!("{total} floats"), flat.len()));
                    }
                    let mut at = 0;
                    for w in &windows {
                        write_range(b, &mut grads.tensors[w.tensor], w.range.start, &flat[at..at + w.range.len()])?;
                        at += w.range.len();
                    }
                }
            }
        }
        let scale = 1.0 / self.comm.world_size() as f32;
        for r in &rows {
            r.add_into(b, &mut grads.tensors[r.tensor], scale)?;
        }
        Ok(())
    }

    /// Buckets started so far.
    pub fn buckets(&self) -> usize {
        self.in_flight.len()
    }
}

/// [`GradSync`] as the backward's [`GradsListener`]: it takes the embedding rows in a
/// world of more than one rank (in a world of one they are added in place, as without a
/// sync).
pub struct Listener<'s, 'c> {
    sync: &'s mut GradSync<'c>,
    b: &'s dyn ComputeBackend,
}

impl GradsListener for Listener<'_, '_> {
    fn ready(&mut self, grads: &ParamSet, indices: &[usize]) -> Result<()> {
        self.sync.ready(self.b, grads, indices)
    }

    fn takes_rows(&self) -> bool {
        self.sync.comm.world_size() > 1
    }

    fn rows(&mut self, grads: &ParamSet, index: usize, ids: &Tensor, rows: &Tensor) -> Result<()> {
        self.sync.rows(self.b, grads, index, ids, rows)
    }
}

/// Whether `w` covers all of its tensor.
fn is_whole(w: &Window, grads: &ParamSet) -> bool {
    w.range.start == 0 && w.range.end == grads.tensors[w.tensor].elem_count()
}

/// Appends elements `range` of `t` (f32, any backend) to `buf`.
fn append_range(b: &dyn ComputeBackend, t: &Tensor, range: Range<usize>, buf: &mut Vec<f32>) -> Result<()> {
    if t.is_host() {
        buf.extend_from_slice(&t.as_slice::<f32>()?[range]);
    } else {
        buf.extend(read_range(b, t, range)?);
    }
    Ok(())
}

/// The common part of two ranges (empty when they do not meet).
fn overlap(a: &Range<usize>, b: &Range<usize>) -> Range<usize> {
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

    /// A listener that records the reports and, taking rows when `rows` is set, keeps the
    /// rows aside.
    struct Recording<'s, 'c> {
        sync: &'s mut GradSync<'c>,
        b: &'s CpuBackend,
        order: Vec<Vec<usize>>,
        rows: Option<Vec<(usize, fusebox::Tensor, fusebox::Tensor)>>,
    }

    impl GradsListener for Recording<'_, '_> {
        fn ready(&mut self, grads: &ParamSet, ids: &[usize]) -> Result<()> {
            self.order.push(ids.to_vec());
            self.sync.ready(self.b, grads, ids)
        }
        fn takes_rows(&self) -> bool {
            self.rows.is_some()
        }
        fn rows(&mut self, _grads: &ParamSet, index: usize, ids: &Tensor, rows: &Tensor) -> Result<()> {
            self.rows.as_mut().unwrap().push((index, ids.clone(), rows.clone()));
            Ok(())
        }
    }

    /// Every architecture's backward reports each gradient exactly once (`ready` and
    /// `finish` check it): an untied head first, blocks from the last down, the embeddings
    /// last — or, to a listener taking rows, with the head, their rows handed over at the
    /// end — and the gradients (the rows added back) equal the plain backward's.
    #[test]
    fn the_backward_reports_every_gradient_once_for_every_architecture() {
        use crate::config::{ModelConfig, Style};
        use crate::model::Model;
        let b = CpuBackend::with_threads(1).unwrap();
        let comm = SingleProcess;
        for style in Style::ALL {
            for tied in [true, false] {
                for take_rows in [false, true] {
                    let what = format!("{style:?} tied {tied} rows {take_rows}");
                    let cfg = ModelConfig { n_layers: 2, tied_embeddings: tied, ..ModelConfig::tiny(style, 20, 8) };
                    let model = Model::new(&b, cfg, 5).unwrap();
                    let ids = Tensor::from_vec((0..12u32).map(|i| i % 20).collect::<Vec<_>>(), [2, 6]).unwrap();
                    let targets =
                        Tensor::from_vec((0..12u32).map(|i| (i * 7) % 20).collect::<Vec<_>>(), [2, 6]).unwrap();
                    let mut plain = ParamSet::zeros(&b, &model.net.specs).unwrap();
                    model.net.loss_and_grads(&b, &ids, &targets, None, 1.0, &mut plain).unwrap();
                    let mut grads = ParamSet::zeros(&b, &model.net.specs).unwrap();
                    let mut sync = GradSync::new(&comm, grads.tensors.len(), 1);
                    let mut rec =
                        Recording { sync: &mut sync, b: &b, order: Vec::new(), rows: take_rows.then(Vec::new) };
                    model.net.loss_and_grads_with(&b, &ids, &targets, None, 1.0, &mut grads, &mut rec).unwrap();
                    let (order, rows) = (rec.order, rec.rows);
                    sync.finish(&b, &mut grads).unwrap_or_else(|e| panic!("{what}: {e}"));
                    let index = &model.net.index;
                    let tables: Vec<usize> = [Some(index.embed), index.pos_embed].into_iter().flatten().collect();
                    let expected_first: Vec<usize> =
                        index.head.into_iter().chain(tables.iter().copied().filter(|_| take_rows)).collect();
                    let at = |p: &[usize]| order.iter().position(|o| o == p).unwrap_or_else(|| panic!("{what}"));
                    if !expected_first.is_empty() {
                        assert_eq!(order[0], expected_first, "{what}: the head (and tables taking rows) first");
                    }
                    assert_eq!(at(&index.layers[0].params()), at(&index.layers[1].params()) + 1, "{what}");
                    if take_rows {
                        let rows = rows.unwrap();
                        assert_eq!(rows.iter().map(|r| r.0).collect::<Vec<_>>(), tables, "{what}");
                        for (i, ids, r) in &rows {
                            b.scatter_add_rows(&mut grads.tensors[*i], ids, r).unwrap();
                        }
                    } else {
                        assert_eq!(order.last().unwrap(), &tables, "{what}: the embeddings come last");
                    }
                    assert_eq!(plain.to_values(&b).unwrap(), grads.to_values(&b).unwrap(), "{what}");
                }
            }
        }
    }

    /// A 2-rank communicator's buckets fill exactly: a gradient larger than a bucket's room
    /// is cut into windows (here through the trait's all-reduce defaults on a pretend peer
    /// holding zeros: the average halves every value, in place, window by window).
    #[test]
    fn large_gradients_are_cut_into_windows_and_written_back_in_place() {
        #[derive(Debug)]
        struct HalfWorld;
        impl Communicator for HalfWorld {
            fn rank(&self) -> usize {
                0
            }
            fn world_size(&self) -> usize {
                2
            }
            fn all_reduce(&self, buf: &mut [f32], op: ReduceOp) -> Result<()> {
                if op == ReduceOp::Average {
                    buf.iter_mut().for_each(|x| *x *= 0.5);
                }
                Ok(())
            }
            fn start_all_reduce(&self, mut buf: Vec<f32>, op: ReduceOp) -> Result<Box<dyn PendingAllReduce>> {
                self.all_reduce(&mut buf, op)?;
                SingleProcess.start_all_reduce(buf, op)
            }
            fn broadcast(&self, _buf: &mut [f32], _root: usize) -> Result<()> {
                Ok(())
            }
            fn barrier(&self) -> Result<()> {
                Ok(())
            }
        }
        let b = CpuBackend::with_threads(1).unwrap();
        let comm = HalfWorld;
        let mut grads = ParamSet::init(&b, &specs(&[100, 1000, 30]), 1).unwrap();
        let mut sync = GradSync::new(&comm, 3, 256 * 4);
        sync.ready(&b, &grads, &[0, 1]).unwrap();
        // 1,100 values: buckets of 100 + 156, 256, 256, 256; 176 left filling.
        assert_eq!(sync.buckets(), 4);
        assert_eq!(sync.in_flight[0].0, [Window { tensor: 0, range: 0..100 }, Window { tensor: 1, range: 0..156 }]);
        assert_eq!(sync.filling, [Window { tensor: 1, range: 924..1000 }]);
        sync.ready(&b, &grads, &[2]).unwrap();
        sync.finish(&b, &mut grads).unwrap();
        for t in &grads.tensors {
            assert!(t.to_vec::<f32>().unwrap().iter().all(|&v| v == 0.5));
        }
    }
}
