//! `quantized_matmul_backward`: `dx = dy · W` with W `[n, k]` read straight from its
//! blocks — the input gradient of `y = x · Wᵀ` when W is frozen (LoRA on a quantized
//! base).
//!
//! dx's columns are cut into groups of whole blocks (about [`GROUP_COLS`] columns), and
//! dy's rows into chunks; a task owns one (row chunk, column group) tile of dx. It walks
//! W's rows in panels: it decodes the panel's blocks that fall in its column group into a
//! small f32 scratch (at most [`PANEL_ELEMS`] values — W is never materialised in f32)
//! and accumulates `dx[rows, group] += dy[rows, panel] · scratch` with a single-threaded
//! gemm. Each element of W is decoded once per row chunk, and a row chunk has at least
//! [`MIN_CHUNK_ROWS`] rows (unless dy has fewer), so decoding costs at most one part in
//! 32 of the multiply-adds.
//!
//! The block decoders are compiled per ISA (AVX-512, AVX2 + FMA and portable, chosen at
//! run time: `simd::multiversion`), and gemm picks its microkernel at run time too. Each
//! dx element is computed by one task, panel after panel in a fixed order, so results do
//! not depend on scheduling or on the number of threads... except through gemm's own
//! summation order within a panel, which depends only on the sizes.

use super::decode::decode_into;
use crate::cpu::memory::host;
use crate::cpu::pool::SharedMut;
use crate::cpu::{convert, CpuBackend};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::shape::Shape;
use crate::spec;
use crate::tensor::Tensor;

/// Target columns of dx per task (a whole number of blocks: one Q4_K super-block, eight
/// Q4_0 blocks).
const GROUP_COLS: usize = 256;
/// f32 values of a task's decoded W panel (128 KiB: stays in L2 while gemm reads it).
const PANEL_ELEMS: usize = 32 * 1024;
/// Fewest dy rows per task when rows are split to feed the threads.
const MIN_CHUNK_ROWS: usize = 32;

/// `dx = dy · W` straight from W's blocks (block format or FP8 E4M3), in dy's dtype.
///
/// # Shapes
/// `dy`: `[..., out]` F32/F16/BF16; `w`: `[out, in]` → `[..., in]`.
pub fn quantized_matmul_backward(cpu: &CpuBackend, dy: &Tensor, w: &Tensor) -> Result<Tensor> {
    const OP: &str = "quantized_matmul_backward";
    host(OP, dy)?;
    host(OP, w)?;
    let spec::quant::QuantMatmulBackwardSpec { m, n, k, w_dtype, out_dims, .. } =
        spec::quant::quantized_matmul_backward(dy, w)?;
    let dys = convert::f32_data(OP, "dy", dy)?;
    let wb = w.host_bytes()?;
    let need = n * w_dtype.storage_bytes(k);
    if wb.len() != need {
        return Err(Error::shape(OP, "w bytes", format!("{need} bytes for [{n}, {k}] {w_dtype}"), wb.len()));
    }
    let mut dx = vec![0.0f32; m * k];
    if m > 0 && n > 0 && k > 0 {
        accumulate(cpu, &dys, m, w_dtype, wb, n, k, &mut dx);
    }
    convert::from_f32(dx, Shape::new(out_dims), dy.dtype())
}

/// How dx `[m, k]` is tiled into tasks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Tiling {
    /// Blocks per column group (the last group may have fewer).
    group_blocks: usize,
    /// Column groups.
    groups: usize,
    /// dy rows per row chunk (the last chunk may have fewer).
    chunk_rows: usize,
    /// Row chunks.
    chunks: usize,
    /// W rows per decoded panel.
    panel_rows: usize,
}

impl Tiling {
    /// The tiling of `[m, n] · [n, k]` for `threads` threads and blocks of `be` elements:
    /// column groups first, then as many row chunks as it takes to give every thread two
    /// tasks, each of at least `MIN_CHUNK_ROWS` rows.
    fn new(m: usize, n: usize, k: usize, be: usize, threads: usize) -> Tiling {
        let blocks = k / be;
        let group_blocks = (GROUP_COLS / be).clamp(1, blocks.max(1));
        let groups = blocks.div_ceil(group_blocks);
        let want_chunks = (2 * threads).div_ceil(groups).min(m / MIN_CHUNK_ROWS).max(1);
        let chunk_rows = m.div_ceil(want_chunks).max(1);
        let chunks = m.div_ceil(chunk_rows);
        let panel_rows = (PANEL_ELEMS / (group_blocks * be)).clamp(1, n.max(1));
        Tiling { group_blocks, groups, chunk_rows, chunks, panel_rows }
    }
}

/// `dx += dys · W` (dx zeroed by the caller; dys `[m, n]`, W's blocks `wb` `[n, k]`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn accumulate(
    cpu: &CpuBackend,
    dys: &[f32],
    m: usize,
    dtype: DType,
    wb: &[u8],
    n: usize,
    k: usize,
    dx: &mut [f32],
) {
    let (be, bb) = (dtype.block_elems(), dtype.block_bytes());
    let row_bytes = dtype.storage_bytes(k);
    let blocks = k / be;
    let t = Tiling::new(m, n, k, be, cpu.threads());
    let dst = SharedMut(dx.as_mut_ptr());
    let work = t.chunk_rows * n * t.group_blocks * be;
    cpu.for_each_index(t.groups * t.chunks, work, |task| {
        let dst = &dst; // borrow the whole `SharedMut` (Sync), not its raw-pointer field
        let (g, c) = (task % t.groups, task / t.groups);
        let first_block = g * t.group_blocks;
        let gb = t.group_blocks.min(blocks - first_block);
        let (c0, cols) = (first_block * be, gb * be);
        let r0 = c * t.chunk_rows;
        let rows = t.chunk_rows.min(m - r0);
        let mut panel = vec![0.0f32; t.panel_rows * cols];
        for (p, j0) in (0..n).step_by(t.panel_rows).enumerate() {
            let pr = t.panel_rows.min(n - j0);
            for (jj, out) in panel[..pr * cols].chunks_exact_mut(cols).enumerate() {
                let at = (j0 + jj) * row_bytes + first_block * bb;
                decode_into(dtype, &wb[at..at + gb * bb], out);
            }
            let first = p == 0;
            // SAFETY: `dys` holds m × n values and `panel` pr × cols; the destination is
            // rows r0..r0+rows, columns c0..c0+cols of the m × k dx, a tile only this task
            // writes (tasks are distinct (group, chunk) pairs), and dx outlives the loop.
            unsafe {
                gemm::gemm(
                    rows,
                    cols,
                    pr,
                    dst.0.add(r0 * k + c0),
                    1,
                    k as isize,
                    !first,
                    dys.as_ptr().add(r0 * n + j0),
                    1,
                    n as isize,
                    panel.as_ptr(),
                    1,
                    cols as isize,
                    if first { 0.0 } else { 1.0 },
                    1.0,
                    false,
                    false,
                    false,
                    gemm::Parallelism::None,
                );
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::quant::{dequantize, quantize};

    #[test]
    fn the_tiling_covers_dx_with_whole_blocks_and_feeds_the_threads() {
        // Q4_K, in = 1536: six groups of one super-block; 512 rows on 2 threads need no split.
        let t = Tiling::new(512, 576, 1536, 256, 2);
        assert_eq!((t.group_blocks, t.groups, t.chunks, t.panel_rows), (1, 6, 1, 128));
        // Q4_1, in = 96: one group of three blocks; rows split into chunks of ≥ 32 rows.
        let t = Tiling::new(100, 37, 96, 32, 8);
        assert_eq!((t.group_blocks, t.groups), (3, 1));
        assert!(t.chunk_rows >= MIN_CHUNK_ROWS && t.chunks * t.chunk_rows >= 100, "{t:?}");
        // One dy row, FP8 (blocks of one element).
        let t = Tiling::new(1, 4, 300, 1, 4);
        assert_eq!((t.group_blocks, t.groups, t.chunks, t.chunk_rows), (256, 2, 1, 1));
    }

    #[test]
    fn dx_equals_dy_times_the_dequantized_w_for_every_thread_count() {
        let (m, n, k) = (70, 45, 512);
        let wf: Vec<f32> = (0..n * k).map(|i| ((i * 7919 % 1000) as f32 / 500.0) - 1.0).collect();
        let dyv: Vec<f32> = (0..m * n).map(|i| ((i * 104_729 % 997) as f32 / 498.5) - 1.0).collect();
        let dy = Tensor::from_vec(dyv.clone(), [m, n]).unwrap();
        for dtype in [DType::Q4_1, DType::Q4K, DType::Q6K, DType::F8E4M3] {
            let cpu1 = CpuBackend::builder().threads(1).build().unwrap();
            let w = quantize(&cpu1, &Tensor::from_vec(wf.clone(), [n, k]).unwrap(), dtype).unwrap();
            let wd = dequantize(&cpu1, &w).unwrap().to_vec_f32().unwrap();
            let mut want = vec![0.0f64; m * k];
            for r in 0..m {
                for j in 0..n {
                    for i in 0..k {
                        want[r * k + i] += f64::from(dyv[r * n + j]) * f64::from(wd[j * k + i]);
                    }
                }
            }
            for threads in [1, 3, 8] {
                let cpu = CpuBackend::builder().threads(threads).build().unwrap();
                let got = quantized_matmul_backward(&cpu, &dy, &w).unwrap().to_vec_f32().unwrap();
                for (i, (&g, &e)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        (f64::from(g) - e).abs() <= 1e-4 * (1.0 + e.abs()),
                        "{dtype} t{threads} dx[{i}]: {g} vs {e}"
                    );
                }
                let again = quantized_matmul_backward(&cpu, &dy, &w).unwrap().to_vec_f32().unwrap();
                assert_eq!(got, again, "{dtype} t{threads}: a second call rounded differently");
            }
        }
    }
}
