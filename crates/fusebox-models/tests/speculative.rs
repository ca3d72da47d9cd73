//! Speculative decoding on the real SmolLM2-135M-Instruct Q4_1 GGUF (skips, saying why,
//! without models/SmolLM2-135M-Instruct.Q4_1.gguf; scripts/fetch-smollm2.sh fetches it).
//!
//! A verify pass of up to 16 tokens after the cache gives each position the bits of the
//! one-token step there (f32 and `--int8` decoding, f32 and f16 caches); generation with
//! prompt-lookup or draft-model drafting gives the tokens of plain decoding, greedy and
//! sampled, and leaves the cache as plain decoding does; a draft model with another
//! vocabulary (Gemma 3's, when its GGUF is present) and bad settings are errors.

use std::path::PathBuf;

use fusebox::{CpuBackend, DType};
use fusebox_models::generate::speculative::check_same_vocabulary;
use fusebox_models::generate::{generate, generate_with, Drafter};
use fusebox_models::gguf::GgufFile;
use fusebox_models::pretrained::Pretrained;
use fusebox_models::tokenizer::Tokenizer;
use fusebox_models::{open, Sampler, SamplerConfig};

fn models() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models")
}

fn smollm2(b: &CpuBackend) -> Option<Pretrained> {
    let p = models().join("SmolLM2-135M-Instruct.Q4_1.gguf");
    if !p.exists() {
        eprintln!("skipping: {} is missing (scripts/fetch-smollm2.sh fetches it)", p.display());
        return None;
    }
    Some(open::load(b, &p).unwrap())
}

/// A prompt whose answer copies its input: a code edit.
const EDIT: &str = "Rename the function `add` to `plus` in this code and print the whole code again:\n\n\
def add(a, b):\n    \"\"\"Return the sum of a and b.\"\"\"\n    return a + b\n\n\
def twice(x):\n    return add(x, x)\n\nprint(twice(21))\n";

fn chat_prompt(m: &Pretrained, text: &str) -> Vec<u32> {
    let t = m.chat_template().unwrap();
    t.encode(&m.tokenizer, &t.apply(&[("user", text)], true).unwrap())
}

#[test]
fn verify_rows_have_the_bits_of_one_token_steps() {
    for exact in [true, false] {
        let b = CpuBackend::builder().threads(2).exact_decode(exact).build().unwrap();
        let Some(model) = smollm2(&b) else { return };
        let net = &model.network;
        let v = net.arch.vocab_size;
        let prompt = model.tokenizer.encode("def add(a, b):\n    return a + b\n\ndef sub(a, b):", true);
        for dtype in [DType::F32, DType::F16] {
            for k in [2usize, 5, 16] {
                let ids: Vec<u32> = (0..k as u32).map(|i| (i * 977 + 13) % 49_000).collect();
                let mut together = net.new_cache_of(&b, 128, dtype).unwrap();
                net.forward_cached(&b, &prompt, &mut together).unwrap();
                let all = net.forward_cached_all(&b, &ids, &mut together).unwrap().to_vec::<f32>().unwrap();
                let mut stepped = net.new_cache_of(&b, 128, dtype).unwrap();
                net.forward_cached(&b, &prompt, &mut stepped).unwrap();
                for (i, &t) in ids.iter().enumerate() {
                    let one = net.forward_cached(&b, &[t], &mut stepped).unwrap();
                    let same = all[i * v..(i + 1) * v].iter().zip(&one).all(|(a, s)| a.to_bits() == s.to_bits());
                    assert!(same, "exact_decode {exact}, {dtype} cache, {k} rows: row {i} differs from its step");
                }
            }
        }
    }
}

/// Plain and drafted generations of `max_new` tokens after `prompt` with `config`.
fn both(
    b: &CpuBackend,
    m: &Pretrained,
    prompt: &[u32],
    max_new: usize,
    config: SamplerConfig,
    drafter: &mut Drafter<'_>,
) -> (Vec<u32>, Vec<u32>, usize) {
    let stop = m.stop_ids(true);
    let mut s = m.session_with_cache(b, 512, DType::F16).unwrap();
    let mut sampler = Sampler::new(config.clone()).unwrap();
    let plain = generate(&mut s, b, prompt, max_new, &mut sampler, &stop, |_| Ok(())).unwrap();
    let plain_len = s.len();
    let mut s = m.session_with_cache(b, 512, DType::F16).unwrap();
    let mut sampler = Sampler::new(config).unwrap();
    let mut streamed = Vec::new();
    let g = generate_with(&mut s, b, prompt, max_new, &mut sampler, &stop, Some(drafter), |t| {
        streamed.push(t);
        Ok(())
    })
    .unwrap();
    assert_eq!(streamed, g.tokens, "on_token sees every token once, in order");
    assert_eq!(s.len(), plain_len, "the cache ends where plain decoding leaves it");
    assert!(g.drafts.accepted <= g.drafts.drafted);
    (plain.tokens, g.tokens, g.drafts.accepted)
}

#[test]
fn prompt_lookup_gives_the_plain_tokens() {
    for exact in [true, false] {
        let b = CpuBackend::builder().threads(2).exact_decode(exact).build().unwrap();
        let Some(m) = smollm2(&b) else { return };
        let prompt = chat_prompt(&m, EDIT);
        let mut d = Drafter::ngram(3, 8).unwrap();
        let (plain, drafted, accepted) = both(&b, &m, &prompt, 60, SamplerConfig::default(), &mut d);
        assert_eq!(plain, drafted, "greedy, exact_decode {exact}");
        assert!(accepted >= 5, "a code edit copies its input: only {accepted} drafts kept");
        // Sampled: one choice per emitted token, in order, so the same seed gives the same tokens.
        let config = SamplerConfig { temperature: 0.8, top_k: 40, top_p: 0.95, seed: 7, ..SamplerConfig::default() };
        let mut d = Drafter::ngram(2, 4).unwrap();
        let (plain, drafted, _) = both(&b, &m, &prompt, 40, config, &mut d);
        assert_eq!(plain, drafted, "sampled, exact_decode {exact}");
    }
}

#[test]
fn a_draft_model_gives_the_plain_tokens() {
    let b = CpuBackend::builder().threads(2).build().unwrap();
    let Some(m) = smollm2(&b) else { return };
    // The model drafting for itself: every greedy draft is kept.
    let draft = smollm2(&b).unwrap();
    check_same_vocabulary(&m.tokenizer, &draft.tokenizer).unwrap();
    let mut d = Drafter::model(&b, &draft.network, m.tokenizer.vocab_size(), 512, DType::F16, 5).unwrap();
    let prompt = chat_prompt(&m, "Write three sentences about the sea.");
    let (plain, drafted, accepted) = both(&b, &m, &prompt, 40, SamplerConfig::default(), &mut d);
    assert_eq!(plain, drafted);
    assert!(accepted >= 30, "the model's own greedy drafts: {accepted} of 40 kept");
    // With a repetition penalty the drafts (greedy, unpenalised) are sometimes rejected.
    let config = SamplerConfig { repetition_penalty: 1.3, ..SamplerConfig::default() };
    let (plain, drafted, _) = both(&b, &m, &prompt, 40, config, &mut d);
    assert_eq!(plain, drafted);
}

#[test]
fn another_vocabulary_is_refused() {
    let gemma = models().join("gemma-3-270m-q4_k_m.gguf");
    let smol = models().join("SmolLM2-135M-Instruct.Q4_1.gguf");
    if !gemma.exists() || !smol.exists() {
        eprintln!("skipping: {} or {} is missing", gemma.display(), smol.display());
        return;
    }
    let tok = |p: &PathBuf| Tokenizer::from_gguf(GgufFile::open(p).unwrap().metadata()).unwrap();
    let (s, g) = (tok(&smol), tok(&gemma));
    let e = check_same_vocabulary(&s, &g).unwrap_err().to_string();
    assert!(e.contains(&s.vocab_size().to_string()) && e.contains(&g.vocab_size().to_string()), "{e}");
    assert!(e.contains("--draft-model"), "{e}");
}

#[test]
fn bad_drafting_settings_are_errors() {
    let b = CpuBackend::builder().threads(2).build().unwrap();
    let e = Drafter::ngram(17, 4).unwrap_err().to_string();
    assert!(e.contains("--draft-ngram") && e.contains("1..=16"), "{e}");
    let e = Drafter::ngram(3, 16).unwrap_err().to_string();
    assert!(e.contains("--draft-max") && e.contains("1..=15"), "{e}");
    let Some(m) = smollm2(&b) else { return };
    let e = Drafter::model(&b, &m.network, 49_152, 64, DType::F16, 0).unwrap_err().to_string();
    assert!(e.contains("--draft-max"), "{e}");
}
