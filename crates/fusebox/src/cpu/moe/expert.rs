//! The expert matmul: `y[t, j] = x[t, r(j)] · W[e]ᵀ` with `e = experts[t, j]` (r(j) = 0
//! when x has one row per token, j when it has one per chosen expert), and its backward.
//!
//! The (token, choice) slots are grouped by expert first (a counting sort), so each
//! expert's weight is read once per call, however many rows chose it — llama.cpp's
//! `mul_mat_id` does the same. The forward then runs one parallel region over tasks that
//! each own a run of one expert's W rows: with few rows for that expert (decoding) the
//! task dots its W rows with them straight from the blocks, as `quantized_matmul` does
//! for few rows (the same kernels, so a row's result does not depend on the other rows);
//! with many (a prompt, training) it decodes a panel of W rows and multiplies with gemm.
//! Experts nobody chose are never read.

use super::expert_ids;
use crate::cpu::convert::{f32_data, from_f32, update_f32};
use crate::cpu::matmul::sgemm;
use crate::cpu::memory::host;
use crate::cpu::pool::SharedMut;
use crate::cpu::quant::{panel_product, quantized_dx_accumulate, RowOperand, PANEL_ROWS};
use crate::cpu::CpuBackend;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::shape::Shape;
use crate::spec::{self, moe::ExpertMatmulSpec};
use crate::tensor::Tensor;

/// Up to this many rows of one expert, its rows are dotted with W's rows one run at a
/// time (as `quantized_matmul` does up to the same count); above it, panels and gemm.
const SMALL_M: usize = 16;

/// The slots `t·k + j` grouped by expert: expert e's are `slots[start[e]..start[e + 1]]`,
/// in increasing order.
struct Groups {
    start: Vec<usize>,
    slots: Vec<usize>,
}

impl Groups {
    fn of(ids: &[u32], n_experts: usize) -> Groups {
        let mut start = vec![0usize; n_experts + 1];
        for &e in ids {
            start[e as usize + 1] += 1;
        }
        for e in 0..n_experts {
            start[e + 1] += start[e];
        }
        let mut next = start.clone();
        let mut slots = vec![0usize; ids.len()];
        for (slot, &e) in ids.iter().enumerate() {
            slots[next[e as usize]] = slot;
            next[e as usize] += 1;
        }
        Groups { start, slots }
    }

    /// Expert e's slots.
    fn of_expert(&self, e: usize) -> &[usize] {
        &self.slots[self.start[e]..self.start[e + 1]]
    }
}

/// The x row slot `t·k + j` reads: `t` when x has one row per token, else the slot itself.
fn x_row(s: &ExpertMatmulSpec, slot: usize) -> usize {
    if s.x_rows == 1 {
        slot / s.k
    } else {
        slot
    }
}

/// x's rows in slot order grouped by expert (`Groups::slots`), `[slots, kin]`.
fn gathered_rows(s: &ExpertMatmulSpec, g: &Groups, rows: &[f32]) -> Vec<f32> {
    let kin = s.kin;
    let mut out = Vec::with_capacity(g.slots.len() * kin);
    for &slot in &g.slots {
        let r = x_row(s, slot);
        out.extend_from_slice(&rows[r * kin..(r + 1) * kin]);
    }
    out
}

/// W's bytes, checked to hold `[E, N, K]` of its dtype.
fn weight_bytes<'a>(op: &'static str, w: &'a Tensor, s: &ExpertMatmulSpec) -> Result<&'a [u8]> {
    let wb = w.host_bytes()?;
    let need = s.experts * s.n * s.w_dtype.storage_bytes(s.kin);
    if wb.len() != need {
        return Err(Error::shape(
            op,
            "w bytes",
            format!("{need} bytes for [{}, {}, {}] {}", s.experts, s.n, s.kin, s.w_dtype),
            wb.len(),
        ));
    }
    Ok(wb)
}

/// One task of the forward: W rows `first .. first + rows` of expert `e`.
struct Task {
    e: usize,
    first: usize,
    rows: usize,
}

/// `y[t, j] = x[t, r(j)] · W[experts[t, j]]ᵀ`, W in x's float dtype or a storage format
/// (read from its blocks, never materialised in f32).
///
/// # Shapes
/// `x`: `[T, R, K]` (R = 1 or k); `w`: `[E, N, K]`; `experts`: `[T, k]` U32 →
/// `[T, k, N]`, x's dtype.
pub fn expert_matmul(cpu: &CpuBackend, x: &Tensor, w: &Tensor, experts: &Tensor) -> Result<Tensor> {
    const OP: &str = "expert_matmul";
    for t in [x, w, experts] {
        host(OP, t)?;
    }
    let s = spec::moe::expert_matmul(x, w, experts)?;
    let ids = expert_ids(OP, experts, s.experts)?;
    let wb = weight_bytes(OP, w, &s)?;
    let (n, kin) = (s.n, s.kin);
    let out_shape = Shape::new([s.tokens, s.k, n]);
    if s.tokens == 0 || n == 0 || kin == 0 {
        return from_f32(vec![0.0; s.tokens * s.k * n], out_shape, s.dtype);
    }
    let xs = f32_data(OP, "x", x)?;
    let g = Groups::of(ids, s.experts);
    let xg = gathered_rows(&s, &g, &xs);
    let row_bytes = s.w_dtype.storage_bytes(kin);
    let active: Vec<usize> = (0..s.experts).filter(|&e| !g.of_expert(e).is_empty()).collect();
    // Few rows per expert: the rows prepared once per expert for the row kernels.
    let operands: Vec<Option<RowOperand>> = (0..s.experts)
        .map(|e| {
            let m = g.of_expert(e).len();
            (m > 0 && m <= SMALL_M)
                .then(|| RowOperand::new(cpu, s.w_dtype, &xg[g.start[e] * kin..g.start[e + 1] * kin], m, kin))
        })
        .collect();
    // Runs of W rows: about four per thread over all chosen experts when they are
    // dotted row by row; panels of up to PANEL_ROWS rows for gemm.
    let run = (active.len() * n).div_ceil(cpu.threads() * 4).clamp(1, n);
    let panel = n.div_ceil(cpu.threads() * 2).clamp(16, PANEL_ROWS);
    let mut tasks = Vec::new();
    for &e in &active {
        let step = if operands[e].is_some() { run } else { panel };
        tasks.extend((0..n).step_by(step).map(|first| Task { e, first, rows: step.min(n - first) }));
    }
    // Every output element is written: each slot belongs to one expert, whose tasks
    // cover all n columns.
    let mut out: Vec<f32> = Vec::with_capacity(s.tokens * s.k * n);
    let dst = SharedMut(out.as_mut_ptr());
    let work = (s.tokens * s.k).div_ceil(active.len().max(1)) * kin;
    cpu.for_each_index(tasks.len(), run * work, |i| {
        let dst = &dst; // borrow the whole `SharedMut` (Sync), not its raw-pointer field
        let Task { e, first, rows } = tasks[i];
        let slots = g.of_expert(e);
        let m = slots.len();
        let wrows = &wb[(e * n + first) * row_bytes..(e * n + first + rows) * row_bytes];
        let mut chunk = vec![0.0f32; rows * m];
        match &operands[e] {
            // chunk[r·m + i] = x_i · W[first + r]
            Some(x) => {
                x.dot_rows(wrows, &mut chunk);
                for (r, outs) in chunk.chunks_exact(m).enumerate() {
                    for (&slot, &v) in slots.iter().zip(outs) {
                        // SAFETY: element (slot, first + r) of the [T·k, n] output: only
                        // this task writes expert e's slots in columns first..first+rows,
                        // and `out`'s capacity holds T·k·n elements.
                        unsafe { *dst.0.add(slot * n + first + r) = v };
                    }
                }
            }
            // chunk[i·rows + r] = x_i · W[first + r]
            None => {
                let xe = &xg[g.start[e] * kin..g.start[e + 1] * kin];
                // SAFETY: chunk holds m·rows values, written by this task alone.
                unsafe { panel_product(s.w_dtype, wrows, xe, m, kin, chunk.as_mut_ptr(), rows) };
                for (&slot, outs) in slots.iter().zip(chunk.chunks_exact(rows)) {
                    // SAFETY: as above, the run first..first+rows of slot's output row.
                    unsafe { std::ptr::copy_nonoverlapping(outs.as_ptr(), dst.0.add(slot * n + first), rows) };
                }
            }
        }
    });
    // SAFETY: the tasks wrote all T·k·n elements (see the allocation).
    unsafe { out.set_len(s.tokens * s.k * n) };
    from_f32(out, out_shape, s.dtype)
}

/// Backward of [`expert_matmul`]: `dx[t, r(j)] += dy[t, j] · W[e]` (from W's blocks for
/// a storage format) and, when `dw` is given (float W), `dW[e] += Σ dy[t, j]ᵀ · x[t, r(j)]`
/// over the slots that chose e, accumulated into `dw`.
///
/// # Shapes
/// as `expert_matmul`; `dy`: `[T, k, N]`, x's dtype; `dw`: `[E, N, K]`, w's dtype →
/// dx `[T, R, K]`, x's dtype.
pub fn expert_matmul_backward(
    cpu: &CpuBackend,
    x: &Tensor,
    w: &Tensor,
    experts: &Tensor,
    dy: &Tensor,
    dw: Option<&mut Tensor>,
) -> Result<Tensor> {
    const OP: &str = "expert_matmul_backward";
    for t in [x, w, experts, dy] {
        host(OP, t)?;
    }
    if let Some(dw) = &dw {
        host(OP, dw)?;
    }
    let s = spec::moe::expert_matmul_backward(x, w, experts, dy, dw.as_deref())?;
    let ids = expert_ids(OP, experts, s.experts)?;
    let wb = weight_bytes(OP, w, &s)?;
    let (n, kin) = (s.n, s.kin);
    let xs = f32_data(OP, "x", x)?;
    let dys = f32_data(OP, "dy", dy)?;
    let g = Groups::of(ids, s.experts);
    let xg = gathered_rows(&s, &g, &xs);
    let dyg: Vec<f32> = g.slots.iter().flat_map(|&slot| dys[slot * n..(slot + 1) * n].iter().copied()).collect();
    // dx per slot, in grouped order: dx_g[e's rows] = dy_g[e's rows] · W[e].
    let mut dxg = vec![0.0f32; g.slots.len() * kin];
    let dense = (!s.w_dtype.is_quantized() && s.w_dtype != DType::F8E4M3).then(|| f32_data(OP, "w", w)).transpose()?;
    for e in 0..s.experts {
        let (a, b) = (g.start[e], g.start[e + 1]);
        let m = b - a;
        if m == 0 || n == 0 || kin == 0 {
            continue;
        }
        let dy_e = &dyg[a * n..b * n];
        let dx_e = &mut dxg[a * kin..b * kin];
        match &dense {
            Some(wf) => {
                let w_e = &wf[e * n * kin..(e + 1) * n * kin];
                sgemm(cpu, m, kin, n, dy_e, n, 1, w_e, kin, 1, dx_e, false);
            }
            None => {
                let row_bytes = s.w_dtype.storage_bytes(kin);
                let w_e = &wb[e * n * row_bytes..(e + 1) * n * row_bytes];
                quantized_dx_accumulate(cpu, dy_e, m, s.w_dtype, w_e, n, kin, dx_e);
            }
        }
    }
    if let Some(dw) = dw {
        update_f32(OP, dw, |dwf| {
            for e in 0..s.experts {
                let (a, b) = (g.start[e], g.start[e + 1]);
                if a == b {
                    continue;
                }
                // dW[e] += dy_eᵀ · x_e: [n, m] · [m, kin].
                let dw_e = &mut dwf[e * n * kin..(e + 1) * n * kin];
                sgemm(cpu, n, kin, b - a, &dyg[a * n..b * n], 1, n, &xg[a * kin..b * kin], kin, 1, dw_e, true);
            }
        })?;
    }
    // Scatter back to x's rows (summing a token's k slots when x has one row per token).
    let mut dx = vec![0.0f32; s.tokens * s.x_rows * kin];
    for (i, &slot) in g.slots.iter().enumerate() {
        let r = x_row(&s, slot);
        for (d, v) in dx[r * kin..(r + 1) * kin].iter_mut().zip(&dxg[i * kin..(i + 1) * kin]) {
            *d += v;
        }
    }
    from_f32(dx, Shape::new([s.tokens, s.x_rows, kin]), s.dtype)
}
