//! Qwen3.5 (`qwen35`) GGUF files as llama.cpp writes and reads them, against llama.cpp.
//!
//! `tests/fixtures/qwen3_5_gguf/model.gguf` is a tiny random-weight Qwen3.5 (three Gated
//! DeltaNet layers with 2 key heads for 4 value heads, so the converter tiles the value
//! heads; one gated full-attention layer with partial rotary) built by `transformers`
//! and converted by llama.cpp's own `convert_hf_to_gguf.py`; `reference.safetensors`
//! holds llama.cpp's (llama-cpp-python) and `transformers`' logits of a prompt and
//! llama.cpp's greedy continuation. Regenerate both with
//!     LLAMA_CPP_SRC=/tmp/lcp-src/llama_cpp_python-0.3.36 /tmp/lvenv/bin/python \
//!         scripts/record_qwen3_5_gguf_fixture.py
//!
//! * fusebox reads the converter's file and gives llama.cpp's logits (and transformers')
//!   within f32 rounding, and llama.cpp's greedy tokens wherever the top-2 gap is clear;
//! * fusebox's GGUF export of it is the converter's file again: the same metadata keys
//!   and values, tensor names, shapes, types and values (`ssm_a` to an ulp: it passes
//!   through A_log and back), and reads back as the same model;
//! * llama.cpp loads that export and computes its own logits of the original (skipped,
//!   saying why, when `scripts/record_qwen3_5_gguf_fixture.py --check-export` cannot
//!   import llama_cpp: `$FUSEBOX_PYTHON`, else `/tmp/lvenv/bin/python`, else `python3`).

use std::path::{Path, PathBuf};
use std::process::Command;

use fusebox::CpuBackend;
use fusebox_models::export::{self, gguf::Options, FloatType};
use fusebox_models::gguf::GgufFile;
use fusebox_models::open;
use fusebox_models::safetensors::SafeTensors;
use fusebox_models::{Session, Transformer};

fn cpu() -> CpuBackend {
    CpuBackend::with_threads(2).unwrap()
}

fn fixture(file: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/qwen3_5_gguf").join(file)
}

fn scratch(test: &str) -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("qwen3_5_gguf-{test}"));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

struct Reference(SafeTensors);

impl Reference {
    fn open() -> Reference {
        Reference(SafeTensors::read(&fixture("reference.safetensors")).unwrap())
    }
    fn get(&self, key: &str) -> Vec<f32> {
        self.0.tensor(key).unwrap_or_else(|e| panic!("{key}: {e}")).to_vec_f32().unwrap()
    }
    fn ids(&self, key: &str) -> Vec<u32> {
        self.get(key).iter().map(|&x| x as u32).collect()
    }
}

fn load(path: &Path) -> Transformer {
    open::load(&cpu(), path).unwrap_or_else(|e| panic!("{}: {e}", path.display())).network
}

/// Every position's logits `[T·V]`.
fn logits(net: &Transformer, ids: &[u32]) -> Vec<f32> {
    let b = cpu();
    let mut s = Session::new(net, &b, 64).unwrap();
    s.step_all(&b, ids).unwrap().to_vec_f32().unwrap()
}

/// `max |got − want| / max |want|`.
fn rel(got: &[f32], want: &[f32]) -> f64 {
    assert_eq!(got.len(), want.len());
    let scale = want.iter().fold(0f64, |m, &w| m.max(f64::from(w).abs()));
    got.iter().zip(want).fold(0f64, |m, (&g, &w)| m.max((f64::from(g) - f64::from(w)).abs())) / scale
}

#[test]
fn the_converters_file_gives_llama_cpps_logits_and_greedy_tokens() {
    let r = Reference::open();
    let net = load(&fixture("model.gguf"));
    let ids = r.ids("ids");
    let ours = logits(&net, &ids);
    let (llama, hf) = (r.get("llama_logits"), r.get("hf_logits"));
    let (to_llama, to_hf) = (rel(&ours, &llama), rel(&ours, &hf));
    eprintln!("qwen35 gguf: logits rel {to_llama:.2e} to llama.cpp, {to_hf:.2e} to transformers");
    assert!(to_llama < 1e-5, "logits rel {to_llama} to llama.cpp's");
    assert!(to_hf < 1e-4, "logits rel {to_hf} to transformers'");

    // Greedy through the cache, step by step, while the top-2 gap is far above rounding.
    let b = cpu();
    let mut s = Session::new(&net, &b, 64).unwrap();
    let mut last = s.step(&b, &ids).unwrap();
    let (greedy, gaps) = (r.ids("greedy"), r.get("gaps"));
    let mut compared = 0;
    for (step, (&want, &gap)) in greedy.iter().zip(&gaps).enumerate() {
        if gap < 1e-3 {
            break;
        }
        let top = (0..last.len()).max_by(|&x, &y| last[x].total_cmp(&last[y])).unwrap();
        assert_eq!(top as u32, want, "greedy step {step}: fusebox {top}, llama.cpp {want} (gap {gap})");
        compared += 1;
        last = s.step(&b, &[want]).unwrap();
    }
    assert!(compared >= 4, "only {compared} greedy steps had a clear gap");
}

#[test]
fn export_writes_the_converters_file() {
    let src = fixture("model.gguf");
    let out = scratch("export").join("export.gguf");
    let b = cpu();
    let net = load(&src);
    let (tok, template) = export::read_tokenizer_source(&src).unwrap();
    let opts = Options { float: FloatType::F32, quant: None };
    export::write_gguf(&b, &net, &tok, template.as_deref(), &out, &opts).unwrap();

    let (theirs, ours) = (GgufFile::open(&src).unwrap(), GgufFile::open(&out).unwrap());
    for (key, v) in theirs.metadata().iter().filter(|(k, _)| k.starts_with("qwen35.")) {
        assert_eq!(ours.metadata().get(key), Some(v), "metadata '{key}'");
    }
    let names = |f: &GgufFile| {
        let mut n: Vec<String> = f.tensors().iter().map(|t| t.name().to_string()).collect();
        n.sort();
        n
    };
    assert_eq!(names(&ours), names(&theirs));
    for info in theirs.tensors() {
        let name = info.name();
        let (t, o) = (theirs.tensor(name).unwrap(), ours.tensor(name).unwrap());
        assert_eq!((o.dims(), o.dtype()), (t.dims(), t.dtype()), "{name}");
        let (t, o) = (t.to_vec_f32().unwrap(), o.to_vec_f32().unwrap());
        if name.ends_with(".ssm_a") {
            // −e^{ln(−a)}: back to within an ulp.
            assert!(t.iter().zip(&o).all(|(t, o)| (t - o).abs() <= 2.0 * f32::EPSILON * t.abs()), "{name}");
        } else {
            assert!(t == o, "{name}: values differ from the converter's");
        }
    }

    let r = Reference::open();
    let ids = r.ids("ids");
    let back = rel(&logits(&load(&out), &ids), &logits(&net, &ids));
    assert!(back < 1e-6, "the export reads back with logits rel {back}");

    llama_cpp_runs_the_export(&out, &ids, &r.get("llama_logits"));
}

fn python() -> String {
    if let Some(p) = std::env::var_os("FUSEBOX_PYTHON") {
        return p.to_string_lossy().into_owned();
    }
    if Path::new("/tmp/lvenv/bin/python").exists() {
        return "/tmp/lvenv/bin/python".into();
    }
    "python3".into()
}

/// llama-cpp-python loads fusebox's export and computes llama.cpp's logits of the
/// converter's file (skipped when llama_cpp does not import).
fn llama_cpp_runs_the_export(path: &Path, ids: &[u32], want: &[f32]) {
    let py = python();
    if !Command::new(&py).args(["-c", "import llama_cpp, numpy"]).output().is_ok_and(|o| o.status.success()) {
        eprintln!("skipping llama.cpp on the export: {py} cannot import llama_cpp (set FUSEBOX_PYTHON)");
        return;
    }
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/record_qwen3_5_gguf_fixture.py");
    let ids_arg = ids.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
    let out = Command::new(&py)
        .arg(script)
        .args(["--check-export", &path.display().to_string(), "--ids", &ids_arg])
        .output()
        .unwrap();
    assert!(out.status.success(), "llama.cpp on the export: {}", String::from_utf8_lossy(&out.stderr));
    let json: serde_json::Value = serde_json::from_slice(out.stdout.trim_ascii()).unwrap();
    let got: Vec<f32> = json["logits"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|row| row.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32))
        .collect();
    let r = rel(&got, want);
    eprintln!("llama.cpp on fusebox's export: logits rel {r:.2e} to its own on the converter's file");
    assert!(r < 1e-5, "llama.cpp's logits on the export: rel {r}");
}
