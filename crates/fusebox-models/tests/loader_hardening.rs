//! Regression tests for the model loaders against hostile or careless inputs: each
//! test is a reproduction that used to panic, hang, run a corrupt model or print a
//! misleading error. Every file is built here from a tiny Llama (2 layers, width 8).

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::gguf_writer::GgufWriter;
use common::small_vocab::{hf_tokenizer_json, small_tokenizer_writer, small_vocab, ADDED};
use fusebox::{CpuBackend, Tensor};
use fusebox_models::gguf::{GgmlType, Value};
use fusebox_models::open;
use fusebox_models::pretrained::{self, Pretrained};
use fusebox_models::safetensors;
use fusebox_models::tokenizer::Tokenizer;
use serde_json::{json, Value as Json};

const DIM: usize = 8;
const HEADS: usize = 2;
const KV_HEADS: usize = 1;
const HD: usize = DIM / HEADS;
const FF: usize = 16;
const LAYERS: usize = 2;
const CTX: usize = 32;

fn vocab_size() -> usize {
    small_vocab().0.len() + ADDED.len()
}

fn cpu() -> CpuBackend {
    CpuBackend::with_threads(1).unwrap()
}

/// `n` deterministic small values.
fn values(n: usize, salt: usize) -> Vec<f32> {
    (0..n).map(|i| (((i * 37 + salt * 11) % 17) as f32 - 8.0) / 32.0).collect()
}

/// The model's tensors as (GGUF name, HF name, row-major shape).
fn layout() -> Vec<(String, String, Vec<usize>)> {
    let v = vocab_size();
    let mut out = vec![("token_embd.weight".into(), "model.embed_tokens.weight".into(), vec![v, DIM])];
    for l in 0..LAYERS {
        let parts: [(&str, &str, Vec<usize>); 9] = [
            ("attn_norm", "input_layernorm", vec![DIM]),
            ("attn_q", "self_attn.q_proj", vec![HEADS * HD, DIM]),
            ("attn_k", "self_attn.k_proj", vec![KV_HEADS * HD, DIM]),
            ("attn_v", "self_attn.v_proj", vec![KV_HEADS * HD, DIM]),
            ("attn_output", "self_attn.o_proj", vec![DIM, HEADS * HD]),
            ("ffn_norm", "post_attention_layernorm", vec![DIM]),
            ("ffn_gate", "mlp.gate_proj", vec![FF, DIM]),
            ("ffn_up", "mlp.up_proj", vec![FF, DIM]),
            ("ffn_down", "mlp.down_proj", vec![DIM, FF]),
        ];
        for (g, h, shape) in parts {
            out.push((format!("blk.{l}.{g}.weight"), format!("model.layers.{l}.{h}.weight"), shape));
        }
    }
    out.push(("output_norm.weight".into(), "model.norm.weight".into(), vec![DIM]));
    out
}

/// A valid tiny Llama GGUF (F32 weights, the small tokenizer, a ChatML template).
fn gguf() -> GgufWriter {
    let mut w = small_tokenizer_writer()
        .kv("general.architecture", Value::String("llama".into()))
        .kv("llama.block_count", Value::U32(LAYERS as u32))
        .kv("llama.context_length", Value::U32(CTX as u32))
        .kv("llama.embedding_length", Value::U32(DIM as u32))
        .kv("llama.feed_forward_length", Value::U32(FF as u32))
        .kv("llama.attention.head_count", Value::U32(HEADS as u32))
        .kv("llama.attention.head_count_kv", Value::U32(KV_HEADS as u32))
        .kv("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5));
    for (i, (name, _, shape)) in layout().into_iter().enumerate() {
        let n = shape.iter().product();
        let bytes = values(n, i).iter().flat_map(|x| x.to_le_bytes()).collect();
        let dims: Vec<u64> = shape.iter().rev().map(|&d| d as u64).collect();
        w = w.tensor(&name, &dims, GgmlType::F32, bytes);
    }
    w
}

fn set_kv(mut w: GgufWriter, key: &str, v: Value) -> GgufWriter {
    match w.kvs.iter_mut().find(|(k, _)| k == key) {
        Some(kv) => kv.1 = v,
        None => w.kvs.push((key.to_owned(), v)),
    }
    w
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("fusebox-hardening-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn load(path: &Path) -> Result<Pretrained, String> {
    open::load(&cpu(), path).map_err(|e| e.to_string())
}

/// Writes `bytes` as `name` in a fresh directory and loads it.
fn load_gguf_bytes(name: &str, bytes: &[u8]) -> Result<Pretrained, String> {
    let dir = temp_dir(name);
    let path = dir.join(format!("{name}.gguf"));
    std::fs::write(&path, bytes).unwrap();
    let out = load(&path);
    std::fs::remove_dir_all(&dir).unwrap();
    out
}

fn gguf_err(name: &str, bytes: &[u8]) -> String {
    match load_gguf_bytes(name, bytes) {
        Ok(_) => panic!("{name}: the corrupt GGUF loaded"),
        Err(e) => e,
    }
}

/// Where tensor `name`'s info (n_dims, dims, type, offset) starts in a GGUF's bytes.
fn info_at(bytes: &[u8], name: &str) -> usize {
    let mut needle = (name.len() as u64).to_le_bytes().to_vec();
    needle.extend_from_slice(name.as_bytes());
    let at = bytes.windows(needle.len()).position(|w| w == needle).unwrap();
    at + needle.len()
}

/// Overwrites tensor `name`'s ggml type and/or data offset in place.
fn patch_info(bytes: &mut [u8], name: &str, ty: Option<u32>, offset: Option<u64>) {
    let at = info_at(bytes, name);
    let n_dims = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
    let ty_at = at + 4 + 8 * n_dims;
    if let Some(ty) = ty {
        bytes[ty_at..ty_at + 4].copy_from_slice(&ty.to_le_bytes());
    }
    if let Some(off) = offset {
        bytes[ty_at + 4..ty_at + 12].copy_from_slice(&off.to_le_bytes());
    }
}

fn tokenizer_json() -> Json {
    hf_tokenizer_json(json!({"type": "ByteLevel", "add_prefix_space": false, "use_regex": true}))
}

fn hf_config() -> Json {
    json!({
        "model_type": "llama", "hidden_size": DIM, "intermediate_size": FF, "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "vocab_size": vocab_size(),
        "max_position_embeddings": CTX, "rms_norm_eps": 1e-5, "tie_word_embeddings": true, "hidden_act": "silu"
    })
}

/// The tiny model's HF tensors.
fn hf_tensors() -> Vec<(String, Tensor)> {
    layout()
        .into_iter()
        .enumerate()
        .map(|(i, (_, name, shape))| {
            let n = shape.iter().product();
            (name, Tensor::from_vec(values(n, i), shape).unwrap())
        })
        .collect()
}

/// A valid tiny HF Llama directory in one `model.safetensors`.
fn hf_dir(name: &str) -> PathBuf {
    let dir = temp_dir(name);
    std::fs::write(dir.join("config.json"), hf_config().to_string()).unwrap();
    std::fs::write(dir.join("tokenizer.json"), tokenizer_json().to_string()).unwrap();
    safetensors::write(&dir.join("model.safetensors"), &hf_tensors(), &BTreeMap::new()).unwrap();
    dir
}

fn hf_err(dir: &Path) -> String {
    match load(dir) {
        Ok(_) => panic!("{}: the corrupt directory loaded", dir.display()),
        Err(e) => e,
    }
}

#[test]
fn the_tiny_models_load_and_run() {
    let b = cpu();
    let p = load_gguf_bytes("valid", &gguf().to_bytes()).unwrap();
    let mut s = p.session(&b, 8).unwrap();
    let mut sampler = fusebox_models::Sampler::new(Default::default()).unwrap();
    let g = pretrained::generate(&mut s, &b, &[1, 2, 3], 2, &mut sampler, &[], |_| Ok(())).unwrap();
    assert_eq!(g.tokens.len(), 2);
    assert!(p.chat_template().is_ok());
    let dir = hf_dir("valid");
    let p = load(&dir).unwrap();
    assert!(p.description.contains("hf llama"), "{}", p.description);
    std::fs::remove_dir_all(&dir).unwrap();
}

// 1 (a): an id past the vocabulary in tokenizer.json indexed out of bounds.
#[test]
fn tokenizer_json_ids_past_the_vocabulary_are_errors() {
    let mut j = tokenizer_json();
    j["model"]["vocab"]["zzz"] = json!(18446744073709551615u64);
    let e = Tokenizer::from_hf_json(&j.to_string(), None).err().unwrap().to_string();
    assert!(e.contains("\"zzz\"") && e.contains("18446744073709551615"), "{e}");
    let mut j = tokenizer_json();
    j["added_tokens"][0]["id"] = json!(18446744073709551615u64);
    let e = Tokenizer::from_hf_json(&j.to_string(), None).err().unwrap().to_string();
    assert!(e.contains("added token") && e.contains("<|im_start|>"), "{e}");
    let mut j = tokenizer_json();
    j["added_tokens"][0]["id"] = json!(-1);
    assert!(Tokenizer::from_hf_json(&j.to_string(), None).is_err());
}

// 6: duplicate tokenizer ids were accepted (the later entry silently replaced the first).
#[test]
fn duplicate_tokenizer_ids_are_refused() {
    let mut j = tokenizer_json();
    j["model"]["vocab"]["zzz"] = json!(5);
    let e = Tokenizer::from_hf_json(&j.to_string(), None).err().unwrap().to_string();
    assert!(e.contains("share the id 5") && e.contains("\"zzz\""), "{e}");
    let mut j = tokenizer_json();
    j["added_tokens"][1]["id"] = j["added_tokens"][0]["id"].clone();
    let e = Tokenizer::from_hf_json(&j.to_string(), None).err().unwrap().to_string();
    assert!(e.contains("two added tokens"), "{e}");
    // An added token in the place of a vocabulary entry stays allowed.
    let mut j = tokenizer_json();
    j["added_tokens"][0]["id"] = json!(3);
    j["added_tokens"][1]["id"] = json!(256 + 7);
    j["added_tokens"][2]["id"] = json!(256 + 8);
    assert!(Tokenizer::from_hf_json(&j.to_string(), None).is_ok());
}

// 2: context_length 2^32−1 with a huge --ctx-size aborted in the allocator.
#[test]
fn a_context_that_does_not_fit_is_an_error() {
    let b = cpu();
    let w = set_kv(gguf(), "llama.context_length", Value::U32(u32::MAX));
    let p = load_gguf_bytes("ctx", &w.to_bytes()).unwrap();
    assert_eq!(p.context_length(), u32::MAX as usize);
    let e = p.session(&b, u32::MAX as usize).err().unwrap().to_string();
    assert!(e.contains("KV cache") && e.contains("4294967295 positions"), "{e}");
    assert!(p.session(&b, 16).is_ok());
    // A tensor too large for memory is an error, not an abort.
    assert!(fusebox::Tensor::zeros([1usize << 60], fusebox::DType::U32).is_err());
}

/// Runs `f` on another thread; fails when it has not returned within 20 s (a hang).
fn within_time<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(20)).unwrap_or_else(|_| panic!("{what}: hung"))
}

fn mkfifo(path: &Path) {
    let _ = std::fs::remove_file(path);
    assert!(std::process::Command::new("mkfifo").arg(path).status().unwrap().success());
}

fn symlink_to_dev_zero(path: &Path) {
    let _ = std::fs::remove_file(path);
    std::os::unix::fs::symlink("/dev/zero", path).unwrap();
}

// 3: a FIFO hung the loader; /dev/zero behind a symlink was read until memory ran out.
#[test]
fn special_files_are_refused() {
    for file in ["model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json"] {
        for kind in ["fifo", "zero"] {
            let dir = hf_dir(&format!("special-{kind}-{}", file.replace('.', "-")));
            let path = dir.join(file);
            if kind == "fifo" {
                mkfifo(&path);
            } else {
                symlink_to_dev_zero(&path);
            }
            if file == "config.json" {
                // Routed to the loader (which refuses it), not to a checkpoint reader.
                assert!(open::is_pretrained(&dir), "{file} as {kind}");
            }
            let d = dir.clone();
            let e = within_time(file, move || load(&d).err());
            let e = e.unwrap_or_else(|| panic!("{file} as {kind} loaded"));
            assert!(e.contains(file) && (e.contains("FIFO") || e.contains("character device")), "{file} {kind}: {e}");
            std::fs::remove_dir_all(&dir).unwrap();
        }
    }
    let dir = temp_dir("special-gguf");
    let fifo = dir.join("m.gguf");
    mkfifo(&fifo);
    let f = fifo.clone();
    let e = within_time("fifo gguf", move || load(&f).err()).unwrap();
    assert!(e.contains("m.gguf"), "{e}");
    assert!(!open::is_pretrained(&dir.join("missing.bin")));
    let zero = dir.join("z.gguf");
    symlink_to_dev_zero(&zero);
    let e = within_time("/dev/zero gguf", move || load(&zero).err()).unwrap();
    assert!(e.contains("character device"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

// 6: GGUF tensors whose type or offset made their data overlap another tensor's or
// leave the data section, an alignment contradicting the data start, and a block_count
// below the blocks present all loaded.
#[test]
fn gguf_layout_corruptions_are_refused_by_name() {
    let good = gguf().to_bytes();
    assert!(load_gguf_bytes("good", &good).is_ok());

    // F32 → F16 halves the size: the next tensor's offset leaves bytes unexplained.
    let mut b = good.clone();
    patch_info(&mut b, "blk.0.attn_q.weight", Some(1), None);
    let e = gguf_err("type-smaller", &b);
    assert!(e.contains("blk.0.attn_k.weight") && e.contains("blk.0.attn_q.weight"), "{e}");
    // An offset that points back at the first tensor's data.
    let mut b = good.clone();
    patch_info(&mut b, "blk.1.ffn_gate.weight", Some(GgmlType::F32.0), Some(0));
    let e = gguf_err("offset-overlap", &b);
    assert!(e.contains("blk.1.ffn_gate.weight") && e.contains("offset 0"), "{e}");
    // An offset past the data section.
    let mut b = good.clone();
    patch_info(&mut b, "output_norm.weight", None, Some(1 << 20));
    let e = gguf_err("offset-past-end", &b);
    assert!(e.contains("output_norm.weight"), "{e}");
    // general.alignment 256 contradicts where the writer (alignment 32) put the data.
    let mut w = gguf();
    w.kvs.push(("general.alignment".into(), Value::U32(256)));
    let e = gguf_err("alignment", &w.to_bytes());
    assert!(e.contains("alignment 256") || e.contains("general.alignment 256"), "{e}");
    // block_count 1 with two blocks present.
    let w = set_kv(gguf(), "llama.block_count", Value::U32(1));
    let e = gguf_err("block-count", &w.to_bytes());
    assert!(e.contains("blk.1.") && e.contains("block_count 1"), "{e}");
    // A tensor the llama layout has none of (a bias) is not dropped silently.
    let w = gguf().tensor("blk.0.attn_q.bias", &[DIM as u64], GgmlType::F32, vec![0; DIM * 4]);
    let e = gguf_err("bias", &w.to_bytes());
    assert!(e.contains("blk.0.attn_q.bias"), "{e}");
    // Trailing bytes after the last tensor's padding.
    let mut b = good.clone();
    b.extend(std::iter::repeat_n(7u8, 100));
    let e = gguf_err("trailing", &b);
    assert!(e.contains("belong to no tensor") && e.contains("output_norm.weight"), "{e}");
}

/// Rewrites the header of a safetensors file through `edit`, keeping the data.
fn edit_header(path: &Path, edit: impl FnOnce(&mut serde_json::Map<String, Json>), extra_data: usize) {
    let bytes = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let mut header: serde_json::Map<String, Json> = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    edit(&mut header);
    let text = Json::Object(header).to_string();
    let mut out = (text.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(text.as_bytes());
    out.extend_from_slice(&bytes[8 + n..]);
    out.extend(std::iter::repeat_n(0u8, extra_data));
    std::fs::write(path, out).unwrap();
}

// 6: safetensors with overlapping data_offsets, trailing bytes, the same tensor in two
// shards; num_hidden_layers below the layers present; hidden_act not a string.
#[test]
fn hf_corruptions_are_refused_by_name() {
    let dir = hf_dir("st-overlap");
    edit_header(
        &dir.join("model.safetensors"),
        |h| {
            let a = h["model.layers.0.mlp.up_proj.weight"]["data_offsets"].clone();
            h.get_mut("model.layers.0.mlp.gate_proj.weight").unwrap()["data_offsets"] = a;
        },
        0,
    );
    let e = hf_err(&dir);
    assert!(e.contains("overlap") && e.contains("model.layers.0.mlp."), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();

    let dir = hf_dir("st-trailing");
    edit_header(&dir.join("model.safetensors"), |_| {}, 12);
    let e = hf_err(&dir);
    assert!(e.contains("12 trailing bytes") && e.contains("model.safetensors"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();

    let dir = hf_dir("st-two-shards");
    let t = hf_tensors();
    safetensors::write(&dir.join("extra.safetensors"), &t[..1], &BTreeMap::new()).unwrap();
    let e = hf_err(&dir);
    assert!(e.contains("two shards") && e.contains(&t[0].0), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();

    let dir = hf_dir("layers");
    let mut c = hf_config();
    c["num_hidden_layers"] = json!(1);
    std::fs::write(dir.join("config.json"), c.to_string()).unwrap();
    let e = hf_err(&dir);
    assert!(e.contains("model.layers.1.") && e.contains("1-layer"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();

    let dir = hf_dir("act");
    let mut c = hf_config();
    c["hidden_act"] = json!(["gelu"]);
    std::fs::write(dir.join("config.json"), c.to_string()).unwrap();
    let e = hf_err(&dir);
    assert!(e.contains("hidden_act") && e.contains("expected a string"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

// 8: errors that did not name the field or the file, or named the wrong thing.
#[test]
fn errors_name_the_file_field_and_values() {
    let with = |key: &str, v: u32| set_kv(gguf(), key, Value::U32(v)).to_bytes();
    let e = gguf_err("emb0", &with("llama.embedding_length", 0));
    assert!(e.contains("emb0.gguf") && e.contains("llama.embedding_length") && e.contains("got 0"), "{e}");
    assert!(!e.contains("partial rotary"), "{e}");
    let e = gguf_err("heads7", &with("llama.attention.head_count", 7));
    assert!(e.contains("heads7.gguf") && e.contains("llama.attention.head_count") && e.contains("got 7"), "{e}");
    let e = gguf_err("key0", &with("llama.attention.key_length", 0));
    assert!(e.contains("llama.attention.key_length") && e.contains("got 0"), "{e}");
    let e = gguf_err("ff0", &with("llama.feed_forward_length", 0));
    assert!(e.contains("llama.feed_forward_length") && !e.contains("LlamaConfig {"), "{e}");
    let mut w = gguf();
    w.kvs.retain(|(k, _)| k != "llama.context_length");
    let e = gguf_err("no-ctx", &w.to_bytes());
    assert!(e.contains("no-ctx.gguf") && e.contains("llama.context_length"), "{e}");

    // An HF config.json without model_type.
    let dir = hf_dir("no-model-type");
    let mut c = hf_config();
    c.as_object_mut().unwrap().remove("model_type");
    std::fs::write(dir.join("config.json"), c.to_string()).unwrap();
    assert!(open::is_pretrained(&dir));
    let e = hf_err(&dir);
    assert!(e.contains("model_type") && !e.contains("style"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();

    // A valid GGUF under another extension.
    let dir = temp_dir("bin");
    let path = dir.join("x.bin");
    std::fs::write(&path, gguf().to_bytes()).unwrap();
    assert!(open::is_pretrained(&path));
    assert!(load(&path).is_ok());
    std::fs::remove_dir_all(&dir).unwrap();

    // A chat template that does not parse says so, quoting minijinja, rather than "no template".
    let w = set_kv(gguf(), "tokenizer.chat_template", Value::String("{% for m in messages %}[INST]".into()));
    let p = load_gguf_bytes("template", &w.to_bytes()).unwrap();
    let e = p.chat_template().err().unwrap().to_string();
    assert!(
        e.contains("tokenizer.chat_template") && e.contains("does not parse") && e.contains("template.gguf"),
        "{e}"
    );
    // No template: ChatML, with a notice.
    let mut w = gguf();
    w.kvs.retain(|(k, _)| k != "tokenizer.chat_template");
    let p = load_gguf_bytes("no-template", &w.to_bytes()).unwrap();
    let t = p.chat_template().unwrap();
    assert!(t.notice().is_some_and(|n| n.contains("no chat template") && n.contains("ChatML")), "{:?}", t.notice());
    assert_eq!(t.apply(&[("user", "hi")], true).unwrap(), "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
}

/// `tokenizer_config.json`'s `chat_template` as a list of named templates: `default` is
/// used, as transformers does; a list without one names what it has.
#[test]
fn named_chat_templates_use_default() {
    let dir = hf_dir("named-templates");
    let write = |v: Json| std::fs::write(dir.join("tokenizer_config.json"), v.to_string()).unwrap();
    write(json!({"chat_template": [
        {"name": "tool_use", "template": "TOOLS"},
        {"name": "default", "template": "{% for m in messages %}[{{ m.content }}]{% endfor %}"}
    ]}));
    let p = load(&dir).unwrap();
    assert_eq!(p.chat_template().unwrap().apply(&[("user", "hi")], true).unwrap(), "[hi]");
    write(json!({"chat_template": [{"name": "tool_use", "template": "TOOLS"}, {"name": "rag", "template": "R"}]}));
    let e = load(&dir).unwrap().chat_template().err().unwrap().to_string();
    assert!(e.contains("no 'default'") && e.contains("tool_use, rag"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

// Issue 34, item 5: a layer count from the file sized the parameter plan before anything
// checked it, so a GGUF whose `llama.block_count` is 4294967295 or a `config.json` whose
// `num_hidden_layers` is 2^40 aborted the process (`memory allocation of 1786706394720
// bytes failed`). Counts are now checked against the tensors the file holds first.
#[test]
fn layer_counts_past_the_tensors_present_are_errors_not_aborts() {
    let w = set_kv(gguf(), "llama.block_count", Value::U32(u32::MAX));
    let e = gguf_err("block-count-max", &w.to_bytes());
    assert!(e.contains("llama.block_count") && e.contains("4294967295"), "{e}");

    let dir = hf_dir("layers-2-40");
    let mut c = hf_config();
    c["num_hidden_layers"] = json!(1u64 << 40);
    std::fs::write(dir.join("config.json"), c.to_string()).unwrap();
    let e = hf_err(&dir);
    assert!(e.contains("num_hidden_layers") && e.contains("1099511627776"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

// Item 5 for the other sizes a file states: each is checked against the tensors present
// before it sizes anything (the context is checked against memory when a cache is made:
// `a_context_that_does_not_fit_is_an_error`).
#[test]
fn huge_sizes_in_metadata_are_errors_not_aborts() {
    for (key, v) in [
        ("llama.embedding_length", u32::MAX - 1),
        ("llama.feed_forward_length", u32::MAX),
        ("llama.attention.head_count", 1 << 31),
        ("llama.attention.head_count_kv", 1 << 30),
        ("llama.attention.key_length", 1 << 30),
        ("llama.vocab_size", u32::MAX),
    ] {
        let w = set_kv(gguf(), key, Value::U32(v));
        let e = gguf_err("huge-size", &w.to_bytes());
        // The key itself, the head size derived from it, or the tensor whose shape it contradicts.
        assert!(e.contains(key) || e.contains("head_dim") || e.contains("shape"), "{key} = {v}: {e}");
    }
    for (key, v) in [
        ("hidden_size", 1u64 << 40),
        ("intermediate_size", 1 << 40),
        ("num_attention_heads", 1 << 40),
        ("num_key_value_heads", 1 << 39),
        ("head_dim", 1 << 40),
        ("vocab_size", 1 << 40),
    ] {
        let dir = hf_dir("huge-size");
        let mut c = hf_config();
        c[key] = json!(v);
        std::fs::write(dir.join("config.json"), c.to_string()).unwrap();
        let e = hf_err(&dir);
        assert!(e.contains(key) || e.contains("head_dim") || e.contains("shape"), "{key} = {v}: {e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
