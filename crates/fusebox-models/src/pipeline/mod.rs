//! One model over several processes: pipeline-parallel inference on MPI.
//!
//! Under `mpirun -np N` the blocks are split into `N` consecutive [`Stage`](crate::transformer::Stage)s
//! ([`split_layers`]); rank `r` loads only stage `r`'s tensors and keeps the KV cache
//! (and recurrent state) of its blocks. Rank 0 holds the embeddings, owns the tokenizer,
//! the sampler and the user, and drives a [`Pipeline`]: each step runs its blocks, sends
//! the hidden state to rank 1 (`x` and the next block's `norm1(x)`, in the [`Wire`]
//! dtype), and waits for the logits, which the last rank computes with the final norm
//! and the head and sends back. A head in a block format is split by vocabulary rows
//! ([`Split`]): the last rank sends the logits of its rows with the normed rows, and
//! rank 0 multiplies those by its own rows. Every other rank runs [`follow`] until rank 0
//! ends the run. A step from rank `r` to `r + 1` is one MPI message; a token costs `N`
//! messages.
//!
//! With the f32 wire each stage computes exactly the bits one process would (see
//! [`crate::transformer::Stage`]), so greedy decoding gives one process's tokens.

pub mod split;
mod wire;

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use fusebox::{ComputeBackend, Error, Result, Tensor};

pub use self::split::{parse_layer_split, split_layers, Split, SplitOptions};
pub use self::wire::Wire;
use self::wire::{Entry, Header, Kind, ALL_LOGITS};

use crate::comm::{Communicator, PendingSend};
use crate::transformer::{KvCache, StageInput, Transformer};

/// What one stage did over a run.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StageStats {
    /// The rank that ran the stage.
    pub rank: usize,
    /// Steps it ran (a prompt is one step, each generated token one).
    pub steps: u64,
    /// Seconds spent in its blocks (and the head on the last stage).
    pub compute_seconds: f64,
    /// Seconds rank 0 waited for the logits after sending a step (rank 0 only): the
    /// other stages' compute plus every hop.
    pub wait_seconds: f64,
    /// Bytes it sent.
    pub bytes_sent: u64,
    /// The rank's peak resident memory in bytes (Linux `VmHWM`; 0 where unknown), read
    /// at the end of the run.
    pub peak_resident_bytes: u64,
}

/// This process's peak resident memory in bytes (Linux `VmHWM`); 0 where unknown.
pub fn peak_resident_bytes() -> u64 {
    let Ok(text) = std::fs::read_to_string("/proc/self/status") else { return 0 };
    let kib = text
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok());
    kib.map_or(0, |k| k * 1024)
}

impl StageStats {
    const FIELDS: usize = 6;

    fn push(&self, out: &mut Vec<u8>) {
        let v = [
            self.rank as f64,
            self.steps as f64,
            self.compute_seconds,
            self.wait_seconds,
            self.bytes_sent as f64,
            self.peak_resident_bytes as f64,
        ];
        v.iter().for_each(|x| out.extend_from_slice(&x.to_le_bytes()));
    }

    fn read_all(bytes: &[u8]) -> Vec<StageStats> {
        let values: Vec<f64> =
            bytes.chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().unwrap_or([0; 8]))).collect();
        values
            .chunks_exact(Self::FIELDS)
            .map(|v| StageStats {
                rank: v[0] as usize,
                steps: v[1] as u64,
                compute_seconds: v[2],
                wait_seconds: v[3],
                bytes_sent: v[4] as u64,
                peak_resident_bytes: v[5] as u64,
            })
            .collect()
    }
}

/// Rank 0's end of a pipeline: runs the first stage and drives the others.
#[derive(Debug)]
pub struct Pipeline {
    comm: Arc<dyn Communicator>,
    wire: Wire,
    stats: Mutex<StageStats>,
    /// The batches [`submit`](Pipeline::submit)ted whose logits have not been collected,
    /// oldest first.
    flight: Mutex<VecDeque<InFlight>>,
}

/// A submitted batch: its send (waited for once its logits are back: by then rank 1
/// has it) and how many rows of logits it gets.
struct InFlight {
    send: Box<dyn PendingSend>,
    rows: usize,
}

impl std::fmt::Debug for InFlight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "InFlight {{ rows: {} }}", self.rows)
    }
}

/// One sequence of a submitted batch: the server's cache slot it lives in (the same slot
/// on every rank) and its new tokens.
#[derive(Debug, Clone, Copy)]
pub struct Sequence<'a> {
    /// Its cache slot, `0 ..` the number of caches each follower holds.
    pub slot: usize,
    /// Its new tokens.
    pub ids: &'a [u32],
}

impl Pipeline {
    /// The pipeline of `comm`'s ranks, driven from this process, which must be rank 0 of
    /// at least two.
    pub fn new(comm: Arc<dyn Communicator>, wire: Wire) -> Result<Pipeline> {
        if comm.rank() != 0 || comm.world_size() < 2 {
            return Err(Error::value(
                "Pipeline",
                "process",
                "rank 0 of two or more (the others run pipeline::follow)",
                format!("rank {} of {}", comm.rank(), comm.world_size()),
            ));
        }
        Ok(Pipeline { comm, wire, stats: Mutex::new(StageStats::default()), flight: Mutex::new(VecDeque::new()) })
    }

    /// Processes in the pipeline.
    pub fn world_size(&self) -> usize {
        self.comm.world_size()
    }

    /// The hidden state's dtype between stages.
    pub fn wire(&self) -> Wire {
        self.wire
    }

    /// Runs `ids` at positions `cache.len ..` through every stage — `model` is the first
    /// — and returns the logits of the last new position `[1, V]`, or of every new
    /// position `[T, V]` when `all` (f32, host).
    ///
    /// # Shapes
    /// `ids`: T tokens, `cache.len + T ≤ cache.capacity` → `[1 | T, V]`.
    pub fn step(
        &self,
        model: &Transformer,
        b: &dyn ComputeBackend,
        ids: &[u32],
        cache: &mut KvCache,
        all: bool,
    ) -> Result<Tensor> {
        let pos = cache.len;
        let start = Instant::now();
        let out = model.forward_stage(b, StageInput::Tokens(ids), cache)?;
        let (x, h) = (b.to_host(&out.x)?, b.to_host(&out.h)?);
        let header = Header {
            kind: Kind::Step,
            flags: if all { ALL_LOGITS } else { 0 },
            rows: ids.len() as u64,
            pos: pos as u64,
        };
        let msg = wire::message(header, |o| {
            // Host f32 tensors: the push cannot fail on them.
            let _ = wire::push_hidden(o, self.wire, &x, &h);
        });
        let sent = Instant::now();
        self.comm.send(1, &msg)?;
        let last = self.comm.world_size() - 1;
        let reply = self.comm.recv(last)?;
        let waited = sent.elapsed().as_secs_f64();
        let rows = if all { ids.len() } else { 1 };
        let logits = logits_from(model, b, &reply, last, rows, "a step")?;
        let mut s = self.stats.lock().map_err(|_| Error::Io("pipeline: counters poisoned".into()))?;
        s.steps += 1;
        s.wait_seconds += waited;
        s.compute_seconds += start.elapsed().as_secs_f64() - waited;
        s.bytes_sent += msg.len() as u64;
        Tensor::from_vec(logits, [rows, model.arch.vocab_size])
    }

    /// Starts a server's batch: runs the first stage (`model`) over `seqs` — one sequence
    /// of any number of new tokens (a prompt chunk), or several of one token each (a decode
    /// step) — with rank 0's `caches` of their slots, sends the result on and returns
    /// without waiting for the logits, so that the next batch can run here while the other
    /// stages run this one. [`collect`](Self::collect) gives the batches' logits back in
    /// the order they were submitted; at most `world_size` batches should be in flight.
    ///
    /// # Shapes
    /// `seqs`: one sequence of T tokens, or N of one token with distinct, increasing
    /// slots; `caches`: one per sequence, with room for its tokens.
    pub fn submit(
        &self,
        model: &Transformer,
        b: &dyn ComputeBackend,
        seqs: &[Sequence<'_>],
        caches: &mut [&mut KvCache],
    ) -> Result<()> {
        const OP: &str = "Pipeline::submit";
        let start = Instant::now();
        let entries: Vec<Entry> =
            seqs.iter().zip(caches.iter()).map(|(s, c)| Entry { slot: s.slot, pos: c.len, len: s.ids.len() }).collect();
        check_batch_table(OP, &entries)?;
        let out = match (seqs, &mut *caches) {
            ([one], [cache]) => model.forward_stage(b, StageInput::Tokens(one.ids), cache)?,
            _ => {
                let ids: Vec<u32> = seqs.iter().map(|s| s.ids[0]).collect();
                model.forward_batch_stage(b, StageInput::Tokens(&ids), caches)?
            }
        };
        let (x, h) = (b.to_host(&out.x)?, b.to_host(&out.h)?);
        let header = Header { kind: Kind::Batch, flags: 0, rows: seqs.len() as u64, pos: 0 };
        let msg = wire::message(header, |o| {
            wire::push_table(o, &entries);
            // Host f32 tensors: the push cannot fail on them.
            let _ = wire::push_hidden(o, self.wire, &x, &h);
        });
        let bytes = msg.len() as u64;
        let send = self.comm.start_send(1, msg)?;
        self.flight
            .lock()
            .map_err(|_| Error::Io("pipeline: queue poisoned".into()))?
            .push_back(InFlight { send, rows: seqs.len() });
        let mut s = self.stats.lock().map_err(|_| Error::Io("pipeline: counters poisoned".into()))?;
        s.steps += 1;
        s.compute_seconds += start.elapsed().as_secs_f64();
        s.bytes_sent += bytes;
        Ok(())
    }

    /// Batches submitted and not yet collected.
    pub fn in_flight(&self) -> usize {
        self.flight.lock().map_or(0, |f| f.len())
    }

    /// Waits for the oldest submitted batch's logits: each sequence's last position's
    /// `[V]` (f32), in the order they were submitted (`b` runs this rank's rows of a split
    /// head).
    pub fn collect(&self, model: &Transformer, b: &dyn ComputeBackend) -> Result<Vec<Vec<f32>>> {
        let oldest = self
            .flight
            .lock()
            .map_err(|_| Error::Io("pipeline: queue poisoned".into()))?
            .pop_front()
            .ok_or_else(|| Error::value("Pipeline::collect", "batches in flight", "at least one", 0))?;
        let last = self.comm.world_size() - 1;
        let waiting = Instant::now();
        let reply = self.comm.recv(last)?;
        let waited = waiting.elapsed().as_secs_f64();
        // Rank 1 has had the batch since before the logits came back.
        oldest.send.wait()?;
        let start = Instant::now();
        let logits = logits_from(model, b, &reply, last, oldest.rows, "a batch")?;
        let mut s = self.stats.lock().map_err(|_| Error::Io("pipeline: counters poisoned".into()))?;
        s.wait_seconds += waited;
        s.compute_seconds += start.elapsed().as_secs_f64();
        let v = model.arch.vocab_size;
        Ok(logits.chunks_exact(v).map(<[f32]>::to_vec).collect())
    }

    /// Ends the other ranks' [`follow`] loops; returns every stage's counters, rank 0's
    /// first. Call once, when no step will follow and every submitted batch has been
    /// collected.
    pub fn finish(&self) -> Result<Vec<StageStats>> {
        let open = self.in_flight();
        if open > 0 {
            return Err(Error::value("Pipeline::finish", "batches in flight", "none (collect them first)", open));
        }
        let end = wire::message(Header { kind: Kind::End, flags: 0, rows: 0, pos: 0 }, |_| ());
        self.comm.send(1, &end)?;
        let last = self.comm.world_size() - 1;
        let reply = self.comm.recv(last)?;
        let (header, payload) = wire::parse(&reply, last)?;
        if header.kind != Kind::End {
            return Err(Error::Io(format!("pipeline: rank {last} answered the end with {:?}", header.kind)));
        }
        let mut mine = self.stats.lock().map_err(|_| Error::Io("pipeline: counters poisoned".into()))?.clone();
        mine.peak_resident_bytes = peak_resident_bytes();
        let mut all = vec![mine];
        all.extend(StageStats::read_all(payload));
        Ok(all)
    }
}

/// The loop of every rank but 0: receives steps from the previous rank, runs this
/// stage's blocks (`model`) over its caches, and hands the result on — to the next rank,
/// or from the last stage the logits to rank 0 — until rank 0 ends the run. `caches[s]`
/// is slot `s`'s cache: a single sequence (`generate`, `chat`) lives in slot 0, a server's
/// in as many slots as it has. A step at position 0 starts a new sequence in its slot
/// (the cache is cleared).
pub fn follow(
    model: &Transformer,
    b: &dyn ComputeBackend,
    comm: &dyn Communicator,
    wire: Wire,
    caches: &mut [KvCache],
) -> Result<()> {
    let (rank, world) = (comm.rank(), comm.world_size());
    if rank == 0 || rank >= world {
        return Err(Error::value("pipeline::follow", "rank", format!("1..{world}"), rank));
    }
    if caches.is_empty() {
        return Err(Error::value("pipeline::follow", "caches", "at least one", 0));
    }
    let last = rank + 1 == world;
    let d = model.arch.d_model;
    let mut stats = StageStats { rank, ..StageStats::default() };
    loop {
        let msg = comm.recv(rank - 1)?;
        let (header, payload) = wire::parse(&msg, rank - 1)?;
        let start = Instant::now();
        let reply = match header.kind {
            Kind::End => {
                stats.peak_resident_bytes = peak_resident_bytes();
                let reply = wire::message(header, |o| {
                    o.extend_from_slice(payload);
                    stats.push(o);
                });
                comm.send(if last { 0 } else { rank + 1 }, &reply)?;
                return Ok(());
            }
            Kind::Logits => {
                return Err(Error::Io(format!("pipeline: rank {rank} was sent logits by rank {}", rank - 1)));
            }
            Kind::Step => {
                let (rows, pos) = (header.rows as usize, header.pos as usize);
                let cache = &mut caches[0];
                start_at(b, rank, pos, cache)?;
                let (x, h) = wire::read_hidden(payload, wire, rows, d, rank - 1)?;
                let out = model.forward_stage(b, StageInput::Hidden { x: b.upload(&x)?, h: b.upload(&h)? }, cache)?;
                if last {
                    logits_message(model, b, &out.h, header.flags & ALL_LOGITS != 0, header.pos)?
                } else {
                    hidden_message(b, header, &[], wire, &out)?
                }
            }
            Kind::Batch => {
                let (entries, hidden) = wire::read_table(payload, header.rows as usize, rank - 1)?;
                check_batch_table("pipeline::follow", &entries)?;
                let rows: usize = entries.iter().map(|e| e.len).sum();
                let (x, h) = wire::read_hidden(hidden, wire, rows, d, rank - 1)?;
                let (x, h) = (b.upload(&x)?, b.upload(&h)?);
                let mut picked = slot_caches(caches, &entries, rank)?;
                for (e, c) in entries.iter().zip(picked.iter_mut()) {
                    start_at(b, rank, e.pos, c)?;
                }
                let out = match picked.as_mut_slice() {
                    [cache] => model.forward_stage(b, StageInput::Hidden { x, h }, cache)?,
                    many => {
                        let n = many.len();
                        let (x, h) = (x.reshape([n, 1, d])?, h.reshape([n, 1, d])?);
                        model.forward_batch_stage(b, StageInput::Hidden { x, h }, many)?
                    }
                };
                if last {
                    logits_message(model, b, &out.h, entries.len() > 1, 0)?
                } else {
                    hidden_message(b, header, &entries, wire, &out)?
                }
            }
        };
        stats.steps += 1;
        stats.compute_seconds += start.elapsed().as_secs_f64();
        stats.bytes_sent += reply.len() as u64;
        comm.send(if last { 0 } else { rank + 1 }, &reply)?;
    }
}

/// Readies `cache` for a step at `pos`: a new sequence at 0 (the backing its
/// predecessor grew given back, as rank 0's server slots do), else the next position.
fn start_at(b: &dyn ComputeBackend, rank: usize, pos: usize, cache: &mut KvCache) -> Result<()> {
    if pos == 0 {
        cache.release(b)?;
    } else if pos != cache.len {
        return Err(Error::Io(format!(
            "pipeline: rank {rank} holds {} positions but was sent a step at position {pos}",
            cache.len
        )));
    }
    Ok(())
}

/// The last stage's answer to rank 0 for its output `h` `[1 | N, T, D]` (every row's
/// when `all`, else the last's): the logits of its vocabulary rows `[rows, V − V₀]`, and
/// when rank 0 holds the head's first `V₀ > 0` rows, the normed rows `[rows, D]` (f32:
/// rank 0's logits are then the bits this rank would compute).
fn logits_message(model: &Transformer, b: &dyn ComputeBackend, h: &Tensor, all: bool, pos: u64) -> Result<Vec<u8>> {
    let input = model.head_input(b, h, all)?;
    let logits = model.head_logits(b, &input)?;
    let rows = logits.dims()[0] as u64;
    let shared = model.stage().head_share(model.arch.vocab_size).start > 0;
    let input = if shared { Some(b.to_host(&input)?) } else { None };
    Ok(wire::message(Header { kind: Kind::Logits, flags: 0, rows, pos }, |o| {
        wire::push_f32s(o, logits.as_slice::<f32>().unwrap_or(&[]));
        if let Some(h) = &input {
            wire::push_f32s(o, h.as_slice::<f32>().unwrap_or(&[]));
        }
    }))
}

/// The logits `[rows × V]` (row-major) of the last rank's answer `reply` to `what`: its
/// rows of the head, and this rank's rows (the head's first `V₀`, see
/// [`Stage::head_share`](crate::transformer::Stage::head_share)) computed here from the
/// normed rows it sent along.
fn logits_from(
    model: &Transformer,
    b: &dyn ComputeBackend,
    reply: &[u8],
    last: usize,
    rows: usize,
    what: &str,
) -> Result<Vec<f32>> {
    let (header, payload) = wire::parse(reply, last)?;
    let (v, d) = (model.arch.vocab_size, model.arch.d_model);
    let lead = model.stage().head_share(v).len();
    let theirs = rows * (v - lead) * 4;
    let hidden = if lead > 0 { rows * d * 4 } else { 0 };
    if header.kind != Kind::Logits || header.rows != rows as u64 || payload.len() != theirs + hidden {
        return Err(Error::Io(format!(
            "pipeline: rank {last} answered {what} with {:?} of {} rows ({} bytes), expected the logits of {rows} \
             rows × {} (and {hidden} bytes of normed rows)",
            header.kind,
            header.rows,
            payload.len(),
            v - lead
        )));
    }
    let tail = wire::f32s(&payload[..theirs]);
    if lead == 0 {
        return Ok(tail);
    }
    let h = Tensor::from_vec(wire::f32s(&payload[theirs..]), [rows, d])?;
    let own = model.head_logits(b, &b.upload(&h)?)?;
    let own = own.as_slice::<f32>()?;
    let mut out = Vec::with_capacity(rows * v);
    for r in 0..rows {
        out.extend_from_slice(&own[r * lead..(r + 1) * lead]);
        out.extend_from_slice(&tail[r * (v - lead)..(r + 1) * (v - lead)]);
    }
    Ok(out)
}

/// A stage's output as the next stage's input: `header`, the batch table (if any), `x`, `h`.
fn hidden_message(
    b: &dyn ComputeBackend,
    header: Header,
    entries: &[Entry],
    wire: Wire,
    out: &crate::transformer::StageOutput,
) -> Result<Vec<u8>> {
    let (x, h) = (b.to_host(&out.x)?, b.to_host(&out.h)?);
    let mut m = wire::message(header, |o| wire::push_table(o, entries));
    wire::push_hidden(&mut m, wire, &x, &h)?;
    Ok(m)
}

/// A batch is one sequence of any length, or several of one position each in distinct,
/// increasing slots (each slot's cache is taken once).
fn check_batch_table(op: &'static str, entries: &[Entry]) -> Result<()> {
    let ok = match entries {
        [] => false,
        [one] => one.len > 0,
        many => many.iter().all(|e| e.len == 1) && many.windows(2).all(|w| w[0].slot < w[1].slot),
    };
    if ok {
        Ok(())
    } else {
        let shown: Vec<String> = entries.iter().map(|e| format!("slot {} +{}", e.slot, e.len)).collect();
        Err(Error::value(
            op,
            "batch",
            "one sequence, or several of one token each in increasing slots",
            shown.join(", "),
        ))
    }
}

/// This rank's caches of the batch's slots, in its order.
fn slot_caches<'c>(caches: &'c mut [KvCache], entries: &[Entry], rank: usize) -> Result<Vec<&'c mut KvCache>> {
    let n = caches.len();
    if let Some(e) = entries.iter().find(|e| e.slot >= n) {
        return Err(Error::Io(format!(
            "pipeline: rank {rank} holds {n} cache slots but was sent a step for slot {}: do all ranks run with the \
             same --parallel?",
            e.slot
        )));
    }
    let mut wanted = entries.iter().map(|e| e.slot).peekable();
    let mut picked = Vec::with_capacity(entries.len());
    for (i, c) in caches.iter_mut().enumerate() {
        if wanted.peek() == Some(&i) {
            wanted.next();
            picked.push(c);
        }
    }
    Ok(picked)
}
