//! Linear algebra: `matmul` (+ backward), `batched_matmul`, `linear_forward` (+ backward)
//! and `head_prefix_matmul`, all built on one strided f32 GEMM ([`sgemm`], the `gemm`
//! crate) run inside the backend's thread pool. Transposes and GQA head sharing are
//! expressed through strides, never by copying; F16/BF16 operands are converted to f32
//! once and results are written back in the input dtype.

use std::borrow::Cow;
use std::mem::MaybeUninit;

use half::{bf16, f16};

use crate::cpu::{convert, output, simd, CpuBackend};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::spec;
use crate::spec::attention::AttentionDims;
use crate::spec::matmul::{LinearSpec, MatmulSpec};
use crate::tensor::Tensor;
use crate::types::{LinearGradients, MatmulGradients};

/// Products with fewer multiply-adds than this run on one thread: below it, waking the
/// pool costs more than the product (gemm's own threading threshold, 48·48·256).
pub const PARALLEL_GEMM_WORK: usize = gemm::DEFAULT_THREADING_THRESHOLD;

/// `c = a·b`, or `c += a·b` when `accumulate`, for f32 matrices given by strides:
/// `a(i,p) = a[i·a_rs + p·a_cs]` (`m×k`), `b(p,j) = b[p·b_rs + j·b_cs]` (`k×n`), and `c`
/// row-major `[m, n]`. A transposed operand is the same slice with its strides swapped.
/// Large products run multithreaded inside `cpu`'s pool (results depend only on the
/// thread count, never on scheduling).
///
/// # Panics
/// When a stride/size combination reaches past the end of a slice (a caller bug, not
/// user input: every public op validates shapes before calling this).
pub fn sgemm(
    cpu: &CpuBackend,
    m: usize,
    n: usize,
    k: usize,
    a: &[f32],
    a_rs: usize,
    a_cs: usize,
    b: &[f32],
    b_rs: usize,
    b_cs: usize,
    c: &mut [f32],
    accumulate: bool,
) {
    let (a, b) = (View::new(a, a_rs, a_cs), View::new(b, b_rs, b_cs));
    sgemm_to(cpu, m, n, k, a, b, output::as_uninit(c), accumulate);
}

/// `a·b` as a new row-major `[m, n]` vector (see [`sgemm`]). The GEMM writes every
/// element of fresh memory, with no zero-fill pass before it.
#[allow(clippy::too_many_arguments)]
pub fn sgemm_new(
    cpu: &CpuBackend,
    m: usize,
    n: usize,
    k: usize,
    a: &[f32],
    a_rs: usize,
    a_cs: usize,
    b: &[f32],
    b_rs: usize,
    b_cs: usize,
) -> Vec<f32> {
    let len = m * n;
    let mut c: Vec<f32> = Vec::with_capacity(len);
    let (a, b) = (View::new(a, a_rs, a_cs), View::new(b, b_rs, b_cs));
    sgemm_to(cpu, m, n, k, a, b, &mut c.spare_capacity_mut()[..len], false);
    // SAFETY: without `accumulate`, `gemm_f32` writes all `m·n` elements (zeros when k = 0).
    unsafe { c.set_len(len) };
    c
}

/// A strided f32 matrix operand: element `(i, p)` is `data[i·rs + p·cs]` (the f32 and
/// the BF16 GEMMs' operands).
#[derive(Clone, Copy)]
pub(crate) struct View<'a> {
    pub(crate) data: &'a [f32],
    pub(crate) rs: usize,
    pub(crate) cs: usize,
}

impl<'a> View<'a> {
    pub(crate) fn new(data: &'a [f32], rs: usize, cs: usize) -> Self {
        View { data, rs, cs }
    }

    /// The same matrix from row `r` on.
    pub(crate) fn rows_from(self, r: usize) -> Self {
        View { data: &self.data[r * self.rs..], ..self }
    }

    /// The same matrix from column `c` on.
    pub(crate) fn cols_from(self, c: usize) -> Self {
        View { data: &self.data[c * self.cs..], ..self }
    }

    /// Asserts that a `rows×cols` view stays inside the slice (a caller bug otherwise).
    pub(crate) fn check(&self, side: &str, rows: usize, cols: usize) {
        let extent = (rows - 1) * self.rs + (cols - 1) * self.cs + 1;
        let (rs, cs) = (self.rs, self.cs);
        assert!(extent <= self.data.len(), "gemm: {side} view [{rows}x{cols}] rs {rs} cs {cs} exceeds its slice");
    }
}

/// [`sgemm`] into slots that must be initialised when `accumulate` (the GEMM reads them).
#[allow(clippy::too_many_arguments)]
fn sgemm_to(
    cpu: &CpuBackend,
    m: usize,
    n: usize,
    k: usize,
    a: View<'_>,
    b: View<'_>,
    c: &mut [MaybeUninit<f32>],
    accumulate: bool,
) {
    let work = m.saturating_mul(n).saturating_mul(k);
    let none = gemm::Parallelism::None;
    // Inside a team job the other participants are busy with the outer loop.
    if cpu.threads() == 1 || work < PARALLEL_GEMM_WORK || super::team::in_team() {
        return gemm_f32(m, n, k, a, b, c, accumulate, none);
    }
    // Blocks on the team, each a serial GEMM that packs its own operands; the team
    // starts a loop in about a microsecond, where waking the rayon pool from outside
    // costs a futex wake (tens of µs in a VM, more than a small product's work).
    // - Under TEAM_GEMM_SPLIT_WORK: blocks of rows (of columns when m is short), two per
    //   thread, so a late thread finds less to do. Each packs all of B (or of A), a small
    //   share of its multiply-adds.
    // - From there on: one block of columns per thread (of rows when n is short), so the
    //   repacking of A is paid once per thread, not per block. gemm's own rayon threading
    //   packs each panel of B once but meets its threads at every panel, which costs
    //   more (docs/performance.md, "Matrix products").
    // Rayon stays for a product called from one of its workers, and for a product under
    // TEAM_GEMM_SPLIT_WORK whose m and n are both too short to split.
    let on_team = !cpu.on_pool_worker();
    let big = work >= TEAM_GEMM_SPLIT_WORK;
    let by_rows = if big { n < 2 * TEAM_GEMM_MIN } else { m >= 2 * TEAM_GEMM_MIN };
    if on_team && (by_rows || n >= 2 * TEAM_GEMM_MIN) {
        let len = if by_rows { m } else { n };
        let per_thread = if big { 1 } else { 2 };
        let step = len.div_ceil(cpu.threads() * per_thread).max(TEAM_GEMM_MIN).next_multiple_of(16);
        let c_at = super::pool::SharedMut(c.as_mut_ptr());
        cpu.for_each_index(len.div_ceil(step), PARALLEL_GEMM_WORK, |blk| {
            let (lo, hi) = (blk * step, ((blk + 1) * step).min(len));
            // Rows lo..hi of A and C, or columns lo..hi of B and C (C's row stride is n).
            let (rows, cols, a, b, at) =
                if by_rows { (hi - lo, n, a.rows_from(lo), b, lo * n) } else { (m, hi - lo, a, b.cols_from(lo), lo) };
            // SAFETY: blocks of `c` are disjoint (gemm writes only the block's rows, or
            // only its columns of each row through the stride n), each index runs once,
            // and `c` holds `m·n` elements, so every block's view ends inside it.
            unsafe { gemm_f32_raw(rows, cols, k, a, b, c_at.ptr().add(at), n, accumulate, none) };
        });
    } else {
        let threads = cpu.threads();
        cpu.install(|| gemm_f32(m, n, k, a, b, c, accumulate, gemm::Parallelism::Rayon(threads)));
    }
}

/// The fewest rows (or columns) of a block of a product split on the team.
const TEAM_GEMM_MIN: usize = 64;

/// Products of at least this many multiply-adds (645³) are split into one block per
/// thread (see `sgemm_to`).
const TEAM_GEMM_SPLIT_WORK: usize = 1 << 28;

/// [`sgemm`] on the calling thread only (for callers already parallel over products).
pub fn sgemm_serial(
    m: usize,
    n: usize,
    k: usize,
    a: &[f32],
    a_rs: usize,
    a_cs: usize,
    b: &[f32],
    b_rs: usize,
    b_cs: usize,
    c: &mut [f32],
    accumulate: bool,
) {
    let (a, b) = (View::new(a, a_rs, a_cs), View::new(b, b_rs, b_cs));
    gemm_f32(m, n, k, a, b, output::as_uninit(c), accumulate, gemm::Parallelism::None);
}

#[allow(clippy::too_many_arguments)]
fn gemm_f32(
    m: usize,
    n: usize,
    k: usize,
    a: View<'_>,
    b: View<'_>,
    c: &mut [MaybeUninit<f32>],
    accumulate: bool,
    parallelism: gemm::Parallelism,
) {
    let c = &mut c[..m * n];
    // SAFETY: `c` is exactly `m·n` elements, row-major with row stride `n`, exclusively
    // borrowed.
    unsafe { gemm_f32_raw(m, n, k, a, b, c.as_mut_ptr(), n, accumulate, parallelism) }
}

/// The GEMM behind [`gemm_f32`], writing `c(i, j) = c[i·c_rs + j]`.
///
/// # Safety
/// Those `m×n` elements of `c` must be valid for writes (and initialised when
/// `accumulate`), and no other thread may access them during the call.
#[allow(clippy::too_many_arguments)]
unsafe fn gemm_f32_raw(
    m: usize,
    n: usize,
    k: usize,
    a: View<'_>,
    b: View<'_>,
    c: *mut MaybeUninit<f32>,
    c_rs: usize,
    accumulate: bool,
    parallelism: gemm::Parallelism,
) {
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        // An empty sum: a·b is the zero matrix.
        if !accumulate {
            for i in 0..m {
                // SAFETY: row `i`'s `n` elements are valid for writes (the contract).
                unsafe { std::slice::from_raw_parts_mut(c.add(i * c_rs), n) }.fill(MaybeUninit::new(0.0));
            }
        }
        return;
    }
    a.check("lhs", m, k);
    b.check("rhs", k, n);
    // Under an AVX2 cap gemm's AVX2 microkernels run instead of those it would pick.
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: as for gemm::gemm below, whose arguments these are; every stride is
        // non-negative (usize).
        let capped = unsafe {
            super::gemm_capped::gemm_f32(
                m,
                n,
                k,
                c.cast::<f32>(),
                1,
                c_rs as isize,
                accumulate,
                a.data.as_ptr(),
                a.cs as isize,
                a.rs as isize,
                b.data.as_ptr(),
                b.cs as isize,
                b.rs as isize,
                1.0f32,
                1.0f32,
                parallelism,
            )
        };
        if capped {
            return;
        }
    }
    // SAFETY: the asserts above keep every element the views address inside `a` and `b`;
    // `c`'s elements are ours by the contract. gemm computes dst := alpha·dst +
    // beta·lhs·rhs, reading dst only if asked (`accumulate`, when the caller guarantees it
    // is initialised) and writing all of it.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c.cast::<f32>(),
            1,
            c_rs as isize,
            accumulate,
            a.data.as_ptr(),
            a.cs as isize,
            a.rs as isize,
            b.data.as_ptr(),
            b.cs as isize,
            b.rs as isize,
            1.0f32,
            1.0f32,
            false,
            false,
            false,
            parallelism,
        );
    }
}

/// How one operand of a batch of products is laid out: element (i, j) of matrix `t` is
/// at `t·bs + i·rs + j·cs` (`bs = 0`: one matrix shared by every product).
#[derive(Debug, Clone, Copy)]
struct Layout {
    rs: usize,
    cs: usize,
    bs: usize,
}

impl Layout {
    /// A contiguous row-major `rows×cols` matrix per batch.
    fn rows(rows: usize, cols: usize) -> Layout {
        Layout { rs: cols, cs: 1, bs: rows * cols }
    }
    /// The same memory read as the transposed matrix.
    fn t(self) -> Layout {
        Layout { rs: self.cs, cs: self.rs, bs: self.bs }
    }
}

/// `c[t] = a[t]·b[t]` for `t < batches`, `c` contiguous `[batches, m, n]`. Folds the batch
/// into the rows when `b` is shared and `a`'s rows continue across batches (one big
/// product); otherwise splits the batch over threads when each product is small, or gives
/// each large product gemm's own threads.
fn gemm_batched(
    cpu: &CpuBackend,
    batches: usize,
    (m, n, k): (usize, usize, usize),
    a: &[f32],
    la: Layout,
    b: &[f32],
    lb: Layout,
    c: &mut [f32],
) {
    if batches == 0 || m == 0 || n == 0 {
        return;
    }
    if batches == 1 || (lb.bs == 0 && la.bs == m * la.rs) {
        sgemm(cpu, batches * m, n, k, a, la.rs, la.cs, b, lb.rs, lb.cs, c, false);
    } else if m * n * k >= PARALLEL_GEMM_WORK {
        for (t, ct) in c.chunks_mut(m * n).enumerate() {
            sgemm(cpu, m, n, k, &a[t * la.bs..], la.rs, la.cs, &b[t * lb.bs..], lb.rs, lb.cs, ct, false);
        }
    } else {
        cpu.for_each_chunk(&mut c[..batches * m * n], m * n, k, |t, ct| {
            sgemm_serial(m, n, k, &a[t * la.bs..], la.rs, la.cs, &b[t * lb.bs..], lb.rs, lb.cs, ct, false);
        });
    }
}

/// `c = Σ_t a[t]·b[t]` over `batches` products (`c` row-major `[m, n]`): one product of
/// inner size `batches·k` when both operands' inner dimension continues across batches,
/// else products accumulated in batch order (deterministic).
fn gemm_batched_sum(
    cpu: &CpuBackend,
    batches: usize,
    (m, n, k): (usize, usize, usize),
    a: &[f32],
    la: Layout,
    b: &[f32],
    lb: Layout,
    c: &mut [f32],
) {
    if batches <= 1 || (la.bs == k * la.cs && lb.bs == k * lb.rs) {
        sgemm(cpu, m, n, batches * k, a, la.rs, la.cs, b, lb.rs, lb.cs, c, false);
        return;
    }
    for t in 0..batches {
        sgemm(cpu, m, n, k, &a[t * la.bs..], la.rs, la.cs, &b[t * lb.bs..], lb.rs, lb.cs, c, t > 0);
    }
}

/// The strided layouts of a validated product.
trait Layouts {
    /// `op(a)` per batch.
    fn a_layout(&self) -> Layout;
    /// `op(b)` per batch (batch stride 0 when shared).
    fn b_layout(&self) -> Layout;
    /// The output per batch.
    fn out_layout(&self) -> Layout;
}

impl Layouts for MatmulSpec {
    fn a_layout(&self) -> Layout {
        if self.transpose_a {
            Layout::rows(self.k, self.m).t()
        } else {
            Layout::rows(self.m, self.k)
        }
    }

    fn b_layout(&self) -> Layout {
        let l = if self.transpose_b { Layout::rows(self.n, self.k).t() } else { Layout::rows(self.k, self.n) };
        if self.b_shared {
            Layout { bs: 0, ..l }
        } else {
            l
        }
    }

    fn out_layout(&self) -> Layout {
        Layout::rows(self.m, self.n)
    }
}

/// `op(a)·op(b)` for a validated problem, in f32.
fn matmul_f32(cpu: &CpuBackend, p: &MatmulSpec, a: &[f32], b: &[f32]) -> Vec<f32> {
    let mut out = convert::zeroed_f32(cpu, p.batches * p.m * p.n);
    gemm_batched(cpu, p.batches, (p.m, p.n, p.k), a, p.a_layout(), b, p.b_layout(), &mut out);
    out
}

/// `out = op(a)·op(b)`, batched over leading dims; `b` may be 2-d and shared by every batch.
///
/// # Shapes
/// `a`: `[..., m, k]` (`[..., k, m]` transposed); `b`: `[..., k, n]` or `[k, n]`
/// (`[..., n, k]` / `[n, k]` transposed) → `[..., m, n]`.
pub fn matmul(cpu: &CpuBackend, a: &Tensor, b: &Tensor, transpose_a: bool, transpose_b: bool) -> Result<Tensor> {
    const OP: &str = "matmul";
    let p = spec::matmul::matmul(a, b, transpose_a, transpose_b)?;
    let (ad, bd) = (convert::f32_data(OP, "a", a)?, convert::f32_data(OP, "b", b)?);
    convert::from_f32(matmul_f32(cpu, &p, &ad, &bd), p.out_dims(), a.dtype())
}

/// Backward of `matmul`: with `A = op(a)`, `B = op(b)`, `dA = dC·Bᵀ` and `dB = Aᵀ·dC`,
/// each stored in its operand's own layout; `db` is summed over the batch when `b` was shared.
///
/// # Shapes
/// as `matmul`; `d_out`: `[..., m, n]` → `da` like `a`, `db` like `b`.
pub fn matmul_backward(
    cpu: &CpuBackend,
    a: &Tensor,
    b: &Tensor,
    d_out: &Tensor,
    transpose_a: bool,
    transpose_b: bool,
) -> Result<MatmulGradients> {
    const OP: &str = "matmul_backward";
    let p = spec::matmul::matmul_backward(a, b, d_out, transpose_a, transpose_b)?;
    let ad = convert::f32_data(OP, "a", a)?;
    let bd = convert::f32_data(OP, "b", b)?;
    let dc = convert::f32_data(OP, "d_out", d_out)?;
    let (m, n, k) = (p.m, p.n, p.k);
    let (la, lb, lc) = (p.a_layout(), p.b_layout(), p.out_layout());

    let mut da = convert::zeroed_f32(cpu, a.elem_count());
    if transpose_a {
        // a holds Aᵀ, so da = dAᵀ = B·dCᵀ  ([k, n]·[n, m]).
        gemm_batched(cpu, p.batches, (k, m, n), &bd, lb, &dc, lc.t(), &mut da);
    } else {
        // da = dC·Bᵀ  ([m, n]·[n, k]).
        gemm_batched(cpu, p.batches, (m, k, n), &dc, lc, &bd, lb.t(), &mut da);
    }

    let mut db = convert::zeroed_f32(cpu, b.elem_count());
    // db = Aᵀ·dC ([k, m]·[m, n]), or dbᵀ = dCᵀ·A ([n, m]·[m, k]) when b holds Bᵀ.
    let (dims, lhs, l_lhs, rhs, l_rhs) =
        if transpose_b { ((n, k, m), &dc, lc.t(), &ad, la) } else { ((k, n, m), &ad, la.t(), &dc, lc) };
    if p.b_shared {
        gemm_batched_sum(cpu, p.batches, dims, lhs, l_lhs, rhs, l_rhs, &mut db);
    } else {
        gemm_batched(cpu, p.batches, dims, lhs, l_lhs, rhs, l_rhs, &mut db);
    }
    Ok(MatmulGradients {
        da: convert::from_f32(da, a.shape().clone(), a.dtype())?,
        db: convert::from_f32(db, b.shape().clone(), b.dtype())?,
    })
}

/// `out[i] = op(a[i])·op(b[i])` for rank-3 operands.
///
/// # Shapes
/// `a`: `[batch, m, k]`, `b`: `[batch, k, p]` (last two dims swapped by the flags) → `[batch, m, p]`.
pub fn batched_matmul(
    cpu: &CpuBackend,
    a: &Tensor,
    b: &Tensor,
    transpose_a: bool,
    transpose_b: bool,
) -> Result<Tensor> {
    const OP: &str = "batched_matmul";
    let p = spec::matmul::batched_matmul(a, b, transpose_a, transpose_b)?;
    let (ad, bd) = (convert::f32_data(OP, "a", a)?, convert::f32_data(OP, "b", b)?);
    convert::from_f32(matmul_f32(cpu, &p, &ad, &bd), p.out_dims(), a.dtype())
}

/// `y = x·Wᵀ + bias`: one product over every row of `x`, `W` read transposed by strides
/// and the bias pre-filled into the output so the product accumulates onto it.
///
/// # Shapes
/// `x`: `[..., in]`; `w`: `[out, in]`; `bias`: `[out]` → `[..., out]`.
pub fn linear_forward(cpu: &CpuBackend, x: &Tensor, w: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
    const OP: &str = "linear_forward";
    let LinearSpec { rows, features_in: fin, features_out: fout, out_dims, .. } =
        spec::matmul::linear_forward(x, w, bias)?;
    let xd = convert::f32_data(OP, "x", x)?;
    let wd = convert::f32_data(OP, "w", w)?;
    // y[r, o] (+)= Σ_i x[r, i]·w[o, i]: Wᵀ(i, o) = w[o·in + i], so rs 1, cs in.
    let y = match bias {
        Some(bias) => {
            let bd = convert::f32_data(OP, "bias", bias)?;
            let mut y =
                convert::filled_chunks(cpu, rows * fout, fout.max(1), 1, |_, row: &mut [f32]| row.copy_from_slice(&bd));
            sgemm(cpu, rows, fout, fin, &xd, fin, 1, &wd, 1, fin, &mut y, true);
            y
        }
        None => sgemm_new(cpu, rows, fout, fin, &xd, fin, 1, &wd, 1, fin),
    };
    convert::from_f32(y, out_dims, x.dtype())
}

/// Backward of `linear_forward`: `dx = dy·W`, `dW = dyᵀ·x`, `dbias = Σ_rows dy`.
///
/// # Shapes
/// `x`: `[..., in]`; `w`: `[out, in]`; `d_out`: `[..., out]` → dx `[..., in]`,
/// dW `[out, in]`, dbias `[out]` when `with_bias`.
pub fn linear_backward(
    cpu: &CpuBackend,
    x: &Tensor,
    w: &Tensor,
    d_out: &Tensor,
    with_bias: bool,
) -> Result<LinearGradients> {
    const OP: &str = "linear_backward";
    let LinearSpec { rows, features_in: fin, features_out: fout, .. } = spec::matmul::linear_backward(x, w, d_out)?;
    let xd = convert::f32_data(OP, "x", x)?;
    let wd = convert::f32_data(OP, "w", w)?;
    let dy = convert::f32_data(OP, "d_out", d_out)?;

    let dx = sgemm_new(cpu, rows, fin, fout, &dy, fout, 1, &wd, fin, 1);
    // dW[o, i] = Σ_r dy[r, o]·x[r, i]: dyᵀ(o, r) = dy[r·out + o], so rs 1, cs out.
    let dw = sgemm_new(cpu, fout, fin, rows, &dy, 1, fout, &xd, fin, 1);
    let dbias =
        if with_bias { Some(convert::from_f32(column_sums(cpu, &dy, rows, fout), [fout], x.dtype())?) } else { None };
    Ok(LinearGradients {
        dx: convert::from_f32(dx, x.shape().clone(), x.dtype())?,
        dweight: convert::from_f32(dw, w.shape().clone(), w.dtype())?,
        dbias,
    })
}

/// `linear_backward` accumulating into existing gradients: `dW += dyᵀ·x` (the product
/// is added onto `dweight` by the GEMM itself, no temporary), `dbias += Σ_rows dy`;
/// returns `dx = dy·W`.
///
/// # Shapes
/// `x`: `[..., in]`; `w`: `[out, in]`; `d_out`: `[..., out]`; `dweight`: `[out, in]`;
/// `dbias`: `[out]` → dx `[..., in]`.
pub fn linear_backward_accumulate(
    cpu: &CpuBackend,
    x: &Tensor,
    w: &Tensor,
    d_out: &Tensor,
    dweight: &mut Tensor,
    dbias: Option<&mut Tensor>,
) -> Result<Tensor> {
    const OP: &str = "linear_backward_accumulate";
    // Called directly by backends (not through `on_cpu!`): hold this backend's ISA.
    let _isa = cpu.enter();
    let LinearSpec { rows, features_in: fin, features_out: fout, .. } =
        spec::matmul::linear_backward_accumulate(x, w, d_out, dweight, dbias.as_deref())?;
    dweight.ensure_writable(OP)?;
    if let Some(db) = &dbias {
        db.ensure_writable(OP)?;
    }
    let xd = convert::f32_data(OP, "x", x)?;
    let wd = convert::f32_data(OP, "w", w)?;
    let dy = convert::f32_data(OP, "d_out", d_out)?;

    let dx = sgemm_new(cpu, rows, fin, fout, &dy, fout, 1, &wd, fin, 1);
    // dW[o, i] += Σ_r dy[r, o]·x[r, i], dyᵀ read by strides as in `linear_backward`.
    convert::update_f32(OP, dweight, |dw| sgemm(cpu, fout, fin, rows, &dy, 1, fout, &xd, fin, 1, dw, true))?;
    if let Some(db) = dbias {
        let sums = column_sums(cpu, &dy, rows, fout);
        convert::update_f32(OP, db, |acc| simd::axpy(acc, 1.0, &sums))?;
    }
    convert::from_f32(dx, x.shape().clone(), x.dtype())
}

/// `s[c] = Σ_r m[r, c]` of a row-major `[rows, cols]` matrix: threads own blocks of
/// columns and add rows in order, so the sums do not depend on scheduling.
pub(crate) fn column_sums(cpu: &CpuBackend, m: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    const BLOCK: usize = 256;
    let mut sums = vec![0.0f32; cols];
    cpu.for_each_chunk(&mut sums, BLOCK, rows, |block, acc| {
        let start = block * BLOCK;
        for r in 0..rows {
            simd::axpy(acc, 1.0, &m[r * cols + start..][..acc.len()]);
        }
    });
    sums
}

/// The first `len` rows of every `[capacity, d]` head of a `[heads, capacity, d]` cache as
/// f32: borrowed whole when F32 (read in place), else only the prefix is converted.
fn cache_prefix_f32<'a>(
    op: &'static str,
    cache: &'a Tensor,
    heads: usize,
    capacity: usize,
    len: usize,
    d: usize,
) -> Result<(Cow<'a, [f32]>, usize)> {
    fn gather<T: Copy>(src: &[T], heads: usize, capacity: usize, len: usize, d: usize, f: fn(T) -> f32) -> Vec<f32> {
        let mut out = Vec::with_capacity(heads * len * d);
        for h in 0..heads {
            out.extend(src[h * capacity * d..][..len * d].iter().map(|&v| f(v)));
        }
        out
    }
    match cache.dtype() {
        DType::F32 => Ok((Cow::Borrowed(cache.as_slice::<f32>()?), capacity * d)),
        DType::F16 => Ok((Cow::Owned(gather(cache.as_slice::<f16>()?, heads, capacity, len, d, f16::to_f32)), len * d)),
        DType::BF16 => {
            Ok((Cow::Owned(gather(cache.as_slice::<bf16>()?, heads, capacity, len, d, bf16::to_f32)), len * d))
        }
        other => Err(Error::dtype(op, "k_cache", "f32, f16 or bf16", other)),
    }
}

/// Scores of queries against the first `len` cached keys, without copying the cache:
/// `s[b,h,i,j] = q[b,h,i,:]·k_cache[b, h/(Hq/Hkv), j, :]` for `j < len` (no scale). The
/// queries of one kv head's group are consecutive in memory, so each (batch, kv head) is
/// one product `[group·Tq, D]·[D, len]` with the keys read transposed by strides.
///
/// # Shapes
/// `q`: `[B, Hq, Tq, D]`; `k_cache`: `[B, Hkv, capacity, D]`, `len ≤ capacity` → `[B, Hq, Tq, len]`.
pub fn head_prefix_matmul(cpu: &CpuBackend, q: &Tensor, k_cache: &Tensor, len: usize) -> Result<Tensor> {
    const OP: &str = "head_prefix_matmul";
    let spec::attention::DecodeSpec { dims, capacity, .. } = spec::attention::head_prefix_matmul(q, k_cache, len)?;
    let AttentionDims { batch, hq, hkv, tq, d, .. } = dims;
    let group = hq / hkv;
    let qd = convert::f32_data(OP, "q", q)?;
    let (kd_f32, head_stride) = cache_prefix_f32(OP, k_cache, batch * hkv, capacity, len, d)?;
    let mut out = vec![0.0f32; batch * hq * tq * len];
    // Per (batch, kv head): rows are the group's queries [group·Tq, D]; Kᵀ(p, j) = k[j·D + p].
    let lq = Layout::rows(group * tq, d);
    let lk = Layout { rs: 1, cs: d, bs: head_stride };
    gemm_batched(cpu, batch * hkv, (group * tq, len, d), &qd, lq, &kd_f32, lk, &mut out);
    convert::from_f32(out, [batch, hq, tq, len], q.dtype())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Not a timing assertion (timing belongs in benchmarks): checks a 1024³ product
    /// against a few dot products and prints the rate it reached.
    #[test]
    fn sgemm_1024_cubed_rate() {
        let cpu = CpuBackend::new().unwrap();
        let n = 1024;
        let a: Vec<f32> = (0..n * n).map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5).collect();
        let b: Vec<f32> = (0..n * n).map(|i| ((i * 104_729) % 997) as f32 / 997.0 - 0.5).collect();
        let mut c = vec![0.0f32; n * n];
        sgemm(&cpu, n, n, n, &a, n, 1, &b, n, 1, &mut c, false); // warm-up
                                                                 // Best of a few runs: the machine may be shared, the best run is the kernel's rate.
        let mut best = f64::INFINITY;
        for _ in 0..10 {
            let start = std::time::Instant::now();
            sgemm(&cpu, n, n, n, &a, n, 1, &b, n, 1, &mut c, false);
            best = best.min(start.elapsed().as_secs_f64());
        }
        println!(
            "sgemm 1024³ on {} threads: {:.1} GFLOP/s (best of 10)",
            cpu.threads(),
            2.0 * (n * n * n) as f64 / best / 1e9
        );
        for &(i, j) in &[(0, 0), (3, 1000), (1023, 17), (512, 512)] {
            let want: f64 = (0..n).map(|p| a[i * n + p] as f64 * b[p * n + j] as f64).sum();
            assert!((c[i * n + j] as f64 - want).abs() < 1e-3, "c[{i},{j}] = {} vs {want}", c[i * n + j]);
        }
    }

    /// Products split into row blocks, column blocks, or left to rayon, with transposed
    /// operands and accumulation, on 3 threads, against an f64 reference (every element
    /// of the small products, every 11th row of the large ones).
    #[test]
    fn products_split_on_the_team_match_the_definition() {
        let cpu = CpuBackend::with_threads(3).expect("pool");
        // (m, n, k): rows split, columns split (m too short), neither (both short); then
        // from TEAM_GEMM_SPLIT_WORK on, one block per thread: columns, rows (n too short).
        for (m, n, k) in [(300, 70, 40), (50, 400, 40), (100, 100, 90), (1000, 1030, 262), (16400, 70, 240)] {
            assert_eq!(m * n * k >= TEAM_GEMM_SPLIT_WORK, m >= 1000, "{m}x{n}x{k}");
            let row_step = if m >= 1000 { 11 } else { 1 };
            let a: Vec<f32> = (0..m * k).map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5).collect();
            let b: Vec<f32> = (0..k * n).map(|i| ((i * 104_729) % 997) as f32 / 997.0 - 0.5).collect();
            for (transpose_a, transpose_b, accumulate) in
                [(false, false, false), (true, true, true), (true, false, false)]
            {
                // The same matrices, stored transposed when asked.
                let (a_rs, a_cs, a_data) = if transpose_a {
                    (1, m, (0..m * k).map(|i| a[(i % m) * k + i / m]).collect::<Vec<f32>>())
                } else {
                    (k, 1, a.clone())
                };
                let (b_rs, b_cs, b_data) = if transpose_b {
                    (1, k, (0..k * n).map(|i| b[(i % k) * n + i / k]).collect::<Vec<f32>>())
                } else {
                    (n, 1, b.clone())
                };
                let start = |i: usize| if accumulate { (i % 5) as f32 } else { f32::NAN };
                let mut c: Vec<f32> = (0..m * n).map(start).collect();
                sgemm(&cpu, m, n, k, &a_data, a_rs, a_cs, &b_data, b_rs, b_cs, &mut c, accumulate);
                for i in (0..m).step_by(row_step) {
                    for j in 0..n {
                        let dot: f64 = (0..k).map(|p| a[i * k + p] as f64 * b[p * n + j] as f64).sum();
                        let want = dot + if accumulate { start(i * n + j) as f64 } else { 0.0 };
                        let got = c[i * n + j] as f64;
                        assert!(
                            (got - want).abs() < 1e-4,
                            "{m}x{n}x{k} ta {transpose_a} tb {transpose_b}: c[{i},{j}] = {got} vs {want}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn strided_transposes_and_accumulate() {
        let cpu = CpuBackend::with_threads(1).expect("pool");
        // a = [[1, 2], [3, 4]] stored transposed; b = [[5, 6], [7, 8]].
        let at = [1.0, 3.0, 2.0, 4.0];
        let b = [5.0, 6.0, 7.0, 8.0];
        let mut c = vec![1.0f32; 4];
        sgemm(&cpu, 2, 2, 2, &at, 1, 2, &b, 2, 1, &mut c, true);
        assert_eq!(c, vec![20.0, 23.0, 44.0, 51.0]);
        sgemm(&cpu, 2, 2, 0, &at, 1, 2, &b, 2, 1, &mut c, false);
        assert_eq!(c, vec![0.0; 4]);
    }
}
