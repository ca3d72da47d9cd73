//! `fusebox train --init MODEL`: fine-tuning a pretrained model (GGUF or Hugging Face),
//! every parameter or LoRA adapters, on text, chat JSONL or the addition task as chat
//! turns; `--resume` of such a run; `--eval-only`.

use std::path::Path;
use std::sync::Arc;

use fusebox::{Error, Result};
use fusebox_models::comm::Communicator;
use fusebox_models::data::sequences::{self, Sequences};
use fusebox_models::finetune::{self, FineTuner, Loaded};
use fusebox_models::train::{TrainConfig, Trainer};
use fusebox_models::transformer::{Adapters, LoraConfig, Target};
use fusebox_models::weights::Purpose;
use serde_json::{json, Value};

use super::args::TrainArgs;
use super::plan::plan_ranks;
use super::run_loop::{self, eval_line};
use crate::backends::backend_for;

/// `--data` naming the built-in addition task as chat turns.
pub const ADDITION_CHAT: &str = "addition-chat";
/// Training problems of `addition-chat` (drawn once, sampled with replacement).
const ADDITION_TRAIN: usize = 5_000;
/// Held-out problems of `addition-chat` (exact match is measured on these).
const ADDITION_VALID: usize = 200;

/// The learning rate of a fresh LoRA run where `--lr` does not say otherwise: the
/// adapters start at B = 0 and need larger steps than full fine-tuning's 1e-4.
const LORA_LR: f32 = 1e-3;

/// The settings of a fine-tuning run where no flag (and no checkpoint) says otherwise:
/// 200 steps of 8 sequences of at most 256 tokens, learning rate 1e-4 (1e-3 for LoRA)
/// after 10 warmup steps, no weight decay, an evaluation every 50 steps.
fn defaults(lora: bool) -> TrainConfig {
    TrainConfig {
        steps: 200,
        batch: 8,
        seq_len: 256,
        lr: if lora { LORA_LR } else { 1e-4 },
        warmup: 10,
        weight_decay: 0.0,
        eval_every: 50,
        eval_batches: 4,
        ..TrainConfig::default()
    }
}

/// The LoRA settings the flags ask for (`None`: full fine-tuning); every bad value is
/// refused naming its flag.
fn lora_config(a: &TrainArgs) -> Result<Option<LoraConfig>> {
    let Some(rank) = a.lora_rank else { return Ok(None) };
    let mut c = LoraConfig::new(rank);
    if let Some(alpha) = a.lora_alpha {
        c.alpha = alpha;
    }
    if let Some(t) = &a.lora_targets {
        c.targets = Target::parse_list(t)?;
    }
    if let Some(p) = a.lora_dropout {
        if p != 0.0 {
            return Err(Error::value("train", "--lora-dropout", "0 (adapter dropout is not implemented)", p));
        }
    }
    c.validate()?;
    Ok(Some(c))
}

/// Where the data comes from, as saved in `trainer.json` so a resumed run rebuilds it.
fn data_args(data: &str, skip_bad_lines: bool) -> Value {
    json!({"data": data, "skip_bad_lines": skip_bad_lines})
}

/// The sequences `--data` names, in `model`'s tokens.
fn load_data(model: &Loaded, data: &str, skip_bad_lines: bool, config: &TrainConfig) -> Result<Sequences> {
    let path = Path::new(data);
    if data == ADDITION_CHAT && !path.exists() {
        return sequences::addition_chat(
            &model.tokenizer,
            model.chat_template()?,
            config.seed,
            ADDITION_TRAIN,
            ADDITION_VALID,
        );
    }
    let ext = path.extension().map(|e| e.to_string_lossy().to_ascii_lowercase());
    match ext.as_deref() {
        Some("jsonl") => sequences::chat_jsonl(
            path,
            &model.tokenizer,
            model.chat_template()?,
            config.seq_len,
            skip_bad_lines,
            config.seed,
        ),
        _ => sequences::text_file(path, &model.tokenizer, config.seq_len),
    }
}

/// One rank's part of a fine-tuning invocation (see the module docs).
pub(crate) fn run(args: &TrainArgs, comm: &Arc<dyn Communicator>) -> Result<()> {
    if args.init.is_some() && args.resume.is_some() {
        return Err(Error::value("train", "--init", "either --init MODEL or --resume CHECKPOINT", "both"));
    }
    let lora = lora_config(args)?;
    if args.init.is_some() && args.data.is_none() {
        let expected = format!("FILE.txt, FILE.jsonl or {ADDITION_CHAT} with --init");
        return Err(Error::value("train", "--data", expected, "nothing"));
    }
    let plan = plan_ranks(args, defaults(lora.is_some()), "runs/finetune", comm)?;
    let config = plan.config.clone();
    config.validate()?;
    let b = backend_for(&args.backend, args.threads)?;
    let b = b.as_ref();
    let lead = comm.rank() == 0;
    // The model and where the data comes from: the flags' for a fresh run, the
    // checkpoint's (unless --data says otherwise) on --resume.
    let (model, saved, data_src, skip_bad) = match (&args.init, &plan.resume) {
        (Some(init), _) => {
            let model = match lora {
                Some(cfg) => {
                    let mut m = finetune::load_base_for(b, init, Purpose::Frozen)?;
                    let adapters = Adapters::init(b, &m.net.arch, cfg, config.seed)?;
                    m.net.attach_lora(adapters)?;
                    m
                }
                None => finetune::load_base(b, init)?,
            };
            let data = args.data.as_ref().map(|d| d.display().to_string()).unwrap_or_default();
            (model, None, data, args.skip_bad_lines)
        }
        (None, Some(info)) => {
            let (model, saved) = finetune::load_checkpoint(b, &info.dir)?;
            let da = saved.data_args();
            let data = match (&args.data, da.get("data").and_then(Value::as_str)) {
                (Some(d), _) => d.display().to_string(),
                (None, Some(d)) => d.to_string(),
                (None, None) => {
                    return Err(Error::Io(format!(
                        "{}: the checkpoint does not say where its data came from; pass --data",
                        info.dir.display()
                    )))
                }
            };
            let skip = args.skip_bad_lines || da.get("skip_bad_lines").and_then(Value::as_bool).unwrap_or(false);
            (model, Some(saved), data, skip)
        }
        (None, None) => return Err(Error::value("train", "--init", "a model to fine-tune", "nothing")),
    };
    let data = load_data(&model, &data_src, skip_bad, &config)?;
    if lead {
        for note in &data.skipped {
            eprintln!("skipped: {note}");
        }
    }
    let mut tuner: FineTuner = match &saved {
        Some(s) => Trainer::resume(b, model, s, config, data)?,
        None => Trainer::new(b, model, config, data)?,
    };
    tuner.data_args = data_args(&data_src, skip_bad);
    tuner.join(b, comm.clone())?;
    // The evaluation before training, on rank 0 (which alone prints).
    let initial = if lead { Some(tuner.evaluate(b)?) } else { None };
    if args.eval_only {
        if let Some(initial) = initial {
            let v = json!({
                "step": tuner.step,
                "eval_loss": initial.loss,
                "accuracy": initial.accuracy,
                "held_out": tuner.data.valid.len(),
                "data": tuner.data.description,
            });
            if args.json {
                println!("{v}");
            } else {
                println!(
                    "{} at step {}: {} ({} held-out sequences)",
                    tuner.model.base.path.display(),
                    tuner.step,
                    eval_line(&initial),
                    tuner.data.valid.len()
                );
            }
        }
        return Ok(());
    }
    let net = &tuner.model.net;
    let trained = match &net.lora {
        Some(ad) => {
            let targets: Vec<&str> = ad.config.targets.iter().map(|t| t.name()).collect();
            let (rank, alpha, millions) = (ad.config.rank, ad.config.alpha, ad.len() as f64 / 1e6);
            format!(
                "frozen; LoRA rank {rank}, alpha {alpha}, on {}: {millions:.2}M adapter parameters trained",
                targets.join(",")
            )
        }
        None => "all trained in f32".to_string(),
    };
    let (a, millions) = (&net.arch, net.params.len() as f64 / 1e6);
    let intro = format!(
        "fine-tuning {} ({}: {} layers, d_model {}, {millions:.1}M parameters, {trained})",
        tuner.model.base.path.display(),
        a.name,
        a.n_layers,
        a.d_model
    );
    run_loop::train(b, args, &plan, &mut tuner, &intro, initial, |_| Ok(Vec::new()))
}
