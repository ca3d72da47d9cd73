//! fusebox against PyTorch, as llm.c checks itself: a tiny model's weights, tokens,
//! loss and every gradient, recorded once from PyTorch autograd (in f64) by
//! `scripts/record_torch_fixture.py` into `tests/fixtures/torch_<style>.safetensors`.
//! The model's explicit forward and backward must reproduce them in f32.

use std::path::PathBuf;

use fusebox::{ComputeBackend, CpuBackend, Tensor};
use fusebox_models::model::param_specs;
use fusebox_models::safetensors::SafeTensors;
use fusebox_models::{Model, ModelConfig, ParamSet};
use serde_json::{Map, Value};

/// Loss: relative error against the f64 reference.
const LOSS_REL: f64 = 1e-5;
/// Gradients: `|fusebox − torch| ≤ GRAD_ABS + GRAD_REL·|torch|` per element. PyTorch's
/// own f32 run stays within about 1% of this bound (the script prints it).
const GRAD_ABS: f64 = 1e-5;
const GRAD_REL: f64 = 1e-3;

fn fixture(style: &str) -> SafeTensors {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("tests/fixtures/torch_{style}.safetensors"));
    SafeTensors::read(&path).unwrap_or_else(|e| panic!("{e} (recreate with scripts/record_torch_fixture.py)"))
}

/// The model config stored in the header's metadata (values are JSON, the style a bare string).
fn config_of(st: &SafeTensors) -> ModelConfig {
    let fields: Map<String, Value> = st
        .metadata
        .iter()
        .map(|(k, v)| (k.clone(), serde_json::from_str(v).unwrap_or_else(|_| Value::String(v.clone()))))
        .collect();
    ModelConfig::from_json(&Value::Object(fields)).expect("fixture metadata holds a valid ModelConfig")
}

fn f32s(st: &SafeTensors, name: &str) -> Vec<f32> {
    st.tensor(name).and_then(|t| t.to_vec::<f32>()).unwrap_or_else(|e| panic!("fixture tensor '{name}': {e}"))
}

fn check_against_torch(style: &str) {
    let st = fixture(style);
    let cfg = config_of(&st);
    assert_eq!(cfg.style.name(), style, "fixture style");
    let b = CpuBackend::new().unwrap();
    let (specs, _) = param_specs(&cfg);

    // Every fixture parameter is a fusebox parameter and the other way round.
    let stored: Vec<&String> = st
        .tensors
        .keys()
        .filter(|n| !n.starts_with("grad.") && !["ids", "targets", "ignore_index", "loss"].contains(&n.as_str()))
        .collect();
    let expected: Vec<&String> = specs.iter().map(|s| &s.name).collect();
    let mut sorted = expected.clone();
    sorted.sort();
    assert_eq!(stored, sorted, "{style}: parameter names in the fixture vs param_specs");

    let mut values = Vec::new();
    for s in &specs {
        let t = st.tensor(&s.name).unwrap();
        assert_eq!(t.shape(), &s.shape, "{style}: shape of '{}'", s.name);
        values.extend(f32s(&st, &s.name));
    }
    let params = ParamSet::from_values(&b, &specs, values).unwrap();
    let model = Model::from_params(&b, cfg, params).unwrap();

    let ids: Tensor = st.tensor("ids").unwrap();
    let targets: Tensor = st.tensor("targets").unwrap();
    let ignore = st.tensor("ignore_index").unwrap().to_vec::<u32>().unwrap()[0];
    assert!(targets.to_vec::<u32>().unwrap().contains(&ignore), "the fixture has an ignored position");

    let mut grads = ParamSet::zeros(&b, &model.net.specs).unwrap();
    let loss = model.net.loss_and_grads(&b, &ids, &targets, Some(ignore), 1.0, &mut grads).unwrap() as f64;
    let want_loss = f32s(&st, "loss")[0] as f64;
    let loss_rel = (loss / want_loss - 1.0).abs();
    assert!(loss_rel <= LOSS_REL, "{style}: loss {loss:.8} vs torch {want_loss:.8} (relative error {loss_rel:.2e})");

    // Compare every gradient; report every parameter that fails, worst element first.
    let mut failures = Vec::new();
    let mut worst_overall = 0.0f64;
    for (spec, g) in model.net.specs.iter().zip(&grads.tensors) {
        let got = b.to_host(g).unwrap().to_vec::<f32>().unwrap();
        let want = f32s(&st, &format!("grad.{}", spec.name));
        assert_eq!(got.len(), want.len(), "{style}: gradient length of '{}'", spec.name);
        let (mut worst, mut at) = (0.0f64, 0);
        for (i, (&a, &e)) in got.iter().zip(&want).enumerate() {
            let ratio = (a as f64 - e as f64).abs() / (GRAD_ABS + GRAD_REL * (e as f64).abs());
            // NaN compares false everywhere, so catch it explicitly.
            let ratio = if ratio.is_nan() { f64::INFINITY } else { ratio };
            if ratio > worst {
                (worst, at) = (ratio, i);
            }
        }
        worst_overall = worst_overall.max(worst);
        if worst > 1.0 {
            failures.push(format!(
                "  grad.{} {} (flat index {at}): fusebox {:.7e}, torch {:.7e} — {worst:.1}× the tolerance",
                spec.name, spec.shape, got[at], want[at]
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{style}: gradients differ from PyTorch (tolerance {GRAD_ABS:e} + {GRAD_REL:e}·|torch|):\n{}",
        failures.join("\n")
    );
    eprintln!("{style}: loss rel error {loss_rel:.1e}; worst gradient element at {worst_overall:.3} of the tolerance");
}

#[test]
fn gpt2_style_matches_pytorch() {
    check_against_torch("gpt2");
}

#[test]
fn llama_style_matches_pytorch() {
    check_against_torch("llama");
}
