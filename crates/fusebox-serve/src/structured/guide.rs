//! One constrained answer on the model thread: the mask each step samples under, and
//! the matcher each sampled token advances.
//!
//! A step's order: the sampler needs the mask (ready, or waited for); the sampled token
//! is committed to the matcher at once (cheap: it says whether the grammar is finished,
//! which ends the answer without another forward); then the matcher goes to the guide's
//! thread, which computes the next mask while the model thread runs the next forward
//! over every slot. Time the model thread spends waiting for a mask is counted.

use std::sync::mpsc::{channel, Receiver, Sender};
use std::time::{Duration, Instant};

use llguidance::Matcher;
use toktrie::SimpleVob;

/// A matcher and its mask, or what went wrong computing it.
type Computed = (Box<Matcher>, Result<SimpleVob, String>);

enum State {
    /// The mask of the next token.
    Ready(Box<Matcher>, SimpleVob),
    /// The guide's thread is computing it.
    Computing,
    /// The matcher failed (its message was returned once).
    Failed,
}

/// What a committed token did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Commit {
    /// The grammar goes on.
    More,
    /// The grammar is complete and allows nothing more but the end: the answer ends.
    Finished,
}

/// A constrained answer's state (see the module docs).
pub struct Guide {
    state: State,
    /// To the guide's thread (started at the first commit) and back.
    worker: Option<(Sender<Box<Matcher>>, Receiver<Computed>)>,
    /// Time the model thread waited for masks.
    waited: Duration,
    /// The vocabulary's end-of-sequence ids.
    ends: Vec<u32>,
}

impl std::fmt::Debug for Guide {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match self.state {
            State::Ready(..) => "ready",
            State::Computing => "computing",
            State::Failed => "failed",
        };
        f.debug_struct("Guide").field("state", &state).field("waited", &self.waited).finish()
    }
}

impl Guide {
    /// A guide from a started matcher and the mask of its first token.
    pub fn new(matcher: Matcher, mask: SimpleVob) -> Guide {
        let ends = matcher.tok_env().map(|env| env.tok_trie().eos_tokens().to_vec()).unwrap_or_default();
        Guide { state: State::Ready(Box::new(matcher), mask), worker: None, waited: Duration::ZERO, ends }
    }

    /// An independent copy for another choice of the same request (its own parser
    /// state and caches).
    pub fn fork(&self) -> Option<Guide> {
        match &self.state {
            State::Ready(m, mask) => Some(Guide::new(m.deep_clone(), mask.clone())),
            _ => None,
        }
    }

    /// Time the model thread has waited for this guide's masks.
    pub fn waited(&self) -> Duration {
        self.waited
    }

    /// The mask of the next token, waiting for the guide's thread if it is still at it.
    pub fn mask(&mut self) -> Result<&SimpleVob, String> {
        if matches!(self.state, State::Computing) {
            let start = Instant::now();
            let got = self.worker.as_ref().map(|(_, rx)| rx.recv());
            self.waited += start.elapsed();
            self.state = match got {
                Some(Ok((m, Ok(mask)))) if !mask.is_zero() => State::Ready(m, mask),
                Some(Ok((_, Ok(_)))) => {
                    self.state = State::Failed;
                    return Err("the constraint allows no next token".into());
                }
                Some(Ok((_, Err(e)))) => {
                    self.state = State::Failed;
                    return Err(e);
                }
                _ => {
                    self.state = State::Failed;
                    return Err("the constraint's thread ended".into());
                }
            };
        }
        match &self.state {
            State::Ready(_, mask) => Ok(mask),
            _ => Err("the constraint failed earlier".into()),
        }
    }

    /// Whether `id` ends the answer under the constraint (one of the vocabulary's
    /// end-of-sequence ids; the mask allows them only where the grammar is complete).
    pub fn is_end(&self, id: u32) -> bool {
        self.ends.contains(&id)
    }

    /// Advances the matcher by the sampled `id` and starts computing the next mask.
    pub fn commit(&mut self, id: u32) -> Result<Commit, String> {
        let State::Ready(mut m, mask) = std::mem::replace(&mut self.state, State::Failed) else {
            return Err("the constraint has no mask for this token".into());
        };
        if !mask.is_allowed(id) {
            return Err(format!("token {id} was sampled outside the constraint's mask"));
        }
        m.consume_token(id).map_err(|e| e.to_string())?;
        if m.is_stopped() {
            return Ok(Commit::Finished);
        }
        let (to, _) = self.worker.get_or_insert_with(spawn_worker);
        to.send(m).map_err(|_| "the constraint's thread ended".to_string())?;
        self.state = State::Computing;
        Ok(Commit::More)
    }
}

/// The guide's thread: takes a matcher, sends it back with its next mask; ends when its
/// guide is dropped.
fn spawn_worker() -> (Sender<Box<Matcher>>, Receiver<Computed>) {
    let (to, inbox) = channel::<Box<Matcher>>();
    let (outbox, from) = channel::<Computed>();
    let spawned = std::thread::Builder::new().name("fusebox-mask".into()).spawn(move || {
        for mut m in inbox {
            let mask = m.compute_mask().map_err(|e| e.to_string());
            if outbox.send((m, mask)).is_err() {
                break;
            }
        }
    });
    if spawned.is_err() {
        // Without a thread the inbox is dropped: the next `mask` reports the failure.
        return (channel().0, from);
    }
    (to, from)
}

/// `logits` with every id outside `mask` set to −∞ (the sampler then never picks one:
/// greedy takes the argmax of the rest, and a softmax gives them probability 0 before
/// top-k, top-p and min-p look).
pub fn masked(logits: &[f32], mask: &SimpleVob) -> Vec<f32> {
    let mut out = logits.to_vec();
    let words = mask.as_slice();
    for (w, chunk) in out.chunks_mut(32).enumerate() {
        let bits = words.get(w).copied().unwrap_or(0);
        if bits == u32::MAX {
            continue;
        }
        for (b, l) in chunk.iter_mut().enumerate() {
            if bits & (1 << b) == 0 {
                *l = f32::NEG_INFINITY;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masking_keeps_exactly_the_allowed_logits() {
        let mut mask = SimpleVob::alloc(70);
        for id in [0u32, 31, 32, 33, 64, 69] {
            mask.allow_token(id);
        }
        let logits: Vec<f32> = (0..70).map(|i| i as f32).collect();
        let m = masked(&logits, &mask);
        for (i, &l) in m.iter().enumerate() {
            if mask.is_allowed(i as u32) {
                assert_eq!(l, i as f32);
            } else {
                assert_eq!(l, f32::NEG_INFINITY, "{i}");
            }
        }
        let all = SimpleVob::alloc_ones(64);
        assert_eq!(masked(&logits[..64], &all), logits[..64]);
    }
}
