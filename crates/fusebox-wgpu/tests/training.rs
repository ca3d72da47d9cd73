//! End to end: 20 training steps of tiny GPT-2 and Llama models on `WgpuBackend`
//! give the CPU run's losses within 1e-3 relative.
//!
//! Without an adapter the test prints why and passes, unless
//! `FUSEBOX_REQUIRE_GPU_ADAPTER=1` (CI), where it fails.

use fusebox::{ComputeBackend, CpuBackend};
use fusebox_models::data::addition::Addition;
use fusebox_models::train::{Task, TrainConfig, Trainer};
use fusebox_models::{ModelConfig, Style};
use fusebox_wgpu::WgpuBackend;

fn train_config(steps: u64) -> TrainConfig {
    TrainConfig {
        steps,
        batch: 16,
        accumulation: 2,
        seq_len: 12,
        lr: 3e-3,
        min_lr_ratio: 0.1,
        warmup: 5,
        weight_decay: 0.1,
        beta1: 0.9,
        beta2: 0.95,
        grad_clip: 1.0,
        seed: 42,
        eval_every: 0,
        eval_batches: 1,
        checkpoint_activations: false,
        zero: 0,
        precision: fusebox_models::transformer::Precision::F32,
    }
}

fn model_config(style: Style) -> ModelConfig {
    let n_kv_heads = if style == Style::Gpt2 { 4 } else { 2 };
    ModelConfig { n_layers: 2, d_model: 32, n_heads: 4, n_kv_heads, d_ff: 64, ..ModelConfig::tiny(style, 14, 16) }
}

fn losses(b: &dyn ComputeBackend, style: Style, steps: u64) -> Vec<f32> {
    let mut t =
        Trainer::scratch(b, model_config(style), train_config(steps), Task::Addition(Addition::new(42))).unwrap();
    (0..steps).map(|_| t.train_step(b).unwrap().loss).collect()
}

#[test]
fn twenty_training_steps_on_wgpu_match_the_cpu() {
    let gpu = match WgpuBackend::new() {
        Ok(b) => b,
        Err(e) => {
            if std::env::var("FUSEBOX_REQUIRE_GPU_ADAPTER").is_ok_and(|v| v == "1") {
                panic!("FUSEBOX_REQUIRE_GPU_ADAPTER=1 but no wgpu adapter: {e}");
            }
            println!("skipped: no wgpu adapter ({e})");
            return;
        }
    };
    let cpu = CpuBackend::with_threads(2).unwrap();
    for style in [Style::Gpt2, Style::Llama] {
        let before = (gpu.native_dispatches(), gpu.cpu_fallbacks());
        let start = std::time::Instant::now();
        let on_gpu = losses(&gpu, style, 20);
        let gpu_s = start.elapsed().as_secs_f64();
        let dispatches = gpu.native_dispatches() - before.0;
        let fallbacks = gpu.cpu_fallbacks() - before.1;
        let on_cpu = losses(&cpu, style, 20);
        let worst = on_cpu.iter().zip(&on_gpu).map(|(c, g)| ((c - g) / c).abs()).fold(0.0f32, f32::max);
        println!("{style:?}: cpu losses {on_cpu:?}");
        println!("{style:?}: wgpu losses {on_gpu:?}");
        println!(
            "{style:?}: largest relative difference {worst:.2e}; wgpu {gpu_s:.1}s, {dispatches} GPU dispatches, \
             {fallbacks} CPU fallbacks"
        );
        assert!(worst <= 1e-3, "{style:?}: wgpu losses differ from the cpu's by {worst:.2e} relative");
        assert!(on_gpu[19] < on_gpu[0], "{style:?}: the loss did not fall on wgpu: {on_gpu:?}");
    }
}
