//! Parameters, gradients and optimizer state in a few large allocations: a `ParamSet`
//! is one flat buffer partitioned into named, individually writable tensors.

use fusebox::{ComputeBackend, DType, Error, Result, Shape, Tensor};

/// How a parameter starts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Init {
    /// Normal with mean 0 and this standard deviation.
    Normal(f32),
    /// All ones (norm weights).
    Ones,
    /// All zeros (biases).
    Zeros,
}

/// Name, shape, initialisation and weight-decay flag of one parameter.
#[derive(Debug, Clone, PartialEq)]
pub struct ParamSpec {
    /// The parameter's name (as in checkpoints).
    pub name: String,
    /// Its shape.
    pub shape: Shape,
    /// How it starts.
    pub init: Init,
    /// Matrices decay; norms, biases (and embeddings of tiny models) do not.
    pub decay: bool,
}

/// Scalars in `specs` together; an error when the count overflows.
fn total_len(specs: &[ParamSpec]) -> Result<usize> {
    specs.iter().try_fold(0usize, |acc, s| acc.checked_add(s.shape.checked_elem_count()?)).ok_or_else(|| {
        Error::value("ParamSet", "parameter count", "fewer than usize::MAX scalars", format!("{} tensors", specs.len()))
    })
}

/// One flat allocation partitioned into the tensors of `specs`, in order.
#[derive(Debug)]
pub struct ParamSet {
    /// The parameters, views into one allocation.
    pub tensors: Vec<Tensor>,
}

impl ParamSet {
    /// Zero-filled tensors for `specs`, in one allocation on `backend`.
    pub fn zeros(backend: &dyn ComputeBackend, specs: &[ParamSpec]) -> Result<ParamSet> {
        let total = total_len(specs)?;
        let flat = backend.zeros(&Shape::new([total]), DType::F32)?;
        let shapes: Vec<Shape> = specs.iter().map(|s| s.shape.clone()).collect();
        Ok(ParamSet { tensors: flat.partition(&shapes)? })
    }

    /// Tensors initialised per `specs` from a seeded generator (Box–Muller normals).
    pub fn init(backend: &dyn ComputeBackend, specs: &[ParamSpec], seed: u64) -> Result<ParamSet> {
        let mut rng = crate::rng::Rng::new(seed);
        let total = total_len(specs)?;
        let mut values = Vec::new();
        values.try_reserve_exact(total).map_err(|_| {
            Error::value(
                "ParamSet::init",
                "parameter buffer",
                "memory for the parameters",
                format!("{total} f32 values refused by the allocator"),
            )
        })?;
        for s in specs {
            let n = s.shape.elem_count();
            match s.init {
                Init::Zeros => values.extend(std::iter::repeat_n(0.0, n)),
                Init::Ones => values.extend(std::iter::repeat_n(1.0, n)),
                Init::Normal(std) => values.extend((0..n).map(|_| rng.normal() * std)),
            }
        }
        Self::from_values(backend, specs, values)
    }

    /// Tensors holding `values` (all parameters concatenated in spec order).
    pub fn from_values(backend: &dyn ComputeBackend, specs: &[ParamSpec], values: Vec<f32>) -> Result<ParamSet> {
        let total: usize = specs.iter().map(|s| s.shape.elem_count()).sum();
        if values.len() != total {
            return Err(Error::shape(
                "ParamSet",
                "values",
                format!("{total} floats"),
                format!("{} floats", values.len()),
            ));
        }
        let flat = backend.upload(&Tensor::from_vec(values, [total])?)?;
        let shapes: Vec<Shape> = specs.iter().map(|s| s.shape.clone()).collect();
        Ok(ParamSet { tensors: flat.partition(&shapes)? })
    }

    /// All values concatenated in spec order (for checkpoints).
    pub fn to_values(&self, backend: &dyn ComputeBackend) -> Result<Vec<f32>> {
        let mut out = Vec::new();
        for t in &self.tensors {
            out.extend(backend.to_host(t)?.to_vec::<f32>()?);
        }
        Ok(out)
    }

    /// Tensor `i` and, when given, tensor `j` (≠ `i`), both mutable: a weight's and its
    /// bias's gradient for one accumulating call.
    pub fn pair_mut(&mut self, i: usize, j: Option<usize>) -> Result<(&mut Tensor, Option<&mut Tensor>)> {
        let n = self.tensors.len();
        if i >= n || j.is_some_and(|j| j >= n || j == i) {
            return Err(Error::value(
                "ParamSet::pair_mut",
                "indices",
                format!("two distinct indices < {n}"),
                format!("{i}, {j:?}"),
            ));
        }
        let (mut first, mut second) = (None, None);
        for (k, t) in self.tensors.iter_mut().enumerate() {
            if k == i {
                first = Some(t);
            } else if Some(k) == j {
                second = Some(t);
            }
        }
        Ok((first.expect("i < len was checked"), second))
    }

    /// Sets every value to zero in place (no reallocation).
    pub fn fill_zero(&mut self, backend: &dyn ComputeBackend) -> Result<()> {
        self.tensors.iter_mut().try_for_each(|t| backend.fill(t, 0.0))
    }

    /// Number of scalars.
    pub fn len(&self) -> usize {
        self.tensors.iter().map(Tensor::elem_count).sum()
    }

    /// Whether the set holds no parameters.
    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }
}
