//! `fusebox train --init MODEL --lora-rank R`: LoRA on the tiny Hugging Face llama of
//! `fusebox-models/tests/fixtures/arch/` end to end — the final JSON object with its
//! memory figures, resume, generation and export from the checkpoint (adapters merged),
//! and bad LoRA flags refused by name.

mod fine_tune;

use fine_tune::{last_json, llama, run, stderr, text_data, TempDir};
use serde_json::Value;

#[test]
fn lora_trains_resumes_generates_and_exports() {
    let dir = TempDir::new("lora-run");
    let data = text_data(&dir.0);
    let out = dir.0.join("out").display().to_string();
    let common = ["--threads", "1", "--seq", "16", "--batch", "2", "--json"];
    let fresh = ["train", "--init", &llama(), "--data", &data, "--steps", "4", "--out", &out, "--lora-rank", "4"];
    let o = run(&[&fresh[..], &["--lora-targets", "q,v,down"], &common].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    let v = last_json(&o);
    let (initial, last) = (v["initial_eval_loss"].as_f64().unwrap(), v["eval_loss"].as_f64().unwrap());
    assert!(last < initial, "held-out loss {initial} → {last}");
    assert_eq!(v["method"], "lora");
    let (params, adapters, opt) = (
        v["parameter_bytes"].as_u64().unwrap(),
        v["adapter_bytes"].as_u64().unwrap(),
        v["optimizer_bytes"].as_u64().unwrap(),
    );
    assert!(adapters > 0 && adapters < params, "adapters {adapters} B, parameters {params} B");
    assert_eq!(opt, 3 * adapters, "gradients and AdamW moments of the adapters only");
    let trainer: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.0.join("out/step-4/trainer.json")).unwrap()).unwrap();
    assert_eq!(trainer["finetune"]["method"], "lora");
    assert_eq!(trainer["finetune"]["lora"]["targets"], serde_json::json!(["q", "v", "down"]));

    // --resume continues the LoRA run; LoRA flags there are refused by name.
    let o = run(&["train", "--resume", &out, "--steps", "6", "--threads", "1", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(last_json(&o)["steps"], 6);
    let o = run(&["train", "--resume", &out, "--steps", "8", "--lora-rank", "8"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("--lora-rank") && stderr(&o).contains("resumed"), "{}", stderr(&o));

    // generate and export read the checkpoint with the adapters merged: the merged GGUF
    // and Hugging Face exports generate greedily what the checkpoint generates.
    let greedy = |model: &str| {
        let o = run(&[
            "generate",
            "--model",
            model,
            "--prompt",
            "the cat",
            "--max-tokens",
            "8",
            "--temperature",
            "0",
            "--threads",
            "1",
        ]);
        assert!(o.status.success(), "{model}: {}", stderr(&o));
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let want = greedy(&out);
    let hf = dir.0.join("hf").display().to_string();
    let o = run(&["export", "--model", &out, "--format", "hf", "--out", &hf]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(dir.0.join("hf/model.safetensors").exists());
    assert_eq!(greedy(&hf), want, "the merged hf export generates otherwise");
    let gguf = dir.0.join("merged.gguf").display().to_string();
    let o = run(&["export", "--model", &out, "--format", "gguf", "--out", &gguf]);
    assert!(o.status.success(), "{}", stderr(&o));
    // (The tiny fixture's tokenizer decodes differently from GGUF — the base's own GGUF
    // export does too — so the GGUF file is compared with the merged hf export's.)
    let via_hf = dir.0.join("via-hf.gguf").display().to_string();
    let o = run(&["export", "--model", &hf, "--format", "gguf", "--out", &via_hf]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(greedy(&gguf), greedy(&via_hf), "the merged gguf export generates otherwise");

    // The adapters alone, as PEFT writes them.
    let peft = dir.0.join("peft").display().to_string();
    let o = run(&["export", "--model", &out, "--format", "peft", "--out", &peft]);
    assert!(o.status.success(), "{}", stderr(&o));
    let cfg: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.0.join("peft/adapter_config.json")).unwrap()).unwrap();
    assert_eq!(cfg["r"], 4);
    assert_eq!(cfg["lora_alpha"].as_f64(), Some(8.0));
    assert_eq!(cfg["target_modules"], serde_json::json!(["down_proj", "q_proj", "v_proj"]));
    assert!(dir.0.join("peft/adapter_model.safetensors").exists());
    let o = run(&["export", "--model", &out, "--format", "peft", "--out", &peft]);
    assert!(o.status.success(), "an earlier PEFT export is replaced: {}", stderr(&o));
    let o = run(&["export", "--model", &out, "--format", "peft", "--quant", "q8_0", "--out", &peft]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("--quant"), "{}", stderr(&o));
}

#[test]
fn bad_lora_flags_are_refused_by_name() {
    let dir = TempDir::new("lora-bad");
    let data = text_data(&dir.0);
    let out = dir.0.join("out").display().to_string();
    let base =
        ["train", "--init", &llama(), "--data", &data, "--steps", "1", "--out", &out, "--threads", "1", "--seq", "16"];
    for (extra, flag, word) in [
        (&["--lora-rank", "0"][..], "--lora-rank", "at least 1"),
        (&["--lora-rank", "4", "--lora-targets", "q,zz"][..], "--lora-targets", "zz"),
        (&["--lora-rank", "4", "--lora-alpha", "-1"][..], "--lora-alpha", "> 0"),
        (&["--lora-rank", "4", "--lora-dropout", "0.1"][..], "--lora-dropout", "not implemented"),
    ] {
        let o = run(&[&base[..], extra].concat());
        assert!(!o.status.success(), "{extra:?} was accepted");
        let e = stderr(&o);
        assert!(e.contains(flag) && e.contains(word), "{extra:?}: {e}");
    }
    // LoRA is for a fresh --init run: not from scratch, not on a full checkpoint's resume.
    let o = run(&["train", "--preset", "tiny", "--lora-rank", "4", "--steps", "1", "--out", &out]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("--lora-rank") && stderr(&o).contains("--init"), "{}", stderr(&o));
    let o = run(&[&base[..], &["--json"]].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    let o = run(&["train", "--resume", &out, "--lora-rank", "4", "--steps", "2"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("--lora-rank"), "{}", stderr(&o));
    // A PEFT export needs LoRA adapters.
    let peft = dir.0.join("peft").display().to_string();
    let o = run(&["export", "--model", &out, "--format", "peft", "--out", &peft]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("full fine-tuning checkpoint"), "{}", stderr(&o));
}
