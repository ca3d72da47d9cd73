//! Gemma 3 270M Q4_K_M end to end (SentencePiece tokenizer, Q5_0/Q4_K/Q6_K/Q8_0 blocks,
//! sliding-window local layers, GeGLU, the four norms): fusebox's tokens and greedy
//! continuation against llama.cpp's on the same file, recorded by
//! `scripts/record_gemma3_fixture.py`. Skips, saying why, without the model file
//! (`scripts/fetch-gemma3.sh`).

use std::path::PathBuf;

use fusebox::CpuBackend;
use fusebox_models::open;
use serde_json::Value as Json;

/// Greedy tokens are compared while the reference's top-2 logit gap is at least this:
/// below it, f32 rounding differences (llama.cpp quantizes activations to 8 bits for its
/// dot products; fusebox keeps them in f32) may legitimately pick the other token.
const CLEAR_GAP: f64 = 0.3;

fn model_path() -> PathBuf {
    match std::env::var_os("FUSEBOX_GEMMA3_GGUF") {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/gemma-3-270m-q4_k_m.gguf"),
    }
}

fn fixture() -> Json {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gemma3_greedy.json");
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

fn ids(v: &Json) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

#[test]
fn greedy_tokens_agree_with_llama_cpp_while_the_gap_is_clear() {
    let path = model_path();
    if !path.exists() {
        eprintln!("skipping: Gemma 3 GGUF not found at {} (scripts/fetch-gemma3.sh)", path.display());
        return;
    }
    let b = CpuBackend::with_threads(2).unwrap();
    let p = open::load(&b, &path).unwrap();
    assert!(p.description.contains("gemma3"), "{}", p.description);
    let mut compared = 0;
    for case in fixture()["cases"].as_array().unwrap() {
        let prompt = case["prompt"].as_str().unwrap();
        let prompt_ids = ids(&case["ids"]);
        assert_eq!(p.tokenizer.tokenize(prompt, true, false), prompt_ids, "tokens of {prompt:?}");
        let want = ids(&case["greedy"]);
        let gaps: Vec<f64> = case["gaps"].as_array().unwrap().iter().map(|g| g.as_f64().unwrap()).collect();
        let mut session = p.session(&b, prompt_ids.len() + want.len() + 1).unwrap();
        let mut logits = session.step(&b, &prompt_ids).unwrap();
        for (step, (&token, &gap)) in want.iter().zip(&gaps).enumerate() {
            if gap < CLEAR_GAP {
                break;
            }
            let ours = logits.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).unwrap().0 as u32;
            assert_eq!(ours, token, "{prompt:?} step {step}: fusebox {ours}, llama.cpp {token} (gap {gap})");
            compared += 1;
            logits = session.step(&b, &[token]).unwrap();
        }
    }
    assert!(compared >= 10, "only {compared} clear steps compared");
}
