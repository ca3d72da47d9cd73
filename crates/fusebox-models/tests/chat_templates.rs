//! fusebox's chat-template rendering against Hugging Face `transformers`'
//! `apply_chat_template`, byte for byte, for the templates of SmolLM2, Gemma 3,
//! Llama 3.1, Qwen2.5 and Mistral v0.3 (fixtures/chat_templates/, recorded by
//! scripts/record_chat_template_fixtures.py; its header says where each template
//! comes from).

use std::path::{Path, PathBuf};

use fusebox_models::chat::{ChatTemplate, GEMMA3_TEMPLATE};
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
fn renders_match_transformers_for_the_five_templates() {
    let expected = expected();
    let templates = expected["templates"].as_array().unwrap();
    let names: Vec<&str> = templates.iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["smollm2", "gemma3", "llama3.1", "qwen2.5", "mistral-v0.3"]);
    let mut failures = Vec::new();
    let mut checked = 0;
    for t in templates {
        let name = t["name"].as_str().unwrap();
        let source = std::fs::read_to_string(fixtures().join(t["file"].as_str().unwrap())).unwrap();
        let template = ChatTemplate::new(&source, t["bos_token"].as_str(), t["eos_token"].as_str()).unwrap();
        for case in t["cases"].as_array().unwrap() {
            let case_name = case["name"].as_str().unwrap();
            let messages = case["messages"].as_array().unwrap();
            let gen = case["add_generation_prompt"].as_bool().unwrap();
            let ours = template.render(messages, gen, &serde_json::Map::new());
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
    assert_eq!(checked, 40);
    assert!(failures.is_empty(), "{} of {checked} differ:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn the_bundled_gemma3_fallback_is_the_fixture() {
    let fixture = std::fs::read_to_string(fixtures().join("gemma3.jinja")).unwrap();
    assert_eq!(GEMMA3_TEMPLATE, fixture);
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
