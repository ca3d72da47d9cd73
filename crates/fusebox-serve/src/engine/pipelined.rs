//! The scheduler's model steps when the model is split over MPI ranks
//! ([`Pipeline`]): batches are *submitted* — rank 0 runs its blocks and sends the
//! hidden state on — and their logits *collected* later, so that up to one batch per
//! rank is in flight and every rank has work: while rank 1 runs one micro-batch of the
//! generating slots, rank 0 runs the next.
//!
//! The generating slots are cut into as many micro-batches as there are ranks; a slot
//! whose logits are awaited is `in_flight` and waits. Prompt chunks go through the
//! pipeline too, alternating with decode micro-batches; a chunk that is not the prompt's
//! last needs no logits, so the next chunk of the same prompt follows it at once (the
//! ranks run them in order). Each turn fills the pipeline, then collects the oldest
//! batch and samples from its logits.

use std::collections::VecDeque;
use std::time::Instant;

use fusebox::{ComputeBackend, Result};
use fusebox_models::pipeline::{Pipeline, Sequence};
use fusebox_models::pretrained::Pretrained;
use fusebox_models::transformer::KvCache;

use super::{accept, picked, Phase, Slot};
use crate::metrics::Metrics;

/// A batch whose logits have not come back.
enum Batch {
    /// A prompt chunk of `tokens` tokens for `slot`'s job number `arrival`; `last`: the
    /// prompt's last chunk, whose logits give the first token.
    Chunk { slot: usize, arrival: u64, tokens: usize, last: bool },
    /// One decode step of these slots (each with its job's arrival number).
    Decode { rows: Vec<(usize, u64)> },
}

/// The batches in flight, oldest first.
pub(super) struct Flight {
    batches: VecDeque<(Batch, Instant)>,
    /// The last submitted batch was a prompt chunk (the next prefers a decode step).
    last_was_chunk: bool,
}

impl Flight {
    pub(super) fn new() -> Flight {
        Flight { batches: VecDeque::new(), last_was_chunk: false }
    }

    /// Nothing awaits its logits.
    pub(super) fn is_empty(&self) -> bool {
        self.batches.is_empty()
    }

    /// One turn: submits batches until one per rank is in flight (or nothing is ready),
    /// then collects the oldest and samples its slots' next tokens. An error is the
    /// pipeline's (a rank's message or compute): the caller ends the server.
    pub(super) fn turn(
        &mut self,
        p: &Pipeline,
        model: &Pretrained,
        b: &dyn ComputeBackend,
        slots: &mut [Slot],
        prefill_chunk: usize,
        vocab: usize,
        m: &Metrics,
    ) -> Result<()> {
        let depth = p.world_size();
        while self.batches.len() < depth {
            let chunk = next_chunk(slots);
            let decoders = next_decoders(slots, depth);
            let batch = match (chunk, decoders.is_empty()) {
                (Some(i), true) => submit_chunk(p, model, b, slots, i, prefill_chunk)?,
                (Some(i), false) if !self.last_was_chunk => submit_chunk(p, model, b, slots, i, prefill_chunk)?,
                (_, false) => submit_decode(p, model, b, slots, &decoders)?,
                (None, true) => break,
            };
            self.last_was_chunk = matches!(batch, Batch::Chunk { .. });
            self.batches.push_back((batch, Instant::now()));
        }
        let Some((batch, started)) = self.batches.pop_front() else { return Ok(()) };
        let logits = p.collect(&model.network, b)?;
        let mut take = |slot: usize, arrival: u64, row: usize| {
            let s = &mut slots[slot];
            s.in_flight = false;
            // The job may have ended (its client left, a shutdown) while its batch ran.
            let Some(a) = s.active.as_mut().filter(|a| a.arrival == arrival) else { return };
            let l = &logits[row];
            if !accept(model, a, &l[..vocab.min(l.len())], s.cache.len, s.cache.capacity, m) {
                s.active = None;
            }
        };
        match batch {
            Batch::Chunk { slot, arrival, tokens, last } => {
                m.add_prefill(tokens, started.elapsed());
                if last {
                    take(slot, arrival, 0);
                }
            }
            Batch::Decode { rows } => {
                m.add_decode(rows.len(), started.elapsed());
                for (row, &(slot, arrival)) in rows.iter().enumerate() {
                    take(slot, arrival, row);
                }
            }
        }
        Ok(())
    }
}

/// The slot of the earliest arrival with prompt left to submit.
fn next_chunk(slots: &[Slot]) -> Option<usize> {
    slots
        .iter()
        .enumerate()
        .filter(|(_, s)| !s.in_flight)
        .filter_map(|(i, s)| match &s.active {
            Some(a) => match a.phase {
                Phase::Prefill { done } if done < a.job.prompt.len() => Some((a.arrival, i)),
                _ => None,
            },
            None => None,
        })
        .min()
        .map(|(_, i)| i)
}

/// The next decode micro-batch: generating slots not in flight, in slot order, at most
/// a `1/depth` share (rounded up) of every generating slot.
fn next_decoders(slots: &[Slot], depth: usize) -> Vec<usize> {
    let generating = |s: &Slot| matches!(s.active.as_ref().map(|a| &a.phase), Some(Phase::Decode { .. }));
    let total = slots.iter().filter(|s| generating(s)).count();
    let share = total.div_ceil(depth.max(1));
    slots.iter().enumerate().filter(|(_, s)| generating(s) && !s.in_flight).map(|(i, _)| i).take(share).collect()
}

/// Submits `slot`'s next prompt chunk.
fn submit_chunk(
    p: &Pipeline,
    model: &Pretrained,
    b: &dyn ComputeBackend,
    slots: &mut [Slot],
    slot: usize,
    chunk: usize,
) -> Result<Batch> {
    let s = &mut slots[slot];
    let Some(a) = s.active.as_mut() else { return Err(chosen_wrongly(slot)) };
    let Phase::Prefill { done } = a.phase else { return Err(chosen_wrongly(slot)) };
    let end = (done + chunk.max(1)).min(a.job.prompt.len());
    let seq = Sequence { slot, ids: &a.job.prompt[done..end] };
    p.submit(&model.network, b, &[seq], &mut [&mut s.cache])?;
    a.phase = Phase::Prefill { done: end };
    let last = end == a.job.prompt.len();
    // Only the last chunk's logits are wanted; until they come, the slot waits.
    s.in_flight = last;
    Ok(Batch::Chunk { slot, arrival: a.arrival, tokens: end - done, last })
}

/// Submits one decode step of `rows` (increasing slot indices).
fn submit_decode(
    p: &Pipeline,
    model: &Pretrained,
    b: &dyn ComputeBackend,
    slots: &mut [Slot],
    rows: &[usize],
) -> Result<Batch> {
    let mut next = Vec::with_capacity(rows.len());
    let mut arrivals = Vec::with_capacity(rows.len());
    for &i in rows {
        match &slots[i].active {
            Some(a) => match a.phase {
                Phase::Decode { next: t } => {
                    next.push(t);
                    arrivals.push((i, a.arrival));
                }
                Phase::Prefill { .. } => return Err(chosen_wrongly(i)),
            },
            None => return Err(chosen_wrongly(i)),
        }
    }
    let seqs: Vec<Sequence<'_>> =
        rows.iter().zip(&next).map(|(&slot, t)| Sequence { slot, ids: std::slice::from_ref(t) }).collect();
    let mut caches: Vec<&mut KvCache> = picked(slots, rows.iter().copied())
        .into_iter()
        .map(|s| {
            s.in_flight = true;
            &mut s.cache
        })
        .collect();
    p.submit(&model.network, b, &seqs, &mut caches)?;
    Ok(Batch::Decode { rows: arrivals })
}

/// A slot passed to a submit function without a job in the phase it was chosen for (they
/// are chosen on this thread just before: a scheduler bug, reported rather than run).
fn chosen_wrongly(slot: usize) -> fusebox::Error {
    fusebox::Error::Io(format!("serve: slot {slot} was chosen for a batch its job is not ready for"))
}
