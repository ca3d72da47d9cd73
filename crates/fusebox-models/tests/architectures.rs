//! Every architecture against Hugging Face `transformers`: tiny random-weight models
//! saved by `scripts/record_arch_fixtures.py` (bf16 weights; the reference ran in f64
//! on the same values) under `tests/fixtures/arch/<name>/`, the reference beside it. For each: the prompt's
//! last-position logits, greedy decoding through the KV cache (token for token while
//! the reference's top-2 gap is ≥ 0.3), and one training step's loss and the gradient
//! of every parameter; and, for the architectures llama.cpp defines, the same weights
//! written as a GGUF file with llama.cpp's names and metadata give the same logits.
//!
//! Qwen3.5 and Qwen3.5-MoE as they are published — the vision-language wrapper
//! (`qwen3_5` / `qwen3_5_moe`: `text_config`, `model.language_model.*`, a vision tower),
//! with the MoE's experts per expert and fused into 3-D tensors — are run text only
//! against the wrapper's logits and greedy tokens on a text prompt (`*_vl*`, recorded by
//! `/tmp/tvenv/bin/python scripts/record_qwen3_5_wrapper_fixtures.py`).

mod common;

use std::path::PathBuf;

use common::gguf_writer::GgufWriter;
use fusebox::{CpuBackend, DType, RopeStyle, Tensor};
use fusebox_models::arch::{self, Fix, GGUF_NAMES};
use fusebox_models::gguf::{GgmlType, GgufFile, Value};
use fusebox_models::safetensors::SafeTensors;
use fusebox_models::transformer::{Positions, RopeScaling, Transformer};
use fusebox_models::weights::{self, Purpose, TensorSource};
use fusebox_models::{generate, ParamSet, Sampler, SamplerConfig, Session};

/// Relative agreement asked of logits, loss and gradients.
const TOL: f64 = 1e-4;
/// Greedy tokens must agree while the reference's top-2 gap is at least this.
const GAP: f32 = 0.3;

fn dir(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/arch").join(name)
}

fn cpu() -> CpuBackend {
    CpuBackend::with_threads(2).unwrap()
}

struct Reference(SafeTensors);

impl Reference {
    fn open(name: &str) -> Reference {
        let path = dir(name).with_file_name(format!("{name}.reference.safetensors"));
        Reference(SafeTensors::read(&path).unwrap())
    }
    fn get(&self, key: &str) -> Vec<f32> {
        self.0.tensor(key).unwrap_or_else(|e| panic!("{key}: {e}")).to_vec_f32().unwrap()
    }
    fn ids(&self, key: &str) -> Vec<u32> {
        self.get(key).iter().map(|&x| x as u32).collect()
    }
}

/// `max |got − want| / max |want|`.
fn rel_err(got: &[f32], want: &[f32]) -> f64 {
    assert_eq!(got.len(), want.len());
    let scale = want.iter().fold(0.0f64, |m, &w| m.max(f64::from(w).abs())).max(1e-30);
    got.iter().zip(want).map(|(&g, &w)| (f64::from(g) - f64::from(w)).abs()).fold(0.0, f64::max) / scale
}

/// Through `open::load` (config, safetensors and tokenizer.json — what `fusebox
/// generate --model DIR` runs): the prompt's last logits and greedy decoding.
fn logits_and_greedy(name: &str) {
    let b = cpu();
    let r = Reference::open(name);
    // The loader `fusebox generate --model DIR` uses: weights, config and tokenizer.
    let pretrained = fusebox_models::open::load(&b, &dir(name)).unwrap();
    assert_eq!(pretrained.tokenizer.vocab_size(), 256, "{name}: the byte-level tokenizer");
    let model = &pretrained.network;
    let ids = r.ids("ids");
    let mut session = Session::new(model, &b, 64).unwrap();
    let logits = session.step(&b, &ids).unwrap();
    let e = rel_err(&logits, &r.get("logits"));
    assert!(e < TOL, "{name}: last-position logits off by {e:.2e} (relative)");

    let (want, gaps) = (r.ids("greedy"), r.get("gaps"));
    let mut session = Session::new(model, &b, 64).unwrap();
    let mut sampler = Sampler::new(SamplerConfig::default()).unwrap();
    let got = generate(&mut session, &b, &ids, want.len(), &mut sampler, &[], |_| Ok(())).unwrap().tokens;
    let sure = gaps.iter().take_while(|&&g| g >= GAP).count();
    assert_eq!(got[..sure], want[..sure], "{name}: greedy tokens (the first {sure} have a top-2 gap ≥ {GAP})");
    // Past a close call the two may part ways: feed the reference's tokens through the
    // decode path and check our choice at every step whose gap is clear.
    let mut session = Session::new(model, &b, 64).unwrap();
    let mut logits = session.step(&b, &ids).unwrap();
    let mut checked = 0;
    for (k, (&tok, &gap)) in want.iter().zip(&gaps).enumerate() {
        if gap >= GAP {
            let ours = fusebox_models::sampler::argmax(&logits) as u32;
            assert_eq!(ours, tok, "{name}: greedy step {k} (reference gap {gap:.3})");
            checked += 1;
        }
        logits = session.step(&b, &[tok]).unwrap();
    }
    eprintln!(
        "{name}: logits rel. error {e:.1e}; greedy: {sure} free-running and {checked} teacher-forced steps agree"
    );
}

fn training_step(name: &str) {
    let b = cpu();
    let r = Reference::open(name);
    let model = weights::load_hf_for(&b, &dir(name), Purpose::Training).unwrap();
    // transformers runs `model(ids, labels=ids)` over the whole sequence and shifts the
    // labels: the last position predicts nothing (it still routes, for the experts'
    // load-balancing loss).
    let seq = r.ids("train_ids");
    let t = seq.len();
    let ids = Tensor::from_vec(seq.clone(), [1, t]).unwrap();
    let targets = Tensor::from_vec(seq[1..].iter().copied().chain([u32::MAX]).collect::<Vec<_>>(), [1, t]).unwrap();
    let mut grads = ParamSet::zeros(&b, &model.specs).unwrap();
    let loss = model.loss_and_grads(&b, &ids, &targets, Some(u32::MAX), 1.0, &mut grads).unwrap();
    let want = r.get("loss")[0];
    let e = (f64::from(loss) - f64::from(want)).abs() / f64::from(want).abs();
    assert!(e < TOL, "{name}: loss {loss} vs {want} ({e:.2e} relative)");

    // Every parameter's gradient, found under the file's name for it, read as the
    // loader reads the weights (Qwen3-Next's fused projections split into their parts).
    let config = weights::read_config(&dir(name)).unwrap();
    let plan = weights::hf_plan(&config, &weights::Shards::open(&dir(name)).unwrap()).unwrap();
    let prefix = if r.0.tensors.contains_key("grad.transformer.wte.weight") { "transformer." } else { "" };
    let recorded = RecordedGrads(&r.0);
    let unfused = arch::by_name(&model.arch.name).unwrap().hf_source(&model.arch, &recorded).unwrap();
    let grads_src: &dyn TensorSource = unfused.as_deref().unwrap_or(&recorded);
    let get = |f: &str| -> Vec<f32> {
        let key = f.strip_prefix("grad.").unwrap();
        grads_src.get(key).unwrap_or_else(|e| panic!("{f}: {e}")).to_vec_f32().unwrap()
    };
    let (mut used, mut worst) = (std::collections::BTreeSet::new(), 0.0f64);
    for (spec, g) in model.specs.iter().zip(&grads.tensors) {
        let (file, fix) = plan.names.file_name(&spec.name).unwrap_or_else(|| panic!("{name}: {}", spec.name));
        // One recorded tensor per expert for the stacked expert parameters.
        let files: Vec<String> = if file.contains("{e}") {
            (0..spec.shape.dims()[0]).map(|e| format!("grad.{prefix}{}", file.replace("{e}", &e.to_string()))).collect()
        } else {
            vec![format!("grad.{prefix}{file}")]
        };
        let want: Vec<f32> = files.iter().flat_map(|f| get(f)).collect();
        used.extend(files);
        // Laid out as the loader lays out the weight (transposed, or one part of an
        // interleaved pair); d/dw of `1 + w` is d/dw of w.
        let want = if fix == Fix::PlusOne { want } else { fix.to_ours(spec.shape.dims(), &want) };
        let e = rel_err(&g.to_vec_f32().unwrap(), &want);
        assert!(e < TOL, "{name}: gradient of {} ({file}) off by {e:.2e} (relative)", spec.name);
        worst = worst.max(e);
    }
    let checked = used.len();
    eprintln!("{name}: loss rel. error {e:.1e}; worst gradient rel. error {worst:.1e} over {checked} parameters");
    let recorded = grads_src.names().len();
    assert_eq!(checked, recorded, "{name}: every recorded gradient has a parameter here");
}

/// The recorded gradients (`grad.<checkpoint name>`) as a checkpoint's tensors.
struct RecordedGrads<'a>(&'a SafeTensors);

impl TensorSource for RecordedGrads<'_> {
    fn origin(&self) -> String {
        "reference gradients".into()
    }
    fn names(&self) -> Vec<String> {
        self.0.tensors.keys().filter_map(|k| k.strip_prefix("grad.")).map(str::to_string).collect()
    }
    fn has(&self, name: &str) -> bool {
        self.0.tensors.contains_key(&format!("grad.{name}"))
    }
    fn dtype(&self, name: &str) -> fusebox::Result<DType> {
        Ok(self.0.tensor(&format!("grad.{name}"))?.dtype())
    }
    fn get(&self, name: &str) -> fusebox::Result<Tensor> {
        self.0.tensor(&format!("grad.{name}"))
    }
}

/// HF half-split q/k rows → the interleaved order llama.cpp's converter writes for
/// the llama architecture: GGUF row `h·hd + 2i + s` is HF row `h·hd + s·hd/2 + i`.
fn to_interleaved(v: &[f32], heads: usize, hd: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0.0; v.len()];
    for h in 0..heads {
        for i in 0..hd / 2 {
            for s in 0..2 {
                let (dst, src) = (h * hd + 2 * i + s, h * hd + s * hd / 2 + i);
                out[dst * cols..(dst + 1) * cols].copy_from_slice(&v[src * cols..(src + 1) * cols]);
            }
        }
    }
    out
}

/// The fixture's weights as llama.cpp's converter would write them for `gguf_arch`.
fn fixture_as_gguf(name: &str, gguf_arch: &str) -> GgufFile {
    let b = cpu();
    let m: Transformer = weights::load_hf_for(&b, &dir(name), Purpose::Training).unwrap();
    let a = &m.arch;
    let key = |k: &str| format!("{gguf_arch}.{k}");
    let eps_key = if a.positions == Positions::Learned {
        "attention.layer_norm_epsilon"
    } else {
        "attention.layer_norm_rms_epsilon"
    };
    let mut wr = GgufWriter::default()
        .kv("general.architecture", Value::String(gguf_arch.into()))
        .kv(&key("block_count"), Value::U32(a.n_layers as u32))
        .kv(&key("context_length"), Value::U32(a.context_length as u32))
        .kv(&key("embedding_length"), Value::U32(a.d_model as u32))
        .kv(&key("feed_forward_length"), Value::U32(a.d_ff as u32))
        .kv(&key("attention.head_count"), Value::U32(a.n_heads as u32))
        .kv(&key("attention.head_count_kv"), Value::U32(a.n_kv_heads as u32))
        .kv(&key("attention.key_length"), Value::U32(a.head_dim as u32))
        .kv(&key("attention.value_length"), Value::U32(a.head_dim as u32))
        .kv(&key(eps_key), Value::F32(a.norm_eps))
        .kv(&key("rope.freq_base"), Value::F32(a.rope.theta as f32))
        .kv(&key("vocab_size"), Value::U32(a.vocab_size as u32));
    if let Some(w) = a.sliding_window {
        wr = wr.kv(&key("attention.sliding_window"), Value::U32(w as u32));
    }
    if let Some(moe) = &a.moe {
        wr = wr
            .kv(&key("expert_count"), Value::U32(moe.experts as u32))
            .kv(&key("expert_used_count"), Value::U32(moe.top_k as u32))
            .kv(&key("expert_feed_forward_length"), Value::U32(moe.d_expert as u32));
        if let Some(w) = moe.d_shared {
            wr = wr.kv(&key("expert_shared_feed_forward_length"), Value::U32(w as u32));
        }
    }
    match &a.rope.scaling {
        RopeScaling::None => {}
        RopeScaling::Linear { factor } => {
            wr = wr
                .kv(&key("rope.scaling.type"), Value::String("linear".into()))
                .kv(&key("rope.scaling.factor"), Value::F32(*factor as f32));
        }
        RopeScaling::Llama3 { .. } => {
            // llama.cpp stores Llama 3 scaling as per-frequency divisors.
            let mut plain = a.rope.clone();
            plain.scaling = RopeScaling::None;
            let (p, s) = (plain.frequencies(a.head_dim), a.rope.frequencies(a.head_dim));
            let f: Vec<u8> = p.iter().zip(&s).flat_map(|(p, s)| ((p / s) as f32).to_le_bytes()).collect();
            wr = wr.tensor("rope_freqs.weight", &[(a.head_dim / 2) as u64], GgmlType::F32, f);
        }
        RopeScaling::FreqFactors(_) => unreachable!("HF configs have no frequency factors"),
        RopeScaling::Yarn { .. } => unreachable!("the GGUF list below has no YaRN fixture"),
    }
    let interleave = gguf_arch == "llama";
    for (spec, t) in m.specs.iter().zip(&m.params.tensors) {
        let (gguf_name, _) = GGUF_NAMES.file_name(&spec.name).unwrap();
        let dims = spec.shape.dims();
        let mut v = t.to_vec_f32().unwrap();
        if interleave && spec.name.ends_with("attn.q.weight") {
            v = to_interleaved(&v, a.n_heads, a.head_dim, dims[1]);
        } else if interleave && spec.name.ends_with("attn.k.weight") {
            v = to_interleaved(&v, a.n_kv_heads, a.head_dim, dims[1]);
        }
        let ggml: Vec<u64> = dims.iter().rev().map(|&d| d as u64).collect();
        wr = wr.tensor(&gguf_name, &ggml, GgmlType::F32, v.iter().flat_map(|x| x.to_le_bytes()).collect());
    }
    GgufFile::from_bytes(wr.to_bytes()).unwrap()
}

fn gguf_matches_hf(name: &str, gguf_arch: &str) {
    let b = cpu();
    let r = Reference::open(name);
    let ids = r.ids("ids");
    let from_gguf = weights::load_gguf(&b, &fixture_as_gguf(name, gguf_arch)).unwrap();
    let from_hf = weights::load_hf(&b, &dir(name)).unwrap();
    let want_style = if gguf_arch == "llama" { RopeStyle::Interleaved } else { RopeStyle::HalfSplit };
    assert_eq!(from_gguf.arch.rope.style, want_style);
    let run = |m: &Transformer| {
        let mut s = Session::new(m, &b, 32).unwrap();
        s.step(&b, &ids).unwrap();
        s.step(&b, &[5]).unwrap()
    };
    let e = rel_err(&run(&from_gguf), &run(&from_hf));
    assert!(e < 1e-5, "{name} as gguf '{gguf_arch}': logits off by {e:.2e} (relative) from the HF directory");
}

macro_rules! arch_tests {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[test]
            fn logits_and_greedy_tokens_match_transformers() {
                super::logits_and_greedy(stringify!($name));
            }
            #[test]
            fn one_training_step_matches_transformers() {
                super::training_step(stringify!($name));
            }
        }
    )*};
}

arch_tests!(
    llama,
    llama_linear_tied,
    mistral,
    qwen2,
    qwen3,
    phi3,
    gemma3,
    gpt2,
    qwen3_moe,
    mixtral,
    olmoe,
    qwen2_moe,
    qwen3_yarn,
    gpt_oss,
    qwen3_5,
    qwen3_next,
    qwen3_5_moe
);

/// The wrapper checkpoints: logits and greedy tokens (their reference records no
/// training step; the text model's is the `qwen3_5` / `qwen3_5_moe` fixtures').
macro_rules! wrapper_tests {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[test]
            fn logits_and_greedy_tokens_of_the_text_model_match_transformers() {
                super::logits_and_greedy(stringify!($name));
            }
        }
    )*};
}

wrapper_tests!(qwen3_5_vl, qwen3_5_moe_vl, qwen3_5_moe_vl_fused);

#[test]
fn wrappers_load_text_only_saying_so_and_fused_experts_load_as_per_expert_ones() {
    let b = cpu();
    let p = fusebox_models::open::load(&b, &dir("qwen3_5_vl")).unwrap();
    let notice = "text only: the vision tower (model.visual.*, 21 tensors) not loaded";
    assert!(p.description.contains(notice), "{}", p.description);
    // transformers ties the head by the wrapper's tie_word_embeddings, not its text_config's.
    assert!(p.network.arch.tied_embeddings);
    let per_expert = weights::load_hf_for(&b, &dir("qwen3_5_moe_vl"), Purpose::Training).unwrap();
    let fused = weights::load_hf_for(&b, &dir("qwen3_5_moe_vl_fused"), Purpose::Training).unwrap();
    assert_eq!(per_expert.specs.len(), fused.specs.len());
    for ((spec, x), y) in per_expert.specs.iter().zip(&per_expert.params.tensors).zip(&fused.params.tensors) {
        assert_eq!(x.to_vec_f32().unwrap(), y.to_vec_f32().unwrap(), "{}", spec.name);
    }
    // The text model's own checkpoints say nothing of the kind.
    let p = fusebox_models::open::load(&b, &dir("qwen3_5")).unwrap();
    assert!(!p.description.contains("text only"), "{}", p.description);
}

#[test]
fn gguf_files_of_the_fixtures_match_their_hf_directories() {
    for (name, gguf_arch) in [
        ("llama", "llama"),
        ("llama_linear_tied", "llama"),
        ("mistral", "llama"),
        ("qwen2", "qwen2"),
        ("qwen3", "qwen3"),
        ("phi3", "phi3"),
        ("gpt2", "gpt2"),
        ("qwen3_moe", "qwen3moe"),
        ("mixtral", "llama"),
        ("olmoe", "olmoe"),
        ("qwen2_moe", "qwen2moe"),
    ] {
        gguf_matches_hf(name, gguf_arch);
    }
}

#[test]
fn unknown_architectures_and_options_are_refused_by_name() {
    let config = weights::read_config(&dir("llama")).unwrap();
    let shards = weights::Shards::open(&dir("llama")).unwrap();
    let mut c = config.clone();
    c["model_type"] = serde_json::json!("falcon");
    let err = weights::hf_plan(&c, &shards).unwrap_err().to_string();
    assert!(err.contains("falcon") && err.contains("qwen3"), "{err}");
    let mut c = config.clone();
    c["rope_parameters"] = serde_json::json!({"rope_type": "longrope", "factor": 4.0, "rope_theta": 10000.0});
    assert!(weights::hf_plan(&c, &shards).unwrap_err().to_string().contains("longrope"));
    let mut c = config.clone();
    c["hidden_act"] = serde_json::json!("relu");
    assert!(weights::hf_plan(&c, &shards).unwrap_err().to_string().contains("relu"));
    let g = weights::read_config(&dir("gemma3")).unwrap();
    let mut c = g.clone();
    c["final_logit_softcapping"] = serde_json::json!(30.0);
    let gemma_shards = weights::Shards::open(&dir("gemma3")).unwrap();
    assert!(weights::hf_plan(&c, &gemma_shards).unwrap_err().to_string().contains("final_logit_softcapping"));
    // A model loaded for inference (quantized or backend-laid-out weights) refuses to train.
    let b = cpu();
    let m = weights::load_hf(&b, &dir("llama")).unwrap();
    let ids = Tensor::from_vec(vec![1u32, 2, 3], [1, 3]).unwrap();
    assert!(m.forward(&b, &ids).unwrap_err().to_string().contains("inference"));
}

/// Gemma 3 270M (`models/gemma-3-270m-q4_k_m.gguf`, when present): its metadata and
/// tensor names map onto the Gemma 3 architecture.
#[test]
fn gemma3_270m_config_and_tensor_names_map() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/gemma-3-270m-q4_k_m.gguf");
    if !path.exists() {
        eprintln!("skipped: {} not found (scripts/fetch-gemma3.sh)", path.display());
        return;
    }
    let file = GgufFile::open(&path).unwrap();
    let vocab = file.metadata().get_strings("tokenizer.ggml.tokens").unwrap().map(<[String]>::len);
    let tensors = arch::FileTensors { count: file.tensors().len(), has: &|n| file.tensor_info(n).is_some() };
    let plan = arch::gguf_plan(file.metadata(), vocab, &tensors, &|| unreachable!()).unwrap();
    let a = &plan.arch;
    assert_eq!(
        (a.name.as_str(), a.n_layers, a.d_model, a.n_heads, a.n_kv_heads, a.head_dim),
        ("gemma3", 18, 640, 4, 1, 256)
    );
    assert_eq!((a.d_ff, a.vocab_size, a.sliding_window, a.tied_embeddings), (2048, 262144, Some(512), true));
    assert!(a.post_norms && a.qk_norm && a.mlp == fusebox_models::transformer::Mlp::GeGlu);
    assert!((a.embed_scale - 640f32.sqrt()).abs() < 1e-6 && (a.attn_scale - 1.0 / 16.0).abs() < 1e-7);
    let global: Vec<usize> = (0..18).filter(|&l| a.window(l).is_none()).collect();
    assert_eq!(global, [5, 11, 17]);
    assert_eq!((a.rope.theta, a.rope_of(0).theta), (1_000_000.0, 10_000.0));
    // Every tensor of the file is a parameter of this layout, and every parameter is in the file.
    let (specs, _) = fusebox_models::transformer::layout(a, |_| Default::default());
    let names: std::collections::BTreeSet<String> =
        specs.iter().map(|s| GGUF_NAMES.file_name(&s.name).unwrap().0).collect();
    let in_file: std::collections::BTreeSet<String> = file.tensors().iter().map(|t| t.name().to_string()).collect();
    assert_eq!(names, in_file);
    for s in &specs {
        let info = file.tensor_info(&GGUF_NAMES.file_name(&s.name).unwrap().0).unwrap();
        assert_eq!(info.shape().unwrap(), s.shape.dims(), "{}", s.name);
    }
}

/// The fixtures' tokenizers have 256 + specials ids below the 272-row embedding: what
/// `fusebox generate --model DIR` samples must be a token the tokenizer decodes, however
/// the padding rows score.
#[test]
fn generation_samples_only_ids_the_tokenizer_has() {
    let b = cpu();
    for name in ["llama", "llama_linear_tied", "mistral", "qwen2", "qwen3", "phi3", "gemma3", "gpt2"] {
        let p = fusebox_models::open::load(&b, &dir(name)).unwrap();
        let prompt = p.tokenizer.encode("ab", false);
        let mut session = p.session(&b, prompt.len() + 24).unwrap();
        let mut sampler = Sampler::new(SamplerConfig::default()).unwrap();
        let out = generate(&mut session, &b, &prompt, 24, &mut sampler, &[], |_| Ok(())).unwrap();
        assert!(out.tokens.iter().all(|&t| (t as usize) < p.tokenizer.vocab_size()), "{name}: {:?}", out.tokens);
        p.tokenizer.decode(&out.tokens).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}

/// A prompt fed in pieces (a chat's later turns: the cache continued by several tokens
/// at once, then one at a time) gives the logits of the whole prompt at once: the
/// linear-attention layers' convolution inputs and delta-rule state carry over exactly.
#[test]
fn a_prompt_in_pieces_gives_the_logits_of_the_whole() {
    let b = cpu();
    for name in ["qwen3_5", "llama"] {
        let model = fusebox_models::open::load(&b, &dir(name)).unwrap().network;
        let ids = Reference::open(name).ids("ids");
        let mut whole = Session::new(&model, &b, 64).unwrap();
        let want = whole.step_all(&b, &ids).unwrap().to_vec_f32().unwrap();
        let mut pieces = Session::new(&model, &b, 64).unwrap();
        let mut got = Vec::new();
        for piece in [&ids[..2], &ids[2..7], &ids[7..8], &ids[8..]] {
            got.extend(pieces.step_all(&b, piece).unwrap().to_vec_f32().unwrap());
        }
        let e = rel_err(&got, &want);
        assert!(e < 1e-5, "{name}: a prompt in pieces off the whole prompt by {e:.2e}");
        // After a clear, the cache starts again from nothing.
        pieces.clear();
        let again = pieces.step_all(&b, &ids).unwrap().to_vec_f32().unwrap();
        assert!(rel_err(&again, &want) < 1e-6, "{name}: a cleared session differs");
    }
}
