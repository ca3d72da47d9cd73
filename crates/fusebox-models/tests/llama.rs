//! The pretrained-model path on small synthetic checkpoints (no download needed):
//! a GGUF Llama with every weight format against the plain-loop reference; the same
//! weights as a sharded Hugging Face directory (half-split rope) against the GGUF
//! (interleaved rope); GPT-2 safetensors (Conv1D `[in, out]`) against the trainable
//! model (the same transformer); and the errors for broken files and oversized prompts.

mod common;
mod reference_llama;

use std::collections::BTreeMap;
use std::path::PathBuf;

use common::gguf_writer::GgufWriter;
use fusebox::{ComputeBackend, CpuBackend, DType, Tensor};
use fusebox_models::gguf::{Array, GgmlType, GgufFile, Value};
use fusebox_models::pretrained::{self, Session};
use fusebox_models::transformer::Ffn;
use fusebox_models::weights::{load_gguf, load_hf};
use fusebox_models::{safetensors, Model, ModelConfig, Style, Transformer};
use reference_llama::RefLlama;
use serde_json::json;

const VOCAB: usize = 96;
const DIM: usize = 256; // K-quants need rows of 256
const FF: usize = 512;
const HEADS: usize = 4;
const KV_HEADS: usize = 2;
const HD: usize = DIM / HEADS;
const LAYERS: usize = 2;
const CTX: usize = 64;

/// A seeded uniform generator.
struct Gen(fusebox::rng::Rng);
impl Gen {
    fn next(&mut self) -> f32 {
        self.0.uniform() * 2.0 - 1.0
    }
    fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.next() * scale).collect()
    }
}

/// f32 weights of the synthetic model in HF naming and layout (`[out, in]`, q/k rows
/// in half-split order).
struct Weights(BTreeMap<String, (Vec<usize>, Vec<f32>)>);

fn weights(seed: u64) -> Weights {
    let mut g = Gen(fusebox::rng::Rng::new(seed));
    let mut w = BTreeMap::new();
    // Matrices uniform in ±scale; norm weights (offset 1) in 1 ± scale.
    let mut put = |name: String, shape: Vec<usize>, offset: f32, scale: f32, g: &mut Gen| {
        let n = shape.iter().product();
        w.insert(name, (shape, g.vec(n, scale).iter().map(|x| offset + x).collect()));
    };
    put("model.embed_tokens.weight".into(), vec![VOCAB, DIM], 0.0, 1.0, &mut g);
    for l in 0..LAYERS {
        let p = |s: &str| format!("model.layers.{l}.{s}.weight");
        let m = 1.0 / (DIM as f32).sqrt();
        put(p("self_attn.q_proj"), vec![HEADS * HD, DIM], 0.0, 2.0 * m, &mut g);
        put(p("self_attn.k_proj"), vec![KV_HEADS * HD, DIM], 0.0, 2.0 * m, &mut g);
        put(p("self_attn.v_proj"), vec![KV_HEADS * HD, DIM], 0.0, m, &mut g);
        put(p("self_attn.o_proj"), vec![DIM, HEADS * HD], 0.0, m, &mut g);
        put(p("mlp.gate_proj"), vec![FF, DIM], 0.0, m, &mut g);
        put(p("mlp.up_proj"), vec![FF, DIM], 0.0, m, &mut g);
        put(p("mlp.down_proj"), vec![DIM, FF], 0.0, 1.0 / (FF as f32).sqrt(), &mut g);
        for norm in ["input_layernorm", "post_attention_layernorm"] {
            put(p(norm), vec![DIM], 1.0, 0.2, &mut g);
        }
    }
    put("model.norm.weight".into(), vec![DIM], 1.0, 0.2, &mut g);
    put("lm_head.weight".into(), vec![VOCAB, DIM], 0.0, 1.0 / (DIM as f32).sqrt(), &mut g);
    Weights(w)
}

/// HF half-split q/k rows → GGUF's interleaved order (llama.cpp's convert `permute`):
/// GGUF row `h·hd + 2i + s` is HF row `h·hd + s·hd/2 + i`.
fn to_interleaved(v: &[f32], heads: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0.0; v.len()];
    for h in 0..heads {
        for i in 0..HD / 2 {
            for s in 0..2 {
                let dst = h * HD + 2 * i + s;
                let src = h * HD + s * HD / 2 + i;
                out[dst * cols..(dst + 1) * cols].copy_from_slice(&v[src * cols..(src + 1) * cols]);
            }
        }
    }
    out
}

/// Bytes of `values` (`[rows, cols]`) stored as `dtype`.
fn encode(values: &[f32], shape: &[usize], dtype: DType) -> Vec<u8> {
    let t = Tensor::from_vec(values.to_vec(), shape.to_vec()).unwrap();
    let cpu = CpuBackend::with_threads(1).unwrap();
    let t = match dtype {
        DType::F32 => t,
        DType::F16 | DType::BF16 => cpu.cast(&t, dtype).unwrap(),
        q => cpu.quantize(&t, q).unwrap(),
    };
    t.host_bytes().unwrap().to_vec()
}

/// GGUF names, HF names and storage formats: between them every supported format.
fn gguf_layout(l: usize) -> Vec<(String, String, DType)> {
    let formats = if l == 0 {
        [DType::Q4_0, DType::Q4_1, DType::Q8_0, DType::Q4K, DType::Q6K, DType::F16, DType::BF16]
    } else {
        [DType::F32, DType::Q6K, DType::Q4K, DType::Q8_0, DType::Q4_1, DType::Q4_0, DType::F16]
    };
    let names = [
        ("attn_q", "self_attn.q_proj"),
        ("attn_k", "self_attn.k_proj"),
        ("attn_v", "self_attn.v_proj"),
        ("attn_output", "self_attn.o_proj"),
        ("ffn_gate", "mlp.gate_proj"),
        ("ffn_up", "mlp.up_proj"),
        ("ffn_down", "mlp.down_proj"),
    ];
    let mut out: Vec<(String, String, DType)> = names
        .iter()
        .zip(formats)
        .map(|((g, h), f)| (format!("blk.{l}.{g}.weight"), format!("model.layers.{l}.{h}.weight"), f))
        .collect();
    out.push((format!("blk.{l}.attn_norm.weight"), format!("model.layers.{l}.input_layernorm.weight"), DType::F32));
    out.push((
        format!("blk.{l}.ffn_norm.weight"),
        format!("model.layers.{l}.post_attention_layernorm.weight"),
        DType::F32,
    ));
    out
}

/// A GGUF file of `w`: quantized per [`gguf_layout`] when `quantized`, else all F32.
fn gguf_writer(w: &Weights, quantized: bool, tied: bool) -> GgufWriter {
    gguf_writer_with(w, if quantized { Formats::Mixed } else { Formats::Uniform(DType::F32) }, tied)
}

/// Storage formats of the block matrices: mixed per [`gguf_layout`] (q, k, v and gate,
/// up differ, so they stay separate), or one format for all (so they are stacked).
#[derive(Clone, Copy)]
enum Formats {
    Mixed,
    Uniform(DType),
}

fn gguf_writer_with(w: &Weights, formats: Formats, tied: bool) -> GgufWriter {
    let quantized = matches!(formats, Formats::Mixed);
    let tokens: Vec<String> = (0..VOCAB).map(|i| format!("t{i}")).collect();
    let mut wr = GgufWriter::default()
        .kv("general.architecture", Value::String("llama".into()))
        .kv("llama.block_count", Value::U32(LAYERS as u32))
        .kv("llama.context_length", Value::U32(CTX as u32))
        .kv("llama.embedding_length", Value::U32(DIM as u32))
        .kv("llama.feed_forward_length", Value::U32(FF as u32))
        .kv("llama.attention.head_count", Value::U32(HEADS as u32))
        .kv("llama.attention.head_count_kv", Value::U32(KV_HEADS as u32))
        .kv("llama.rope.freq_base", Value::F32(10000.0))
        .kv("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5))
        .kv("tokenizer.ggml.tokens", Value::Array(Array::String(tokens)));
    let add = |wr: GgufWriter, gguf: &str, hf: &str, dtype: DType| {
        let (shape, v) = &w.0[hf];
        let v = if hf.contains("q_proj") {
            to_interleaved(v, HEADS, DIM)
        } else if hf.contains("k_proj") {
            to_interleaved(v, KV_HEADS, DIM)
        } else {
            v.clone()
        };
        let dims: Vec<u64> = shape.iter().rev().map(|&d| d as u64).collect();
        wr.tensor(gguf, &dims, GgmlType::from_dtype(dtype).unwrap(), encode(&v, shape, dtype))
    };
    let emb = if quantized { DType::Q8_0 } else { DType::F32 };
    wr = add(wr, "token_embd.weight", "model.embed_tokens.weight", emb);
    for l in 0..LAYERS {
        for (g, h, f) in gguf_layout(l) {
            let f = match formats {
                Formats::Mixed => f,
                Formats::Uniform(_) if g.contains("norm") => f,
                Formats::Uniform(u) => u,
            };
            wr = add(wr, &g, &h, f);
        }
    }
    wr = add(wr, "output_norm.weight", "model.norm.weight", DType::F32);
    if !tied {
        wr = add(wr, "output.weight", "lm_head.weight", if quantized { DType::Q6K } else { DType::F32 });
    }
    wr
}

fn cpu() -> CpuBackend {
    CpuBackend::with_threads(2).unwrap()
}

fn max_diff(a: &[f32], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(&x, &y)| (x as f64 - y).abs()).fold(0.0, f64::max)
}

const PROMPT: [u32; 7] = [3, 17, 95, 0, 42, 42, 8];

/// Every prompt position's logits (one prefill), then three decode steps, against the
/// reference; and the prompt fed in two chunks (decode_attention with several queries).
fn check_against_reference(file: &GgufFile, tol: f64) {
    let b = cpu();
    let model = load_gguf(&b, file).unwrap();
    let reference = RefLlama::from_gguf(file);
    let mut cache = reference.new_cache();
    let mut state = model.new_cache(&b, CTX).unwrap();
    let all = model.forward_cached_all(&b, &PROMPT, &mut state).unwrap().to_vec_f32().unwrap();
    for (t, &id) in PROMPT.iter().enumerate() {
        let r = reference.step(id, &mut cache, true).unwrap();
        let d = max_diff(&all[t * VOCAB..(t + 1) * VOCAB], &r);
        assert!(d < tol, "prompt position {t}: max |Δ| {d:.2e}");
    }
    for (i, id) in [5u32, 77, 5].into_iter().enumerate() {
        let fast = model.forward_cached(&b, &[id], &mut state).unwrap();
        let r = reference.step(id, &mut cache, true).unwrap();
        let d = max_diff(&fast, &r);
        assert!(d < tol, "decode step {i}: max |Δ| {d:.2e}");
    }
    // Two chunks: 4 tokens by prefill, 3 by decode_attention with Tq = 3.
    let mut state = model.new_cache(&b, CTX).unwrap();
    model.forward_cached(&b, &PROMPT[..4], &mut state).unwrap();
    let fast = model.forward_cached(&b, &PROMPT[4..], &mut state).unwrap();
    let mut cache = reference.new_cache();
    let mut r = None;
    for &id in &PROMPT {
        r = reference.step(id, &mut cache, true);
    }
    let d = max_diff(&fast, &r.unwrap());
    assert!(d < tol, "chunked prompt: max |Δ| {d:.2e}");
}

#[test]
fn gguf_every_weight_format_matches_the_reference() {
    for tied in [false, true] {
        let file = GgufFile::from_bytes(gguf_writer(&weights(1), true, tied).to_bytes()).unwrap();
        let model = load_gguf(&cpu(), &file).unwrap();
        assert_eq!(model.arch.tied_embeddings, tied);
        let mut formats: Vec<DType> = model
            .specs
            .iter()
            .zip(&model.params.tensors)
            .filter(|(s, _)| s.shape.rank() == 2 && s.name.starts_with("h."))
            .map(|(_, t)| t.dtype())
            .collect();
        formats.sort_by_key(|d| d.name());
        formats.dedup();
        // F16/BF16 matrices are widened to F32 at load; the five block formats stay.
        assert_eq!(formats.len(), 6, "{formats:?}");
        check_against_reference(&file, 2e-3);
    }
    // One format throughout: q/k/v and gate/up are stacked into one matrix each.
    for dtype in [DType::Q4K, DType::Q4_1] {
        let file =
            GgufFile::from_bytes(gguf_writer_with(&weights(4), Formats::Uniform(dtype), true).to_bytes()).unwrap();
        let model = load_gguf(&cpu(), &file).unwrap();
        assert!(model
            .index
            .layers
            .iter()
            .all(|l| l.qkv.stacked() && matches!(&l.ffn, Ffn::Dense { up, .. } if up.stacked())));
        check_against_reference(&file, 2e-3);
    }
}

/// Writes `w` as an HF Llama directory in two shards with an index, stored as `dtype`.
fn write_hf_llama(dir: &PathBuf, w: &Weights, dtype: DType, tied: bool) {
    std::fs::create_dir_all(dir).unwrap();
    let config = json!({
        "model_type": "llama", "hidden_size": DIM, "intermediate_size": FF, "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "vocab_size": VOCAB,
        "max_position_embeddings": CTX, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "tie_word_embeddings": tied, "rope_scaling": null, "hidden_act": "silu"
    });
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let mut shards: [Vec<(String, Tensor)>; 2] = [Vec::new(), Vec::new()];
    let mut map = serde_json::Map::new();
    for (i, (name, (shape, v))) in w.0.iter().enumerate() {
        if tied && name == "lm_head.weight" {
            continue;
        }
        let t = Tensor::from_vec(v.clone(), shape.clone()).unwrap();
        let t = if dtype == DType::F32 { t } else { cpu().cast(&t, dtype).unwrap() };
        let shard = i % 2;
        map.insert(name.clone(), json!(format!("model-0000{}-of-00002.safetensors", shard + 1)));
        shards[shard].push((name.clone(), t));
    }
    for (s, tensors) in shards.iter().enumerate() {
        let path = dir.join(format!("model-0000{}-of-00002.safetensors", s + 1));
        safetensors::write(&path, tensors, &BTreeMap::new()).unwrap();
    }
    std::fs::write(dir.join("model.safetensors.index.json"), json!({"weight_map": map}).to_string()).unwrap();
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("fusebox-llama-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn logits_of(model: &Transformer, b: &dyn ComputeBackend) -> Vec<f32> {
    let mut state = model.new_cache(b, CTX).unwrap();
    model.forward_cached(b, &PROMPT, &mut state).unwrap();
    model.forward_cached(b, &[9], &mut state).unwrap()
}

#[test]
fn hf_safetensors_half_split_matches_gguf_interleaved() {
    let b = cpu();
    let w = weights(2);
    for tied in [false, true] {
        let file = GgufFile::from_bytes(gguf_writer(&w, false, tied).to_bytes()).unwrap();
        let from_gguf = load_gguf(&b, &file).unwrap();
        let want = logits_of(&from_gguf, &b);
        let reference = RefLlama::from_gguf(&file);
        let mut cache = reference.new_cache();
        let mut r = None;
        for &id in PROMPT.iter().chain(&[9]) {
            r = reference.step(id, &mut cache, true);
        }
        assert!(max_diff(&want, &r.unwrap()) < 1e-3);
        for (dtype, tol) in [(DType::F32, 1e-4), (DType::BF16, 0.15), (DType::F16, 0.02)] {
            let dir = temp_dir(&format!("hf-{tied}-{dtype}"));
            write_hf_llama(&dir, &w, dtype, tied);
            let from_hf = load_hf(&b, &dir).unwrap();
            assert_eq!(from_hf.arch.rope.style, fusebox::RopeStyle::HalfSplit);
            let got = logits_of(&from_hf, &b);
            let d = want.iter().zip(&got).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
            assert!(d < tol, "{dtype} tied={tied}: max |Δ| {d:.2e}");
            std::fs::remove_dir_all(&dir).unwrap();
        }
    }
}

#[test]
fn gpt2_safetensors_transposes_conv1d_weights() {
    let b = cpu();
    let cfg = ModelConfig { max_seq: 32, ..ModelConfig::tiny(Style::Gpt2, 80, 32) };
    let model = Model::new(&b, cfg.clone(), 7).unwrap();
    let (d, f) = (cfg.d_model, cfg.d_ff);
    let get = |name: &str| -> Vec<f32> {
        let i = model.net.specs.iter().position(|s| s.name == name).unwrap_or_else(|| panic!("{name}"));
        model.net.params.tensors[i].to_vec_f32().unwrap()
    };
    // [out, in] → Conv1D [in, out].
    let conv = |v: &[f32], out: usize, inp: usize| -> Vec<f32> {
        let mut t = vec![0.0; v.len()];
        for o in 0..out {
            for i in 0..inp {
                t[i * out + o] = v[o * inp + i];
            }
        }
        t
    };
    let mut tensors: Vec<(String, Tensor)> = Vec::new();
    let mut put = |name: String, v: Vec<f32>, shape: Vec<usize>| {
        tensors.push((name, Tensor::from_vec(v, shape).unwrap()));
    };
    put("wte.weight".into(), get("wte"), vec![cfg.vocab_size, d]);
    put("wpe.weight".into(), get("wpe"), vec![cfg.max_seq, d]);
    for l in 0..cfg.n_layers {
        let g = |s: &str| get(&format!("h.{l}.{s}"));
        let n = |s: &str| format!("h.{l}.{s}");
        let mut qkv = g("attn.q.weight");
        qkv.extend(g("attn.k.weight"));
        qkv.extend(g("attn.v.weight"));
        let mut qkv_b = g("attn.q.bias");
        qkv_b.extend(g("attn.k.bias"));
        qkv_b.extend(g("attn.v.bias"));
        put(n("ln_1.weight"), g("norm1.weight"), vec![d]);
        put(n("ln_1.bias"), g("norm1.bias"), vec![d]);
        put(n("attn.c_attn.weight"), conv(&qkv, 3 * d, d), vec![d, 3 * d]);
        put(n("attn.c_attn.bias"), qkv_b, vec![3 * d]);
        put(n("attn.c_proj.weight"), conv(&g("attn.o.weight"), d, d), vec![d, d]);
        put(n("attn.c_proj.bias"), g("attn.o.bias"), vec![d]);
        put(n("ln_2.weight"), g("norm2.weight"), vec![d]);
        put(n("ln_2.bias"), g("norm2.bias"), vec![d]);
        put(n("mlp.c_fc.weight"), conv(&g("mlp.fc.weight"), f, d), vec![d, f]);
        put(n("mlp.c_fc.bias"), g("mlp.fc.bias"), vec![f]);
        put(n("mlp.c_proj.weight"), conv(&g("mlp.proj.weight"), d, f), vec![f, d]);
        put(n("mlp.c_proj.bias"), g("mlp.proj.bias"), vec![d]);
    }
    put("ln_f.weight".into(), get("norm_f.weight"), vec![d]);
    put("ln_f.bias".into(), get("norm_f.bias"), vec![d]);
    let dir = temp_dir("gpt2");
    std::fs::create_dir_all(&dir).unwrap();
    safetensors::write(&dir.join("model.safetensors"), &tensors, &BTreeMap::new()).unwrap();
    let config = json!({"model_type": "gpt2", "n_embd": d, "n_layer": cfg.n_layers, "n_head": cfg.n_heads,
                        "n_positions": cfg.max_seq, "vocab_size": cfg.vocab_size, "layer_norm_epsilon": 1e-5,
                        "activation_function": "gelu_new"});
    let with_config = |config: &serde_json::Value| {
        std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
        load_hf(&b, &dir)
    };
    let loaded = with_config(&config).unwrap();
    let ids: Vec<u32> = vec![1, 5, 79, 0, 33];
    let run = |m: &Transformer| {
        let mut cache = m.new_cache(&b, 16).unwrap();
        m.forward_cached(&b, &ids, &mut cache).unwrap();
        m.forward_cached(&b, &[4], &mut cache).unwrap()
    };
    // The file's fused c_attn runs as one stacked matrix, the trained model's as three.
    let (want, got) = (run(&model.net), run(&loaded));
    let d = want.iter().zip(&got).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
    assert!(d < 1e-5, "same weights, same logits: max |Δ| {d:.2e}");
    // Wrong activation and missing tensors are named.
    let mut bad = config.clone();
    bad["activation_function"] = json!("relu");
    assert!(with_config(&bad).unwrap_err().to_string().contains("relu"));
    let mut bigger = config.clone();
    bigger["n_layer"] = json!(cfg.n_layers + 1);
    let err = with_config(&bigger).unwrap_err().to_string();
    assert!(err.contains(&format!("h.{}.ln_1.weight", cfg.n_layers)), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn broken_files_and_long_prompts_are_errors() {
    let b = cpu();
    let w = weights(3);
    // A missing block tensor is named.
    let mut wr = gguf_writer(&w, false, true);
    wr.tensors.retain(|t| t.name != "blk.1.ffn_up.weight");
    let err = load_gguf(&b, &GgufFile::from_bytes(wr.to_bytes()).unwrap()).unwrap_err().to_string();
    assert!(err.contains("blk.1.ffn_up.weight"), "{err}");
    // A wrong shape is named.
    let mut wr = gguf_writer(&w, false, true);
    let t = wr.tensors.iter_mut().find(|t| t.name == "blk.0.attn_k.weight").unwrap();
    t.dims = vec![DIM as u64 / 2, 2 * (KV_HEADS * HD) as u64];
    let err = load_gguf(&b, &GgufFile::from_bytes(wr.to_bytes()).unwrap()).unwrap_err().to_string();
    assert!(err.contains("blk.0.attn_k.weight"), "{err}");
    // An unsupported architecture is named.
    let mut wr = gguf_writer(&w, false, true);
    wr.kvs[0].1 = Value::String("falcon".into());
    let err = load_gguf(&b, &GgufFile::from_bytes(wr.to_bytes()).unwrap()).unwrap_err().to_string();
    assert!(err.contains("falcon"), "{err}");
    // Context limits.
    let model = load_gguf(&b, &GgufFile::from_bytes(gguf_writer(&w, false, true).to_bytes()).unwrap()).unwrap();
    assert!(model.new_cache(&b, CTX + 1).is_err());
    assert!(model.new_cache(&b, 0).is_err());
    let mut state = model.new_cache(&b, 6).unwrap();
    assert!(model.forward_cached(&b, &PROMPT, &mut state).is_err(), "7 tokens into a context of 6");
    assert!(model.forward_cached(&b, &[VOCAB as u32], &mut state).is_err(), "id beyond the vocabulary");
    assert!(model.forward_cached(&b, &[], &mut state).is_err());
    // generate: a prompt longer than the context is an error; at the limit it stops.
    let mut session = Session::new(&model, &b, 8).unwrap();
    let mut sampler = fusebox_models::Sampler::new(Default::default()).unwrap();
    let err = pretrained::generate(&mut session, &b, &[1; 9], 4, &mut sampler, &[], |_| Ok(())).unwrap_err();
    assert!(err.to_string().contains("ctx-size"), "{err}");
    let g = pretrained::generate(&mut session, &b, &PROMPT, 10, &mut sampler, &[], |_| Ok(())).unwrap();
    assert_eq!((g.tokens.len(), g.stop), (2, pretrained::StopReason::ContextFull));
    let mut session = Session::new(&model, &b, 32).unwrap();
    let g = pretrained::generate(&mut session, &b, &PROMPT, 5, &mut sampler, &[], |_| Ok(())).unwrap();
    assert_eq!((g.tokens.len(), g.stop, g.decode_steps), (5, pretrained::StopReason::MaxTokens, 4));
    let first = g.tokens[0];
    let mut session = Session::new(&model, &b, 32).unwrap();
    let g = pretrained::generate(&mut session, &b, &PROMPT, 5, &mut sampler, &[first], |_| Ok(())).unwrap();
    assert_eq!((g.tokens.clone(), g.stop), (vec![first], pretrained::StopReason::StopToken));
}
