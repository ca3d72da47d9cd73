//! Greedy agreement of the fast Llama path with the plain-loop f64 reference
//! (`tests/reference_llama`) on SmolLM2: five prompts, 24 tokens each, compared token for
//! token up to the first step where the reference's top two logits lie within 0.3, and
//! the logits at the last prompt position.
//!
//! ```text
//! cargo run --release -p fusebox-models --example llama_agreement [-- MODEL.gguf [THREADS]]
//! ```

#[path = "../tests/reference_llama/mod.rs"]
mod reference_llama;

use std::time::Instant;

use fusebox::create_backend;
use fusebox_models::gguf::GgufFile;
use fusebox_models::open;
use reference_llama::{compare_greedy, RefLlama};

const PROMPTS: [&str; 5] = [
    "The capital of France is",
    "Once upon a time, there was a little girl who",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "The three primary colors are",
    "Water boils at a temperature of",
];
const NEW_TOKENS: usize = 24;
const TIE_MARGIN: f64 = 0.3;

fn main() -> fusebox::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let path = args.get(1).cloned().unwrap_or_else(|| "models/SmolLM2-135M-Instruct.Q4_1.gguf".into());
    let threads = args.get(2).cloned().unwrap_or_else(|| "2".into());
    let b = create_backend(&format!("cpu:{threads}"))?;
    let t = Instant::now();
    let fast = open::load(b.as_ref(), path.as_ref())?;
    println!("fast path: {} (loaded in {:.1} s)", fast.description, t.elapsed().as_secs_f64());
    let t = Instant::now();
    let reference = RefLlama::from_gguf(&GgufFile::open(&path)?);
    println!("reference: dequantized to f32 in {:.1} s", t.elapsed().as_secs_f64());
    let mut failures = 0;
    for prompt in PROMPTS {
        let ids = fast.tokenizer.encode(prompt, false);
        let mut session = fast.session(b.as_ref(), ids.len() + NEW_TOKENS + 1)?;
        let t = Instant::now();
        let a = compare_greedy(
            &reference,
            |ids| session.step(b.as_ref(), ids).expect("fast forward"),
            &ids,
            NEW_TOKENS,
            TIE_MARGIN,
        );
        let ok = a.mismatch_at.is_none();
        failures += usize::from(!ok);
        println!(
            "\n{} {prompt:?} ({} prompt tokens, {:.1} s)\n  agreed on {} of {} steps{}; last-prompt logits: max |Δ| {:.2e} (max |logit| {:.1}); \
             max |Δ| over compared steps {:.2e}",
            if ok { "OK  " } else { "FAIL" },
            a.prompt_tokens,
            t.elapsed().as_secs_f64(),
            a.compared - usize::from(a.mismatch_at.is_some()),
            NEW_TOKENS,
            match (a.mismatch_at, a.near_tie_at) {
                (Some(s), _) => format!(" (tokens differ at step {s})"),
                (None, Some(s)) => format!(" (stopped at step {s}: reference top-2 within {TIE_MARGIN})"),
                _ => String::new(),
            },
            a.prompt_logit_max_diff,
            a.prompt_logit_max_abs,
            a.max_logit_diff,
        );
        println!(
            "  identical tokens from the start: {} of {NEW_TOKENS} (max |Δ| logit over them {:.2e})",
            a.same_prefix, a.same_prefix_max_logit_diff
        );
        println!("  reference: {:?}", fast.tokenizer.decode(&a.reference_tokens)?);
        println!("  fast:      {:?}", fast.tokenizer.decode(&a.fast_tokens)?);
    }
    println!("\n{} of {} prompts agree", PROMPTS.len() - failures, PROMPTS.len());
    if failures > 0 {
        std::process::exit(1);
    }
    Ok(())
}
