//! 16-bit KV caches on the real models: greedy decoding with F16 (and BF16) caches
//! against the F32 cache, SmolLM2-135M Q4_1 and Gemma 3 270M Q4_K_M, ten prompts each.
//! The 16-bit sessions take each prompt in two chunks (the second attends over the
//! 16-bit cache with several queries), then follow the F32 session's greedy tokens;
//! their greedy choice must match while the F32 top-2 logit gap is at least
//! [`CLEAR_GAP`], and the largest |Δlogit| over those steps is printed and bounded.
//! Skips, saying why, without the model files (`scripts/fetch-smollm2.sh`,
//! `scripts/fetch-gemma3.sh`).

use std::path::PathBuf;

use fusebox::{CpuBackend, DType};
use fusebox_models::open;

/// Steps are compared while the F32 cache's top-2 logit gap is at least this.
const CLEAR_GAP: f32 = 0.5;
/// Greedy steps per prompt.
const STEPS: usize = 12;

const PROMPTS: [&str; 10] = [
    "The capital of France is",
    "Once upon a time, there was a little girl who",
    "The three primary colors are",
    "def fibonacci(n):",
    "Water boils at a temperature of",
    "The quick brown fox",
    "In 1969, the first person to walk on the moon was",
    "A list of fruits: apple, banana,",
    "The most important thing about learning a language is",
    "Dear Sir or Madam, I am writing to",
];

/// What one cache dtype gave against the F32 cache over every prompt.
#[derive(Debug, Default)]
struct Agreement {
    /// Greedy steps compared (F32 gap ≥ CLEAR_GAP).
    compared: usize,
    /// Steps whose greedy token differed.
    mismatches: usize,
    /// Largest |Δlogit| over the compared steps.
    max_logit_diff: f32,
}

fn top2(logits: &[f32]) -> (usize, f32) {
    let (mut best, mut first, mut second) = (0, f32::NEG_INFINITY, f32::NEG_INFINITY);
    for (i, &x) in logits.iter().enumerate() {
        if x > first {
            (best, second, first) = (i, first, x);
        } else if x > second {
            second = x;
        }
    }
    (best, first - second)
}

fn agreement(path: &std::path::Path, dtype: DType) -> Agreement {
    let b = CpuBackend::with_threads(2).unwrap();
    let p = open::load(&b, path).unwrap();
    let mut a = Agreement::default();
    for prompt in PROMPTS {
        let ids = p.tokenizer.encode(prompt, p.tokenizer.add_bos_default());
        let ctx = ids.len() + STEPS + 1;
        let mut exact = p.session(&b, ctx).unwrap();
        let mut half = p.session_with_cache(&b, ctx, dtype).unwrap();
        assert_eq!(half.cache_dtype(), dtype);
        let mut want = exact.step(&b, &ids).unwrap();
        let cut = ids.len() / 2;
        if cut > 0 {
            half.step(&b, &ids[..cut]).unwrap();
        }
        let mut got = half.step(&b, &ids[cut..]).unwrap();
        for _ in 0..STEPS {
            let (token, gap) = top2(&want);
            if gap < CLEAR_GAP {
                break;
            }
            a.compared += 1;
            if top2(&got).0 != token {
                a.mismatches += 1;
            }
            let diff = want.iter().zip(&got).map(|(x, y)| (x - y).abs()).fold(0.0f32, f32::max);
            a.max_logit_diff = a.max_logit_diff.max(diff);
            want = exact.step(&b, &[token as u32]).unwrap();
            got = half.step(&b, &[token as u32]).unwrap();
        }
    }
    a
}

fn check(name: &str, path: PathBuf, fetch: &str) {
    if !path.exists() {
        eprintln!("skipping: {name} GGUF not found at {} ({fetch})", path.display());
        return;
    }
    for dtype in [DType::F16, DType::BF16] {
        let a = agreement(&path, dtype);
        println!(
            "{name}, {dtype} cache vs f32 cache: {} greedy steps compared (f32 top-2 gap ≥ {CLEAR_GAP}), {} \
             mismatches, max |Δlogit| {:.4}",
            a.compared, a.mismatches, a.max_logit_diff
        );
        assert!(a.compared >= 10, "{name} {dtype}: only {} steps compared", a.compared);
        assert_eq!(a.mismatches, 0, "{name} {dtype}: {a:?}");
        // Rounding K and V to f16 (11 significant bits) moves a logit by a small fraction
        // of the clear gap; bf16 (8 bits) by up to about ten times more, still below it.
        let bound = if dtype == DType::F16 { 0.1 } else { CLEAR_GAP };
        assert!(a.max_logit_diff < bound, "{name} {dtype}: {a:?}");
    }
}

fn workspace_model(env: &str, file: &str) -> PathBuf {
    match std::env::var_os(env) {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models").join(file),
    }
}

#[test]
fn smollm2_greedy_with_16_bit_caches_matches_the_f32_cache() {
    check(
        "SmolLM2-135M Q4_1",
        workspace_model("FUSEBOX_SMOLLM2_GGUF", "SmolLM2-135M-Instruct.Q4_1.gguf"),
        "scripts/fetch-smollm2.sh",
    );
}

#[test]
fn gemma3_greedy_with_16_bit_caches_matches_the_f32_cache() {
    check(
        "Gemma 3 270M Q4_K_M",
        workspace_model("FUSEBOX_GEMMA3_GGUF", "gemma-3-270m-q4_k_m.gguf"),
        "scripts/fetch-gemma3.sh",
    );
}
