//! Collective communication between the processes of a data-parallel run.
//!
//! A [`Communicator`] joins `world_size` processes, each with its `rank`, and offers what
//! data-parallel training needs: an all-reduce of an f32 buffer in place (sum, average or
//! max), a broadcast from one rank, a barrier, and a non-blocking all-reduce
//! ([`Communicator::start_all_reduce`]) whose handle owns its buffer while the reduction is
//! in flight, so gradients can be reduced while the backward still runs. ZeRO-sharded
//! training adds a reduce-scatter ([`Communicator::reduce_scatter`], and non-blocking
//! [`Communicator::start_reduce_scatter`]: each rank gets the reduction of its own
//! consecutive piece of the buffer) and an all-gather ([`Communicator::all_gather`]: every
//! rank gets the pieces of all ranks, concatenated in rank order).
//!
//! [`SingleProcess`] is the world of one: every collective is the identity (an average over
//! one rank is the value itself) and costs nothing, so plain training runs the same code as
//! a distributed run. `MpiCommunicator` (cargo feature `mpi`) joins the processes an MPI
//! launcher (`mpirun -np N`) started, through the `mpi` crate (rsmpi).
//!
//! # Device buffers
//!
//! The byte-level methods work on host f32 buffers. The trainer reaches them only through
//! the tensor methods ([`Communicator::start_all_reduce_tensors`] and
//! [`PendingAllReduce::finish`]), whose default stages the tensors through one host buffer
//! (`to_host`, reduce, `copy_into`). A communicator over device memory (NCCL for a CUDA
//! backend, say) overrides those two methods to pack the tensors into one device buffer
//! and reduce it in place on the device's stream; the trainer does not change.

#[cfg(feature = "mpi")]
mod mpi;

use std::fmt::Debug;

use fusebox::{ComputeBackend, Error, Result, Tensor};

#[cfg(feature = "mpi")]
pub use self::mpi::MpiCommunicator;

/// How an all-reduce combines the ranks' values, element by element.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReduceOp {
    /// `Σ_r x_r`.
    Sum,
    /// `(Σ_r x_r) / world_size`: the sum, then one multiplication by `1/world_size`.
    Average,
    /// `max_r x_r`.
    Max,
}

/// A message [`Communicator::start_send`] is sending. It owns the bytes; dropping it
/// unfinished waits for the send.
pub trait PendingSend: Send {
    /// Returns once the bytes have left this process (the receiver or the library holds
    /// them).
    fn wait(self: Box<Self>) -> Result<()>;
}

/// A send that finished before its handle was made.
struct Sent;

impl PendingSend for Sent {
    fn wait(self: Box<Self>) -> Result<()> {
        Ok(())
    }
}

/// A non-blocking all-reduce (or reduce-scatter) in flight. It owns its buffer; dropping it
/// unfinished waits for the reduction (the buffer must outlive it) and discards the result.
pub trait PendingAllReduce {
    /// Drives the reduction forward without blocking; true once it is complete. MPI
    /// libraries progress non-blocking collectives mostly inside MPI calls, so a caller
    /// that overlaps computation calls this between pieces of work.
    fn test(&mut self) -> Result<bool>;

    /// Waits for the reduction and returns the reduced buffer (of a reduce-scatter: this
    /// rank's piece).
    fn wait(self: Box<Self>) -> Result<Vec<f32>>;

    /// Waits for the reduction and writes the result into `outs`, the tensors
    /// [`Communicator::start_all_reduce_tensors`] was given, in the same order and shapes.
    ///
    /// # Shapes
    /// `outs[i]`: the shape of the `i`-th tensor started; writable.
    fn finish(self: Box<Self>, b: &dyn ComputeBackend, outs: &mut [&mut Tensor]) -> Result<()> {
        let flat = self.wait()?;
        unpack(b, &flat, outs)
    }
}

/// Collective operations over the processes of one run (see the module docs). Shareable
/// between threads (a trainer holding one stays `Send`); an implementation may still
/// require that its collectives are called from one thread, and says so by an error.
pub trait Communicator: Debug + Send + Sync {
    /// This process's rank, `0..world_size`.
    fn rank(&self) -> usize;

    /// Number of processes.
    fn world_size(&self) -> usize;

    /// Reduces `buf` over every rank in place: afterwards every rank holds the same result.
    ///
    /// # Shapes
    /// `buf`: the same length on every rank.
    fn all_reduce(&self, buf: &mut [f32], op: ReduceOp) -> Result<()>;

    /// Starts reducing `buf` over every rank without waiting; the handle gives it back
    /// reduced.
    ///
    /// # Shapes
    /// `buf`: the same length on every rank, and collectives started in the same order.
    fn start_all_reduce(&self, buf: Vec<f32>, op: ReduceOp) -> Result<Box<dyn PendingAllReduce>>;

    /// Copies rank `root`'s `buf` into every other rank's `buf`.
    ///
    /// # Shapes
    /// `buf`: the same length on every rank.
    fn broadcast(&self, buf: &mut [f32], root: usize) -> Result<()>;

    /// Reduces `buf` over every rank and gives this rank its piece of the result: rank `r`
    /// gets elements `Σ_{q<r} counts[q] .. + counts[r]` of the reduction. The default
    /// all-reduces the whole buffer and keeps the piece (right for any communicator; MPI
    /// overrides it with `MPI_Reduce_scatter`, which moves `1/world_size` of the bytes).
    ///
    /// # Shapes
    /// `counts`: `world_size` entries summing to `buf.len()`, the same on every rank;
    /// returns `counts[rank]` values.
    fn reduce_scatter(&self, buf: &[f32], counts: &[usize], op: ReduceOp) -> Result<Vec<f32>> {
        let piece = piece_of("reduce_scatter", buf.len(), counts, self.rank(), self.world_size())?;
        let mut all = buf.to_vec();
        self.all_reduce(&mut all, op)?;
        all.truncate(piece.end);
        Ok(all.split_off(piece.start))
    }

    /// Starts [`reduce_scatter`](Self::reduce_scatter) without waiting; the handle's
    /// [`PendingAllReduce::wait`] gives this rank's piece. The default reduces before it
    /// returns (a finished handle).
    ///
    /// # Shapes
    /// as [`reduce_scatter`](Self::reduce_scatter), collectives started in the same order.
    fn start_reduce_scatter(&self, buf: Vec<f32>, counts: &[usize], op: ReduceOp) -> Result<Box<dyn PendingAllReduce>> {
        Ok(Box::new(Done(Some(self.reduce_scatter(&buf, counts, op)?))))
    }

    /// Every rank's `mine`, concatenated in rank order, on every rank. The default sums a
    /// buffer holding `mine` at this rank's place and `-0.0` elsewhere with
    /// [`all_reduce`](Self::all_reduce): `-0.0 + x = x` exactly for every `x` (`+0.0`,
    /// `-0.0`, infinities and NaN included), so the result is the pieces bit for bit. MPI
    /// overrides it with `MPI_Allgatherv`.
    ///
    /// # Shapes
    /// `counts`: `world_size` entries, the same on every rank; `mine`: `counts[rank]`
    /// values; returns `Σ counts` values.
    fn all_gather(&self, mine: &[f32], counts: &[usize]) -> Result<Vec<f32>> {
        let total = counts.iter().sum();
        let piece = piece_of("all_gather", total, counts, self.rank(), self.world_size())?;
        check_piece("all_gather", mine.len(), piece.len())?;
        let mut all = vec![-0.0f32; total];
        all[piece].copy_from_slice(mine);
        self.all_reduce(&mut all, ReduceOp::Sum)?;
        Ok(all)
    }

    /// [`all_gather`](Self::all_gather) of several buffers at once, in place: `bufs[k]`
    /// holds `Σ counts[k]` values, this rank's part already at its place (after the parts
    /// of the lower ranks); afterwards every rank's part is at its place on every rank.
    /// The default gathers each buffer in turn through [`all_gather`](Self::all_gather);
    /// MPI sends this rank's parts from where they lie and receives the others' straight
    /// into `bufs`, every transfer in flight at once.
    ///
    /// # Shapes
    /// `counts`: one entry per buffer, each `world_size` counts summing to that buffer's
    /// length; the same buffers and counts, in the same order, on every rank.
    fn all_gather_in_place(&self, bufs: &mut [&mut [f32]], counts: &[Vec<usize>]) -> Result<()> {
        check_gather_in_place(bufs, counts)?;
        for (buf, counts) in bufs.iter_mut().zip(counts) {
            let piece = piece_of("all_gather_in_place", buf.len(), counts, self.rank(), self.world_size())?;
            let all = self.all_gather(&buf[piece], counts)?;
            buf.copy_from_slice(&all);
        }
        Ok(())
    }

    /// Returns once every rank has called it.
    fn barrier(&self) -> Result<()>;

    /// Sends `bytes` to rank `dest`, returning once `bytes` may be reused. Messages from
    /// one rank to another arrive in the order they were sent. The world of one has no
    /// peer to send to: an error.
    fn send(&self, dest: usize, bytes: &[u8]) -> Result<()> {
        let _ = bytes;
        Err(no_peer("send", dest, self.world_size()))
    }

    /// Starts sending `bytes` to rank `dest` and returns without waiting for the receiver;
    /// the handle owns the bytes until they have left. Ordered with [`send`](Self::send)'s
    /// messages. The default sends before it returns (a finished handle).
    fn start_send(&self, dest: usize, bytes: Vec<u8>) -> Result<Box<dyn PendingSend>> {
        self.send(dest, &bytes)?;
        Ok(Box::new(Sent))
    }

    /// The next message rank `src` sent to this one, whatever its length (blocking).
    fn recv(&self, src: usize) -> Result<Vec<u8>> {
        Err(no_peer("recv", src, self.world_size()))
    }

    /// Ends every process of the run with exit status `code`, after `why` (naming this rank)
    /// is printed to stderr. The remedy for an error on one rank: the others would wait in
    /// their next collective for ever.
    fn abort(&self, code: i32, why: &str) -> ! {
        eprintln!("rank {} of {}: {why}", self.rank(), self.world_size());
        std::process::exit(code)
    }

    /// Starts an all-reduce of `tensors` (f32, any backend) as one message; the handle's
    /// [`PendingAllReduce::finish`] writes the result back. The default copies them into one
    /// host buffer; a device communicator reduces them where they live.
    fn start_all_reduce_tensors(
        &self,
        b: &dyn ComputeBackend,
        tensors: &[&Tensor],
        op: ReduceOp,
    ) -> Result<Box<dyn PendingAllReduce>> {
        self.start_all_reduce(pack(b, tensors)?, op)
    }

    /// Reduces `tensors` in place over every rank (blocking).
    fn all_reduce_tensors(&self, b: &dyn ComputeBackend, tensors: &mut [&mut Tensor], op: ReduceOp) -> Result<()> {
        let refs: Vec<&Tensor> = tensors.iter().map(|t| &**t).collect();
        let pending = self.start_all_reduce_tensors(b, &refs, op)?;
        pending.finish(b, tensors)
    }

    /// Copies rank `root`'s `tensors` into every other rank's (blocking).
    fn broadcast_tensors(&self, b: &dyn ComputeBackend, tensors: &mut [&mut Tensor], root: usize) -> Result<()> {
        if self.world_size() == 1 {
            return Ok(());
        }
        let refs: Vec<&Tensor> = tensors.iter().map(|t| &**t).collect();
        let mut flat = pack(b, &refs)?;
        self.broadcast(&mut flat, root)?;
        unpack(b, &flat, tensors)
    }
}

/// Rank `rank`'s piece of a buffer of `len` values cut into consecutive pieces of `counts`;
/// an error naming `op` unless `counts` has one entry per rank and sums to `len`.
pub(crate) fn piece_of(
    op: &'static str,
    len: usize,
    counts: &[usize],
    rank: usize,
    world: usize,
) -> Result<std::ops::Range<usize>> {
    if counts.len() != world {
        return Err(Error::value(op, "counts", format!("one per rank ({world})"), counts.len()));
    }
    let total: usize = counts.iter().sum();
    if total != len {
        return Err(Error::shape(op, "buffer", format!("Σ counts = {total} floats"), format!("{len} floats")));
    }
    let start: usize = counts[..rank].iter().sum();
    Ok(start..start + counts[rank])
}

/// An error unless there is one entry of counts per buffer of an in-place all-gather.
pub(crate) fn check_gather_in_place(bufs: &[&mut [f32]], counts: &[Vec<usize>]) -> Result<()> {
    if bufs.len() == counts.len() {
        Ok(())
    } else {
        Err(Error::value(
            "all_gather_in_place",
            "counts",
            format!("one entry per buffer ({})", bufs.len()),
            counts.len(),
        ))
    }
}

/// An error naming `op` unless this rank's piece holds `expected` values.
pub(crate) fn check_piece(op: &'static str, got: usize, expected: usize) -> Result<()> {
    if got == expected {
        Ok(())
    } else {
        Err(Error::shape(op, "this rank's piece", format!("{expected} floats (counts[rank])"), format!("{got} floats")))
    }
}

/// The f32 values of `tensors`, concatenated on the host.
fn pack(b: &dyn ComputeBackend, tensors: &[&Tensor]) -> Result<Vec<f32>> {
    let total = tensors.iter().map(|t| t.elem_count()).sum();
    let mut flat = Vec::with_capacity(total);
    for t in tensors {
        if t.is_host() {
            flat.extend_from_slice(t.as_slice::<f32>()?);
        } else {
            flat.extend_from_slice(b.to_host(t)?.as_slice::<f32>()?);
        }
    }
    Ok(flat)
}

/// Writes consecutive pieces of `flat` into `outs`.
fn unpack(b: &dyn ComputeBackend, flat: &[f32], outs: &mut [&mut Tensor]) -> Result<()> {
    let total: usize = outs.iter().map(|t| t.elem_count()).sum();
    if total != flat.len() {
        return Err(Error::shape("all_reduce", "result", format!("{total} floats"), format!("{} floats", flat.len())));
    }
    let mut offset = 0;
    for t in outs.iter_mut() {
        let n = t.elem_count();
        let piece = &flat[offset..offset + n];
        if t.is_host() {
            t.as_mut_slice::<f32>()?.copy_from_slice(piece);
        } else {
            let src = b.upload(&Tensor::from_slice(piece, t.shape().clone())?)?;
            b.copy_into(t, &src)?;
        }
        offset += n;
    }
    Ok(())
}

/// The world of one process: every collective is the identity.
#[derive(Debug, Clone, Copy, Default)]
pub struct SingleProcess;

/// A reduction over one rank, complete from the start.
struct Done(Option<Vec<f32>>);

impl PendingAllReduce for Done {
    fn test(&mut self) -> Result<bool> {
        Ok(true)
    }
    fn wait(self: Box<Self>) -> Result<Vec<f32>> {
        Ok(self.0.unwrap_or_default())
    }
    fn finish(self: Box<Self>, _b: &dyn ComputeBackend, _outs: &mut [&mut Tensor]) -> Result<()> {
        // The tensors already hold the result; nothing was copied out.
        Ok(())
    }
}

impl Communicator for SingleProcess {
    fn rank(&self) -> usize {
        0
    }
    fn world_size(&self) -> usize {
        1
    }
    fn all_reduce(&self, _buf: &mut [f32], _op: ReduceOp) -> Result<()> {
        Ok(())
    }
    fn start_all_reduce(&self, buf: Vec<f32>, _op: ReduceOp) -> Result<Box<dyn PendingAllReduce>> {
        Ok(Box::new(Done(Some(buf))))
    }
    fn broadcast(&self, _buf: &mut [f32], root: usize) -> Result<()> {
        check_root(root, 1)
    }
    fn barrier(&self) -> Result<()> {
        Ok(())
    }
    fn reduce_scatter(&self, buf: &[f32], counts: &[usize], _op: ReduceOp) -> Result<Vec<f32>> {
        piece_of("reduce_scatter", buf.len(), counts, 0, 1)?;
        Ok(buf.to_vec())
    }
    fn all_gather(&self, mine: &[f32], counts: &[usize]) -> Result<Vec<f32>> {
        piece_of("all_gather", mine.len(), counts, 0, 1)?;
        Ok(mine.to_vec())
    }
    fn all_gather_in_place(&self, bufs: &mut [&mut [f32]], counts: &[Vec<usize>]) -> Result<()> {
        check_gather_in_place(bufs, counts)?;
        bufs.iter().zip(counts).try_for_each(|(buf, c)| piece_of("all_gather_in_place", buf.len(), c, 0, 1).map(drop))
    }
    fn start_all_reduce_tensors(
        &self,
        _b: &dyn ComputeBackend,
        _tensors: &[&Tensor],
        _op: ReduceOp,
    ) -> Result<Box<dyn PendingAllReduce>> {
        Ok(Box::new(Done(None)))
    }
}

/// The error of a point-to-point call with no peer `rank` to talk to.
fn no_peer(op: &'static str, rank: usize, world: usize) -> Error {
    Error::unsupported(op, format!("rank {rank} of a world of {world} process(es): no other process to talk to"))
}

/// An error unless `peer` is a rank of a world of `world` processes other than `me`.
#[cfg_attr(not(feature = "mpi"), allow(dead_code))]
fn check_peer(op: &'static str, peer: usize, me: usize, world: usize) -> Result<()> {
    if peer < world && peer != me {
        Ok(())
    } else {
        Err(Error::value(op, "peer", format!("a rank < {world} other than this one ({me})"), peer))
    }
}

/// An error unless `root` is a rank of a world of `world` processes.
fn check_root(root: usize, world: usize) -> Result<()> {
    if root < world {
        Ok(())
    } else {
        Err(Error::value("broadcast", "root", format!("a rank < {world}"), root))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fusebox::CpuBackend;

    #[test]
    fn the_world_of_one_is_the_identity() {
        let c = SingleProcess;
        assert_eq!((c.rank(), c.world_size()), (0, 1));
        let mut buf = vec![1.0, -2.5, 3.0];
        for op in [ReduceOp::Sum, ReduceOp::Average, ReduceOp::Max] {
            c.all_reduce(&mut buf, op).unwrap();
            assert_eq!(buf, [1.0, -2.5, 3.0]);
        }
        let mut p = c.start_all_reduce(buf.clone(), ReduceOp::Average).unwrap();
        assert!(p.test().unwrap());
        assert_eq!(p.wait().unwrap(), buf);
        c.broadcast(&mut buf, 0).unwrap();
        assert!(c.broadcast(&mut buf, 1).unwrap_err().to_string().contains("root"));
        c.barrier().unwrap();
        assert!(c.send(0, b"x").unwrap_err().to_string().contains("no other process"));
        assert!(c.recv(0).unwrap_err().to_string().contains("no other process"));
        assert_eq!(c.reduce_scatter(&buf, &[3], ReduceOp::Average).unwrap(), buf);
        assert_eq!(c.start_reduce_scatter(buf.clone(), &[3], ReduceOp::Sum).unwrap().wait().unwrap(), buf);
        assert_eq!(c.all_gather(&buf, &[3]).unwrap(), buf);
        let e = c.reduce_scatter(&buf, &[2], ReduceOp::Sum).unwrap_err().to_string();
        assert!(e.contains("Σ counts = 2"), "{e}");
        assert!(c.all_gather(&buf, &[3, 0]).unwrap_err().to_string().contains("one per rank"));
    }

    /// A pretend rank `rank` of `world` whose all-reduce sums fixed buffers of the other
    /// ranks (every rank holding `rank + 1` times the input), to check the defaults.
    #[derive(Debug)]
    struct Pretend {
        rank: usize,
        world: usize,
        others: Vec<f32>,
    }

    impl Communicator for Pretend {
        fn rank(&self) -> usize {
            self.rank
        }
        fn world_size(&self) -> usize {
            self.world
        }
        fn all_reduce(&self, buf: &mut [f32], op: ReduceOp) -> Result<()> {
            assert_eq!(op, ReduceOp::Sum);
            buf.iter_mut().zip(&self.others).for_each(|(x, o)| *x += o);
            Ok(())
        }
        fn start_all_reduce(&self, _buf: Vec<f32>, _op: ReduceOp) -> Result<Box<dyn PendingAllReduce>> {
            unreachable!()
        }
        fn broadcast(&self, _buf: &mut [f32], _root: usize) -> Result<()> {
            Ok(())
        }
        fn barrier(&self) -> Result<()> {
            Ok(())
        }
    }

    #[test]
    fn the_default_reduce_scatter_and_all_gather_cut_and_join_pieces_in_rank_order() {
        let c = Pretend { rank: 1, world: 3, others: vec![10.0; 6] };
        assert_eq!(
            c.reduce_scatter(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[1, 3, 2], ReduceOp::Sum).unwrap(),
            [12.0, 13.0, 14.0]
        );
        // Every other rank contributes -0.0 where it holds nothing: the pieces come back exact.
        let c = Pretend { rank: 1, world: 3, others: vec![-0.0, 7.5, -0.0, -0.0, f32::INFINITY, -0.0] };
        let got = c.all_gather(&[-0.0, 0.0], &[2, 2, 2]).unwrap();
        let want = [-0.0f32, 7.5, -0.0, 0.0, f32::INFINITY, -0.0];
        assert_eq!(got.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), want.map(f32::to_bits));
        assert!(c.all_gather(&[1.0], &[2, 2, 2]).unwrap_err().to_string().contains("counts[rank]"));
        // In place: whatever stood at the other ranks' places is replaced by their parts.
        let c = Pretend { rank: 1, world: 3, others: vec![5.0, -0.0, -0.0, 6.0] };
        let mut buf = [9.0, 1.0, 2.0, 9.0];
        c.all_gather_in_place(&mut [&mut buf[..]], &[vec![1, 2, 1]]).unwrap();
        assert_eq!(buf, [5.0, 1.0, 2.0, 6.0]);
        let e = c.all_gather_in_place(&mut [&mut buf[..]], &[]).unwrap_err().to_string();
        assert!(e.contains("one entry per buffer"), "{e}");
        let e = c.all_gather_in_place(&mut [&mut buf[..]], &[vec![1, 1, 1]]).unwrap_err().to_string();
        assert!(e.contains("Σ counts = 3"), "{e}");
        let mut one = [1.0, 2.0];
        SingleProcess.all_gather_in_place(&mut [&mut one[..]], &[vec![2]]).unwrap();
        assert_eq!(one, [1.0, 2.0]);
        assert!(SingleProcess.all_gather_in_place(&mut [&mut one[..]], &[vec![1]]).is_err());
    }

    #[test]
    fn host_staging_round_trips_tensors_in_order() {
        let b = CpuBackend::with_threads(1).unwrap();
        let mut x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], [2, 2]).unwrap();
        let mut y = Tensor::from_vec(vec![5.0f32], [1]).unwrap();
        let flat = pack(&b, &[&x, &y]).unwrap();
        assert_eq!(flat, [1.0, 2.0, 3.0, 4.0, 5.0]);
        let doubled: Vec<f32> = flat.iter().map(|v| v * 2.0).collect();
        unpack(&b, &doubled, &mut [&mut x, &mut y]).unwrap();
        assert_eq!(x.to_vec::<f32>().unwrap(), [2.0, 4.0, 6.0, 8.0]);
        assert_eq!(y.to_vec::<f32>().unwrap(), [10.0]);
        let e = unpack(&b, &doubled[..4], &mut [&mut x, &mut y]).unwrap_err();
        assert!(e.to_string().contains("5 floats"), "{e}");
    }
}
