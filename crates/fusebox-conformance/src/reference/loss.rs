//! f64 twin of the cross-entropy: per row `logsumexp(z) − z[target]`, averaged over the
//! rows that count, and its gradient `(softmax(z) − onehot(target))/count`.

use crate::array::Array;

/// `ln Σ_j e^(z_j)` of one row, stabilised by its max.
fn logsumexp(row: &[f64]) -> f64 {
    let max = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    max + row.iter().map(|&z| (z - max).exp()).sum::<f64>().ln()
}

/// Whether a row counts (its target is not the ignore index).
fn counts(target: f64, ignore_index: Option<u32>) -> bool {
    ignore_index.is_none_or(|ig| target != ig as f64)
}

/// `(mean loss, d_logits, count)` for logits `[N, V]` and targets `[N]` (as f64 ids).
/// No counted row: loss 0, zero gradient.
pub fn cross_entropy(logits: &Array, targets: &Array, ignore_index: Option<u32>) -> (f64, Array, usize) {
    let d = cross_entropy_backward(logits, targets, ignore_index, 1.0);
    let mut total = 0.0;
    let mut count = 0;
    for r in 0..logits.rows() {
        if counts(targets.data[r], ignore_index) {
            let row = logits.row(r);
            total += logsumexp(row) - row[targets.data[r] as usize];
            count += 1;
        }
    }
    let loss = if count == 0 { 0.0 } else { total / count as f64 };
    (loss, d, count)
}

/// `d_logits = d_loss·(softmax(z) − onehot(target))/count`, zero rows where ignored.
pub fn cross_entropy_backward(logits: &Array, targets: &Array, ignore_index: Option<u32>, d_loss: f64) -> Array {
    let mut d = Array::zeros(logits.shape.clone());
    let count = targets.data.iter().filter(|&&t| counts(t, ignore_index)).count();
    let v = logits.last_dim();
    for r in 0..logits.rows() {
        if !counts(targets.data[r], ignore_index) {
            continue;
        }
        let row = logits.row(r);
        let lse = logsumexp(row);
        for (j, &z) in row.iter().enumerate() {
            let onehot = if j == targets.data[r] as usize { 1.0 } else { 0.0 };
            d.data[r * v + j] = d_loss * ((z - lse).exp() - onehot) / count as f64;
        }
    }
    d
}
