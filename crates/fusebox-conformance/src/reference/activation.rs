//! f64 twins of the activations: the textbook formulas, elementwise.

use fusebox::GeluForm;

use crate::array::Array;

/// `σ(x) = 1/(1 + e^−x)`.
pub fn sigmoid_of(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// `erf(x)`, to about 1e-15: for |x| < 3 the all-positive series
/// `erf x = 2/√π·e^(−x²)·Σ_n 2ⁿx^(2n+1)/(1·3·…·(2n+1))`; beyond, `1 − erfc x` with
/// `erfc x = e^(−x²)/(√π·(x + (1/2)/(x + (2/2)/(x + (3/2)/(x + …)))))`, the continued
/// fraction evaluated from 200 levels down.
pub fn erf(x: f64) -> f64 {
    let z = x.abs();
    let value = if z < 3.0 {
        let mut term = z;
        let mut sum = z;
        let mut n = 0.0;
        while term > 1e-17 * sum {
            n += 1.0;
            term *= 2.0 * z * z / (2.0 * n + 1.0);
            sum += term;
        }
        2.0 / std::f64::consts::PI.sqrt() * (-z * z).exp() * sum
    } else {
        let mut fraction = z;
        for k in (1..=200).rev() {
            fraction = z + (k as f64 / 2.0) / fraction;
        }
        1.0 - (-z * z).exp() / (std::f64::consts::PI.sqrt() * fraction)
    };
    value.copysign(x)
}

/// `Φ(x) = ½(1 + erf(x/√2))`.
pub fn normal_cdf(x: f64) -> f64 {
    0.5 * (1.0 + erf(x / std::f64::consts::SQRT_2))
}

/// `silu(x) = x·σ(x)`.
pub fn silu(x: &Array) -> Array {
    x.map(|x| x * sigmoid_of(x))
}

/// `dx = dy·σ(x)·(1 + x·(1 − σ(x)))`.
pub fn silu_backward(x: &Array, dy: &Array) -> Array {
    x.zip(dy, |x, dy| {
        let s = sigmoid_of(x);
        dy * s * (1.0 + x * (1.0 - s))
    })
}

/// `u = √(2/π)·(x + 0.044715x³)`, the argument of the GELU tanh form.
fn gelu_u(x: f64) -> f64 {
    (2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)
}

/// GELU: `½x(1 + tanh u)` (tanh form) or `½x(1 + erf(x/√2))` (erf form).
pub fn gelu(x: &Array, form: GeluForm) -> Array {
    match form {
        GeluForm::Tanh => x.map(|x| 0.5 * x * (1.0 + gelu_u(x).tanh())),
        GeluForm::Erf => x.map(|x| x * normal_cdf(x)),
    }
}

/// `dx = dy·gelu'(x)`: tanh form `½(1 + tanh u) + ½x(1 − tanh²u)·u'`,
/// `u' = √(2/π)(1 + 3·0.044715x²)`; erf form `Φ(x) + x·e^(−x²/2)/√(2π)`.
pub fn gelu_backward(x: &Array, dy: &Array, form: GeluForm) -> Array {
    match form {
        GeluForm::Tanh => x.zip(dy, |x, dy| {
            let t = gelu_u(x).tanh();
            let du = (2.0 / std::f64::consts::PI).sqrt() * (1.0 + 3.0 * 0.044715 * x * x);
            dy * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * du)
        }),
        GeluForm::Erf => x.zip(dy, |x, dy| {
            let pdf = (-0.5 * x * x).exp() / (2.0 * std::f64::consts::PI).sqrt();
            dy * (normal_cdf(x) + x * pdf)
        }),
    }
}

/// `max(x, 0)`.
pub fn relu(x: &Array) -> Array {
    x.map(|x| if x > 0.0 { x } else { 0.0 })
}

/// `dx = dy·[x > 0]`.
pub fn relu_backward(x: &Array, dy: &Array) -> Array {
    x.zip(dy, |x, dy| if x > 0.0 { dy } else { 0.0 })
}

/// `σ(x)`.
pub fn sigmoid(x: &Array) -> Array {
    x.map(sigmoid_of)
}

/// `dx = dy·σ(x)·(1 − σ(x))`.
pub fn sigmoid_backward(x: &Array, dy: &Array) -> Array {
    x.zip(dy, |x, dy| dy * sigmoid_of(x) * (1.0 - sigmoid_of(x)))
}

/// `tanh(x)`.
pub fn tanh(x: &Array) -> Array {
    x.map(f64::tanh)
}

/// `dx = dy·(1 − tanh²(x))`.
pub fn tanh_backward(x: &Array, dy: &Array) -> Array {
    x.zip(dy, |x, dy| dy * (1.0 - x.tanh() * x.tanh()))
}

/// `silu(gate)·up`.
pub fn silu_mul(gate: &Array, up: &Array) -> Array {
    gate.zip(up, |g, u| g * sigmoid_of(g) * u)
}

/// `(d_gate, d_up) = (dy·up·silu'(gate), dy·silu(gate))`.
pub fn silu_mul_backward(gate: &Array, up: &Array, dy: &Array) -> (Array, Array) {
    let mut d_gate = Array::zeros(gate.shape.clone());
    let mut d_up = Array::zeros(gate.shape.clone());
    for i in 0..gate.len() {
        let (g, u, d) = (gate.data[i], up.data[i], dy.data[i]);
        let s = sigmoid_of(g);
        d_gate.data[i] = d * u * s * (1.0 + g * (1.0 - s));
        d_up.data[i] = d * g * s;
    }
    (d_gate, d_up)
}

/// gpt-oss's clamped SwiGLU: `(u' + 1)·g'·σ(α·g')`, `g' = min(g, limit)`,
/// `u' = clamp(u, −limit, limit)`.
pub fn clamped_swiglu(gate: &Array, up: &Array, alpha: f64, limit: f64) -> Array {
    gate.zip(up, |g, u| {
        let (g, u) = (g.min(limit), u.clamp(-limit, limit));
        (u + 1.0) * g * sigmoid_of(alpha * g)
    })
}

/// `(d_gate, d_up)` of [`clamped_swiglu`]: with `s = σ(α·g')`,
/// `d_gate = dy·(u' + 1)·(s + α·g'·s·(1 − s))` where `g ≤ limit` (else 0) and
/// `d_up = dy·g'·s` where `|u| ≤ limit` (else 0).
pub fn clamped_swiglu_backward(gate: &Array, up: &Array, dy: &Array, alpha: f64, limit: f64) -> (Array, Array) {
    let mut d_gate = Array::zeros(gate.shape.clone());
    let mut d_up = Array::zeros(gate.shape.clone());
    for i in 0..gate.len() {
        let (g, u, d) = (gate.data[i], up.data[i], dy.data[i]);
        let (gc, uc) = (g.min(limit), u.clamp(-limit, limit));
        let s = sigmoid_of(alpha * gc);
        if g <= limit {
            d_gate.data[i] = d * (uc + 1.0) * (s + alpha * gc * s * (1.0 - s));
        }
        if (-limit..=limit).contains(&u) {
            d_up.data[i] = d * gc * s;
        }
    }
    (d_gate, d_up)
}

/// `gelu(gate)·up` (GeGLU).
pub fn gelu_mul(gate: &Array, up: &Array, form: GeluForm) -> Array {
    gelu(gate, form).zip(up, |a, u| a * u)
}

/// `(d_gate, d_up) = (dy·up·gelu'(gate), dy·gelu(gate))`: the GELU backward of `dy·up`,
/// and `dy` times the GELU.
pub fn gelu_mul_backward(gate: &Array, up: &Array, dy: &Array, form: GeluForm) -> (Array, Array) {
    let d_gate = gelu_backward(gate, &dy.zip(up, |d, u| d * u), form);
    let d_up = gelu(gate, form).zip(dy, |a, d| a * d);
    (d_gate, d_up)
}

/// `max(x, ln(1 + exp(min(x, 88))))`, literally.
pub fn stable_softplus(x: &Array) -> Array {
    x.map(|x| x.max(x.min(88.0).exp().ln_1p()))
}

/// The Gated DeltaNet gates: `g = −e^{a_log[h]}·softplus(a + dt_bias[h])` (softplus as
/// `stable_softplus`), `β = σ(b)`, for a, b `[..., H]`. Returns (g, β).
pub fn gdn_gates(a: &Array, b: &Array, a_log: &Array, dt_bias: &Array) -> (Array, Array) {
    let h = a.last_dim();
    let mut g = Array::zeros(a.shape.clone());
    for (i, v) in g.data.iter_mut().enumerate() {
        let x = a.data[i] + dt_bias.data[i % h];
        *v = -a_log.data[i % h].exp() * x.max(x.min(88.0).exp().ln_1p());
    }
    (g, b.map(sigmoid_of))
}

/// Gradients of `gdn_gates` for upstream `dg`, `dβ`: with `x = a + dt_bias[h]`,
/// `da = −dg·e^{a_log[h]}·σ(x)` (softplus' = σ), `db = dβ·β(1 − β)`,
/// `da_log[h] = Σ dg·g` (∂g/∂a_log = g), `ddt_bias[h] = Σ da`. Returns (da, db, da_log, ddt_bias).
pub fn gdn_gates_backward(
    a: &Array,
    b: &Array,
    a_log: &Array,
    dt_bias: &Array,
    dg: &Array,
    dbeta: &Array,
) -> (Array, Array, Array, Array) {
    let h = a.last_dim();
    let (g, beta) = gdn_gates(a, b, a_log, dt_bias);
    let (mut da, mut da_log, mut ddt_bias) =
        (Array::zeros(a.shape.clone()), Array::zeros(vec![h]), Array::zeros(vec![h]));
    for i in 0..a.len() {
        let x = a.data[i] + dt_bias.data[i % h];
        da.data[i] = -dg.data[i] * a_log.data[i % h].exp() * sigmoid_of(x);
        ddt_bias.data[i % h] += da.data[i];
        da_log.data[i % h] += dg.data[i] * g.data[i];
    }
    let db = dbeta.zip(&beta, |d, s| d * s * (1.0 - s));
    (da, db, da_log, ddt_bias)
}
