//! Linear layers with BF16 operands and f32 accumulation (`bgemm`): the forward and
//! the accumulating backward of mixed-precision training. Bias and its gradient stay f32.

use crate::cpu::matmul::column_sums;
use crate::cpu::{convert, output, simd, CpuBackend};
use crate::error::Result;
use crate::spec;
use crate::spec::matmul::LinearSpec;
use crate::tensor::Tensor;

use super::{bgemm, View};

/// `y = bf16(x)·bf16(W)ᵀ + bias`, accumulated in f32 (bias added in f32).
///
/// # Shapes
/// `x`: `[..., in]`; `w`: `[out, in]`; `bias`: `[out]` → `[..., out]`.
pub fn linear_forward_bf16(cpu: &CpuBackend, x: &Tensor, w: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
    const OP: &str = "linear_forward_bf16";
    let LinearSpec { rows, features_in: fin, features_out: fout, out_dims, .. } =
        spec::matmul::linear_forward_bf16(x, w, bias)?;
    let xd = convert::f32_data(OP, "x", x)?;
    let wd = convert::f32_data(OP, "w", w)?;
    // y[r, o] = Σ_i x[r, i]·w[o, i]: Wᵀ(i, o) = w[o·in + i], so rs 1, cs in.
    let (a, b) = (View::new(&xd, fin, 1), View::new(&wd, 1, fin));
    let y = match bias {
        Some(bias) => {
            let bd = convert::f32_data(OP, "bias", bias)?;
            let mut y =
                convert::filled_chunks(cpu, rows * fout, fout.max(1), 1, |_, row: &mut [f32]| row.copy_from_slice(&bd));
            bgemm(cpu, rows, fout, fin, a, b, output::as_uninit(&mut y), true);
            y
        }
        None => {
            let mut y: Vec<f32> = Vec::with_capacity(rows * fout);
            bgemm(cpu, rows, fout, fin, a, b, &mut y.spare_capacity_mut()[..rows * fout], false);
            // SAFETY: without accumulate, bgemm writes all rows·fout values.
            unsafe { y.set_len(rows * fout) };
            y
        }
    };
    convert::from_f32(y, out_dims, x.dtype())
}

/// Backward of [`linear_forward_bf16`] accumulating the parameter gradients:
/// `dW += bf16(dy)ᵀ·bf16(x)`, `dbias += Σ_rows dy` (f32), and returns
/// `dx = bf16(dy)·bf16(W)`.
///
/// # Shapes
/// `x`: `[..., in]`; `w`: `[out, in]`; `d_out`: `[..., out]`; `dweight`: `[out, in]`;
/// `dbias`: `[out]` → dx `[..., in]`.
pub fn linear_backward_accumulate_bf16(
    cpu: &CpuBackend,
    x: &Tensor,
    w: &Tensor,
    d_out: &Tensor,
    dweight: &mut Tensor,
    dbias: Option<&mut Tensor>,
) -> Result<Tensor> {
    const OP: &str = "linear_backward_accumulate_bf16";
    let _isa = cpu.enter();
    let LinearSpec { rows, features_in: fin, features_out: fout, .. } =
        spec::matmul::linear_backward_accumulate_bf16(x, w, d_out, dweight, dbias.as_deref())?;
    dweight.ensure_writable(OP)?;
    if let Some(db) = &dbias {
        db.ensure_writable(OP)?;
    }
    let xd = convert::f32_data(OP, "x", x)?;
    let wd = convert::f32_data(OP, "w", w)?;
    let dy = convert::f32_data(OP, "d_out", d_out)?;

    // dx[r, i] = Σ_o dy[r, o]·w[o, i].
    let mut dx: Vec<f32> = Vec::with_capacity(rows * fin);
    let (a, b) = (View::new(&dy, fout, 1), View::new(&wd, fin, 1));
    bgemm(cpu, rows, fin, fout, a, b, &mut dx.spare_capacity_mut()[..rows * fin], false);
    // SAFETY: without accumulate, bgemm writes all rows·fin values.
    unsafe { dx.set_len(rows * fin) };
    // dW[o, i] += Σ_r dy[r, o]·x[r, i]: dyᵀ(o, r) = dy[r·out + o], so rs 1, cs out.
    let (a, b) = (View::new(&dy, 1, fout), View::new(&xd, fin, 1));
    convert::update_f32(OP, dweight, |dw| bgemm(cpu, fout, fin, rows, a, b, output::as_uninit(dw), true))?;
    if let Some(db) = dbias {
        let sums = column_sums(cpu, &dy, rows, fout);
        convert::update_f32(OP, db, |acc| simd::axpy(acc, 1.0, &sums))?;
    }
    convert::from_f32(dx, x.shape().clone(), x.dtype())
}
