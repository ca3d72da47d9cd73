//! Whole-model gradients against central finite differences, on tiny configs of every
//! style: the explicit backward must agree with the forward it differentiates.

use fusebox::{ComputeBackend, CpuBackend, Tensor};
use fusebox_models::rng::Rng;
use fusebox_models::{Model, ModelConfig, ParamSet, Style};

fn tiny(style: Style) -> ModelConfig {
    ModelConfig {
        style,
        vocab_size: 11,
        n_layers: 2,
        n_heads: 4,
        n_kv_heads: if style == Style::Gpt2 { 4 } else { 2 },
        d_model: 16,
        d_ff: 24,
        max_seq: 16,
        norm_eps: 1e-5,
        rope_theta: 10000.0,
        tied_embeddings: style == Style::Gpt2,
    }
}

fn check_gradients(style: Style) {
    let b = CpuBackend::with_threads(1).unwrap();
    let cfg = tiny(style);
    let mut model = Model::new(&b, cfg.clone(), 7).unwrap();
    // Larger weights than the default init so every path carries signal.
    let values: Vec<f32> = model.net.params.to_values(&b).unwrap();
    let mut rng = Rng::new(3);
    // Norm weights stay near 1: QK-norm weights of 10 would saturate the softmax.
    let mut scaled = Vec::with_capacity(values.len());
    let mut at = 0;
    for spec in &model.net.specs {
        let n = spec.shape.elem_count();
        let qk_norm = spec.name.contains("q_norm") || spec.name.contains("k_norm");
        scaled.extend(values[at..at + n].iter().map(|v| if qk_norm { *v } else { v * 10.0 } + 0.05 * rng.normal()));
        at += n;
    }
    model.net.params = ParamSet::from_values(&b, &model.net.specs, scaled.clone()).unwrap();

    let (bsz, t) = (2, 12);
    let ids: Vec<u32> = (0..bsz * t).map(|_| rng.below(cfg.vocab_size) as u32).collect();
    let mut targets: Vec<u32> = (0..bsz * t).map(|_| rng.below(cfg.vocab_size) as u32).collect();
    targets[3] = 99; // one ignored position
    let ids = Tensor::from_vec(ids, [bsz, t]).unwrap();
    let targets = Tensor::from_vec(targets, [bsz, t]).unwrap();

    let mut grads = ParamSet::zeros(&b, &model.net.specs).unwrap();
    model.net.loss_and_grads(&b, &ids, &targets, Some(99), 1.0, &mut grads).unwrap();
    let analytic = grads.to_values(&b).unwrap();

    // Probe a spread of coordinates in every parameter tensor.
    let mut offset = 0;
    let mut checked = 0;
    for spec in model.net.specs.clone() {
        let n = spec.shape.elem_count();
        for probe in 0..3 {
            let i = offset + (probe * 7919 + 13) % n;
            let h = 1e-3f32;
            let loss_at = |delta: f32| {
                let mut v = scaled.clone();
                v[i] += delta;
                let m = Model::from_params(&b, cfg.clone(), ParamSet::from_values(&b, &model.net.specs, v).unwrap())
                    .unwrap();
                m.net.loss(&b, &ids, &targets, Some(99)).unwrap() as f64
            };
            let numeric = (loss_at(h) - loss_at(-h)) / (2.0 * h as f64);
            let a = analytic[i] as f64;
            let tol = 3e-3 + 3e-2 * numeric.abs();
            assert!(
                (a - numeric).abs() <= tol,
                "{style:?} {} [{}]: analytic {a:.6}, finite difference {numeric:.6}",
                spec.name,
                i - offset
            );
            checked += 1;
        }
        offset += n;
    }
    assert!(checked >= 3 * model.net.specs.len());
}

#[test]
fn gpt2_style_gradients_match_finite_differences() {
    check_gradients(Style::Gpt2);
}

#[test]
fn llama_style_gradients_match_finite_differences() {
    check_gradients(Style::Llama);
}

#[test]
fn qwen3_style_gradients_match_finite_differences() {
    check_gradients(Style::Qwen3);
}

/// Post norms, QK-norm, GeGLU, the embedding scale, and a local layer whose window (8)
/// is shorter than the sequence (12).
#[test]
fn gemma3_style_gradients_match_finite_differences() {
    check_gradients(Style::Gemma3);
}

#[test]
fn bad_ids_are_errors_not_panics() {
    let b = CpuBackend::new().unwrap();
    let model = Model::new(&b, tiny(Style::Llama), 1).unwrap();
    let too_long = Tensor::from_vec(vec![0u32; 17], [1, 17]).unwrap();
    assert!(model.net.forward(&b, &too_long).is_err());
    let out_of_vocab = Tensor::from_vec(vec![0u32, 50], [1, 2]).unwrap();
    assert!(model.net.forward(&b, &out_of_vocab).is_err());
    let wrong_rank = Tensor::from_vec(vec![0u32, 1], [2]).unwrap();
    assert!(model.net.forward(&b, &wrong_rank).is_err());
    let _ = b.name();
}
