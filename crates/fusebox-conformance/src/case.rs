//! Cases and the builders that make them. A family module describes an op once
//! (inputs, how to call the backend, its f64 twin) and the builders expand that into
//! a forward case per dtype plus generated bad-input cases; a gradient description
//! expands into a finite-difference check of the twin's backward, a comparison of the
//! backend's backward with the twin's, and bad-input cases for the backward.

use std::sync::Arc;

use fusebox::{ComputeBackend, DType, Op, Result as FbResult, Tensor};

use crate::array::Array;
use crate::rng::Rng;
use crate::tolerance::Tolerance;

/// What a case checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CaseKind {
    /// Backend forward against the f64 twin.
    Forward,
    /// Backend backward against the twin's backward.
    Backward,
    /// The twin's backward against central finite differences of the twin's forward.
    TwinGradient,
    /// A stated property (in-place semantics, a step worked out by hand, no NaN, ...).
    Property,
    /// Bad input must give an `Err`, never a panic or a wrong answer.
    BadInput,
}

/// The body of a case: `Ok(())` or a message that says what went wrong.
pub type CaseFn<B> = Arc<dyn Fn(&B) -> Result<(), String> + Send + Sync>;

/// One check against a backend. `name` holds the full configuration and is printed on failure.
pub struct Case<B: ?Sized> {
    /// The op this case checks (drives the coverage check).
    pub op: Op,
    /// What kind of check it is.
    pub kind: CaseKind,
    /// The full configuration, printed on failure.
    pub name: String,
    /// The check itself.
    pub run: CaseFn<B>,
}

impl<B: ?Sized> Clone for Case<B> {
    fn clone(&self) -> Self {
        Case { op: self.op, kind: self.kind, name: self.name.clone(), run: self.run.clone() }
    }
}

impl<B: ComputeBackend + ?Sized + 'static> Case<B> {
    /// A hand-written case.
    pub fn custom(
        op: Op,
        kind: CaseKind,
        name: impl Into<String>,
        run: impl Fn(&B) -> Result<(), String> + Send + Sync + 'static,
    ) -> Case<B> {
        Case { op, kind, name: name.into(), run: Arc::new(run) }
    }

    /// A bad-input case: `call` must return `Err` (and must not panic).
    pub fn expect_error(
        op: Op,
        name: impl Into<String>,
        call: impl Fn(&B) -> FbResult<()> + Send + Sync + 'static,
    ) -> Case<B> {
        let name = name.into();
        let label = name.clone();
        Case::custom(op, CaseKind::BadInput, name, move |b| match call(b) {
            Err(_) => Ok(()),
            Ok(()) => Err(format!("accepted bad input ({label}) instead of returning an error")),
        })
    }
}

/// A tensor input of a case, with what the generated bad-input cases may change.
#[derive(Debug, Clone)]
pub struct Input {
    /// The tensor passed to the op.
    pub tensor: Tensor,
    /// Growing this input's last dimension by one must be an error.
    pub shape_checked: bool,
    /// Giving this input the wrong kind of dtype (U32 for a float, F32 for ids) must be an error.
    pub dtype_checked: bool,
    /// Converted to the case's dtype in F16/BF16 variants (false for ids and f32-only inputs).
    pub follows_dtype: bool,
    /// Differentiated by gradient cases (false for ids, targets, saved statistics).
    pub differentiable: bool,
}

impl Input {
    /// A float input: shape and dtype checked, follows the case dtype, differentiable.
    pub fn new(tensor: Tensor) -> Input {
        let is_float = tensor.dtype().is_float();
        Input { tensor, shape_checked: true, dtype_checked: true, follows_dtype: is_float, differentiable: is_float }
    }
    /// Any shape is valid for this input on its own (single-input elementwise ops).
    pub fn shape_free(mut self) -> Input {
        self.shape_checked = false;
        self
    }
    /// Any dtype is valid for this input (layout ops).
    pub fn dtype_free(mut self) -> Input {
        self.dtype_checked = false;
        self
    }
    /// Stays F32 in F16/BF16 variants (saved statistics, rope tables).
    pub fn keep_f32(mut self) -> Input {
        self.follows_dtype = false;
        self
    }
    /// Not differentiated (ids, targets, saved statistics).
    pub fn constant(mut self) -> Input {
        self.differentiable = false;
        self
    }
}

impl From<Tensor> for Input {
    fn from(t: Tensor) -> Input {
        Input::new(t)
    }
}

type CallFn<B> = Arc<dyn Fn(&B, &[Tensor]) -> FbResult<Vec<Tensor>> + Send + Sync>;
type TwinFn = Arc<dyn Fn(&[Array]) -> Vec<Array> + Send + Sync>;

/// Describes an op once; [`OpCase::build`] expands it into cases.
pub struct OpCase<B: ?Sized> {
    op: Op,
    config: String,
    inputs: Vec<Input>,
    call: Option<CallFn<B>>,
    twin: Option<TwinFn>,
    tolerance: Option<Tolerance>,
    dtypes: Vec<DType>,
    generate_bad: bool,
}

fn cast_input(t: &Tensor, dtype: DType) -> Tensor {
    let v = t.to_vec_f32().expect("float input");
    Tensor::from_f32_as(&v, t.shape().clone(), dtype).expect("float dtype")
}

fn upload<B: ComputeBackend + ?Sized>(b: &B, inputs: &[Tensor]) -> Result<Vec<Tensor>, String> {
    inputs.iter().map(|t| b.upload(t).map_err(|e| format!("upload failed: {e}"))).collect()
}

fn download<B: ComputeBackend + ?Sized>(b: &B, outs: &[Tensor]) -> Result<Vec<Array>, String> {
    outs.iter()
        .map(|t| {
            let h = b.to_host(t).map_err(|e| format!("to_host failed: {e}"))?;
            if h.dtype().is_float() || h.dtype() == DType::U32 {
                Ok(Array::from_tensor(&h))
            } else {
                Err(format!("output has dtype {} which the suite cannot compare", h.dtype()))
            }
        })
        .collect()
}

/// Runs `f`, turning a panic into an error message.
pub fn catch<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).map_err(|p| {
        let msg = p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "non-string panic".into());
        format!("PANICKED: {msg}")
    })
}

/// Bad-input variants of `inputs`: for every checked input, its last dim grown by one,
/// and its dtype swapped between float and U32. Returns (description, inputs).
fn bad_variants(inputs: &[Input], seed: u64) -> Vec<(String, Vec<Tensor>)> {
    let mut rng = Rng::new(seed);
    let mut out = Vec::new();
    for (i, inp) in inputs.iter().enumerate() {
        let t = &inp.tensor;
        if inp.shape_checked && t.rank() >= 1 {
            let mut dims = t.dims().to_vec();
            *dims.last_mut().expect("rank ≥ 1") += t.dtype().block_elems();
            let shape = fusebox::Shape::new(dims);
            let bad = if t.dtype() == DType::U32 {
                Tensor::from_vec(vec![0u32; shape.elem_count()], shape.clone()).expect("shape")
            } else {
                rng.like(&shape, t.dtype())
            };
            let mut v: Vec<Tensor> = inputs.iter().map(|x| x.tensor.clone()).collect();
            v[i] = bad;
            out.push((format!("input {i} last dim grown to {shape}"), v));
        }
        if inp.dtype_checked {
            let bad = match t.dtype() {
                DType::U32 => rng.like(t.shape(), DType::F32),
                d if d.is_float() => rng.like(t.shape(), DType::U32),
                _ => continue,
            };
            let mut v: Vec<Tensor> = inputs.iter().map(|x| x.tensor.clone()).collect();
            let desc = format!("input {i} dtype {} instead of {}", bad.dtype(), t.dtype());
            v[i] = bad;
            out.push((desc, v));
        }
    }
    out
}

fn bad_cases<B: ComputeBackend + ?Sized + 'static>(
    op: Op,
    config: &str,
    inputs: &[Input],
    call: &CallFn<B>,
    seed: u64,
) -> Vec<Case<B>> {
    bad_variants(inputs, seed)
        .into_iter()
        .map(|(desc, tensors)| {
            let call = call.clone();
            Case::custom(op, CaseKind::BadInput, format!("{config} | bad: {desc}"), move |b: &B| {
                let up = upload(b, &tensors)?;
                match catch(|| call(b, &up))? {
                    Err(_) => Ok(()),
                    Ok(_) => Err("accepted the bad input instead of returning an error".into()),
                }
            })
        })
        .collect()
}

fn seed_of(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3))
}

impl<B: ComputeBackend + ?Sized + 'static> OpCase<B> {
    /// Starts the description of a case of `op`; `config` names sizes and parameters.
    pub fn new(op: Op, config: impl Into<String>) -> Self {
        OpCase {
            op,
            config: config.into(),
            inputs: Vec::new(),
            call: None,
            twin: None,
            tolerance: None,
            dtypes: vec![DType::F32],
            generate_bad: true,
        }
    }
    /// Adds a tensor input.
    pub fn input(mut self, input: impl Into<Input>) -> Self {
        self.inputs.push(input.into());
        self
    }
    /// How to call the backend: receives the inputs (uploaded), returns the outputs to compare.
    pub fn call(mut self, f: impl Fn(&B, &[Tensor]) -> FbResult<Vec<Tensor>> + Send + Sync + 'static) -> Self {
        self.call = Some(Arc::new(f));
        self
    }
    /// The f64 twin: receives the inputs as f64 arrays (after any dtype rounding),
    /// returns the expected outputs in the order `call` returns them.
    pub fn twin(mut self, f: impl Fn(&[Array]) -> Vec<Array> + Send + Sync + 'static) -> Self {
        self.twin = Some(Arc::new(f));
        self
    }
    /// Tolerance for F32 results (F16/BF16 variants use at least the dtype's default).
    pub fn tolerance(mut self, t: Tolerance) -> Self {
        self.tolerance = Some(t);
        self
    }
    /// The dtypes to run with (default F32 only); inputs that follow the dtype are
    /// rounded to it, and the twin sees the rounded values.
    pub fn dtypes(mut self, dtypes: &[DType]) -> Self {
        self.dtypes = dtypes.to_vec();
        self
    }
    /// Do not generate bad-input variants from this description (when another
    /// description of the same op already does, or none applies).
    pub fn no_bad_inputs(mut self) -> Self {
        self.generate_bad = false;
        self
    }

    /// The forward cases (one per dtype) and the generated bad-input cases.
    pub fn build(self) -> Vec<Case<B>> {
        let call = self.call.expect("OpCase::call is required");
        let twin = self.twin.expect("OpCase::twin is required");
        let mut cases = Vec::new();
        for &dtype in &self.dtypes {
            let tensors: Vec<Tensor> = self
                .inputs
                .iter()
                .map(|i| {
                    if i.follows_dtype && dtype != DType::F32 {
                        cast_input(&i.tensor, dtype)
                    } else {
                        i.tensor.clone()
                    }
                })
                .collect();
            let tol = match (self.tolerance, dtype) {
                (Some(t), DType::F32) => t,
                (Some(t), d) => t.max(Tolerance::for_dtype(d)),
                (None, d) => Tolerance::for_dtype(d),
            };
            let (call, twin) = (call.clone(), twin.clone());
            let name = format!("{} | {dtype}", self.config);
            cases.push(Case::custom(self.op, CaseKind::Forward, name, move |b: &B| {
                let up = upload(b, &tensors)?;
                let outs = catch(|| call(b, &up))?.map_err(|e| format!("returned an error: {e}"))?;
                let got = download(b, &outs)?;
                let arrays: Vec<Array> = tensors.iter().map(Array::from_tensor).collect();
                let want = twin(&arrays);
                if got.len() != want.len() {
                    return Err(format!("{} outputs, twin has {}", got.len(), want.len()));
                }
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    tol.check(&format!("output {i}"), g, w)?;
                }
                Ok(())
            }));
        }
        if self.generate_bad {
            cases.extend(bad_cases(self.op, &self.config, &self.inputs, &call, seed_of(&self.config)));
        }
        cases
    }
}

type GradTwinFn = Arc<dyn Fn(&[Array], &Array) -> Vec<Array> + Send + Sync>;
type ForwardTwinFn = Arc<dyn Fn(&[Array]) -> Array + Send + Sync>;
type BackwardCallFn<B> = Arc<dyn Fn(&B, &[Tensor], &Tensor) -> FbResult<Vec<Tensor>> + Send + Sync>;

/// Describes a backward once; [`GradCase::build`] checks the twin's backward by finite
/// differences, the backend's backward against the twin's, and bad inputs.
pub struct GradCase<B: ?Sized> {
    op: Op,
    config: String,
    inputs: Vec<Input>,
    forward: Option<ForwardTwinFn>,
    backward_twin: Option<GradTwinFn>,
    backward_call: Option<BackwardCallFn<B>>,
    tolerance: Tolerance,
    fd_tolerance: Tolerance,
    fd_step: f64,
}

impl<B: ComputeBackend + ?Sized + 'static> GradCase<B> {
    /// Starts the description of backward op `op` (e.g. `Op::RmsNormBackward`).
    pub fn new(op: Op, config: impl Into<String>) -> Self {
        GradCase {
            op,
            config: config.into(),
            inputs: Vec::new(),
            forward: None,
            backward_twin: None,
            backward_call: None,
            tolerance: Tolerance::F32,
            fd_tolerance: Tolerance::FINITE_DIFF,
            fd_step: 1e-6,
        }
    }
    /// Adds an input of the forward (mark ids and the like `.constant()`).
    pub fn input(mut self, input: impl Into<Input>) -> Self {
        self.inputs.push(input.into());
        self
    }
    /// The twin's forward, reduced to the one output being differentiated.
    pub fn forward(mut self, f: impl Fn(&[Array]) -> Array + Send + Sync + 'static) -> Self {
        self.forward = Some(Arc::new(f));
        self
    }
    /// The twin's backward: given inputs and the output gradient, the gradient of every
    /// differentiable input, in input order.
    pub fn backward_twin(mut self, f: impl Fn(&[Array], &Array) -> Vec<Array> + Send + Sync + 'static) -> Self {
        self.backward_twin = Some(Arc::new(f));
        self
    }
    /// How to call the backend's backward: inputs (uploaded) and the output gradient;
    /// returns the gradients of the differentiable inputs, in input order.
    pub fn backward_call(
        mut self,
        f: impl Fn(&B, &[Tensor], &Tensor) -> FbResult<Vec<Tensor>> + Send + Sync + 'static,
    ) -> Self {
        self.backward_call = Some(Arc::new(f));
        self
    }
    /// Tolerance of the backend's backward against the twin's (default F32).
    pub fn tolerance(mut self, t: Tolerance) -> Self {
        self.tolerance = t;
        self
    }
    /// Tolerance and step of the finite-difference check (defaults 1e-6 abs, 1e-5 rel, h = 1e-6).
    pub fn finite_difference(mut self, t: Tolerance, step: f64) -> Self {
        self.fd_tolerance = t;
        self.fd_step = step;
        self
    }

    /// The twin-vs-finite-differences case, the backend-vs-twin case and bad-input cases.
    pub fn build(self) -> Vec<Case<B>> {
        let forward = self.forward.expect("GradCase::forward is required");
        let twin = self.backward_twin.expect("GradCase::backward_twin is required");
        let call = self.backward_call.expect("GradCase::backward_call is required");
        let arrays: Vec<Array> = self.inputs.iter().map(|i| Array::from_tensor(&i.tensor)).collect();
        let out_shape = forward(&arrays).shape;
        let mut rng = Rng::new(seed_of(&self.config));
        let d_out = rng.tensor(out_shape.clone(), -1.0, 1.0);
        let d_out_arr = Array::from_tensor(&d_out);
        let diff: Vec<usize> = (0..self.inputs.len()).filter(|&i| self.inputs[i].differentiable).collect();
        let mut cases = Vec::new();

        // 1. Twin backward against central finite differences of the twin forward.
        {
            let (forward, twin, arrays, d_out_arr, diff) =
                (forward.clone(), twin.clone(), arrays.clone(), d_out_arr.clone(), diff.clone());
            let (h, tol) = (self.fd_step, self.fd_tolerance);
            cases.push(Case::custom(
                self.op,
                CaseKind::TwinGradient,
                format!("{} | twin vs finite differences", self.config),
                move |_b: &B| {
                    let grads = twin(&arrays, &d_out_arr);
                    if grads.len() != diff.len() {
                        return Err(format!(
                            "twin gave {} gradients for {} differentiable inputs",
                            grads.len(),
                            diff.len()
                        ));
                    }
                    for (g, &i) in grads.iter().zip(&diff) {
                        let mut numeric = Array::zeros(arrays[i].shape.clone());
                        for e in 0..arrays[i].len() {
                            let mut plus = arrays.clone();
                            let mut minus = arrays.clone();
                            let step = h * arrays[i].data[e].abs().max(1.0);
                            plus[i].data[e] += step;
                            minus[i].data[e] -= step;
                            numeric.data[e] =
                                (forward(&plus).dot(&d_out_arr) - forward(&minus).dot(&d_out_arr)) / (2.0 * step);
                        }
                        tol.check(&format!("d(input {i})"), g, &numeric)?;
                    }
                    Ok(())
                },
            ));
        }
        // 2. Backend backward against the twin's.
        {
            let tensors: Vec<Tensor> = self.inputs.iter().map(|i| i.tensor.clone()).collect();
            let (twin, call, d_out, tol) = (twin.clone(), call.clone(), d_out.clone(), self.tolerance);
            cases.push(Case::custom(
                self.op,
                CaseKind::Backward,
                format!("{} | backend vs twin", self.config),
                move |b: &B| {
                    let up = upload(b, &tensors)?;
                    let dy = b.upload(&d_out).map_err(|e| format!("upload failed: {e}"))?;
                    let outs = catch(|| call(b, &up, &dy))?.map_err(|e| format!("returned an error: {e}"))?;
                    let got = download(b, &outs)?;
                    let arrays: Vec<Array> = tensors.iter().map(Array::from_tensor).collect();
                    let want = twin(&arrays, &Array::from_tensor(&d_out));
                    if got.len() != want.len() {
                        return Err(format!("{} gradients, twin has {}", got.len(), want.len()));
                    }
                    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                        tol.check(&format!("gradient {i}"), g, w)?;
                    }
                    Ok(())
                },
            ));
        }
        // 3. Bad inputs for the backward: every input and the output gradient.
        let mut with_dout = self.inputs.clone();
        with_dout.push(Input::new(d_out));
        let n = self.inputs.len();
        let wrapped: CallFn<B> = Arc::new(move |b: &B, t: &[Tensor]| call(b, &t[..n], &t[n]));
        cases.extend(bad_cases(self.op, &self.config, &with_dout, &wrapped, seed_of(&self.config) ^ 1));
        cases
    }
}
