//! LoRA fine-tuning over a frozen base: the adapted model equals the base at step 0, the
//! adapters' gradients are the full gradient projected (at B = 0) and match finite
//! differences (B ≠ 0) and PyTorch autograd through PEFT (Llama 3, Qwen3, Gemma 3), a
//! block-format GGUF base stays in its blocks and trains, and a LoRA run resumes
//! bit-identically and merges for export.

mod fine_tune;

use std::path::{Path, PathBuf};

use fusebox::{ComputeBackend, CpuBackend, DType, Tensor};
use fusebox_models::data::sequences::{self, IGNORE};
use fusebox_models::export::{self, gguf::Options, FloatType};
use fusebox_models::finetune::{self, FineTuner, Loaded};
use fusebox_models::params::ParamSet;
use fusebox_models::rng::Rng;
use fusebox_models::train::TrainConfig;
use fusebox_models::transformer::{Adapters, LoraConfig, Target, Transformer};
use fusebox_models::weights::Purpose;

use fine_tune::{fixture, text_file, TempDir};

/// The settings of these runs.
fn config(steps: u64) -> TrainConfig {
    fine_tune::config(steps, 1e-2, 0.0)
}

/// A batch of 2 sequences of 12 token ids (and their next-token targets) below `vocab`.
fn batch(b: &CpuBackend, vocab: usize) -> (Tensor, Tensor) {
    let mut rng = Rng::new(11);
    let ids: Vec<u32> = (0..24).map(|_| rng.below(vocab) as u32).collect();
    let targets: Vec<u32> = (0..24).map(|_| rng.below(vocab) as u32).collect();
    (
        b.upload(&Tensor::from_vec(ids, [2, 12]).unwrap()).unwrap(),
        b.upload(&Tensor::from_vec(targets, [2, 12]).unwrap()).unwrap(),
    )
}

fn host(b: &CpuBackend, t: &Tensor) -> Vec<f32> {
    b.to_host(t).unwrap().to_vec::<f32>().unwrap()
}

fn lora_grads(b: &CpuBackend, net: &Transformer, ids: &Tensor, targets: &Tensor) -> (f32, ParamSet) {
    let mut g = ParamSet::zeros(b, &net.lora.as_ref().unwrap().specs).unwrap();
    let loss = net.lora_loss_and_grads(b, ids, targets, Some(IGNORE), 1.0, &mut g).unwrap();
    (loss, g)
}

/// At B = 0 the adapted model is the base exactly, dL/dA = 0, and
/// dL/dB = (α/r)·G·Aᵀ with G = dL/dW the full fine-tuning gradient of the adapted rows.
#[test]
fn adapters_start_at_the_base_with_the_projected_full_gradient() {
    let b = CpuBackend::with_threads(2).unwrap();
    for arch in ["llama", "gpt2", "phi3", "qwen3_5"] {
        let mut net = finetune::load_base(&b, &fixture(arch)).unwrap().net;
        let (ids, targets) = batch(&b, net.arch.vocab_size);
        let (base_logits, _) = net.forward(&b, &ids).unwrap();
        let mut full = ParamSet::zeros(&b, &net.specs).unwrap();
        let full_loss = net.loss_and_grads(&b, &ids, &targets, Some(IGNORE), 1.0, &mut full).unwrap();

        let mut cfg = LoraConfig::new(4);
        cfg.alpha = 3.0;
        if arch == "gpt2" {
            cfg.targets = vec![Target::Q, Target::V, Target::O, Target::Up, Target::Down];
        }
        if arch == "qwen3_5" {
            cfg.targets.extend(Target::LINEAR);
        }
        let adapters = Adapters::init(&b, &net.arch, cfg.clone(), 5).unwrap();
        net.attach_lora(adapters).unwrap();
        let (lora_logits, _) = net.forward(&b, &ids).unwrap();
        let (l0, l1) = (host(&b, &base_logits), host(&b, &lora_logits));
        assert!(l0.iter().zip(&l1).all(|(x, y)| x.to_bits() == y.to_bits()), "{arch}: step-0 logits differ");
        let (loss, grads) = lora_grads(&b, &net, &ids, &targets);
        assert_eq!(loss.to_bits(), full_loss.to_bits(), "{arch}: step-0 loss");

        let ad = net.lora.as_ref().unwrap();
        let stacked = net.specs.iter().any(|s| s.name.contains(".attn.qkv."));
        let gated = net.arch.mlp.gated();
        for (i, &(l, t)) in ad.sites().iter().enumerate() {
            let da = host(&b, &grads.tensors[2 * i]);
            assert!(da.iter().all(|&x| x == 0.0), "{arch} h.{l}.{}: dA ≠ 0 at B = 0", t.name());
            // G's rows for this target.
            let (name, start) = match (t, stacked, gated) {
                (Target::Q | Target::K | Target::V, true, _) => {
                    let q = net.arch.q_dim();
                    let kv = net.arch.kv_dim();
                    let start = match t {
                        Target::Q => 0,
                        Target::K => q,
                        _ => q + kv,
                    };
                    (format!("h.{l}.attn.qkv.weight"), start)
                }
                (Target::Q, ..) => (format!("h.{l}.attn.q.weight"), 0),
                (Target::K, ..) => (format!("h.{l}.attn.k.weight"), 0),
                (Target::V, ..) => (format!("h.{l}.attn.v.weight"), 0),
                (Target::O, ..) => (format!("h.{l}.attn.o.weight"), 0),
                // A Gated DeltaNet's projections: `linear.qkv`, …, `linear.out`.
                (Target::InQkv | Target::InZ | Target::InB | Target::InA | Target::Out, ..) => {
                    (format!("h.{l}.linear.{}.weight", t.name().trim_start_matches("in_")), 0)
                }
                (Target::Gate, _, _) if net.specs.iter().any(|s| s.name == format!("h.{l}.mlp.gate_up.weight")) => {
                    (format!("h.{l}.mlp.gate_up.weight"), 0)
                }
                (Target::Up, _, true) if net.specs.iter().any(|s| s.name == format!("h.{l}.mlp.gate_up.weight")) => {
                    (format!("h.{l}.mlp.gate_up.weight"), net.arch.d_ff)
                }
                (Target::Gate, ..) => (format!("h.{l}.mlp.gate.weight"), 0),
                (Target::Up, _, true) => (format!("h.{l}.mlp.up.weight"), 0),
                (Target::Up, _, false) => (format!("h.{l}.mlp.fc.weight"), 0),
                (Target::Down, _, true) => (format!("h.{l}.mlp.down.weight"), 0),
                (Target::Down, _, false) => (format!("h.{l}.mlp.proj.weight"), 0),
            };
            let w = net.specs.iter().position(|s| s.name == name).unwrap_or_else(|| panic!("{arch}: no {name}"));
            let g = host(&b, &full.tensors[w]);
            let cols = net.specs[w].shape.dims()[1];
            let a = host(&b, &ad.params.tensors[2 * i]);
            let db = host(&b, &grads.tensors[2 * i + 1]);
            let (r, out) = (cfg.rank, db.len() / cfg.rank);
            let mut want = vec![0f64; out * r];
            for o in 0..out {
                for k in 0..r {
                    let row = &g[(start + o) * cols..(start + o + 1) * cols];
                    let dot: f64 =
                        row.iter().zip(&a[k * cols..(k + 1) * cols]).map(|(&x, &y)| x as f64 * y as f64).sum();
                    want[o * r + k] = cfg.scale() as f64 * dot;
                }
            }
            let scale = want.iter().fold(0f64, |m, w| m.max(w.abs()));
            let err = db.iter().zip(&want).fold(0f64, |m, (&x, w)| m.max((x as f64 - w).abs()));
            assert!(scale > 0.0, "{arch} h.{l}.{}: zero gradient", t.name());
            assert!(err <= 1e-4 * scale, "{arch} h.{l}.{}: dB off by {err} (scale {scale})", t.name());
        }
    }
}

/// With B ≠ 0 the analytic adapter gradient matches central differences of the loss along
/// a random direction of the A's and, separately, of the B's.
///
/// Tolerance: the loss (≈ 5) is an f32 reduction with relative rounding ~1e-6, so each
/// difference quotient carries ~5e-6/(2h) = 2.5e-3 of noise at h = 1e-3; the truncation
/// error is O(h²·L''') — the fixtures are strongly curved (initializer range 0.5: at
/// h = 1e-2 the llama quotient is 30% off, at 1e-3 under 0.5%). The directional
/// derivatives compared are O(0.3–1.5), so 2% relative plus 1e-3 absolute leaves a margin
/// yet catches any missing factor (α/r, a transpose, a lost term).
#[test]
fn adapter_gradients_match_finite_differences() {
    let b = CpuBackend::with_threads(2).unwrap();
    for arch in ["llama", "gemma3", "qwen3_moe", "qwen3_5", "qwen3_next", "qwen3_5_moe"] {
        let mut net = finetune::load_base(&b, &fixture(arch)).unwrap().net;
        // `loss` is the cross-entropy alone: the experts' load-balancing term is left out
        // of the gradient too (each expert's own adapters are checked, routing fixed by
        // the small step).
        if let Some(m) = net.arch.moe.as_mut() {
            m.aux_loss_coef = 0.0;
        }
        let (ids, targets) = batch(&b, net.arch.vocab_size);
        let mut ad = Adapters::init(&b, &net.arch, every_target(&net.arch, 3), 9).unwrap();
        let mut rng = Rng::new(3);
        for i in 0..ad.sites().len() {
            let t = &mut ad.params.tensors[2 * i + 1];
            let v = rng.uniform_vec(t.elem_count(), -0.3, 0.3);
            b.copy_into(t, &Tensor::from_vec(v, t.shape().clone()).unwrap()).unwrap();
        }
        net.attach_lora(ad).unwrap();
        let (_, grads) = lora_grads(&b, &net, &ids, &targets);
        for which in [0usize, 1] {
            let n = net.lora.as_ref().unwrap().sites().len();
            let dirs: Vec<Vec<f32>> =
                (0..n).map(|i| rng.uniform_vec(grads.tensors[2 * i + which].elem_count(), -1.0, 1.0)).collect();
            let analytic: f64 = (0..n)
                .map(|i| {
                    host(&b, &grads.tensors[2 * i + which])
                        .iter()
                        .zip(&dirs[i])
                        .map(|(&g, &d)| g as f64 * d as f64)
                        .sum::<f64>()
                })
                .sum();
            let h = 1e-3f32;
            let shifted = |sign: f32, net: &mut Transformer| -> f32 {
                let ad = net.lora.as_mut().unwrap();
                for (i, d) in dirs.iter().enumerate() {
                    let t = &mut ad.params.tensors[2 * i + which];
                    let v: Vec<f32> = host(&b, t).iter().zip(d).map(|(x, d)| x + sign * h * d).collect();
                    b.copy_into(t, &Tensor::from_vec(v, t.shape().clone()).unwrap()).unwrap();
                }
                net.loss(&b, &ids, &targets, Some(IGNORE)).unwrap()
            };
            let up = shifted(1.0, &mut net);
            let down = shifted(-2.0, &mut net);
            shifted(1.0, &mut net);
            let numeric = (up as f64 - down as f64) / (2.0 * h as f64);
            let tol = 2e-2 * analytic.abs() + 1e-3;
            assert!(
                (numeric - analytic).abs() <= tol,
                "{arch} {}: numeric {numeric} vs analytic {analytic}",
                if which == 0 { "A" } else { "B" }
            );
        }
    }
}

/// Rank `rank` on every projection of `arch`: the seven attention and MLP targets and,
/// with Gated DeltaNet layers, their five.
fn every_target(arch: &fusebox_models::transformer::Arch, rank: usize) -> LoraConfig {
    let mut cfg = LoraConfig::new(rank);
    if arch.linear_attention.is_some() {
        cfg.targets.extend(Target::LINEAR);
    }
    cfg
}

/// Adapters on `net` with B drawn from ±0.3 (not zero, so they change the model).
fn nonzero_adapters(b: &CpuBackend, net: &Transformer, cfg: LoraConfig, seed: u64) -> Adapters {
    let mut ad = Adapters::init(b, &net.arch, cfg, seed).unwrap();
    let mut rng = Rng::new(seed + 1);
    for i in 0..ad.sites().len() {
        let t = &mut ad.params.tensors[2 * i + 1];
        let v = rng.uniform_vec(t.elem_count(), -0.3, 0.3);
        b.copy_into(t, &Tensor::from_vec(v, t.shape().clone()).unwrap()).unwrap();
    }
    ad
}

/// The hybrid models' adapters on the Gated DeltaNet projections (and on attention, with
/// its output gate's rows in q, and the MLP or experts) merge into the weights: the merged
/// network gives the adapted one's logits. A PEFT export names the linear layers'
/// modules as transformers does (`linear_attn.in_proj_qkv`, …, `out_proj`), and is
/// refused for Qwen3-Next, whose checkpoint fuses them (`in_proj_qkvz`, `in_proj_ba`).
#[test]
fn gated_deltanet_adapters_merge_and_export_as_peft() {
    let b = CpuBackend::with_threads(2).unwrap();
    for arch in ["qwen3_5", "qwen3_next", "qwen3_5_moe"] {
        let mut net = fusebox_models::weights::load_hf_for(&b, &fixture(arch), Purpose::Training).unwrap();
        let ad = nonzero_adapters(&b, &net, every_target(&net.arch, 2), 5);
        let l0 = (0..net.arch.n_layers).find(|&l| net.arch.is_linear(l)).unwrap();
        let la = net.arch.linear_attention.unwrap();
        let shape = |name: &str| ad.specs.iter().find(|s| s.name == name).map(|s| s.shape.dims().to_vec());
        assert_eq!(shape(&format!("h.{l0}.linear.qkv.lora_B")), Some(vec![la.conv_channels(), 2]));
        assert_eq!(shape(&format!("h.{l0}.linear.out.lora_A")), Some(vec![2, la.value_width()]));
        assert_eq!(shape(&format!("h.{l0}.attn.q.lora_A")), None, "{arch}: a linear layer has no q");
        let (ids, _) = batch(&b, net.arch.vocab_size);
        let base = host(&b, &net.forward(&b, &ids).unwrap().0);
        net.attach_lora(ad).unwrap();
        let adapted = host(&b, &net.forward(&b, &ids).unwrap().0);

        let dir = TempDir::new(&format!("lora-peft-{arch}"));
        let out = dir.0.join("adapter");
        // PEFT has no module for a per-expert adapter: attention and the linear layers only.
        let mut cfg = LoraConfig::new(2);
        cfg.targets = [Target::Q, Target::K, Target::V, Target::O].into_iter().chain(Target::LINEAR).collect();
        let peft = Adapters::init(&b, &net.arch, cfg, 3).unwrap();
        let written = export::peft::write(&b, &net.arch, &peft, "base", &out);
        if arch == "qwen3_next" {
            let e = written.unwrap_err().to_string();
            assert!(e.contains("fuse") && e.contains("linear.qkv"), "{arch}: {e}");
            assert!(!out.exists());
        } else {
            written.unwrap();
            let st = fusebox_models::safetensors::SafeTensors::read(&out.join("adapter_model.safetensors")).unwrap();
            let layers = "base_model.model.model.layers";
            for module in ["in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj"] {
                let a = st.tensor(&format!("{layers}.{l0}.linear_attn.{module}.lora_A.weight")).unwrap();
                assert_eq!(a.dims()[0], 2, "{arch} {module}");
            }
            let q = st.tensor(&format!("{layers}.{}.self_attn.q_proj.lora_B.weight", net.arch.n_layers - 1)).unwrap();
            assert_eq!(q.dims(), [net.arch.q_proj_width(), 2], "{arch}: q_proj with its gate rows");
            let config: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(out.join("adapter_config.json")).unwrap()).unwrap();
            let modules = config["target_modules"].as_array().unwrap();
            assert!(modules.iter().any(|m| m == "in_proj_qkv") && modules.iter().any(|m| m == "out_proj"));
        }

        net.merge_lora(&b).unwrap();
        let merged = host(&b, &net.forward(&b, &ids).unwrap().0);
        let diff = |a: &[f32], c: &[f32]| a.iter().zip(c).map(|(x, y)| (x - y).abs()).fold(0.0f32, f32::max);
        let scale = adapted.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        assert!(diff(&adapted, &base) > 1e-2 * scale, "{arch}: the adapters change the logits");
        let e = diff(&merged, &adapted);
        assert!(e <= 1e-4 * scale, "{arch}: merged logits off by {e} (scale {scale})");
        eprintln!("{arch}: merged vs adapted logits {:.1e} relative", e / scale);
    }
}

/// A target no layer has is refused naming it; PEFT's module names parse.
#[test]
fn gated_deltanet_targets_are_named_and_refused_where_absent() {
    let b = CpuBackend::with_threads(1).unwrap();
    assert_eq!(Target::parse_list("in_proj_qkv,in_z,out_proj,in_proj_a,in_b").unwrap().len(), 5);
    let llama = finetune::load_base(&b, &fixture("llama")).unwrap().net.arch;
    let mut cfg = LoraConfig::new(2);
    cfg.targets = vec![Target::Q, Target::InZ];
    let e = Adapters::init(&b, &llama, cfg, 1).unwrap_err().to_string();
    assert!(e.contains("in_z") && e.contains("Gated DeltaNet") && e.contains("llama"), "{e}");
}

/// The llama fixture written as a Q8_0 GGUF file (the tokenizer included).
fn quantized_gguf(dir: &Path) -> PathBuf {
    let b = CpuBackend::with_threads(2).unwrap();
    let src = fixture("llama");
    let p = fusebox_models::open::load(&b, &src).unwrap();
    let (tok, template) = export::read_tokenizer_source(&src).unwrap();
    let out = dir.join("llama-q8_0.gguf");
    let opts = Options { float: FloatType::F32, quant: Some(DType::Q8_0) };
    export::write_gguf(&b, &p.network, &tok, template.as_deref(), &out, &opts).unwrap();
    out
}

fn lora_tuner(b: &CpuBackend, base: &Path, data: &Path, steps: u64) -> FineTuner {
    let mut model: Loaded = finetune::load_base_for(b, base, Purpose::Frozen).unwrap();
    let ad = Adapters::init(b, &model.net.arch, LoraConfig::new(4), 7).unwrap();
    model.net.attach_lora(ad).unwrap();
    let seqs = sequences::text_file(data, &model.tokenizer, 16).unwrap();
    FineTuner::new(b, model, config(steps), seqs).unwrap()
}

fn adapter_values(b: &CpuBackend, t: &FineTuner) -> Vec<u32> {
    t.model.net.lora.as_ref().unwrap().params.to_values(b).unwrap().iter().map(|x| x.to_bits()).collect()
}

/// QLoRA: a Q8_0 GGUF base keeps its blocks (no f32 copy), is never written, and a LoRA
/// run lowers the held-out loss, resumes bit-identically from its checkpoint (which holds
/// only the adapters), and merges into an f32 network giving the same logits.
#[test]
fn qlora_on_a_quantized_gguf_trains_resumes_and_merges() {
    let b = CpuBackend::with_threads(2).unwrap();
    let dir = TempDir::new("lora-qlora");
    let gguf = quantized_gguf(&dir.0);
    let data = text_file(&dir.0);

    let mut whole = lora_tuner(&b, &gguf, &data, 8);
    let net = &whole.model.net;
    assert!(net.specs.iter().any(|s| s.name.contains(".attn.qkv.")), "q/k/v of one format are stacked");
    let quantized = net.params.tensors.iter().filter(|t| t.dtype() == DType::Q8_0).count();
    assert!(quantized >= 4 * net.arch.n_layers, "block-format matrices kept: {quantized}");
    let base_before: Vec<Vec<u8>> =
        net.params.tensors.iter().map(|t| b.to_host(t).unwrap().host_bytes().unwrap().to_vec()).collect();
    let mem = whole.memory();
    assert_eq!(mem.optimizer_bytes, 3 * mem.adapter_bytes, "gradients and two moments of the adapters only");

    let initial = whole.evaluate(&b).unwrap().loss;
    let straight: Vec<(u32, u32)> = (0..8)
        .map(|_| {
            let s = whole.train_step(&b).unwrap();
            (s.loss.to_bits(), s.grad_norm.to_bits())
        })
        .collect();
    let after = whole.evaluate(&b).unwrap().loss;
    assert!(after < initial, "held-out loss {initial} → {after} did not fall");
    let base_after: Vec<Vec<u8>> =
        whole.model.net.params.tensors.iter().map(|t| b.to_host(t).unwrap().host_bytes().unwrap().to_vec()).collect();
    assert!(base_before == base_after, "the frozen base was written");

    // 4 steps, a checkpoint, a resume in a fresh tuner, 4 more.
    let mut first = lora_tuner(&b, &gguf, &data, 8);
    let mut resumed: Vec<(u32, u32)> = (0..4)
        .map(|_| {
            let s = first.train_step(&b).unwrap();
            (s.loss.to_bits(), s.grad_norm.to_bits())
        })
        .collect();
    let out = dir.0.join("run");
    first.save(&b, &out).unwrap();
    drop(first);
    let st = fusebox_models::safetensors::SafeTensors::read(&out.join("step-4/model.safetensors")).unwrap();
    assert!(st.tensors.keys().all(|n| n.contains(".lora_")), "the checkpoint holds only the adapters");
    let (model, saved) = finetune::load_checkpoint(&b, &out).unwrap();
    assert!(model.net.lora.is_some());
    let seqs = sequences::text_file(&data, &model.tokenizer, 16).unwrap();
    let mut second = FineTuner::resume(&b, model, &saved, config(8), seqs).unwrap();
    resumed.extend((0..4).map(|_| {
        let s = second.train_step(&b).unwrap();
        (s.loss.to_bits(), s.grad_norm.to_bits())
    }));
    assert_eq!(straight, resumed, "losses and gradient norms after resume");
    assert_eq!(adapter_values(&b, &whole), adapter_values(&b, &second), "adapters after resume");
    let ckpt = second.save(&b, &out).unwrap();

    // Merged: W' = dequant(W) + (α/r)·B·A gives the adapted model's logits.
    let (merged, _, _) = finetune::load_merged(&b, &ckpt).unwrap();
    assert!(merged.lora.is_none() && merged.trainable());
    let (ids, _) = batch(&b, merged.arch.vocab_size);
    let want = host(&b, &second.model.net.forward(&b, &ids).unwrap().0);
    let got = host(&b, &merged.forward(&b, &ids).unwrap().0);
    let scale = want.iter().fold(0f32, |m, w| m.max(w.abs()));
    let err = got.iter().zip(&want).fold(0f32, |m, (g, w)| m.max((g - w).abs()));
    assert!(err <= 1e-4 * scale, "merged logits off by {err} (scale {scale})");
}

/// Bad LoRA settings are refused naming the flag.
#[test]
fn bad_lora_settings_are_named() {
    let b = CpuBackend::with_threads(1).unwrap();
    let arch = finetune::load_base(&b, &fixture("gpt2")).unwrap().net.arch;
    let e = Adapters::init(&b, &arch, LoraConfig::new(0), 1).unwrap_err().to_string();
    assert!(e.contains("--lora-rank"), "{e}");
    let e = Target::parse_list("q,kk").unwrap_err().to_string();
    assert!(e.contains("--lora-targets") && e.contains("kk"), "{e}");
    let e = Target::parse_list("q,q").unwrap_err().to_string();
    assert!(e.contains("twice"), "{e}");
    let mut cfg = LoraConfig::new(2);
    cfg.targets = vec![Target::Gate];
    let e = Adapters::init(&b, &arch, cfg, 1).unwrap_err().to_string();
    assert!(e.contains("gate") && e.contains("gpt2"), "{e}");
    let mut cfg = LoraConfig::new(2);
    cfg.alpha = f32::NAN;
    assert!(cfg.validate().unwrap_err().to_string().contains("--lora-alpha"));
}

/// One step of PEFT adapters (r = 4, α = 8, all seven projections, B ≠ 0) in PyTorch
/// autograd, f64 (scripts/record_lora_fixtures.py): fusebox's loss and every adapter's
/// dA and dB agree within 1e-4 relative on Llama 3, Qwen3 and Gemma 3 fixtures.
#[test]
fn adapter_gradients_match_pytorch_autograd() {
    use fusebox_models::safetensors::SafeTensors;
    const TOL: f64 = 1e-4;
    let b = CpuBackend::with_threads(2).unwrap();
    for arch in ["llama", "qwen3", "gemma3"] {
        let reference = SafeTensors::read(&fixture(arch).with_file_name(format!("{arch}.lora.safetensors"))).unwrap();
        let get =
            |key: &str| reference.tensor(key).unwrap_or_else(|e| panic!("{arch} {key}: {e}")).to_vec_f32().unwrap();
        let mut net = finetune::load_base(&b, &fixture(arch)).unwrap().net;
        // An HF directory keeps its half-split rope rows, so B's rows are PEFT's as they are.
        let cfg = LoraConfig { rank: 4, alpha: 8.0, targets: Target::ALL.to_vec() };
        let specs = Adapters::specs_for(&net.arch, &cfg).unwrap();
        let ad = Adapters::init(&b, &net.arch, cfg.clone(), 0).unwrap();
        let mut values = Vec::new();
        for &(l, t) in ad.sites() {
            let module = t.hf_module().rsplit('.').next().unwrap();
            values.extend(get(&format!("a.{l}.{module}")));
            values.extend(get(&format!("b.{l}.{module}")));
        }
        let params = ParamSet::from_values(&b, &specs, values).unwrap();
        net.attach_lora(Adapters::with_params(&net.arch, cfg, params).unwrap()).unwrap();

        let seq: Vec<u32> = get("train_ids").iter().map(|&x| x as u32).collect();
        let t = seq.len() - 1;
        let ids = b.upload(&Tensor::from_vec(seq[..t].to_vec(), [1, t]).unwrap()).unwrap();
        let targets = b.upload(&Tensor::from_vec(seq[1..].to_vec(), [1, t]).unwrap()).unwrap();
        let (loss, grads) = lora_grads(&b, &net, &ids, &targets);
        let want = get("loss")[0];
        let e = (f64::from(loss) - f64::from(want)).abs() / f64::from(want).abs();
        assert!(e < TOL, "{arch}: loss {loss} vs PyTorch {want} ({e:.1e} relative)");

        let ad = net.lora.as_ref().unwrap();
        let mut worst = 0f64;
        for (i, &(l, t)) in ad.sites().iter().enumerate() {
            let module = t.hf_module().rsplit('.').next().unwrap();
            for (k, which) in [(2 * i, "a"), (2 * i + 1, "b")] {
                let got = host(&b, &grads.tensors[k]);
                let want = get(&format!("grad_{which}.{l}.{module}"));
                assert_eq!(got.len(), want.len(), "{arch} layer {l} {module}: d{which} size");
                let scale = want.iter().fold(0f64, |m, &w| m.max(f64::from(w).abs()));
                let err = got.iter().zip(&want).fold(0f64, |m, (&g, &w)| m.max((f64::from(g) - f64::from(w)).abs()));
                assert!(scale > 0.0, "{arch} layer {l} {module}: the reference d{which} is zero");
                let rel = err / scale;
                assert!(rel < TOL, "{arch} layer {l} {module}: d{which} off by {rel:.1e} (relative)");
                worst = worst.max(rel);
            }
        }
        eprintln!(
            "{arch}: loss rel. error {e:.1e}; worst adapter gradient rel. error {worst:.1e} over {} adapters",
            ad.sites().len()
        );
    }
}

/// A mixture of experts' adapters (per expert on gate, up and down, besides attention)
/// merge into its weights: the merged network gives the adapted one's logits.
#[test]
fn expert_adapters_merge_into_the_experts() {
    let b = CpuBackend::with_threads(2).unwrap();
    let mut net = fusebox_models::weights::load_hf_for(&b, &fixture("qwen3_moe"), Purpose::Training).unwrap();
    let mut ad = Adapters::init(&b, &net.arch, LoraConfig::new(2), 5).unwrap();
    assert!(ad.specs.iter().any(|s| s.name == "h.0.mlp.experts.gate.lora_A" && s.shape.dims() == [8, 2, 32]));
    let mut rng = Rng::new(8);
    for i in 0..ad.sites().len() {
        let t = &mut ad.params.tensors[2 * i + 1];
        let v = rng.uniform_vec(t.elem_count(), -0.3, 0.3);
        b.copy_into(t, &Tensor::from_vec(v, t.shape().clone()).unwrap()).unwrap();
    }
    let (ids, _) = batch(&b, net.arch.vocab_size);
    let base = host(&b, &net.forward(&b, &ids).unwrap().0);
    net.attach_lora(ad).unwrap();
    let adapted = host(&b, &net.forward(&b, &ids).unwrap().0);
    net.merge_lora(&b).unwrap();
    let merged = host(&b, &net.forward(&b, &ids).unwrap().0);
    let diff = |a: &[f32], c: &[f32]| a.iter().zip(c).map(|(x, y)| (x - y).abs()).fold(0.0f32, f32::max);
    let scale = adapted.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    assert!(diff(&adapted, &base) > 1e-2 * scale, "the adapters change the logits");
    assert!(diff(&merged, &adapted) <= 1e-4 * scale, "merged logits off by {}", diff(&merged, &adapted));
}
