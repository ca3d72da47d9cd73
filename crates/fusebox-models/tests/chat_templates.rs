//! fusebox's chat-template rendering against Hugging Face `transformers`'
//! `apply_chat_template`, byte for byte, for the templates of SmolLM2, Gemma 3,
//! Llama 3.1, Qwen2.5, Qwen3, Mistral v0.3 and gpt-oss (fixtures/chat_templates/,
//! recorded by scripts/record_chat_template_fixtures.py; its header says where each
//! template comes from). Both sides' `strftime_now` answer the fixture's fixed time.
//! The templates that take tools render them, assistant turns with `tool_calls` and
//! `tool` results too.
//!
//! Regenerate: `/tmp/tvenv/bin/python scripts/record_chat_template_fixtures.py`.

use std::path::{Path, PathBuf};

use fusebox_models::chat::{ChatTemplate, OutputFormat, GEMMA3_TEMPLATE, GPT_OSS_TEMPLATE};
use fusebox_models::gguf::GgufFile;
use fusebox_models::tokenizer::Tokenizer;
use serde_json::Value;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/chat_templates")
}

fn expected() -> Value {
    let text = std::fs::read_to_string(fixtures().join("expected.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

#[test]
fn renders_match_transformers_for_the_seven_templates() {
    let expected = expected();
    let now =
        chrono::NaiveDateTime::parse_from_str(expected["strftime_now"].as_str().unwrap(), "%Y-%m-%dT%H:%M:%S").unwrap();
    let templates = expected["templates"].as_array().unwrap();
    let names: Vec<&str> = templates.iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["smollm2", "gemma3", "llama3.1", "qwen2.5", "qwen3", "mistral-v0.3", "gpt-oss"]);
    let mut failures = Vec::new();
    let mut checked = 0;
    for t in templates {
        let name = t["name"].as_str().unwrap();
        let source = std::fs::read_to_string(fixtures().join(t["file"].as_str().unwrap())).unwrap();
        let template = ChatTemplate::new(&source, t["bos_token"].as_str(), t["eos_token"].as_str())
            .and_then(|t| t.with_fixed_now(now))
            .unwrap();
        for case in t["cases"].as_array().unwrap() {
            let case_name = case["name"].as_str().unwrap();
            let messages = case["messages"].as_array().unwrap();
            let gen = case["add_generation_prompt"].as_bool().unwrap();
            let extra = case["extra"].as_object().cloned().unwrap_or_default();
            let ours = template.render(messages, gen, &extra);
            checked += 1;
            match (&ours, case.get("expected"), case.get("error")) {
                (Ok(text), Some(Value::String(want)), _) if text == want => {}
                (Err(e), None, Some(Value::String(msg))) if e.to_string().contains(msg.as_str()) => {}
                _ => failures.push(format!(
                    "{name}/{case_name}: ours {ours:?}\n    transformers {:?}",
                    case.get("expected").or(case.get("error"))
                )),
            }
        }
    }
    // Eight common cases each, gpt-oss's seven of its own, and four tool cases for each
    // of the four templates that take tools.
    assert_eq!(checked, 7 * 8 + 7 + 4 * 4);
    assert!(failures.is_empty(), "{} of {checked} differ:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn the_bundled_gemma3_fallback_is_the_fixture() {
    let fixture = std::fs::read_to_string(fixtures().join("gemma3.jinja")).unwrap();
    assert_eq!(GEMMA3_TEMPLATE, fixture);
}

#[test]
fn the_bundled_gpt_oss_fallback_is_the_fixture() {
    let fixture = std::fs::read_to_string(fixtures().join("gpt-oss.jinja")).unwrap();
    assert_eq!(GPT_OSS_TEMPLATE, fixture);
}

#[test]
fn a_harmony_vocabulary_without_a_template_gets_gpt_oss_and_harmony_output() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tokenizers/o200k_style");
    let tok = Tokenizer::from_hf_dir(&dir).unwrap();
    let t = ChatTemplate::for_tokenizer(None, &tok).unwrap();
    assert!(t.notice().is_some_and(|n| n.contains("gpt-oss")), "{:?}", t.notice());
    assert_eq!(t.source(), GPT_OSS_TEMPLATE);
    // The probe's assistant turn, the last one without a generation prompt, ends with <|return|>.
    assert_eq!(t.end_of_turn(), ["<|return|>"]);
    let text = t.apply(&[("user", "Hi")], true).unwrap();
    assert!(
        text.starts_with("<|start|>system<|message|>")
            && text.ends_with("<|start|>user<|message|>Hi<|end|><|start|>assistant")
    );
    let format = OutputFormat::detect(&t, &tok);
    assert!(matches!(format, OutputFormat::Harmony(_)));
    let end = tok.token_id("<|end|>").unwrap();
    let ret = tok.token_id("<|return|>").unwrap();
    assert_eq!(format.stop_ids(vec![end, ret]), [ret]);
    // A plain vocabulary keeps plain output with the same template.
    let plain =
        Tokenizer::from_hf_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tokenizers/llama3_style"))
            .unwrap();
    assert_eq!(OutputFormat::detect(&t, &plain), OutputFormat::Plain);
}

fn model(name: &str) -> Option<PathBuf> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models").join(name);
    if p.exists() {
        Some(p)
    } else {
        eprintln!("skipping: {} not found (scripts/fetch-*.sh fetch it)", p.display());
        None
    }
}

#[test]
fn smollm2_gguf_template_is_the_fixture_and_ends_turns_with_im_end() {
    let Some(path) = model("SmolLM2-135M-Instruct.Q4_1.gguf") else { return };
    let file = GgufFile::open(&path).unwrap();
    let source = file.metadata().require_str("tokenizer.chat_template").unwrap();
    assert_eq!(source, std::fs::read_to_string(fixtures().join("smollm2.jinja")).unwrap());
    let tok = Tokenizer::from_gguf(file.metadata()).unwrap();
    let t = ChatTemplate::for_tokenizer(Some(source), &tok).unwrap();
    assert_eq!((t.bos_token(), t.eos_token()), (Some("<|im_start|>"), Some("<|im_end|>")));
    assert_eq!(t.end_of_turn(), ["<|im_end|>"]);
    assert_eq!(t.notice(), None);
}

#[test]
fn gemma3_gguf_without_a_template_falls_back_to_gemma3s() {
    let Some(path) = model("gemma-3-270m-q4_k_m.gguf") else { return };
    let file = GgufFile::open(&path).unwrap();
    assert_eq!(file.metadata().get_str("tokenizer.chat_template").unwrap(), None);
    let tok = match Tokenizer::from_gguf(file.metadata()) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("skipping: this build cannot read Gemma 3's tokenizer: {e}");
            return;
        }
    };
    let t = ChatTemplate::for_tokenizer(None, &tok).unwrap();
    assert!(t.notice().is_some_and(|n| n.contains("Gemma 3")), "{:?}", t.notice());
    assert_eq!(t.end_of_turn(), ["<end_of_turn>"]);
    assert!(t.apply(&[("user", "Hi")], true).unwrap().starts_with("<bos><start_of_turn>user\nHi<end_of_turn>\n"));
}
