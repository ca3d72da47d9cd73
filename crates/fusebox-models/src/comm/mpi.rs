//! [`MpiCommunicator`]: the processes an MPI launcher started (`mpirun -np N`), joined
//! through rsmpi. The collectives are MPI's own (`MPI_Allreduce`, `MPI_Iallreduce`,
//! `MPI_Reduce_scatter`, `MPI_Allgatherv`, `MPI_Bcast`, `MPI_Barrier`) on `MPI_COMM_WORLD`,
//! except the non-blocking reduce-scatter and the in-place all-gather of ZeRO, which are
//! point-to-point (`MPI_Isend`/`MPI_Irecv`, see [`ReduceScatterInFlight`]). MPI is initialised at
//! `MPI_THREAD_SERIALIZED` where the library offers it: any thread may call it, one at a
//! time (a process-wide lock is held across each call — a server's model thread talks to
//! the other ranks, not the thread that started the process). Where the library offers
//! only `MPI_THREAD_FUNNELED`, every call must come from the thread that initialised MPI.
//! The backend's worker threads never call MPI.

use std::ffi::{c_int, c_void};
use std::sync::{Mutex, MutexGuard};

use fusebox::{Error, Result};
use mpi::ffi;
use mpi::raw::AsRaw;
use mpi::topology::{Communicator as _, SimpleCommunicator};
use mpi::traits::CommunicatorCollectives;

use super::{
    check_gather_in_place, check_peer, check_piece, check_root, piece_of, Communicator, PendingAllReduce, PendingSend,
    ReduceOp,
};

/// The tag of point-to-point messages (`send`/`recv`).
const P2P_TAG: c_int = 17;
/// The tag of the messages of a non-blocking reduce-scatter ([`ReduceScatterInFlight`]).
const REDUCE_SCATTER_TAG: c_int = 18;
/// The tag of the messages of an in-place all-gather.
const GATHER_TAG: c_int = 19;

/// Held across every MPI call when MPI is initialised `MPI_THREAD_SERIALIZED`: MPI state
/// is per process, so is the lock.
static MPI_TURN: Mutex<()> = Mutex::new(());

/// The process-wide MPI lock (a panic while it was held leaves nothing to repair: MPI
/// calls do not unwind).
fn mpi_turn() -> MutexGuard<'static, ()> {
    MPI_TURN.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Largest element count one MPI call takes (its `count` is a C `int`); longer buffers go
/// in pieces.
const MAX_COUNT: usize = 1 << 30;

/// `MPI_COMM_WORLD` of an MPI job (see the module docs). Dropping it finalises MPI.
pub struct MpiCommunicator {
    world: SimpleCommunicator,
    rank: usize,
    size: usize,
    /// The thread that initialised MPI, the only one allowed to call it unless `serialized`.
    owner: std::thread::ThreadId,
    /// MPI offers `MPI_THREAD_SERIALIZED` (or more): any thread may call, under [`MPI_TURN`].
    serialized: bool,
    // Declared last: MPI is finalised when the universe drops, after the world handle.
    _universe: mpi::environment::Universe,
}

impl std::fmt::Debug for MpiCommunicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MpiCommunicator {{ rank: {}, world_size: {} }}", self.rank, self.size)
    }
}

/// The byte count of a point-to-point message, which MPI takes as a C `int`.
fn message_count(call: &'static str, bytes: &[u8]) -> Result<c_int> {
    c_int::try_from(bytes.len())
        .map_err(|_| Error::value(call, "message", format!("at most {} bytes", c_int::MAX), bytes.len()))
}

/// Per-rank element counts (and their offsets) as the C `int`s a `v` collective takes; an
/// error naming `call` when a count or the total does not fit.
fn int_counts(call: &'static str, counts: &[usize]) -> Result<(Vec<c_int>, Vec<c_int>)> {
    let too_big = |n: usize| Error::value(call, "floats", format!("at most {} in one call", c_int::MAX), n);
    let total: usize = counts.iter().sum();
    c_int::try_from(total).map_err(|_| too_big(total))?;
    let mut offset = 0;
    let mut displs = Vec::with_capacity(counts.len());
    let mut ints = Vec::with_capacity(counts.len());
    for &n in counts {
        displs.push(offset as c_int);
        ints.push(n as c_int);
        offset += n;
    }
    Ok((ints, displs))
}

/// An error naming the MPI call unless it returned `MPI_SUCCESS`.
fn check(call: &str, code: c_int) -> Result<()> {
    if code == ffi::MPI_SUCCESS as c_int {
        Ok(())
    } else {
        Err(Error::Io(format!("{call} failed with MPI error code {code}")))
    }
}

/// `len` values from `at` on, in spans a C `int` can count: `(start, len)` pairs.
fn spans(at: usize, len: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..len).step_by(MAX_COUNT).map(move |o| (at + o, (len - o).min(MAX_COUNT)))
}

/// Waits for every request (the caller holds the MPI turn); they are null afterwards.
fn wait_all(requests: &mut [ffi::MPI_Request]) -> Result<()> {
    if requests.is_empty() {
        return Ok(());
    }
    // SAFETY: every handle came from a non-blocking call (or is null); their buffers are
    // kept in place by the callers until this returns.
    let code = unsafe { ffi::MPI_Waitall(requests.len() as c_int, requests.as_mut_ptr(), ffi::RSMPI_STATUSES_IGNORE) };
    check("MPI_Waitall", code)
}

impl MpiCommunicator {
    /// Initialises MPI (once per process) and joins `MPI_COMM_WORLD`. An error when MPI was
    /// already initialised or the library cannot give `MPI_THREAD_FUNNELED`.
    pub fn init() -> Result<MpiCommunicator> {
        let (universe, level) = mpi::initialize_with_threading(mpi::Threading::Serialized)
            .ok_or_else(|| Error::Io("MPI_Init_thread: MPI is already initialised in this process".into()))?;
        if level < mpi::Threading::Funneled {
            return Err(Error::Io(format!(
                "MPI_Init_thread: the MPI library offers thread level {level:?}, fusebox needs Funneled"
            )));
        }
        let world = universe.world();
        let (rank, size) = (world.rank() as usize, world.size() as usize);
        let serialized = level >= mpi::Threading::Serialized;
        Ok(MpiCommunicator { world, rank, size, owner: std::thread::current().id(), serialized, _universe: universe })
    }

    /// This thread's turn to call MPI: the process-wide lock where MPI is serialized;
    /// otherwise an error unless called on the thread that initialised MPI.
    fn enter(&self, call: &str) -> Result<Option<MutexGuard<'static, ()>>> {
        if self.serialized {
            Ok(Some(mpi_turn()))
        } else if std::thread::current().id() == self.owner {
            Ok(None)
        } else {
            Err(Error::unsupported(
                "MpiCommunicator",
                format!("{call} from a thread other than the one that initialised MPI (MPI_THREAD_FUNNELED)"),
            ))
        }
    }

    /// Starts sending `len` f32 at `ptr` to `peer` under `tag` (the caller holds the turn).
    ///
    /// # Safety
    /// `ptr..ptr+len` must stay valid and unwritten until the request completes.
    unsafe fn isend(&self, ptr: *const f32, len: usize, peer: usize, tag: c_int) -> Result<ffi::MPI_Request> {
        // SAFETY: reading a predefined handle, constant after MPI_Init.
        let mut request = unsafe { ffi::RSMPI_REQUEST_NULL };
        // SAFETY: as the caller promises; `len` ≤ MAX_COUNT fits a C int.
        let code = unsafe {
            ffi::MPI_Isend(
                ptr as *const c_void,
                len as c_int,
                ffi::RSMPI_FLOAT,
                peer as c_int,
                tag,
                self.world.as_raw(),
                &mut request,
            )
        };
        check("MPI_Isend", code)?;
        Ok(request)
    }

    /// Starts receiving `len` f32 from `peer` under `tag` into `ptr` (the caller holds
    /// the turn).
    ///
    /// # Safety
    /// `ptr..ptr+len` must stay valid, and be neither read nor written, until the request
    /// completes.
    unsafe fn irecv(&self, ptr: *mut f32, len: usize, peer: usize, tag: c_int) -> Result<ffi::MPI_Request> {
        // SAFETY: reading a predefined handle, constant after MPI_Init.
        let mut request = unsafe { ffi::RSMPI_REQUEST_NULL };
        // SAFETY: as the caller promises; `len` ≤ MAX_COUNT fits a C int.
        let code = unsafe {
            ffi::MPI_Irecv(
                ptr as *mut c_void,
                len as c_int,
                ffi::RSMPI_FLOAT,
                peer as c_int,
                tag,
                self.world.as_raw(),
                &mut request,
            )
        };
        check("MPI_Irecv", code)?;
        Ok(request)
    }

    fn op(op: ReduceOp) -> ffi::MPI_Op {
        // SAFETY: reading the library's predefined handles, constant after MPI_Init.
        unsafe {
            match op {
                ReduceOp::Sum | ReduceOp::Average => ffi::RSMPI_SUM,
                ReduceOp::Max => ffi::RSMPI_MAX,
            }
        }
    }

    fn scale(&self, op: ReduceOp, buf: &mut [f32]) {
        if op == ReduceOp::Average && self.size > 1 {
            let s = 1.0 / self.size as f32;
            buf.iter_mut().for_each(|x| *x *= s);
        }
    }
}

/// A non-blocking MPI operation's request, waited for or tested under the MPI lock. Its
/// owner keeps the operation's buffers in place until it is done, and waits in `Drop`.
struct Request {
    handle: ffi::MPI_Request,
    done: bool,
}

impl Request {
    fn new(handle: ffi::MPI_Request) -> Request {
        Request { handle, done: false }
    }

    /// Returns once the operation has completed.
    fn wait(&mut self) -> Result<()> {
        if !self.done {
            let _turn = mpi_turn();
            // SAFETY: `handle` came from a non-blocking call and has not completed; its
            // owner keeps the buffers in place until this returns.
            check("MPI_Wait", unsafe { ffi::MPI_Wait(&mut self.handle, ffi::RSMPI_STATUS_IGNORE) })?;
            self.done = true;
        }
        Ok(())
    }

    /// Whether the operation has completed (without waiting).
    fn test(&mut self) -> Result<bool> {
        if !self.done {
            let mut flag: c_int = 0;
            let _turn = mpi_turn();
            // SAFETY: as in `wait`.
            check("MPI_Test", unsafe { ffi::MPI_Test(&mut self.handle, &mut flag, ffi::RSMPI_STATUS_IGNORE) })?;
            self.done = flag != 0;
        }
        Ok(self.done)
    }
}

/// An `MPI_Iallreduce` in flight; owns its buffers until it completes.
struct MpiPending {
    send: Vec<f32>,
    recv: Vec<f32>,
    request: Request,
    /// `1/world_size` for an average, applied once complete.
    scale: Option<f32>,
}

impl PendingAllReduce for MpiPending {
    fn test(&mut self) -> Result<bool> {
        self.request.test()
    }

    fn wait(mut self: Box<Self>) -> Result<Vec<f32>> {
        self.request.wait()?;
        let mut out = std::mem::take(&mut self.recv);
        if let Some(s) = self.scale {
            out.iter_mut().for_each(|x| *x *= s);
        }
        Ok(out)
    }
}

impl Drop for MpiPending {
    fn drop(&mut self) {
        // The buffers must outlive the request: an unfinished reduction is waited for.
        let _ = self.request.wait();
        let _ = &self.send;
    }
}

/// A reduce-scatter in flight, done point to point so that every rank reduces only its
/// own piece: each rank sends each other rank that rank's part of `send` and receives
/// every other rank's part for it into `received`; [`wait`](PendingAllReduce::wait) then
/// combines the parts in rank order. (Open MPI's `MPI_Ireduce_scatter` reduces the whole
/// buffer on rank 0 and scatters it, so rank 0 did all the arithmetic in its progress
/// calls while the others waited.) Owns its buffers until every message has completed.
struct ReduceScatterInFlight {
    send: Vec<f32>,
    /// Each rank's part for this rank (empty for this rank itself: it is in `send`).
    received: Vec<Vec<f32>>,
    /// This rank's part of `send`.
    piece: std::ops::Range<usize>,
    requests: Vec<ffi::MPI_Request>,
    done: bool,
    op: ReduceOp,
    world: usize,
}

impl ReduceScatterInFlight {
    fn wait_all(&mut self) -> Result<()> {
        if !self.done {
            let _turn = mpi_turn();
            wait_all(&mut self.requests)?;
            self.done = true;
        }
        Ok(())
    }
}

impl PendingAllReduce for ReduceScatterInFlight {
    fn test(&mut self) -> Result<bool> {
        if !self.done && !self.requests.is_empty() {
            let mut flag: c_int = 0;
            let _turn = mpi_turn();
            // SAFETY: as in `wait_all`; `flag` is a valid out-pointer.
            let code = unsafe {
                ffi::MPI_Testall(
                    self.requests.len() as c_int,
                    self.requests.as_mut_ptr(),
                    &mut flag,
                    ffi::RSMPI_STATUSES_IGNORE,
                )
            };
            check("MPI_Testall", code)?;
            self.done = flag != 0;
        }
        Ok(self.done || self.requests.is_empty())
    }

    fn wait(mut self: Box<Self>) -> Result<Vec<f32>> {
        self.wait_all()?;
        let me = self.piece.clone();
        let part = |q: usize| if self.received[q].is_empty() { &self.send[me.clone()] } else { &self.received[q][..] };
        // Rank order, the same for every element: ((x₀ ∘ x₁) ∘ x₂) ∘ …
        let mut out = part(0).to_vec();
        for q in 1..self.world {
            let x = part(q);
            match self.op {
                ReduceOp::Max => out.iter_mut().zip(x).for_each(|(o, &v)| *o = o.max(v)),
                ReduceOp::Sum | ReduceOp::Average => out.iter_mut().zip(x).for_each(|(o, &v)| *o += v),
            }
        }
        if self.op == ReduceOp::Average && self.world > 1 {
            let s = 1.0 / self.world as f32;
            out.iter_mut().for_each(|x| *x *= s);
        }
        Ok(out)
    }
}

impl Drop for ReduceScatterInFlight {
    fn drop(&mut self) {
        // The buffers must outlive the messages: unfinished ones are waited for.
        let _ = self.wait_all();
    }
}

/// An `MPI_Isend` in flight; owns its bytes until it completes.
struct MpiSending {
    bytes: Vec<u8>,
    request: Request,
}

// SAFETY: the request is a plain handle, waited for under the MPI lock; the bytes are owned.
unsafe impl Send for MpiSending {}

impl PendingSend for MpiSending {
    fn wait(mut self: Box<Self>) -> Result<()> {
        self.request.wait()
    }
}

impl Drop for MpiSending {
    fn drop(&mut self) {
        // The bytes must outlive the request: an unfinished send is waited for.
        let _ = self.request.wait();
        let _ = &self.bytes;
    }
}

// SAFETY: the handle may be shared and moved between threads, but every MPI call it makes
// first takes its turn (`enter`): under the process-wide lock where MPI is serialized, or
// only on the thread that initialised MPI, as MPI_THREAD_FUNNELED requires; the handles
// themselves are plain values.
unsafe impl Send for MpiCommunicator {}
// SAFETY: as above.
unsafe impl Sync for MpiCommunicator {}

impl Communicator for MpiCommunicator {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.size
    }

    fn all_reduce(&self, buf: &mut [f32], op: ReduceOp) -> Result<()> {
        let _turn = self.enter("MPI_Allreduce")?;
        for piece in buf.chunks_mut(MAX_COUNT) {
            let send = piece.to_vec();
            // SAFETY: both buffers hold `piece.len()` f32 (≤ MAX_COUNT, fits a C int) and
            // live across the blocking call.
            let code = unsafe {
                ffi::MPI_Allreduce(
                    send.as_ptr() as *const c_void,
                    piece.as_mut_ptr() as *mut c_void,
                    piece.len() as c_int,
                    ffi::RSMPI_FLOAT,
                    Self::op(op),
                    self.world.as_raw(),
                )
            };
            check("MPI_Allreduce", code)?;
            self.scale(op, piece);
        }
        Ok(())
    }

    fn start_all_reduce(&self, buf: Vec<f32>, op: ReduceOp) -> Result<Box<dyn PendingAllReduce>> {
        let _turn = self.enter("MPI_Iallreduce")?;
        if buf.len() > MAX_COUNT {
            return Err(Error::value(
                "MPI_Iallreduce",
                "buffer",
                format!("at most {MAX_COUNT} floats in one non-blocking reduction"),
                buf.len(),
            ));
        }
        let mut recv = vec![0.0f32; buf.len()];
        // SAFETY: reading a predefined handle, constant after MPI_Init.
        let mut request = unsafe { ffi::RSMPI_REQUEST_NULL };
        // SAFETY: `buf` and `recv` hold `buf.len()` f32 each; both move into the handle,
        // which keeps their heap storage in place and waits before freeing it.
        let code = unsafe {
            ffi::MPI_Iallreduce(
                buf.as_ptr() as *const c_void,
                recv.as_mut_ptr() as *mut c_void,
                buf.len() as c_int,
                ffi::RSMPI_FLOAT,
                Self::op(op),
                self.world.as_raw(),
                &mut request,
            )
        };
        check("MPI_Iallreduce", code)?;
        let scale = (op == ReduceOp::Average && self.size > 1).then(|| 1.0 / self.size as f32);
        Ok(Box::new(MpiPending { send: buf, recv, request: Request::new(request), scale }))
    }

    fn reduce_scatter(&self, buf: &[f32], counts: &[usize], op: ReduceOp) -> Result<Vec<f32>> {
        let _turn = self.enter("MPI_Reduce_scatter")?;
        let piece = piece_of("MPI_Reduce_scatter", buf.len(), counts, self.rank, self.size)?;
        let (ints, _) = int_counts("MPI_Reduce_scatter", counts)?;
        let mut recv = vec![0.0f32; piece.len()];
        // SAFETY: `buf` holds Σ counts f32 (checked, fits a C int), `recv` holds this rank's
        // count, `ints` one count per rank; all live across the blocking call.
        let code = unsafe {
            ffi::MPI_Reduce_scatter(
                buf.as_ptr() as *const c_void,
                recv.as_mut_ptr() as *mut c_void,
                ints.as_ptr(),
                ffi::RSMPI_FLOAT,
                Self::op(op),
                self.world.as_raw(),
            )
        };
        check("MPI_Reduce_scatter", code)?;
        self.scale(op, &mut recv);
        Ok(recv)
    }

    fn start_reduce_scatter(&self, buf: Vec<f32>, counts: &[usize], op: ReduceOp) -> Result<Box<dyn PendingAllReduce>> {
        let _turn = self.enter("reduce-scatter")?;
        let piece = piece_of("reduce-scatter", buf.len(), counts, self.rank, self.size)?;
        let mut received: Vec<Vec<f32>> =
            (0..self.size).map(|q| if q == self.rank { Vec::new() } else { vec![0.0; piece.len()] }).collect();
        let mut requests = Vec::new();
        let mut started = || -> Result<()> {
            for (q, into) in received.iter_mut().enumerate() {
                for (at, len) in spans(0, into.len()) {
                    // SAFETY: `into` moves into the handle below, which keeps its heap
                    // storage in place, untouched, until the messages complete.
                    requests.push(unsafe { self.irecv(into.as_mut_ptr().add(at), len, q, REDUCE_SCATTER_TAG)? });
                }
            }
            let mut at = 0;
            for (q, &n) in counts.iter().enumerate() {
                if q != self.rank {
                    for (start, len) in spans(at, n) {
                        // SAFETY: as above for `buf`, which is only read.
                        requests.push(unsafe { self.isend(buf.as_ptr().add(start), len, q, REDUCE_SCATTER_TAG)? });
                    }
                }
                at += n;
            }
            Ok(())
        };
        let result = started();
        let pending = ReduceScatterInFlight { send: buf, received, piece, requests, done: false, op, world: self.size };
        result?;
        Ok(Box::new(pending))
    }

    fn all_gather_in_place(&self, bufs: &mut [&mut [f32]], counts: &[Vec<usize>]) -> Result<()> {
        let _turn = self.enter("all_gather_in_place")?;
        check_gather_in_place(bufs, counts)?;
        for (buf, counts) in bufs.iter().zip(counts) {
            piece_of("all_gather_in_place", buf.len(), counts, self.rank, self.size)?;
        }
        let mut requests = Vec::new();
        let mut started = || -> Result<()> {
            for (buf, counts) in bufs.iter_mut().zip(counts) {
                let base = buf.as_mut_ptr();
                let mut at = 0;
                for (q, &n) in counts.iter().enumerate() {
                    for (start, len) in spans(at, n) {
                        if q == self.rank {
                            for peer in (0..self.size).filter(|&p| p != self.rank) {
                                // SAFETY: this rank's part is only read until `wait_all`
                                // below returns; `bufs` is borrowed for the whole call.
                                requests.push(unsafe { self.isend(base.add(start), len, peer, GATHER_TAG)? });
                            }
                        } else {
                            // SAFETY: rank q's part, disjoint from every other part, is
                            // written by MPI alone until `wait_all` below returns.
                            requests.push(unsafe { self.irecv(base.add(start), len, q, GATHER_TAG)? });
                        }
                    }
                    at += n;
                }
            }
            Ok(())
        };
        let result = started();
        // Every message started must complete before the buffers go back to the caller.
        let waited = wait_all(&mut requests);
        result.and(waited)
    }

    fn all_gather(&self, mine: &[f32], counts: &[usize]) -> Result<Vec<f32>> {
        let _turn = self.enter("MPI_Allgatherv")?;
        let total = counts.iter().sum();
        let piece = piece_of("MPI_Allgatherv", total, counts, self.rank, self.size)?;
        check_piece("MPI_Allgatherv", mine.len(), piece.len())?;
        let (ints, displs) = int_counts("MPI_Allgatherv", counts)?;
        let mut all = vec![0.0f32; total];
        // SAFETY: `mine` holds counts[rank] f32, `all` Σ counts (fits a C int), `ints` and
        // `displs` one entry per rank; all live across the blocking call.
        let code = unsafe {
            ffi::MPI_Allgatherv(
                mine.as_ptr() as *const c_void,
                mine.len() as c_int,
                ffi::RSMPI_FLOAT,
                all.as_mut_ptr() as *mut c_void,
                ints.as_ptr(),
                displs.as_ptr(),
                ffi::RSMPI_FLOAT,
                self.world.as_raw(),
            )
        };
        check("MPI_Allgatherv", code)?;
        Ok(all)
    }

    fn broadcast(&self, buf: &mut [f32], root: usize) -> Result<()> {
        let _turn = self.enter("MPI_Bcast")?;
        check_root(root, self.size)?;
        for piece in buf.chunks_mut(MAX_COUNT) {
            // SAFETY: `piece` holds `piece.len()` f32 (fits a C int) across the blocking call.
            let code = unsafe {
                ffi::MPI_Bcast(
                    piece.as_mut_ptr() as *mut c_void,
                    piece.len() as c_int,
                    ffi::RSMPI_FLOAT,
                    root as c_int,
                    self.world.as_raw(),
                )
            };
            check("MPI_Bcast", code)?;
        }
        Ok(())
    }

    fn barrier(&self) -> Result<()> {
        let _turn = self.enter("MPI_Barrier")?;
        self.world.barrier();
        Ok(())
    }

    fn send(&self, dest: usize, bytes: &[u8]) -> Result<()> {
        let _turn = self.enter("MPI_Send")?;
        check_peer("MPI_Send", dest, self.rank, self.size)?;
        let count = message_count("MPI_Send", bytes)?;
        // SAFETY: `bytes` holds `count` bytes and outlives the blocking call.
        let code = unsafe {
            ffi::MPI_Send(
                bytes.as_ptr() as *const c_void,
                count,
                ffi::RSMPI_UINT8_T,
                dest as c_int,
                P2P_TAG,
                self.world.as_raw(),
            )
        };
        check("MPI_Send", code)
    }

    fn start_send(&self, dest: usize, bytes: Vec<u8>) -> Result<Box<dyn PendingSend>> {
        let _turn = self.enter("MPI_Isend")?;
        check_peer("MPI_Isend", dest, self.rank, self.size)?;
        let count = message_count("MPI_Isend", &bytes)?;
        // SAFETY: reading a predefined handle, constant after MPI_Init.
        let mut request = unsafe { ffi::RSMPI_REQUEST_NULL };
        // SAFETY: `bytes` holds `count` bytes; it moves into the handle, which keeps its
        // heap storage in place and waits before freeing it.
        let code = unsafe {
            ffi::MPI_Isend(
                bytes.as_ptr() as *const c_void,
                count,
                ffi::RSMPI_UINT8_T,
                dest as c_int,
                P2P_TAG,
                self.world.as_raw(),
                &mut request,
            )
        };
        check("MPI_Isend", code)?;
        Ok(Box::new(MpiSending { bytes, request: Request::new(request) }))
    }

    fn recv(&self, src: usize) -> Result<Vec<u8>> {
        let _turn = self.enter("MPI_Recv")?;
        check_peer("MPI_Recv", src, self.rank, self.size)?;
        // SAFETY: MPI_Status is plain data, filled in by MPI_Probe.
        let mut status: ffi::MPI_Status = unsafe { std::mem::zeroed() };
        // SAFETY: `status` is a valid out-pointer for the call.
        check("MPI_Probe", unsafe { ffi::MPI_Probe(src as c_int, P2P_TAG, self.world.as_raw(), &mut status) })?;
        let mut count: c_int = 0;
        // SAFETY: `status` was filled in by MPI_Probe; `count` is a valid out-pointer.
        check("MPI_Get_count", unsafe { ffi::MPI_Get_count(&status, ffi::RSMPI_UINT8_T, &mut count) })?;
        let mut buf = vec![0u8; usize::try_from(count).unwrap_or(0)];
        // SAFETY: `buf` holds the `count` bytes the probed message has, across the call.
        let code = unsafe {
            ffi::MPI_Recv(
                buf.as_mut_ptr() as *mut c_void,
                count,
                ffi::RSMPI_UINT8_T,
                src as c_int,
                P2P_TAG,
                self.world.as_raw(),
                ffi::RSMPI_STATUS_IGNORE,
            )
        };
        check("MPI_Recv", code)?;
        Ok(buf)
    }

    fn abort(&self, code: i32, why: &str) -> ! {
        eprintln!("rank {} of {}: {why}", self.rank, self.size);
        // MPI_Abort ends every process of the job, so no rank waits for this one.
        self.world.abort(code)
    }
}
