//! F16/BF16 inputs are computed in f32: these helpers read any float tensor as f32
//! (borrowing F32 data, converting the others once) and write f32 results back in
//! the caller's dtype.

use std::borrow::Cow;
use std::mem::MaybeUninit;

use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};

use crate::cpu::CpuBackend;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::shape::Shape;
use crate::tensor::Tensor;

/// The elements of a host float tensor as f32 (borrowed when already F32).
pub fn f32_data<'a>(op: &'static str, what: &str, t: &'a Tensor) -> Result<Cow<'a, [f32]>> {
    match t.dtype() {
        DType::F32 => Ok(Cow::Borrowed(t.as_slice::<f32>()?)),
        DType::F16 => Ok(Cow::Owned(t.as_slice::<f16>()?.iter().map(|v| v.to_f32()).collect())),
        DType::BF16 => Ok(Cow::Owned(t.as_slice::<bf16>()?.iter().map(|v| v.to_f32()).collect())),
        other => Err(Error::dtype(op, what, "f32, f16 or bf16", other)),
    }
}

/// A host tensor of `dtype` from f32 results (moved without copy when `dtype` is F32).
pub fn from_f32(data: Vec<f32>, shape: impl Into<Shape>, dtype: DType) -> Result<Tensor> {
    match dtype {
        DType::F32 => Tensor::from_vec(data, shape),
        _ => Tensor::from_f32_as(&data, shape, dtype),
    }
}

/// f32 `data` as a tensor shaped and typed like `like` (F32 takes the vector over; F16/BF16
/// are converted in parallel chunks into a fresh buffer).
pub fn from_f32_par(cpu: &CpuBackend, data: Vec<f32>, like: &Tensor) -> Result<Tensor> {
    const CHUNK: usize = 1 << 14;
    let n = data.len();
    let half = |i: usize, dst: &mut [f16]| dst.convert_from_f32_slice(&data[i * CHUNK..][..dst.len()]);
    let brain = |i: usize, dst: &mut [bf16]| dst.convert_from_f32_slice(&data[i * CHUNK..][..dst.len()]);
    match like.dtype() {
        DType::F32 => Tensor::from_vec(data, like.shape().clone()),
        DType::F16 => Tensor::from_vec(filled_chunks(cpu, n, CHUNK, 1, half), like.shape().clone()),
        DType::BF16 => Tensor::from_vec(filled_chunks(cpu, n, CHUNK, 1, brain), like.shape().clone()),
        other => Err(Error::dtype("from_f32_par", "output", "f32, f16 or bf16", other)),
    }
}

/// Writes f32 `values` into a writable float tensor of any float dtype.
pub fn store_f32(dst: &mut Tensor, values: &[f32]) -> Result<()> {
    match dst.dtype() {
        DType::F32 => dst.as_mut_slice::<f32>()?.copy_from_slice(values),
        DType::F16 => {
            for (d, &v) in dst.as_mut_slice::<f16>()?.iter_mut().zip(values) {
                *d = f16::from_f32(v);
            }
        }
        DType::BF16 => {
            for (d, &v) in dst.as_mut_slice::<bf16>()?.iter_mut().zip(values) {
                *d = bf16::from_f32(v);
            }
        }
        other => return Err(Error::dtype("store_f32", "destination", "f32, f16 or bf16", other)),
    }
    Ok(())
}

/// Applies `f` to a writable float tensor's values as f32, in place.
/// F32 tensors are modified directly; F16/BF16 ones round-trip through f32.
pub fn update_f32(op: &'static str, dst: &mut Tensor, f: impl FnOnce(&mut [f32])) -> Result<()> {
    dst.ensure_writable(op)?;
    if dst.dtype() == DType::F32 {
        f(dst.as_mut_slice::<f32>()?);
        return Ok(());
    }
    let mut values = f32_data(op, "tensor", dst)?.into_owned();
    f(&mut values);
    store_f32(dst, &values)
}

/// A kernel's output tensor, filled as f32 values: written in place in the result for
/// F32 (no copy afterwards), or staged in f32 and converted once, in parallel, for
/// F16/BF16.
pub struct F32Output {
    tensor: Tensor,
    staged: Option<Vec<f32>>,
}

impl F32Output {
    /// A zeroed output of `shape` and float `dtype`.
    pub fn new(shape: &Shape, dtype: DType) -> Result<F32Output> {
        let tensor = Tensor::zeros(shape.clone(), dtype)?;
        let n = shape.elem_count();
        // Empty outputs are staged too: an empty host slice is not cast to f32.
        let staged = if dtype == DType::F32 && n > 0 { None } else { Some(vec![0.0f32; n]) };
        Ok(F32Output { tensor, staged })
    }

    /// The values to write, in row-major order.
    pub fn values(&mut self) -> Result<&mut [f32]> {
        match &mut self.staged {
            Some(v) => Ok(v),
            None => self.tensor.as_mut_slice::<f32>(),
        }
    }

    /// The finished tensor (staged values converted to its dtype).
    pub fn finish(self, cpu: &CpuBackend) -> Result<Tensor> {
        let F32Output { mut tensor, staged } = self;
        let Some(values) = staged.filter(|v| !v.is_empty()) else {
            return Ok(tensor);
        };
        match tensor.dtype() {
            DType::F16 => convert_chunks(cpu, tensor.as_mut_slice::<f16>()?, &values, f16::from_f32),
            DType::BF16 => convert_chunks(cpu, tensor.as_mut_slice::<bf16>()?, &values, bf16::from_f32),
            other => return Err(Error::dtype("F32Output::finish", "output", "f16 or bf16", other)),
        }
        Ok(tensor)
    }
}

/// `dst[i] = convert(src[i])`, in parallel chunks.
fn convert_chunks<T: Send>(cpu: &CpuBackend, dst: &mut [T], src: &[f32], convert: impl Fn(f32) -> T + Sync + Send) {
    const CHUNK: usize = 1 << 14;
    cpu.for_each_chunk(dst, CHUNK, 1, |i, chunk| {
        for (d, &s) in chunk.iter_mut().zip(&src[i * CHUNK..]) {
            *d = convert(s);
        }
    });
}

/// A new tensor of `shape` and float `dtype` whose values `fill` computes in f32 (see
/// [`F32Output`]: written in place for F32, converted once in parallel otherwise).
pub fn f32_output(cpu: &CpuBackend, shape: &Shape, dtype: DType, fill: impl FnOnce(&mut [f32])) -> Result<Tensor> {
    let mut out = F32Output::new(shape, dtype)?;
    fill(out.values()?);
    out.finish(cpu)
}

/// A new tensor of `shape` and float `dtype` filled chunk by chunk: `fill(i, chunk)` writes
/// the f32 values of elements `i·chunk_len ..`, in parallel when `len · work_per_elem` is large.
///
/// Unlike [`f32_output`], the result is not zeroed as a whole beforehand: each chunk is
/// zeroed by the task that fills it, while it is cache-hot, so an output beyond the caches
/// crosses the memory bus once instead of three times (memset, read-for-ownership, write).
/// F16/BF16 chunks are computed in a chunk-sized f32 buffer and converted straight into the
/// result by the same task (no staged full-size f32 vector, no serial conversion pass).
/// Keep `chunk_len` cache-sized (a row).
pub fn f32_output_chunks(
    cpu: &CpuBackend,
    shape: &Shape,
    dtype: DType,
    chunk_len: usize,
    work_per_elem: usize,
    fill: impl Fn(usize, &mut [f32]) + Sync + Send,
) -> Result<Tensor> {
    let n = shape.elem_count();
    match dtype {
        DType::F32 => Tensor::from_vec(filled_chunks(cpu, n, chunk_len, work_per_elem, fill), shape.clone()),
        DType::F16 => {
            let fill_f16 = |i: usize, dst: &mut [f16]| fill_converted(i, dst, &fill, f16::from_f32);
            Tensor::from_vec(filled_chunks(cpu, n, chunk_len, work_per_elem, fill_f16), shape.clone())
        }
        DType::BF16 => {
            let fill_bf16 = |i: usize, dst: &mut [bf16]| fill_converted(i, dst, &fill, bf16::from_f32);
            Tensor::from_vec(filled_chunks(cpu, n, chunk_len, work_per_elem, fill_bf16), shape.clone())
        }
        other => Err(Error::dtype("f32_output_chunks", "output", "f32, f16 or bf16", other)),
    }
}

/// Chunk `i` of a half-precision output: filled in f32, then converted into `dst`.
fn fill_converted<T>(i: usize, dst: &mut [T], fill: &impl Fn(usize, &mut [f32]), convert: impl Fn(f32) -> T) {
    let mut values = vec![0.0f32; dst.len()];
    fill(i, &mut values);
    for (d, &v) in dst.iter_mut().zip(&values) {
        *d = convert(v);
    }
}

/// A vector of `n` elements built by `fill(i, chunk)` over its chunks of `chunk_len`, each
/// chunk set to `T::default()` just before its `fill` (never a whole-vector zeroing pass).
pub(crate) fn filled_chunks<T: Copy + Default + Send>(
    cpu: &CpuBackend,
    n: usize,
    chunk_len: usize,
    work_per_elem: usize,
    fill: impl Fn(usize, &mut [T]) + Sync + Send,
) -> Vec<T> {
    let mut values: Vec<T> = Vec::with_capacity(n);
    cpu.for_each_chunk(&mut values.spare_capacity_mut()[..n], chunk_len, work_per_elem, |i, chunk| {
        fill(i, init_default(chunk))
    });
    // SAFETY: `for_each_chunk` visits every chunk of the first `n` slots (or propagates a
    // task's panic before this line), and `init_default` wrote every element of each.
    unsafe { values.set_len(n) };
    values
}

/// `n` zeros written by the pool's threads in parallel: a buffer that a parallel kernel
/// then overwrites. (`vec![0.0; n]` is one serial memset whenever the allocator reuses a
/// block, leaving the other cores idle: ~5% of the attention backward at B4 H12 T256.)
pub(crate) fn zeroed_f32(cpu: &CpuBackend, n: usize) -> Vec<f32> {
    filled_chunks(cpu, n, 1 << 14, 1, |_, _: &mut [f32]| {})
}

/// Writes `T::default()` into every slot and returns the now initialised slice.
pub(crate) fn init_default<T: Copy + Default>(slots: &mut [MaybeUninit<T>]) -> &mut [T] {
    for slot in slots.iter_mut() {
        slot.write(T::default());
    }
    // SAFETY: every element was just written, and `MaybeUninit<T>` has the layout of `T`.
    unsafe { &mut *(slots as *mut [MaybeUninit<T>] as *mut [T]) }
}
