//! Fine-tuning a pretrained model (`fusebox train --init`): the tiny Hugging Face
//! models of `tests/fixtures/arch/` (recorded by `scripts/record_arch_fixtures.py`)
//! resume bit-identically from a checkpoint, chat data puts the loss on assistant tokens
//! only, and bad data lines are named.

mod fine_tune;

use fusebox::CpuBackend;
use fusebox_models::chat::ChatTemplate;
use fusebox_models::data::sequences::{self, IGNORE};
use fusebox_models::finetune::{self, FineTuner, TokenizerSource};
use fusebox_models::train::TrainConfig;

use fine_tune::{fixture, text_file, TempDir};

/// The settings of these runs.
fn config(steps: u64) -> TrainConfig {
    fine_tune::config(steps, 1e-3, 0.1)
}

#[test]
fn full_fine_tuning_resumes_bit_identically() {
    let b = CpuBackend::with_threads(2).unwrap();
    for arch in ["llama", "gemma3", "gpt2"] {
        let dir = TempDir::new(&format!("ft-resume-{arch}"));
        let data_path = text_file(&dir.0);
        let run = |steps: u64| {
            let model = finetune::load_base(&b, &fixture(arch)).unwrap();
            let data = sequences::text_file(&data_path, &model.tokenizer, 16).unwrap();
            FineTuner::new(&b, model, config(steps), data).unwrap()
        };
        // Straight through: 6 steps.
        let mut whole = run(6);
        let initial = whole.evaluate(&b).unwrap().loss;
        let straight: Vec<(u32, u32)> = (0..6)
            .map(|_| {
                let s = whole.train_step(&b).unwrap();
                (s.loss.to_bits(), s.grad_norm.to_bits())
            })
            .collect();
        let after = whole.evaluate(&b).unwrap().loss;
        assert!(after < initial, "{arch}: held-out loss {initial} → {after} did not fall");
        // 3 steps, a checkpoint, a fresh process's resume, 3 more.
        let mut first = run(6);
        let mut resumed_losses: Vec<(u32, u32)> = (0..3)
            .map(|_| {
                let s = first.train_step(&b).unwrap();
                (s.loss.to_bits(), s.grad_norm.to_bits())
            })
            .collect();
        let out = dir.0.join("run");
        let ckpt = first.save(&b, &out).unwrap();
        drop(first);
        assert!(finetune::is_finetune_checkpoint(&out));
        let (model, saved) = finetune::load_checkpoint(&b, &out).unwrap();
        assert_eq!(saved.step, 3);
        let data = sequences::text_file(&data_path, &model.tokenizer, 16).unwrap();
        let mut second = FineTuner::resume(&b, model, &saved, config(6), data).unwrap();
        resumed_losses.extend((0..3).map(|_| {
            let s = second.train_step(&b).unwrap();
            (s.loss.to_bits(), s.grad_norm.to_bits())
        }));
        assert_eq!(straight, resumed_losses, "{arch}: losses and gradient norms after resume");
        let p1 = whole.model.net.params.to_values(&b).unwrap();
        let p2 = second.model.net.params.to_values(&b).unwrap();
        assert!(p1.iter().zip(&p2).all(|(a, c)| a.to_bits() == c.to_bits()), "{arch}: parameters after resume");
        assert_eq!(second.evaluate(&b).unwrap().loss.to_bits(), after.to_bits());
        // What export reads: the f32 network, the tokenizer's source (the copied
        // tokenizer.json of an HF base) and the template.
        let (net, source, template) = finetune::load_merged(&b, &ckpt).unwrap();
        assert_eq!(net.arch, whole.model.net.arch);
        assert_eq!(source, TokenizerSource::Hf(ckpt.clone()));
        assert!(source.load().is_ok());
        assert!(template.is_some_and(|t| t.contains("im_start")), "{arch}: the fallback ChatML template is saved");
    }
}

#[test]
fn chat_loss_is_on_assistant_tokens_only() {
    let b = CpuBackend::with_threads(1).unwrap();
    let model = finetune::load_base(&b, &fixture("llama")).unwrap();
    let template = ChatTemplate::chatml(None).unwrap();
    let messages = sequences::addition_messages(123, 456);
    let s = sequences::conversation(&messages, &model.tokenizer, &template, 200).unwrap();
    let counted: Vec<u32> = s.targets.iter().copied().filter(|&t| t != IGNORE).collect();
    assert_eq!(model.tokenizer.decode(&counted).unwrap(), "579<|im_end|>\n");
    // Inputs are the rendered conversation, targets the next tokens.
    let whole =
        template.apply(&messages.iter().map(|(r, c)| (r.as_str(), c.as_str())).collect::<Vec<_>>(), false).unwrap();
    let mut ids = s.ids.clone();
    ids.push(*s.targets.last().unwrap());
    assert_eq!(model.tokenizer.decode(&ids).unwrap(), whole);
    // Too long for --seq, no assistant turn: errors that say so.
    let e = sequences::conversation(&messages, &model.tokenizer, &template, 10).unwrap_err().to_string();
    assert!(e.contains("--seq"), "{e}");
    let e = sequences::conversation(&messages[..1], &model.tokenizer, &template, 200).unwrap_err().to_string();
    assert!(e.contains("assistant"), "{e}");
}

#[test]
fn malformed_jsonl_lines_are_named_and_skipped_only_when_asked() {
    let b = CpuBackend::with_threads(1).unwrap();
    let model = finetune::load_base(&b, &fixture("llama")).unwrap();
    let template = ChatTemplate::chatml(None).unwrap();
    let dir = TempDir::new("ft-jsonl");
    let path = dir.0.join("chat.jsonl");
    let good = r#"{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]}"#;
    std::fs::write(&path, format!("{good}\n{{\"messages\": 3}}\n\n{good}\n{good}\nnot json\n")).unwrap();
    let e = sequences::chat_jsonl(&path, &model.tokenizer, &template, 64, false, 1).unwrap_err().to_string();
    assert!(e.contains("chat.jsonl:2:") && e.contains("--skip-bad-lines"), "{e}");
    let data = sequences::chat_jsonl(&path, &model.tokenizer, &template, 64, true, 1).unwrap();
    assert_eq!(data.skipped.len(), 2);
    assert!(data.skipped[0].contains(":2:") && data.skipped[1].contains(":6:"), "{:?}", data.skipped);
    assert_eq!((data.train.len(), data.valid.len()), (2, 1));
    assert!(data.answers);
    // Exact match is measured on held-out answers.
    let tuner = FineTuner::new(&b, model, config(1), data).unwrap();
    let e = tuner.evaluate(&b).unwrap();
    assert!(e.loss.is_finite() && e.accuracy.is_some());
}
