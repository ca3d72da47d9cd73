//! Native op implementations: one file per op family (the trait methods in `backend.rs`
//! delegate to them), plus what they share here: elementwise launches, the strided
//! matmul, row-block chunking for tensors beyond the binding limit.

pub mod activation;
pub mod attention;
pub mod binary;
pub mod convert;
pub mod half;
pub mod layout;
pub mod linear;
pub mod matmul;
pub mod norm;
pub mod optim;
pub mod quant;
pub mod reduce;
pub mod rope_embedding;
pub mod softmax_loss;
pub mod unary;

use fusebox::{DType, Error, Result, Shape, Tensor};

use crate::context::{buffer_of, Context, Kernel};
use crate::kernels;

/// Inner-dimension length one matmul dispatch covers (and rows one column sum covers).
pub const K_CHUNK: usize = 4096;

/// Threads a workgroup in the flat 1-d kernels.
pub const WG: u64 = 256;

/// Unary op codes of `unop` in elementwise.wgsl.
#[derive(Debug, Clone, Copy)]
pub enum Un {
    Exp = 0,
    Log = 1,
    Sqrt = 2,
    Neg = 3,
    Abs = 4,
    Pow = 5,
    Clamp = 6,
    AddS = 7,
    SubS = 8,
    MulS = 9,
    DivS = 10,
    Silu = 11,
    Relu = 12,
    Sigmoid = 13,
    Tanh = 14,
    GeluTanh = 15,
    GeluErf = 16,
    Softplus = 17,
    Fill = 18,
}

/// Binary op codes of `binop` in elementwise.wgsl.
#[derive(Debug, Clone, Copy)]
pub enum Bin {
    Add = 0,
    Sub = 1,
    Mul = 2,
    Div = 3,
    SiluBwd = 4,
    ReluBwd = 5,
    SigmoidBwd = 6,
    TanhBwd = 7,
    GeluTanhBwd = 8,
    GeluErfBwd = 9,
    SiluMul = 10,
    ExpMul = 11,
    AddScaled = 12,
    GeluTanhMul = 13,
    GeluErfMul = 14,
}

pub fn f(x: f32) -> u32 {
    x.to_bits()
}

pub fn u(x: usize) -> Result<u32> {
    u32::try_from(x).map_err(|_| Error::unsupported("wgpu", format!("size {x} exceeds the kernels' 32-bit indexing")))
}

/// The matrix view of an operand: element (batch z, row i, col j) at
/// `z·batch + i·row + j·col` words from the tensor's first element.
#[derive(Debug, Clone, Copy)]
pub struct MatView {
    pub batch: usize,
    pub row: usize,
    pub col: usize,
}

impl MatView {
    /// A row-major `[rows, cols]` matrix per batch (`batch` = 0 when shared).
    pub fn rows(cols: usize, batch: usize) -> MatView {
        MatView { batch, row: cols, col: 1 }
    }
    /// The transposed view.
    pub fn t(self) -> MatView {
        MatView { batch: self.batch, row: self.col, col: self.row }
    }
}

impl Context {
    /// Runs a flat elementwise kernel over `n` elements.
    pub fn flat(&self, op: &'static str, k: &Kernel, args: &[&Tensor], params: &[u32], n: usize) -> Result<()> {
        self.dispatch(op, k, args, params, (n as u64).div_ceil(WG))
    }

    /// `out = unop(x)` into a new tensor.
    pub fn unary(&self, op: &'static str, x: &Tensor, code: Un, p0: f32, p1: f32) -> Result<Tensor> {
        let out = self.empty(op, x.shape().clone(), DType::F32)?;
        let n = x.elem_count();
        self.flat(op, &kernels::UNARY, &[x, &out], &[code as u32, u(n)?, f(p0), f(p1)], n)?;
        Ok(out)
    }

    /// `out = binop(a, b)` into a new tensor (c: the scalar of `AddScaled`).
    pub fn binary(&self, op: &'static str, a: &Tensor, b: &Tensor, code: Bin, c: f32) -> Result<Tensor> {
        let out = self.empty(op, a.shape().clone(), DType::F32)?;
        let n = a.elem_count();
        self.flat(op, &kernels::BINARY, &[a, b, &out], &[code as u32, u(n)?, f(c)], n)?;
        Ok(out)
    }

    /// `out = C (+)= op(A)·op(B) (+ bias)` over `batch` batches with strided views.
    #[allow(clippy::too_many_arguments)]
    pub fn gemm(
        &self,
        op: &'static str,
        (a, av): (&Tensor, MatView),
        (b, bv): (&Tensor, MatView),
        bias: Option<&Tensor>,
        (c_out, cv): (&Tensor, MatView),
        (m, n, k, batch): (usize, usize, usize, usize),
        accumulate: bool,
    ) -> Result<()> {
        if m == 0 || n == 0 {
            return Ok(());
        }
        let tiles_n = n.div_ceil(32);
        let tiles = m.div_ceil(32) * tiles_n;
        let z = u32::try_from(batch).map_err(|_| Error::unsupported(op, "batch count beyond u32"))?;
        // The k loop is split across dispatches that accumulate (see attention.wgsl:
        // software rasterizers bound the loop iterations of one invocation).
        let chunks = k.div_ceil(K_CHUNK).max(1);
        for c in 0..chunks {
            let (k0, k1) = (c * K_CHUNK, ((c + 1) * K_CHUNK).min(k));
            let (a_c, b_c);
            let (a_k, b_k) = if k0 == 0 {
                (a, b)
            } else {
                a_c = a.view(k0 * av.col, Shape::new(vec![a.elem_count() - k0 * av.col]))?;
                b_c = b.view(k0 * bv.row, Shape::new(vec![b.elem_count() - k0 * bv.row]))?;
                (&a_c, &b_c)
            };
            let params = [
                u(m)?,
                u(n)?,
                u(k1 - k0)?,
                u(av.batch)?,
                u(av.row)?,
                u(av.col)?,
                u(bv.batch)?,
                u(bv.row)?,
                u(bv.col)?,
                u(cv.batch)?,
                u(cv.row)?,
                (bias.is_some() && c == 0) as u32,
                u(tiles_n)?,
                (accumulate || c > 0) as u32,
            ];
            self.dispatch_3d(op, &kernels::MATMUL, &[a_k, b_k, bias.unwrap_or(a), c_out], &params, tiles as u64, z)?;
        }
        Ok(())
    }

    /// `out[j] = Σ_r x[r·cols + j]` for `rows` rows of `cols` columns, rows in blocks
    /// that accumulate (bounded loops, see `gemm`).
    pub fn sum_rows(&self, op: &'static str, x: &Tensor, rows: usize, cols: usize, out: &Tensor) -> Result<()> {
        self.sum_rows_into(op, x, rows, cols, out, false)
    }

    /// `sum_rows`, adding to `out` when `accumulate`.
    pub fn sum_rows_into(
        &self,
        op: &'static str,
        x: &Tensor,
        rows: usize,
        cols: usize,
        out: &Tensor,
        accumulate: bool,
    ) -> Result<()> {
        let mut r0 = 0;
        while r0 < rows || r0 == 0 {
            let r1 = (r0 + K_CHUNK).min(rows);
            let xb = x.view(r0 * cols, Shape::new(vec![x.elem_count() - r0 * cols]))?;
            let params = [u(r1 - r0)?, u(cols)?, u(cols)?, (accumulate || r0 > 0) as u32];
            self.flat(op, &kernels::SUM_ROWS, &[&xb, out], &params, cols)?;
            r0 = r1.max(1);
        }
        Ok(())
    }

    /// Rows `[r0, r0 + len)` of a row-major `[rows, cols]` tensor as a view.
    pub fn row_block(t: &Tensor, cols: usize, r0: usize, len: usize) -> Result<Tensor> {
        t.view(r0 * cols, Shape::new(vec![len, cols]))
    }

    /// How many rows of `cols` f32 columns fit in one storage binding.
    pub fn rows_per_binding(&self, cols: usize) -> usize {
        let bytes = (self.limits.max_storage_buffer_binding_size as usize).saturating_sub(256);
        (bytes / (4 * cols.max(1))).max(1)
    }

    /// A copy of `t` (same shape and dtype) in a fresh buffer.
    pub fn copy_tensor(&self, op: &'static str, t: &Tensor) -> Result<Tensor> {
        let out = self.empty(op, t.shape().clone(), t.dtype())?;
        let bytes = (t.byte_len() as u64).div_ceil(4) * 4;
        let src = buffer_of(t)?;
        let dst = buffer_of(&out)?;
        self.copy(src.raw(), t.byte_offset() as u64, dst.raw(), 0, bytes);
        Ok(out)
    }
}
