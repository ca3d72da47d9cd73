//! F16/BF16 storage for in-place ops: the f32 kernels update an F32 copy of each 16-bit
//! tensor, which is then narrowed back into the tensor's own storage (one rounding per
//! element, as the CPU backend rounds an f32 update once on the way back).

use fusebox::{DType, Result, Tensor};

use crate::backend::WgpuBackend;

impl WgpuBackend {
    /// Runs `f` on F32 versions of the device tensors `ts` (each F32, or F16/BF16 at a
    /// word-aligned offset, as `common_float` accepts): an F32 tensor is passed as it is,
    /// a 16-bit one as a widened copy that is narrowed back into it once `f` has run.
    /// The caller checks that the tensors are writable.
    pub(crate) fn update_widened<R>(
        &self,
        op: &'static str,
        ts: &[&Tensor],
        f: impl FnOnce(&[Tensor]) -> Result<R>,
    ) -> Result<R> {
        let wide = ts.iter().map(|t| self.widen(op, t)).collect::<Result<Vec<_>>>()?;
        let r = f(&wide)?;
        for (t, w) in ts.iter().zip(&wide) {
            if t.dtype() != DType::F32 {
                self.narrow_into(op, w, t)?;
            }
        }
        Ok(r)
    }
}
