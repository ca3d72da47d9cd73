//! Held-out evaluation: the weighted mean cross-entropy of a network over a data source's
//! held-out batches, and greedy exact match.

use fusebox::{ComputeBackend, Error, Result};

use super::data::HeldOut;
use crate::sampler::argmax;
use crate::transformer::Transformer;

/// Results of an evaluation.
#[derive(Debug, Clone, Copy)]
pub struct EvalStats {
    /// Mean held-out loss.
    pub loss: f32,
    /// Exact-match accuracy on the held-out sequences (addition, chat data).
    pub accuracy: Option<f64>,
}

/// `Σ wᵢ·lossᵢ / Σ wᵢ` over the batches of `held` (`lossᵢ` the batch's mean cross-entropy
/// over the targets that are not `ignore`), and with `held.exact_match` the share of
/// sequences whose every counted target is the arg-max of its logits.
///
/// That share is greedy decoding's exact match, read off one teacher-forced pass: greedy
/// reproduces the answer iff at every answer position the arg-max given the correct
/// prefix is the correct token.
pub fn evaluate(b: &dyn ComputeBackend, net: &Transformer, held: &HeldOut, ignore: Option<u32>) -> Result<EvalStats> {
    let (mut loss_sum, mut weight_sum) = (0.0f64, 0.0f64);
    let (mut correct, mut sequences) = (0usize, 0usize);
    let vocab = net.arch.vocab_size;
    for (batch, weight) in &held.batches {
        sequences += batch.rows;
        if *weight == 0.0 {
            continue;
        }
        let (ids, targets) = batch.clone().upload(b)?;
        let logits = net.forward_logits(b, &ids)?;
        let ce = b.cross_entropy(&logits, &targets.reshape([batch.rows * batch.seq])?, ignore)?;
        loss_sum += b.to_host(&ce.loss)?.to_vec::<f32>()?[0] as f64 * weight;
        weight_sum += weight;
        if held.exact_match {
            let logits = b.to_host(&logits)?.to_vec::<f32>()?;
            for (row, targets) in batch.targets.chunks(batch.seq.max(1)).enumerate() {
                let all_right = targets.iter().enumerate().filter(|(_, &t)| Some(t) != ignore).all(|(s, &t)| {
                    let at = (row * batch.seq + s) * vocab;
                    argmax(&logits[at..at + vocab]) == t
                });
                correct += usize::from(all_right);
            }
        }
    }
    if weight_sum == 0.0 {
        return Err(Error::value("evaluate", "held-out targets", "at least one counted token", 0));
    }
    Ok(EvalStats {
        loss: (loss_sum / weight_sum) as f32,
        accuracy: held.exact_match.then(|| correct as f64 / sequences as f64),
    })
}
