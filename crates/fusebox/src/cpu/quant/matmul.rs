//! `quantized_matmul` (`y = x · Wᵀ` straight from W's blocks) and its two drivers: W row
//! runs dotted with few x rows (decoding), and decoded W panels times many x rows with
//! gemm (prefill).

use super::decode::decode_into;
use super::fused_dot::fused_rows_multi;
use super::quantize::dequantize_row_into;
use super::{int, QK};
use crate::cpu::memory::host;
use crate::cpu::pool::SharedMut;
use crate::cpu::simd;
use crate::cpu::{convert, CpuBackend};
use crate::dtype::DType;
use crate::error::Result;
use crate::shape::Shape;
use crate::spec;
use crate::tensor::Tensor;

/// Up to this many rows of x, `quantized_matmul` dots each x row with the W blocks as it
/// does for one row (a row's result does not depend on how many rows come with it: a
/// server batching 1..=16 sequences relies on it); above it, it decodes panels of W rows
/// and runs gemm on them.
const SMALL_M: usize = 16;

/// `y = x · Wᵀ` straight from W's blocks (block format or FP8 E4M3), in x's dtype.
///
/// W is never materialised in f32. For up to `SMALL_M` rows of x (token-by-token
/// decoding) each task takes W rows one at a time: for the formats with integer kernels
/// (when the backend was built with `exact_decode(false)`) it dots them in integers with
/// x rounded to 8 bits once per call (see `int.rs`); otherwise it dots the blocks with each
/// x row in f32, each x row with the arithmetic of the one-row kernel (the AVX-512 and
/// AVX2 Q4_0, Q4_1 and Q8_0 kernels decode a block once for up to 4 x rows), so each row's result
/// is bit-identical whatever the number of rows up to `SMALL_M` (FP8 weights: decoded
/// into a buffer and dotted with every x row); for more rows (prompt prefill), with
/// `exact_decode(false)` and a format with a packed integer form where the CPU has its
/// tile kernel, x is rounded to 8 bits once and each task packs a panel of W rows for
/// integer tiles (see `prefill.rs`); otherwise each task decodes a panel of W rows and
/// multiplies x by it with gemm. Tasks own disjoint output columns, and each output is
/// computed by one task in a fixed order, so results do not depend on scheduling.
///
/// # Shapes
/// `x`: `[..., in]` F32/F16/BF16; `w`: `[out, in]` → `[..., out]`.
pub fn quantized_matmul(cpu: &CpuBackend, x: &Tensor, w: &Tensor) -> Result<Tensor> {
    const OP: &str = "quantized_matmul";
    host(OP, x)?;
    host(OP, w)?;
    let spec::quant::QuantMatmulSpec { m, n, k, out_dims, .. } = spec::quant::quantized_matmul(x, w)?;
    let xs = convert::f32_data(OP, "x", x)?;
    let wb = w.host_bytes()?;
    let out = if k == 0 || m == 0 || n == 0 {
        vec![0.0; m * n]
    } else if m <= SMALL_M {
        matmul_by_rows(cpu, &xs, m, w.dtype(), wb, n, k)
    } else {
        super::prefill::matmul(cpu, &xs, m, w.dtype(), wb, n, k)
            .unwrap_or_else(|| matmul_by_panels(cpu, &xs, m, w.dtype(), wb, n, k))
    };
    convert::from_f32(out, Shape::new(out_dims), x.dtype())
}

/// Few x rows: each task takes a run of W rows and dots them with all `m` x rows (see
/// [`RowOperand`]).
fn matmul_by_rows(cpu: &CpuBackend, xs: &[f32], m: usize, dtype: DType, wb: &[u8], n: usize, k: usize) -> Vec<f32> {
    let row_bytes = dtype.storage_bytes(k);
    let rows_per_task = n.div_ceil(cpu.threads() * 4).max(1);
    let x = RowOperand::new(cpu, dtype, xs, m, k);
    by_row_runs(cpu, n, m, k, rows_per_task, |task, chunk| {
        let first = task * rows_per_task;
        x.dot_rows(&wb[first * row_bytes..(first + chunk.len() / m) * row_bytes], chunk);
    })
}

/// `m` x rows made ready to be dotted with W rows of one storage dtype, a run of W rows at
/// a time ([`dot_rows`](Self::dot_rows)): rounded to 8 bits once for the formats with
/// integer kernels (when the backend was built with `exact_decode(false)`, see `int.rs`);
/// with their per-32 sums for the fused block kernels, which give each x row the bits of
/// the one-row kernel (see `fused_rows_multi` in `fused_dot.rs`); else as they are, each W
/// row decoded once into a buffer (FP8, and plain F32/F16/BF16 rows).
pub(crate) struct RowOperand<'a> {
    dtype: DType,
    xs: &'a [f32],
    m: usize,
    k: usize,
    form: RowForm,
}

enum RowForm {
    Integer(Vec<int::Q8Row>),
    Fused { nb: usize, xsum32: Vec<f32> },
    Decoded,
}

impl<'a> RowOperand<'a> {
    /// Prepares the `m` rows of `xs` (`k` values each) for W rows of `dtype`.
    pub(crate) fn new(cpu: &CpuBackend, dtype: DType, xs: &'a [f32], m: usize, k: usize) -> Self {
        let integer = !cpu.exact_decode() && int::activation_block(dtype).is_some_and(|b| k.is_multiple_of(b));
        let form = if integer {
            RowForm::Integer(xs.chunks_exact(k).map(|x| int::quantize_row(x, dtype)).collect())
        } else if dtype.is_quantized() {
            let xsum32 = xs.chunks_exact(k).flat_map(|x| x.chunks(QK).map(simd::sum)).collect();
            RowForm::Fused { nb: k.div_ceil(QK), xsum32 }
        } else {
            RowForm::Decoded
        };
        RowOperand { dtype, xs, m, k, form }
    }

    /// `out[r·m + i] = x_i · W[r]` for the whole rows of `w` (`out.len() / m` of them);
    /// NaN where a kernel refuses the sizes (a caller bug: the specs check them).
    pub(crate) fn dot_rows(&self, w: &[u8], out: &mut [f32]) {
        let (dtype, m, k) = (self.dtype, self.m, self.k);
        let done = match &self.form {
            RowForm::Integer(xq) => int::int_rows_multi(dtype, w, xq, out),
            RowForm::Fused { nb, xsum32 } => fused_rows_multi(dtype, w, self.xs, k, *nb, xsum32, m, out),
            RowForm::Decoded => false,
        };
        if done {
            return;
        }
        let row_bytes = dtype.storage_bytes(k);
        let mut row = vec![0.0f32; k];
        for (wrow, outs) in w.chunks_exact(row_bytes.max(1)).zip(out.chunks_exact_mut(m)) {
            if dequantize_row_into(dtype, wrow, &mut row).is_err() {
                outs.fill(f32::NAN);
                continue;
            }
            for (i, o) in outs.iter_mut().enumerate() {
                *o = simd::dot(&self.xs[i * k..(i + 1) * k], &row);
            }
        }
    }
}

/// The `[m, n]` product from `compute(task, chunk)`, run for each run of `rows_per_task`
/// W rows (task t's run starts at row `t·rows_per_task`), `chunk` holding the run's outputs
/// row by row (`[rows, m]`: W row r's m results together). With several x rows each task
/// then writes its own columns of the output, so no serial transpose follows.
fn by_row_runs(
    cpu: &CpuBackend,
    n: usize,
    m: usize,
    k: usize,
    rows_per_task: usize,
    compute: impl Fn(usize, &mut [f32]) + Sync + Send,
) -> Vec<f32> {
    let mut out = vec![0.0f32; m * n];
    if m == 1 {
        cpu.for_each_chunk(&mut out, rows_per_task, k, compute);
        return out;
    }
    let dst = SharedMut(out.as_mut_ptr());
    cpu.for_each_index(n.div_ceil(rows_per_task), rows_per_task * m * k, |task| {
        let dst = &dst; // borrow the whole `SharedMut` (Sync), not its raw-pointer field
        let first = task * rows_per_task;
        let mut chunk = vec![0.0f32; rows_per_task.min(n - first) * m];
        compute(task, &mut chunk);
        for (r, outs) in chunk.chunks_exact(m).enumerate() {
            for (i, &v) in outs.iter().enumerate() {
                // SAFETY: column first + r < n of row i < m lies inside the m × n output,
                // only this task writes columns first..first + rows, and `out` outlives
                // the loop.
                unsafe { *dst.0.add(i * n + first + r) = v };
            }
        }
    });
    out
}

/// At most this many W rows per panel: the gemm repacks x for every panel, so larger
/// panels pay that less often (Gemma 3 prefill of 512 tokens, 2 threads: 952–1021
/// tokens/s with 128 and zeroed buffers, 992–1091 with 256, 1084–1104 with 256 and no
/// zeroing).
pub(crate) const PANEL_ROWS: usize = 256;

/// Many x rows: each task decodes a panel of W rows into f32 and computes that panel's
/// output columns for every x row with a single-threaded gemm ([`panel_product`]).
fn matmul_by_panels(cpu: &CpuBackend, xs: &[f32], m: usize, dtype: DType, wb: &[u8], n: usize, k: usize) -> Vec<f32> {
    let row_bytes = dtype.storage_bytes(k);
    // Enough panels to feed every thread.
    let panel_rows = n.div_ceil(cpu.threads() * 2).clamp(16, PANEL_ROWS);
    let panels = n.div_ceil(panel_rows);
    // Every element is written below (the panels cover all n columns of all m rows, and
    // the gemm does not read its destination), so the buffer is not zeroed first.
    let mut out: Vec<f32> = Vec::with_capacity(m * n);
    let dst = SharedMut(out.as_mut_ptr());
    cpu.for_each_index(panels, panel_rows * m * k, |p| {
        let dst = &dst; // borrow the whole `SharedMut` (Sync), not its raw-pointer field
        let first = p * panel_rows;
        let rows = panel_rows.min(n - first);
        // SAFETY: the destination is columns first..first+rows of the m × n output (inside
        // its capacity), which only this task writes, and `out` outlives the loop.
        unsafe {
            panel_product(dtype, &wb[first * row_bytes..(first + rows) * row_bytes], xs, m, k, dst.0.add(first), n)
        };
    });
    // SAFETY: the loop above wrote all m·n elements (see the allocation).
    unsafe { out.set_len(m * n) };
    out
}

/// `dst[i·dst_row + r] = x_i · W[r]` for the `m` rows of `xs` (`k` values each) and the
/// whole rows r of `w` (a storage format or plain float `dtype`), decoded into a
/// per-thread f32 panel and multiplied with a single-threaded gemm (the destination is
/// written, never read).
///
/// # Safety
/// `dst` must be valid for writes at `i·dst_row + r` for every `i < m` and W row r, and no
/// other thread may touch those elements during the call.
pub(crate) unsafe fn panel_product(
    dtype: DType,
    w: &[u8],
    xs: &[f32],
    m: usize,
    k: usize,
    dst: *mut f32,
    dst_row: usize,
) {
    thread_local! {
        /// Each thread's decoded panel, kept between calls (its largest size so far:
        /// `PANEL_ROWS · in` f32) so a prompt's matmuls neither allocate nor zero one.
        static PANEL: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    let rows = w.len() / dtype.storage_bytes(k).max(1);
    PANEL.with_borrow_mut(|panel| {
        if panel.len() < rows * k {
            panel.resize(rows * k, 0.0);
        }
        let panel = &mut panel[..rows * k];
        if dtype.is_quantized() || dtype == DType::F8E4M3 {
            decode_into(dtype, w, panel);
        } else if dequantize_row_into(dtype, w, panel).is_err() {
            panel.fill(f32::NAN);
        }
        // SAFETY: `xs` holds m rows of k values and `panel` rows·k values; the caller
        // vouches for the destination.
        unsafe {
            gemm::gemm(
                m,
                rows,
                k,
                dst,
                1,
                dst_row as isize,
                false,
                xs.as_ptr(),
                1,
                k as isize,
                panel.as_ptr(),
                k as isize,
                1,
                0.0,
                1.0,
                false,
                false,
                false,
                gemm::Parallelism::None,
            );
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_inner_dimension_gives_zeros_of_the_right_shape() {
        let cpu = CpuBackend::with_threads(1).unwrap();
        let x = Tensor::zeros([3, 0], DType::F32).unwrap();
        let w = Tensor::zeros([5, 0], DType::Q8_0).unwrap();
        let y = quantized_matmul(&cpu, &x, &w).unwrap();
        assert_eq!(y.dims(), &[3, 5]);
        assert!(y.to_vec_f32().unwrap().iter().all(|&v| v == 0.0));
    }

    /// A server batches 1..=16 sequences into one `quantized_matmul`: each row's result
    /// must not depend on how many rows come with it, on either decode path, on every ISA
    /// this CPU has, for every block format (and for FP8), with the work split over
    /// threads. Rows of 17 blocks of 32 (an odd count: the kernels' last block has no
    /// partner) for the 32-element formats, 3 blocks of 256 for the K formats. Called
    /// through the trait, so the caller's share of the work runs on the backend's ISA too.
    #[test]
    fn each_rows_result_is_bit_identical_for_every_row_count_up_to_16() {
        use crate::backend::ComputeBackend;
        let n = 37;
        for isa in simd::Isa::available() {
            for exact in [true, false] {
                let cpu = CpuBackend::builder().threads(2).isa(isa).exact_decode(exact).build().unwrap();
                for dtype in DType::ALL.into_iter().filter(|d| d.is_quantized() || *d == DType::F8E4M3) {
                    let k = if dtype.block_elems() == 256 { 768 } else { 544 };
                    let x_all: Vec<f32> = (0..SMALL_M * k)
                        .map(|i| ((i * 37 % 101) as f32 / 25.0 - 2.0) * if i % 97 == 3 { 9.0 } else { 1.0 })
                        .collect();
                    let w_f32: Vec<f32> = (0..n * k).map(|i| (i * 53 % 89) as f32 / 22.0 - 2.0).collect();
                    let dense = Tensor::from_vec(w_f32, [n, k]).unwrap();
                    let w = match cpu.quantize(&dense, dtype) {
                        Ok(w) => w,
                        Err(e) => panic!("{dtype}: {e}"),
                    };
                    let one: Vec<Vec<u32>> = (0..SMALL_M)
                        .map(|i| {
                            let x = Tensor::from_vec(x_all[i * k..(i + 1) * k].to_vec(), [1, k]).unwrap();
                            cpu.quantized_matmul(&x, &w)
                                .unwrap()
                                .to_vec_f32()
                                .unwrap()
                                .iter()
                                .map(|v| v.to_bits())
                                .collect()
                        })
                        .collect();
                    assert!(one.iter().flatten().all(|&b| f32::from_bits(b).is_finite()), "{dtype}: non-finite output");
                    for m in 2..=SMALL_M {
                        let x = Tensor::from_vec(x_all[..m * k].to_vec(), [m, k]).unwrap();
                        let y = cpu.quantized_matmul(&x, &w).unwrap().to_vec_f32().unwrap();
                        for (i, row) in y.chunks_exact(n).enumerate() {
                            let bits: Vec<u32> = row.iter().map(|v| v.to_bits()).collect();
                            assert_eq!(
                                bits,
                                one[i],
                                "{dtype}, {}, exact_decode {exact}: row {i} of {m} differs from the row alone",
                                isa.name()
                            );
                        }
                    }
                }
            }
        }
    }

    /// A row's result does not depend on the number of threads (the runs of W rows each
    /// task takes), on either decode path, on every ISA this CPU has, for every block
    /// format: a greedy answer is the same at `--threads 1` and `--threads 2`.
    #[test]
    fn each_rows_result_is_bit_identical_for_every_thread_count() {
        use crate::backend::ComputeBackend;
        let n = 37;
        for isa in simd::Isa::available() {
            for exact in [true, false] {
                let cpus: Vec<CpuBackend> = [1, 2, 3]
                    .iter()
                    .map(|&t| CpuBackend::builder().threads(t).isa(isa).exact_decode(exact).build().unwrap())
                    .collect();
                for dtype in DType::ALL.into_iter().filter(|d| d.is_quantized() || *d == DType::F8E4M3) {
                    let k = if dtype.block_elems() == 256 { 768 } else { 544 };
                    let x: Vec<f32> = (0..3 * k).map(|i| (i * 37 % 101) as f32 / 25.0 - 2.0).collect();
                    let w_f32: Vec<f32> = (0..n * k).map(|i| (i * 53 % 89) as f32 / 22.0 - 2.0).collect();
                    let w = cpus[0].quantize(&Tensor::from_vec(w_f32, [n, k]).unwrap(), dtype).unwrap();
                    for m in [1, 3] {
                        let x = Tensor::from_vec(x[..m * k].to_vec(), [m, k]).unwrap();
                        let bits = |cpu: &CpuBackend| -> Vec<u32> {
                            let y = cpu.quantized_matmul(&x, &w).unwrap().to_vec_f32().unwrap();
                            y.iter().map(|v| v.to_bits()).collect()
                        };
                        let one = bits(&cpus[0]);
                        for cpu in &cpus[1..] {
                            assert_eq!(
                                bits(cpu),
                                one,
                                "{dtype}, {}, exact_decode {exact}, {m} rows: {} threads differ from 1",
                                isa.name(),
                                cpu.threads()
                            );
                        }
                    }
                }
            }
        }
    }
}
