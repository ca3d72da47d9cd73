//! Binary, broadcast, scalar, in-place assign and ternary elementwise ops.

use fusebox::cpu;
use fusebox::spec::elementwise as spec;
use fusebox::{in_place_on_cpu, ComputeBackend, DType, Result, Tensor};

use crate::backend::WgpuBackend;
use crate::kernels;
use crate::ops::convert::word_aligned;
use crate::ops::{u, Bin, Un};

pub(crate) fn add(be: &WgpuBackend, a: &Tensor, b: &Tensor) -> Result<Tensor> {
    match be.binary_op("add", ("a", a), ("b", b), Bin::Add, 0.0)? {
        Some(t) => Ok(t),
        None => fallback!(be, cpu::elementwise::add; [a, b]),
    }
}

pub(crate) fn sub(be: &WgpuBackend, a: &Tensor, b: &Tensor) -> Result<Tensor> {
    match be.binary_op("sub", ("a", a), ("b", b), Bin::Sub, 0.0)? {
        Some(t) => Ok(t),
        None => fallback!(be, cpu::elementwise::sub; [a, b]),
    }
}

pub(crate) fn mul(be: &WgpuBackend, a: &Tensor, b: &Tensor) -> Result<Tensor> {
    match be.binary_op("mul", ("a", a), ("b", b), Bin::Mul, 0.0)? {
        Some(t) => Ok(t),
        None => fallback!(be, cpu::elementwise::mul; [a, b]),
    }
}

pub(crate) fn div(be: &WgpuBackend, a: &Tensor, b: &Tensor) -> Result<Tensor> {
    match be.binary_op("div", ("a", a), ("b", b), Bin::Div, 0.0)? {
        Some(t) => Ok(t),
        None => fallback!(be, cpu::elementwise::div; [a, b]),
    }
}

pub(crate) fn add_scalar(be: &WgpuBackend, a: &Tensor, s: f32) -> Result<Tensor> {
    match be.unary_op("add_scalar", a, Un::AddS, s, 0.0)? {
        Some(t) => Ok(t),
        None => fallback!(be, cpu::elementwise::add_scalar; [a], s),
    }
}

pub(crate) fn sub_scalar(be: &WgpuBackend, a: &Tensor, s: f32) -> Result<Tensor> {
    match be.unary_op("sub_scalar", a, Un::SubS, s, 0.0)? {
        Some(t) => Ok(t),
        None => fallback!(be, cpu::elementwise::sub_scalar; [a], s),
    }
}

pub(crate) fn mul_scalar(be: &WgpuBackend, a: &Tensor, s: f32) -> Result<Tensor> {
    match be.unary_op("mul_scalar", a, Un::MulS, s, 0.0)? {
        Some(t) => Ok(t),
        None => fallback!(be, cpu::elementwise::mul_scalar; [a], s),
    }
}

pub(crate) fn div_scalar(be: &WgpuBackend, a: &Tensor, s: f32) -> Result<Tensor> {
    match be.unary_op("div_scalar", a, Un::DivS, s, 0.0)? {
        Some(t) => Ok(t),
        None => fallback!(be, cpu::elementwise::div_scalar; [a], s),
    }
}

pub(crate) fn add_assign(be: &WgpuBackend, a: &mut Tensor, b: &Tensor) -> Result<()> {
    if be.assign_op("add_assign", a, b, Bin::Add)? {
        return Ok(());
    }
    let b = be.to_host(b)?;
    in_place_on_cpu(be, a, |cpu, a| cpu::elementwise::add_assign(cpu, a, &b))
}

pub(crate) fn sub_assign(be: &WgpuBackend, a: &mut Tensor, b: &Tensor) -> Result<()> {
    if be.assign_op("sub_assign", a, b, Bin::Sub)? {
        return Ok(());
    }
    let b = be.to_host(b)?;
    in_place_on_cpu(be, a, |cpu, a| cpu::elementwise::sub_assign(cpu, a, &b))
}

pub(crate) fn mul_assign(be: &WgpuBackend, a: &mut Tensor, b: &Tensor) -> Result<()> {
    if be.assign_op("mul_assign", a, b, Bin::Mul)? {
        return Ok(());
    }
    let b = be.to_host(b)?;
    in_place_on_cpu(be, a, |cpu, a| cpu::elementwise::mul_assign(cpu, a, &b))
}

pub(crate) fn div_assign(be: &WgpuBackend, a: &mut Tensor, b: &Tensor) -> Result<()> {
    if be.assign_op("div_assign", a, b, Bin::Div)? {
        return Ok(());
    }
    let b = be.to_host(b)?;
    in_place_on_cpu(be, a, |cpu, a| cpu::elementwise::div_assign(cpu, a, &b))
}

pub(crate) fn add_row(be: &WgpuBackend, x: &Tensor, row: &Tensor) -> Result<Tensor> {
    match be.broadcast_op("add_row", x, row, Bin::Add, false)? {
        Some(t) => Ok(t),
        None => fallback!(be, cpu::elementwise::add_row; [x, row]),
    }
}

pub(crate) fn sub_row(be: &WgpuBackend, x: &Tensor, row: &Tensor) -> Result<Tensor> {
    match be.broadcast_op("sub_row", x, row, Bin::Sub, false)? {
        Some(t) => Ok(t),
        None => fallback!(be, cpu::elementwise::sub_row; [x, row]),
    }
}

pub(crate) fn mul_row(be: &WgpuBackend, x: &Tensor, row: &Tensor) -> Result<Tensor> {
    match be.broadcast_op("mul_row", x, row, Bin::Mul, false)? {
        Some(t) => Ok(t),
        None => fallback!(be, cpu::elementwise::mul_row; [x, row]),
    }
}

pub(crate) fn div_row(be: &WgpuBackend, x: &Tensor, row: &Tensor) -> Result<Tensor> {
    match be.broadcast_op("div_row", x, row, Bin::Div, false)? {
        Some(t) => Ok(t),
        None => fallback!(be, cpu::elementwise::div_row; [x, row]),
    }
}

pub(crate) fn add_col(be: &WgpuBackend, x: &Tensor, col: &Tensor) -> Result<Tensor> {
    match be.broadcast_op("add_col", x, col, Bin::Add, true)? {
        Some(t) => Ok(t),
        None => fallback!(be, cpu::elementwise::add_col; [x, col]),
    }
}

pub(crate) fn sub_col(be: &WgpuBackend, x: &Tensor, col: &Tensor) -> Result<Tensor> {
    match be.broadcast_op("sub_col", x, col, Bin::Sub, true)? {
        Some(t) => Ok(t),
        None => fallback!(be, cpu::elementwise::sub_col; [x, col]),
    }
}

pub(crate) fn mul_col(be: &WgpuBackend, x: &Tensor, col: &Tensor) -> Result<Tensor> {
    match be.broadcast_op("mul_col", x, col, Bin::Mul, true)? {
        Some(t) => Ok(t),
        None => fallback!(be, cpu::elementwise::mul_col; [x, col]),
    }
}

pub(crate) fn div_col(be: &WgpuBackend, x: &Tensor, col: &Tensor) -> Result<Tensor> {
    match be.broadcast_op("div_col", x, col, Bin::Div, true)? {
        Some(t) => Ok(t),
        None => fallback!(be, cpu::elementwise::div_col; [x, col]),
    }
}

pub(crate) fn add3(be: &WgpuBackend, a: &Tensor, b: &Tensor, c: &Tensor) -> Result<Tensor> {
    match be.ternary_op("add3", a, b, c, 0)? {
        Some(t) => Ok(t),
        None => fallback!(be, cpu::elementwise::add3; [a, b, c]),
    }
}

pub(crate) fn exp_mul(be: &WgpuBackend, x: &Tensor, y: &Tensor) -> Result<Tensor> {
    match be.binary_op("exp_mul", ("a", x), ("b", y), Bin::ExpMul, 0.0)? {
        Some(t) => Ok(t),
        None => fallback!(be, cpu::elementwise::exp_mul; [x, y]),
    }
}

pub(crate) fn sub_mul(be: &WgpuBackend, a: &Tensor, b: &Tensor, c: &Tensor) -> Result<Tensor> {
    match be.ternary_op("sub_mul", a, b, c, 1)? {
        Some(t) => Ok(t),
        None => fallback!(be, cpu::elementwise::sub_mul; [a, b, c]),
    }
}

pub(crate) fn add_scaled(be: &WgpuBackend, a: &Tensor, b: &Tensor, c: f32) -> Result<Tensor> {
    match be.binary_op("add_scaled", ("a", a), ("b", b), Bin::AddScaled, c)? {
        Some(t) => Ok(t),
        None => fallback!(be, cpu::elementwise::add_scaled; [a, b], c),
    }
}

impl WgpuBackend {
    /// `binop(a, b)` of a call [`spec::same`] accepts (each operand named as the CPU
    /// kernel names it); `None` when the kernel cannot bind the operands.
    pub(crate) fn binary_op(
        &self,
        op: &'static str,
        (an, a): (&str, &Tensor),
        (bn, b): (&str, &Tensor),
        code: Bin,
        c: f32,
    ) -> Result<Option<Tensor>> {
        let dt = spec::same(op, &[(an, a), (bn, b)])?.dtype;
        if !word_aligned(&[a, b]) {
            return Ok(None);
        }
        let (a, b) = (self.widen(op, a)?, self.widen(op, b)?);
        let y = self.ctx.binary(op, &a, &b, code, c)?;
        self.narrow(op, y, dt).map(Some)
    }

    /// Row (`col` false) or column broadcast of a binary op.
    pub(crate) fn broadcast_op(
        &self,
        op: &'static str,
        x: &Tensor,
        v: &Tensor,
        code: Bin,
        col: bool,
    ) -> Result<Option<Tensor>> {
        let s = if col { spec::col_broadcast(op, x, v)? } else { spec::row_broadcast(op, x, v)? };
        let (n, dt) = (s.n, s.dtype);
        if n == 0 || !word_aligned(&[x, v]) {
            return Ok(None);
        }
        let (x, v) = (self.widen(op, x)?, self.widen(op, v)?);
        let out = self.ctx.empty(op, x.shape().clone(), DType::F32)?;
        let k = if col { &kernels::COL } else { &kernels::ROW };
        let total = x.elem_count();
        self.ctx.flat(op, k, &[&x, &v, &out], &[code as u32, u(total)?, u(n)?], total)?;
        self.narrow(op, out, dt).map(Some)
    }

    /// `a ← binop(a, b)` on the device (a 16-bit `a` through an f32 copy); false when the
    /// kernel does not take these operands.
    pub(crate) fn assign_op(&self, op: &'static str, a: &mut Tensor, b: &Tensor, code: Bin) -> Result<bool> {
        if a.is_host() {
            return Ok(false);
        }
        a.ensure_writable(op)?;
        spec::same(op, &[("a", &*a), ("b", b)])?;
        if !word_aligned(&[a, b]) {
            return Ok(false);
        }
        let b = self.widen(op, b)?;
        let n = a.elem_count();
        self.update_widened(op, &[&*a], |a| {
            self.ctx.flat(op, &kernels::BINARY_INPLACE, &[&a[0], &b], &[code as u32, u(n)?], n)
        })?;
        Ok(true)
    }

    pub(crate) fn ternary_op(
        &self,
        op: &'static str,
        a: &Tensor,
        b: &Tensor,
        c: &Tensor,
        code: u32,
    ) -> Result<Option<Tensor>> {
        let dt = spec::same(op, &[("a", a), ("b", b), ("c", c)])?.dtype;
        if !word_aligned(&[a, b, c]) {
            return Ok(None);
        }
        let (a, b, c) = (self.widen(op, a)?, self.widen(op, b)?, self.widen(op, c)?);
        let out = self.ctx.empty(op, a.shape().clone(), DType::F32)?;
        let n = a.elem_count();
        self.ctx.flat(op, &kernels::TERNARY, &[&a, &b, &c, &out], &[code, u(n)?], n)?;
        self.narrow(op, out, dt).map(Some)
    }
}
