//! Reductions: sum, mean, max, var and sum_abs along an axis or over everything, argmax,
//! max_backward and sum_to_shape, as workgroup tree reductions (reduce_axis.wgsl; the
//! max gradient is routed by max_route.wgsl). F16/BF16 inputs are widened and accumulate
//! in f32; results come back in x's dtype (argmax: U32), as on the CPU. Arguments are
//! checked by the ops' specs (`fusebox::spec::reduce`); empty reductions, and
//! sum_to_shape's inputs the kernels do not take, run on the CPU.

use fusebox::cpu;
use fusebox::spec;
use fusebox::spec::reduce::{ReduceSpec, SumToShapeSpec};
use fusebox::{DType, Result, Shape, Tensor};

use crate::backend::WgpuBackend;
use crate::kernels;
use crate::ops::convert::word_aligned;
use crate::ops::{u, Un};

/// Elements of a fibre one lane reduces in one dispatch: longer fibres are cut into
/// blocks whose partial results another pass reduces (bounded shader loops).
const LANE_ITERS: usize = 64;

/// What `reduce_axis` accumulates (its `kind` codes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Sum = 0,
    SumAbs = 1,
    Max = 2,
    SqDev = 3,
    ArgMax = 4,
}

impl Kind {
    /// How the partial results of blocks combine.
    fn partial(self) -> Kind {
        match self {
            Kind::SumAbs | Kind::SqDev => Kind::Sum,
            k => k,
        }
    }
}

/// A reduction viewed as `[outer, n, inner]`, reducing n.
#[derive(Debug, Clone, Copy)]
struct Split {
    outer: usize,
    n: usize,
    inner: usize,
}

impl Split {
    fn outputs(self) -> usize {
        self.outer * self.inner
    }
}

/// The kernels' view of a validated reduction, when they take it: a non-empty
/// reduction with outputs, 32-bit indexable (the rest runs on the CPU).
fn native_split(x: &Tensor, spec: &ReduceSpec) -> Option<Split> {
    let s = Split { outer: spec.outer, n: spec.n, inner: spec.inner };
    (s.n > 0 && s.outputs() > 0 && u(x.elem_count()).is_ok()).then_some(s)
}

pub(crate) fn sum(be: &WgpuBackend, x: &Tensor, axis: Option<usize>) -> Result<Tensor> {
    match be.reduce_op("sum", x, &spec::reduce::sum(x, axis)?, Kind::Sum)? {
        Some(t) => Ok(t),
        None => fallback!(be, cpu::reduce::sum; [x], axis),
    }
}

pub(crate) fn sum_abs(be: &WgpuBackend, x: &Tensor, axis: Option<usize>) -> Result<Tensor> {
    match be.reduce_op("sum_abs", x, &spec::reduce::sum_abs(x, axis)?, Kind::SumAbs)? {
        Some(t) => Ok(t),
        None => fallback!(be, cpu::reduce::sum_abs; [x], axis),
    }
}

pub(crate) fn max(be: &WgpuBackend, x: &Tensor, axis: Option<usize>) -> Result<Tensor> {
    match be.reduce_op("max", x, &spec::reduce::max(x, axis)?, Kind::Max)? {
        Some(t) => Ok(t),
        None => fallback!(be, cpu::reduce::max; [x], axis),
    }
}

pub(crate) fn mean(be: &WgpuBackend, x: &Tensor, axis: Option<usize>) -> Result<Tensor> {
    const OP: &str = "mean";
    let spec = spec::reduce::mean(x, axis)?;
    let Some(s) = native_split(x, &spec) else {
        return fallback!(be, cpu::reduce::mean; [x], axis);
    };
    let x = be.widen(OP, x)?;
    let m = be.means(OP, &x, s)?;
    be.narrow(OP, m.reshape(spec.out_dims)?, spec.dtype)
}

pub(crate) fn var(be: &WgpuBackend, x: &Tensor, axis: Option<usize>) -> Result<Tensor> {
    const OP: &str = "var";
    let spec = spec::reduce::var(x, axis)?;
    let Some(s) = native_split(x, &spec) else {
        return fallback!(be, cpu::reduce::var; [x], axis);
    };
    // Two passes, as on the CPU: the means, then squared deviations from them.
    let x = be.widen(OP, x)?;
    let centres = be.means(OP, &x, s)?;
    let (sq, _) = be.reduce_f32(OP, &x, s, Kind::SqDev, Some(&centres), false)?;
    let v = be.ctx.unary(OP, &sq, Un::DivS, s.n as f32, 0.0)?;
    be.narrow(OP, v.reshape(spec.out_dims)?, spec.dtype)
}

pub(crate) fn argmax(be: &WgpuBackend, x: &Tensor, axis: usize) -> Result<Tensor> {
    const OP: &str = "argmax";
    let spec = spec::reduce::argmax(x, axis)?;
    let Some(s) = native_split(x, &spec) else {
        return fallback!(be, cpu::reduce::argmax; [x], axis);
    };
    let wide = be.widen(OP, x)?;
    let (_, idx) = be.reduce_f32(OP, &wide, s, Kind::ArgMax, None, s.inner > 1)?;
    idx.reshape(spec.out_dims)
}

pub(crate) fn max_backward(be: &WgpuBackend, x: &Tensor, d_out: &Tensor, axis: usize) -> Result<Tensor> {
    const OP: &str = "max_backward";
    let spec = spec::reduce::max_backward(x, d_out, axis)?;
    let Some(s) = native_split(x, &spec) else {
        return fallback!(be, cpu::reduce::max_backward; [x, d_out], axis);
    };
    let dtype = spec.dtype;
    let (wide, dy) = (be.widen(OP, x)?, be.widen(OP, d_out)?);
    let (_, arg) = be.reduce_f32(OP, &wide, s, Kind::ArgMax, None, s.inner > 1)?;
    let dx = be.ctx.zeros(OP, x.shape().clone(), DType::F32)?;
    let p = s.outputs();
    be.ctx.flat(OP, &kernels::MAX_ROUTE, &[&arg, &dy, &dx], &[u(p)?, u(s.n)?, u(s.inner)?], p)?;
    be.narrow(OP, dx, dtype)
}

pub(crate) fn sum_to_shape(be: &WgpuBackend, x: &Tensor, shape: &Shape) -> Result<Tensor> {
    const OP: &str = "sum_to_shape";
    let SumToShapeSpec { runs, dtype } = spec::reduce::sum_to_shape(x, shape)?;
    if x.elem_count() == 0 || u(x.elem_count()).is_err() || !word_aligned(&[x]) {
        return fallback!(be, cpu::reduce::sum_to_shape; [x], shape);
    }
    // Each summed run one reduction, as on the CPU.
    let mut cur = be.widen(OP, x)?;
    if !runs.iter().any(|r| r.1) {
        cur = be.ctx.copy_tensor(OP, &cur)?;
    }
    let mut sizes: Vec<usize> = runs.iter().map(|r| r.0).collect();
    for g in (0..runs.len()).rev().filter(|&g| runs[g].1) {
        let s = Split { outer: sizes[..g].iter().product(), n: sizes[g], inner: sizes[g + 1..].iter().product() };
        cur = be.reduce_f32(OP, &cur, s, Kind::Sum, None, false)?.0;
        sizes[g] = 1;
    }
    be.narrow(OP, cur.reshape(shape.clone())?, dtype)
}

impl WgpuBackend {
    /// Sum, sum_abs or max of `x` (validated as `spec`) in x's dtype; `None` when the
    /// kernels do not take it (see [`native_split`]).
    fn reduce_op(&self, op: &'static str, x: &Tensor, spec: &ReduceSpec, kind: Kind) -> Result<Option<Tensor>> {
        let Some(s) = native_split(x, spec) else {
            return Ok(None);
        };
        let wide = self.widen(op, x)?;
        let (values, _) = self.reduce_f32(op, &wide, s, kind, None, false)?;
        self.narrow(op, values.reshape(spec.out_dims.clone())?, spec.dtype).map(Some)
    }

    /// The means of the F32 device tensor `x` along split `s` (`[outputs]` F32).
    fn means(&self, op: &'static str, x: &Tensor, s: Split) -> Result<Tensor> {
        let (sums, _) = self.reduce_f32(op, x, s, Kind::Sum, None, false)?;
        self.ctx.unary(op, &sums, Un::DivS, s.n as f32, 0.0)
    }

    /// Runs `kind` over the F32 device tensor `x` along `s` (n ≥ 1, outputs ≥ 1): the
    /// `[outputs]` F32 results, and for ArgMax their `[outputs]` U32 indices (`strict`:
    /// −∞ is never an arg-max, as in the CPU's strided path; an all-NaN fibre gives 0).
    fn reduce_f32(
        &self,
        op: &'static str,
        x: &Tensor,
        s: Split,
        kind: Kind,
        centre: Option<&Tensor>,
        strict: bool,
    ) -> Result<(Tensor, Tensor)> {
        let (mut src, mut src_idx, mut s, mut k, mut centre) = (x.clone(), None::<Tensor>, s, kind, centre);
        loop {
            let p = s.outputs();
            // Short fibres share a workgroup (cols outputs of `lanes` lanes each).
            let lanes = (s.n.next_power_of_two() / 4).clamp(1, 256);
            let cols = 256 / lanes;
            let block = lanes * LANE_ITERS;
            let blocks = s.n.div_ceil(block);
            let values = self.ctx.empty(op, [blocks * p], DType::F32)?;
            let idx = self.ctx.empty(op, [if k == Kind::ArgMax { blocks * p } else { 1 }], DType::U32)?;
            u(blocks * p)?; // partial results are indexed in 32 bits
            let params = [
                u(s.outer)?,
                u(s.n)?,
                u(s.inner)?,
                k as u32,
                u(cols)?,
                u(block)?,
                u(blocks)?,
                src_idx.is_some() as u32,
                strict as u32,
                (blocks == 1) as u32,
            ];
            let args = [&src, centre.unwrap_or(&src), src_idx.as_ref().unwrap_or(&src), &values, &idx];
            self.ctx.dispatch(op, &kernels::REDUCE_AXIS, &args, &params, (p.div_ceil(cols) * blocks) as u64)?;
            if blocks == 1 {
                return Ok((values, idx));
            }
            // The partials are [blocks, p]: reduce them as [1, blocks, p].
            s = Split { outer: 1, n: blocks, inner: p };
            (src, k, centre) = (values, k.partial(), None);
            src_idx = (k == Kind::ArgMax).then_some(idx);
        }
    }
}
