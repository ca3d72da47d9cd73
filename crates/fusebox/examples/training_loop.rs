//! A training loop written against the `ComputeBackend` trait alone: a 2-layer MLP
//! (2 → 64 → 4, GELU) learns which quadrant of the plane a point lies in. Each step runs
//! the forward (`linear_forward`, `gelu`), the fused loss and its gradient
//! (`cross_entropy`), the backward (`linear_backward`, `gelu_backward`), global-norm
//! clipping (`global_norm`, `clip_scale`) and AdamW in place (`adamw_update`).
//!
//! ```text
//! cargo run --release -p fusebox --example training_loop
//! ```
//!
//! The loop is generic over the backend (`train<B: ComputeBackend + ?Sized>`), so any
//! backend runs it unchanged. Exits non-zero unless the loss falls to a tenth of its
//! first value and held-out accuracy reaches 95%.

use fusebox::{AdamWConfig, ComputeBackend, CpuBackend, DType, Error, GeluForm, Result, Tensor};

const INPUTS: usize = 2;
const HIDDEN: usize = 64;
const CLASSES: usize = 4;
const BATCH: usize = 128;
const STEPS: usize = 300;

/// The MLP's parameters with their AdamW moments (`m`, `v`), all F32.
struct Param {
    value: Tensor,
    m: Tensor,
    v: Tensor,
}

impl Param {
    fn new(b: &(impl ComputeBackend + ?Sized), value: Tensor) -> Result<Param> {
        let m = b.zeros(value.shape(), DType::F32)?;
        let v = b.zeros(value.shape(), DType::F32)?;
        Ok(Param { value: b.upload(&value)?, m, v })
    }
}

fn main() -> Result<()> {
    let cpu = CpuBackend::new()?;
    let (first, last, accuracy) = train(&cpu)?;
    println!("loss {first:.4} -> {last:.4}; held-out accuracy {:.1}%", accuracy * 100.0);
    if last > first / 10.0 || accuracy < 0.95 {
        eprintln!("training did not converge (want loss ≤ {:.4} and accuracy ≥ 95%)", first / 10.0);
        std::process::exit(1);
    }
    println!("converged");
    Ok(())
}

/// Trains the MLP; returns the first and last training loss and the held-out accuracy.
fn train<B: ComputeBackend + ?Sized>(b: &B) -> Result<(f32, f32, f32)> {
    let mut rng = Lcg(7);
    // Weights `[out, in]` (as `linear_forward` takes them), scaled by 1/√fan_in.
    let mut w1 = Param::new(b, rng.tensor(&[HIDDEN, INPUTS], 1.0 / (INPUTS as f32).sqrt())?)?;
    let mut b1 = Param::new(b, Tensor::zeros([HIDDEN], DType::F32)?)?;
    let mut w2 = Param::new(b, rng.tensor(&[CLASSES, HIDDEN], 1.0 / (HIDDEN as f32).sqrt())?)?;
    let mut b2 = Param::new(b, Tensor::zeros([CLASSES], DType::F32)?)?;
    let adamw = AdamWConfig { lr: 1e-2, weight_decay: 1e-4, ..AdamWConfig::default() };
    let max_norm = 1.0;

    let (mut first, mut last) = (None, 0.0);
    for step in 1..=STEPS {
        let (x, targets) = rng.batch(b, BATCH)?;

        // Forward: logits = W2·gelu(W1·x + b1) + b2.
        let h = b.linear_forward(&x, &w1.value, Some(&b1.value))?;
        let a = b.gelu(&h, GeluForm::Tanh)?;
        let logits = b.linear_forward(&a, &w2.value, Some(&b2.value))?;
        // The fused loss returns d(mean loss)/d(logits) too.
        let ce = b.cross_entropy(&logits, &targets, None)?;
        let loss = b.to_host(&ce.loss)?.to_vec_f32()?[0];
        first.get_or_insert(loss);
        last = loss;

        // Backward, layer by layer.
        let g2 = b.linear_backward(&a, &w2.value, &ce.d_logits, true)?;
        let dh = b.gelu_backward(&h, &g2.dx, GeluForm::Tanh)?;
        let g1 = b.linear_backward(&x, &w1.value, &dh, true)?;
        let missing = || Error::value("training_loop", "bias gradient", "present (with_bias = true)", "none");
        let grads = [g1.dweight, g1.dbias.ok_or_else(missing)?, g2.dweight, g2.dbias.ok_or_else(missing)?];

        // Clip to a global norm of `max_norm` inside the AdamW step (no extra pass).
        let norm = b.global_norm(&grads)?;
        let config = AdamWConfig { grad_scale: b.clip_scale(norm, max_norm)?, ..adamw };
        for (p, g) in [&mut w1, &mut b1, &mut w2, &mut b2].into_iter().zip(&grads) {
            b.adamw_update(&mut p.value, g, &mut p.m, &mut p.v, &config, step as u64)?;
        }
        if step == 1 || step % 50 == 0 {
            println!("step {step:4}: loss {loss:.4}, gradient norm {norm:.3}");
        }
    }

    // Held-out accuracy: argmax of the logits on fresh points.
    let (x, targets) = rng.batch(b, 1000)?;
    let h = b.gelu(&b.linear_forward(&x, &w1.value, Some(&b1.value))?, GeluForm::Tanh)?;
    let logits = b.linear_forward(&h, &w2.value, Some(&b2.value))?;
    let predicted = b.to_host(&b.argmax(&logits, 1)?)?.to_vec::<u32>()?;
    let truth = b.to_host(&targets)?.to_vec::<u32>()?;
    let correct = predicted.iter().zip(&truth).filter(|(p, t)| p == t).count();
    Ok((first.unwrap_or(last), last, correct as f32 / truth.len() as f32))
}

/// A small deterministic generator (64-bit LCG).
struct Lcg(u64);

impl Lcg {
    /// Uniform in [-1, 1).
    fn next(&mut self) -> f32 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    fn tensor(&mut self, shape: &[usize], scale: f32) -> Result<Tensor> {
        let n = shape.iter().product();
        Tensor::from_vec((0..n).map(|_| self.next() * scale).collect::<Vec<f32>>(), shape)
    }

    /// `n` points of the square `[-1, 1)²` (`[n, 2]` F32) and their quadrant (`[n]` U32:
    /// 0 for x ≥ 0, y ≥ 0; 1 for x < 0, y ≥ 0; 2 for x < 0, y < 0; 3 for x ≥ 0, y < 0).
    fn batch<B: ComputeBackend + ?Sized>(&mut self, b: &B, n: usize) -> Result<(Tensor, Tensor)> {
        let points: Vec<f32> = (0..n * INPUTS).map(|_| self.next()).collect();
        let labels: Vec<u32> = points
            .chunks(INPUTS)
            .map(|p| match (p[0] >= 0.0, p[1] >= 0.0) {
                (true, true) => 0,
                (false, true) => 1,
                (false, false) => 2,
                (true, false) => 3,
            })
            .collect();
        Ok((b.upload(&Tensor::from_vec(points, [n, INPUTS])?)?, b.upload(&Tensor::from_vec(labels, [n])?)?))
    }
}
