//! Agreement of the integer decode path (activations rounded to 8 bits for integer dot
//! products with the quantized weights, `exact_decode(false)`) with the f32-activation
//! path (`CpuBackend`'s default, which agrees with the plain-loop f64 reference within
//! 1e-3 logits on SmolLM2: `tests/smollm2.rs`), on twelve prompts: greedy tokens compared
//! up to the first step where the reference's top-2 logit gap is below 0.5, and the
//! largest |Δlogit| over the compared steps.
//!
//! ```text
//! cargo run --release -p fusebox-models --example decode_agreement -- MODEL.gguf [THREADS] [TOKENS]
//! ```

use fusebox::{CpuBackend, Result};
use fusebox_models::{open, pretrained};

const PROMPTS: [&str; 12] = [
    "The capital of France is",
    "Once upon a time, there was a little girl who",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "The three primary colors are",
    "Water boils at a temperature of",
    "The largest planet in the solar system is",
    "To make a cup of tea, first",
    "In 1969, the first humans landed on",
    "The quick brown fox",
    "Photosynthesis is the process by which",
    "A haiku about the sea:\n",
    "Q: What is 12 times 12?\nA:",
];
const TIE_MARGIN: f32 = 0.5;

fn argmax(v: &[f32]) -> u32 {
    v.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).map_or(0, |(i, _)| i as u32)
}

fn top2_gap(v: &[f32]) -> f32 {
    let (mut a, mut b) = (f32::NEG_INFINITY, f32::NEG_INFINITY);
    for &x in v {
        if x > a {
            b = a;
            a = x;
        } else if x > b {
            b = x;
        }
    }
    a - b
}

/// Greedy logits of `n` steps after `prompt` (each step fed the previous argmax).
fn greedy(b: &CpuBackend, model: &pretrained::Pretrained, prompt: &[u32], n: usize) -> Result<Vec<Vec<f32>>> {
    let mut session = model.session(b, prompt.len() + n + 1)?;
    let mut logits = session.step(b, prompt)?;
    let mut all = Vec::with_capacity(n);
    for _ in 0..n {
        let next = argmax(&logits);
        all.push(std::mem::take(&mut logits));
        logits = session.step(b, &[next])?;
    }
    Ok(all)
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let path = args.get(1).cloned().unwrap_or_else(|| "models/SmolLM2-135M-Instruct.Q4_1.gguf".into());
    let threads: usize = args.get(2).and_then(|t| t.parse().ok()).unwrap_or(2);
    let tokens: usize = args.get(3).and_then(|t| t.parse().ok()).unwrap_or(32);
    let exact = CpuBackend::builder().threads(threads).exact_decode(true).build()?;
    let int = CpuBackend::builder().threads(threads).exact_decode(false).build()?;
    let reference_model = open::load(&exact, path.as_ref())?;
    let model = open::load(&int, path.as_ref())?;
    println!("{}: {} (integer path vs f32-activation path, top-2 margin {TIE_MARGIN})", path, model.description);
    let (mut agreeing, mut steps, mut worst, mut worst_first) = (0, 0, 0.0f32, 0.0f32);
    for prompt in PROMPTS {
        let ids = model.tokenizer.encode(prompt, false);
        let reference = greedy(&exact, &reference_model, &ids, tokens)?;
        // The integer path fed the reference's tokens, so each step sees the same context.
        let mut session = model.session(&int, ids.len() + tokens + 1)?;
        let mut logits = session.step(&int, &ids)?;
        let (mut compared, mut mismatch, mut max_diff) = (0, None, 0.0f32);
        let first_diff = diff(&reference[0], &logits);
        for (s, r) in reference.iter().enumerate() {
            if top2_gap(r) < TIE_MARGIN {
                break;
            }
            max_diff = max_diff.max(diff(r, &logits));
            compared += 1;
            if argmax(&logits) != argmax(r) {
                mismatch = Some(s);
                break;
            }
            if s + 1 < reference.len() {
                logits = session.step(&int, &[argmax(r)])?;
            }
        }
        agreeing += usize::from(mismatch.is_none());
        steps += compared;
        worst = worst.max(max_diff);
        worst_first = worst_first.max(first_diff);
        println!(
            "{} {prompt:?}: {compared} steps compared{}, max |Δlogit| {max_diff:.3} (first step {first_diff:.3})",
            if mismatch.is_none() { "agree" } else { "DIFFER" },
            mismatch.map_or(String::new(), |s| format!(", tokens differ at step {s}"))
        );
    }
    println!(
        "\n{agreeing} of {} prompts agree token for token over {steps} steps before a top-2 gap < {TIE_MARGIN}; \
         max |Δlogit| {worst:.3} (at the last prompt position {worst_first:.3})",
        PROMPTS.len()
    );
    Ok(())
}

/// Largest |a − b| over the vocabulary.
fn diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}
