//! Fused cross-entropy: one pass per row computes the max, `Σ e^(z − max)`, the row's
//! loss `ln Σ e^(z − max) + max − z[target]` and `d_logits = (softmax(z) − onehot)/count`
//! (times `d_loss` in the backward), without materializing the softmax separately.
//!
//! Rows run in parallel; each writes its own d_logits row and its own loss slot, and the
//! per-row losses are summed afterwards in row order in f64, so the loss is the same for
//! any thread count.

use crate::cpu::output::{self, Dst};
use crate::cpu::pool::SharedMut;
use crate::cpu::simd;
use crate::cpu::softmax;
#[cfg(target_arch = "x86_64")]
use crate::cpu::softmax_x86;
use crate::cpu::{convert, CpuBackend};
use crate::dtype::DType;
use crate::error::Result;
use crate::shape::Shape;
use crate::spec::softmax::{self as spec, CrossEntropySpec};
use crate::tensor::Tensor;
use crate::types::CrossEntropyOutput;

/// Work units per logit (max, exp and sum, scale).
const ROW_WORK: usize = 4;
/// Logits per parallel task (8 rows of a 32 000-token vocabulary).
const TASK_ELEMS: usize = 1 << 18;

/// Validated inputs: logits as f32, targets, and which rows count.
struct Rows<'a> {
    logits: std::borrow::Cow<'a, [f32]>,
    targets: &'a [u32],
    n: usize,
    vocab: usize,
    ignore: Option<u32>,
    count: usize,
}

impl Rows<'_> {
    /// Whether row `r` is skipped (its target is the ignore index).
    fn ignored(&self, r: usize) -> bool {
        self.ignore == Some(self.targets[r])
    }
}

/// Checks shapes, dtypes and every target (`< V` unless ignored) before any work.
fn read<'a>(op: &'static str, logits: &'a Tensor, targets: &'a Tensor, ignore: Option<u32>) -> Result<Rows<'a>> {
    let CrossEntropySpec { n, vocab, .. } = spec::cross_entropy(op, logits, targets)?;
    let ids = targets.as_slice::<u32>()?;
    let count = spec::cross_entropy_targets(op, ids, vocab, ignore)?;
    Ok(Rows { logits: convert::f32_data(op, "logits", logits)?, targets: ids, n, vocab, ignore, count })
}

/// One row whose max `m` is known (folded while the previous row was written):
/// `d = scale·softmax(z)` with `scale` subtracted at the target, written once (see
/// `softmax::scaled_softmax_row`), returning the row's loss `logsumexp(z) − z[target]` in
/// f64 and the max of `next` (the next row, folded while `d` is scaled).
fn fused_row(z: &[f32], m: f32, target: usize, scale: f32, d: Dst<'_>, next: &[f32]) -> (f64, f32) {
    let (s, next_max) = softmax::scaled_softmax_row(z, m, scale, (target, scale), d, next);
    (row_loss(s, m, z[target]), next_max)
}

/// A row's loss `logsumexp(z) − z[target]` in f64, from its max `m` and `s = Σ e^(z − m)`.
fn row_loss(s: f32, m: f32, z_target: f32) -> f64 {
    (s as f64).ln() + m as f64 - z_target as f64
}

/// Rows at least this long (beyond L1) take the pipelined kernel when it applies.
#[cfg(target_arch = "x86_64")]
const PIPELINE_MIN_VOCAB: usize = 8192;

/// The rows `first .. first + count` of one task by `softmax_x86::scaled_rows_pipelined`
/// when it applies (AVX-512, an output written in place, rows beyond L1, none of them
/// ignored): each row's exps computed in the loop that scales the row before, with the
/// same bits as the row-by-row path. Otherwise hands `dst` back untouched.
#[cfg(target_arch = "x86_64")]
fn pipelined<'a>(
    rows: &Rows,
    first: usize,
    count: usize,
    scale: f32,
    dst: Dst<'a>,
    loss_ptr: SharedMut<f64>,
) -> std::result::Result<(), Dst<'a>> {
    let v = rows.vocab;
    let applies = softmax_x86::has_kernel()
        && dst.in_place()
        && v >= PIPELINE_MIN_VOCAB
        && count > 0
        && !(first..first + count).any(|r| rows.ignored(r));
    if !applies {
        return Err(dst);
    }
    let z = &rows.logits[first * v..(first + count) * v];
    // SAFETY: an in-place piece is handed over whole, and `scaled_rows_pipelined` writes
    // every slot of it.
    unsafe {
        dst.write(|_, out| {
            let minus = |k: usize| (rows.targets[first + k] as usize, scale);
            softmax_x86::scaled_rows_pipelined(z, out, v, simd::max(&z[..v]), scale, minus, |k, s, m| {
                let r = first + k;
                let loss = row_loss(s, m, rows.logits[r * v + rows.targets[r] as usize]);
                // SAFETY: r < n and each row's task writes only its own slot.
                loss_ptr.slice(r, 1)[0] = loss;
            });
        })
    };
    Ok(())
}

/// The shared pass: d_logits scaled by `d_loss/count`, and the sum of the per-row losses
/// (in row order, f64). All rows ignored → zeros and 0.
fn fused(cpu: &CpuBackend, rows: &Rows, d_loss: f32) -> Result<(Tensor, f64)> {
    const OP: &str = "cross_entropy";
    let (n, v) = (rows.n, rows.vocab);
    if rows.count == 0 || v == 0 {
        return Ok((Tensor::zeros([n, v], DType::F32)?, 0.0));
    }
    let scale = d_loss / rows.count as f32;
    let mut losses = vec![0.0f64; n];
    let loss_ptr = SharedMut(losses.as_mut_ptr());
    // Each row is written once into a fresh (not pre-zeroed) buffer, see `output::Dst`.
    // Tasks of several rows: a row's max is folded while the row before it is written
    // (a task's first row, and a row after an ignored one, take a pass of their own).
    let per = (TASK_ELEMS / v).max(1);
    let d_logits =
        output::fresh_tensor(cpu, OP, &Shape::from([n, v]), DType::F32, per * v, ROW_WORK, |t, rows_dst| {
            let rows_here = rows_dst.len() / v;
            #[cfg(target_arch = "x86_64")]
            let rows_dst = match pipelined(rows, t * per, rows_here, scale, rows_dst, loss_ptr) {
                Ok(()) => return,
                Err(rows_dst) => rows_dst,
            };
            let mut folded = None;
            for (k, d_row) in rows_dst.into_chunks(v).enumerate() {
                let r = t * per + k;
                let z = &rows.logits[r * v..(r + 1) * v];
                let max = folded.take();
                if rows.ignored(r) {
                    continue; // d_row dropped unwritten reads as zero; the loss slot stays 0.
                }
                let next = if k + 1 < rows_here { &rows.logits[(r + 1) * v..(r + 2) * v] } else { &[][..] };
                let m = max.unwrap_or_else(|| simd::max(z));
                let (loss, next_max) = fused_row(z, m, rows.targets[r] as usize, scale, d_row, next);
                folded = Some(next_max);
                // SAFETY: r < n and each row's task writes only its own slot.
                unsafe { loss_ptr.slice(r, 1)[0] = loss };
            }
        })?;
    Ok((d_logits, losses.iter().sum()))
}

/// Fused cross-entropy: mean over counted rows of `logsumexp(z) − z[target]`, and
/// `d_logits = (softmax(z) − onehot(target))/count`. Rows whose target is `ignore_index`
/// count for nothing; a target ≥ V is an error naming its row; all rows ignored gives
/// loss 0, zero d_logits and count 0.
///
/// # Shapes
/// `logits`: `[N, V]` float; `targets`: `[N]` U32 → loss `[]` f32, d_logits `[N, V]` f32.
pub fn cross_entropy(
    cpu: &CpuBackend,
    logits: &Tensor,
    targets: &Tensor,
    ignore_index: Option<u32>,
) -> Result<CrossEntropyOutput> {
    let rows = read("cross_entropy", logits, targets, ignore_index)?;
    let (d_logits, loss_sum) = fused(cpu, &rows, 1.0)?;
    let loss = if rows.count == 0 { 0.0 } else { loss_sum / rows.count as f64 };
    Ok(CrossEntropyOutput { loss: Tensor::scalar(loss as f32), d_logits, count: rows.count })
}

/// `d_logits = d_loss·(softmax(z) − onehot(target))/count` (zero rows where ignored).
///
/// # Shapes
/// as [`cross_entropy`] → `[N, V]` f32.
pub fn cross_entropy_backward(
    cpu: &CpuBackend,
    logits: &Tensor,
    targets: &Tensor,
    ignore_index: Option<u32>,
    d_loss: f32,
) -> Result<Tensor> {
    let rows = read("cross_entropy_backward", logits, targets, ignore_index)?;
    Ok(fused(cpu, &rows, d_loss)?.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A row's max is folded alone or while the row before it is written (and a row after
    /// an ignored one starts over): each row of a batch must match the same row on its
    /// own, bit for bit, and so must its loss.
    #[test]
    fn a_row_gives_the_same_bits_wherever_it_falls_in_a_task() {
        let cpu = CpuBackend::with_threads(2).unwrap();
        for v in [100usize, 1000, 32000] {
            let rows = 19;
            let z: Vec<f32> = (0..(rows * v) as u32)
                .map(|i| ((i.wrapping_mul(2_654_435_761) >> 8) as f32 / 8_388_608.0 - 1.0) * 8.0)
                .collect();
            let ids: Vec<u32> = (0..rows as u32).map(|r| (r * 7919) % v as u32).collect();
            let ignore = ids[5];
            let logits = Tensor::from_vec(z.clone(), [rows, v]).unwrap();
            let targets = Tensor::from_vec(ids.clone(), [rows]).unwrap();
            let all = cross_entropy_backward(&cpu, &logits, &targets, Some(ignore), 1.0).unwrap();
            let all = all.to_vec_f32().unwrap();
            let count = ids.iter().filter(|&&t| t != ignore).count() as f32;
            for r in 0..rows {
                let one = Tensor::from_vec(z[r * v..(r + 1) * v].to_vec(), [1, v]).unwrap();
                let t = Tensor::from_vec(vec![ids[r]], [1]).unwrap();
                // One counted row, scaled as the batch scales it (1/count).
                let d = cross_entropy_backward(&cpu, &one, &t, Some(ignore), 1.0 / count).unwrap();
                let got: Vec<u32> = d.to_vec_f32().unwrap().iter().map(|x| x.to_bits()).collect();
                let want: Vec<u32> = all[r * v..(r + 1) * v].iter().map(|x| x.to_bits()).collect();
                assert_eq!(got, want, "vocab {v} row {r}");
            }
        }
    }
}
