//! One model over several processes: pipeline-parallel inference on MPI.
//!
//! Under `mpirun -np N` the blocks are split into `N` consecutive [`Stage`](crate::transformer::Stage)s
//! ([`split_layers`]); rank `r` loads only stage `r`'s tensors and keeps the KV cache
//! (and recurrent state) of its blocks. Rank 0 holds the embeddings, owns the tokenizer,
//! the sampler and the user, and drives a [`Pipeline`]: each step runs its blocks, sends
//! the hidden state to rank 1 (`x` and the next block's `norm1(x)`, in the [`Wire`]
//! dtype), and waits for the logits, which the last rank computes with the final norm
//! and the head and sends back. Every other rank runs [`follow`] until rank 0 ends the
//! run. A step from rank `r` to `r + 1` is one MPI message; a token costs `N` messages.
//!
//! With the f32 wire each stage computes exactly the bits one process would (see
//! [`crate::transformer::Stage`]), so greedy decoding gives one process's tokens.

pub mod split;
mod wire;

use std::sync::{Arc, Mutex};
use std::time::Instant;

use fusebox::{ComputeBackend, Error, Result, Tensor};

pub use self::split::{parse_layer_split, split_layers};
pub use self::wire::Wire;
use self::wire::{Header, Kind, ALL_LOGITS};

use crate::comm::Communicator;
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
        Ok(Pipeline { comm, wire, stats: Mutex::new(StageStats::default()) })
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
        let (header, payload) = wire::parse(&reply, last)?;
        let rows = if all { ids.len() } else { 1 };
        let v = model.arch.vocab_size;
        if header.kind != Kind::Logits || header.rows != rows as u64 || payload.len() != rows * v * 4 {
            return Err(Error::Io(format!(
                "pipeline: rank {last} answered a step with {:?} of {} rows ({} bytes), expected the logits of {rows} \
                 rows × {v}",
                header.kind,
                header.rows,
                payload.len()
            )));
        }
        let mut s = self.stats.lock().map_err(|_| Error::Io("pipeline: counters poisoned".into()))?;
        s.steps += 1;
        s.wait_seconds += waited;
        s.compute_seconds += start.elapsed().as_secs_f64() - waited;
        s.bytes_sent += msg.len() as u64;
        Tensor::from_vec(wire::f32s(payload), [rows, v])
    }

    /// Ends the other ranks' [`follow`] loops; returns every stage's counters, rank 0's
    /// first. Call once, when no step will follow.
    pub fn finish(&self) -> Result<Vec<StageStats>> {
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
/// stage's blocks (`model`) over `cache`, and hands the result on — to the next rank, or
/// from the last stage the logits to rank 0 — until rank 0 ends the run. A step at
/// position 0 starts a new sequence (the cache is cleared).
pub fn follow(
    model: &Transformer,
    b: &dyn ComputeBackend,
    comm: &dyn Communicator,
    wire: Wire,
    cache: &mut KvCache,
) -> Result<()> {
    let (rank, world) = (comm.rank(), comm.world_size());
    if rank == 0 || rank >= world {
        return Err(Error::value("pipeline::follow", "rank", format!("1..{world}"), rank));
    }
    let last = rank + 1 == world;
    let d = model.arch.d_model;
    let mut stats = StageStats { rank, ..StageStats::default() };
    loop {
        let msg = comm.recv(rank - 1)?;
        let (header, payload) = wire::parse(&msg, rank - 1)?;
        match header.kind {
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
            Kind::Step => {}
        }
        let start = Instant::now();
        let (rows, pos) = (header.rows as usize, header.pos as usize);
        if pos == 0 {
            cache.clear();
        } else if pos != cache.len {
            return Err(Error::Io(format!(
                "pipeline: rank {rank} holds {} positions but was sent a step at position {pos}",
                cache.len
            )));
        }
        let (x, h) = wire::read_hidden(payload, wire, rows, d, rank - 1)?;
        let out = model.forward_stage(b, StageInput::Hidden { x: b.upload(&x)?, h: b.upload(&h)? }, cache)?;
        let reply = if last {
            let all = header.flags & ALL_LOGITS != 0;
            let logits = model.stage_logits(b, &out.h, all)?;
            let rows = logits.dims()[0] as u64;
            wire::message(Header { kind: Kind::Logits, flags: 0, rows, pos: header.pos }, |o| {
                wire::push_f32s(o, logits.as_slice::<f32>().unwrap_or(&[]))
            })
        } else {
            let (x, h) = (b.to_host(&out.x)?, b.to_host(&out.h)?);
            let mut m = wire::message(header, |_| ());
            wire::push_hidden(&mut m, wire, &x, &h)?;
            m
        };
        stats.steps += 1;
        stats.compute_seconds += start.elapsed().as_secs_f64();
        stats.bytes_sent += reply.len() as u64;
        comm.send(if last { 0 } else { rank + 1 }, &reply)?;
    }
}
