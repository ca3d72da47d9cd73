//! Chat templates and multi-turn chat.
//!
//! A chat model is trained on conversations laid out by its own Jinja template
//! (`tokenizer.chat_template` in a GGUF file, `chat_template` in a Hugging Face
//! `tokenizer_config.json`). [`ChatTemplate`] renders it with `minijinja` exactly as
//! `transformers`' `apply_chat_template` does; a model without one gets ChatML (or
//! Gemma 3's template for a Gemma vocabulary) with a notice. A conversation over one
//! pretrained model's KV cache is `pretrained::chat::ChatSession`.
//!
//! ```text
//! <|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n
//! <|im_start|>user\nHi!<|im_end|>\n
//! <|im_start|>assistant\n
//! ```
//!
//! (SmolLM2's rendering of one user message with the generation prompt, one line per
//! turn here.)

pub mod output;
mod python;
mod template;
pub mod tools;

pub use output::{OutputFormat, Part, ReplyDecoder, ReplyParser};
pub use template::{
    json_to_value, ChatTemplate, CHATML_TEMPLATE, GEMMA3_TEMPLATE, GPT_OSS_TEMPLATE, SMOLLM2_DEFAULT_SYSTEM,
};
pub use tools::{ParsedCall, ToolCallFormat, ToolSupport};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smollm2_inserts_default_system() {
        let t = ChatTemplate::smollm2().unwrap();
        assert_eq!(
            t.apply(&[("user", "Hi!")], true).unwrap(),
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n\
             <|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n"
        );
        assert_eq!(
            t.apply(&[("system", "Be brief."), ("user", "Hi!"), ("assistant", "Hello.")], false).unwrap(),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n\
             <|im_start|>assistant\nHello.<|im_end|>\n"
        );
        // The Jinja loop never runs for no messages, so no system turn either.
        assert_eq!(t.apply(&[], true).unwrap(), "<|im_start|>assistant\n");
        // A default system prompt with quotes and a backslash stays literal.
        let t = ChatTemplate::chatml(Some("It's a \\ {{ x }}")).unwrap();
        assert!(t
            .apply(&[("user", "q")], false)
            .unwrap()
            .starts_with("<|im_start|>system\nIt's a \\ {{ x }}<|im_end|>"));
    }

    #[test]
    fn jinja_errors_are_quoted() {
        let e = ChatTemplate::from_jinja("{% for m in messages %}").unwrap_err().to_string();
        assert!(e.contains("does not parse") && e.contains("unexpected end of input"), "{e}");
        let t = ChatTemplate::from_jinja("{{ raise_exception('Only user and assistant roles') }}").unwrap();
        let e = t.apply(&[("user", "x")], true).unwrap_err().to_string();
        assert!(e.contains("rendering failed") && e.contains("Only user and assistant roles"), "{e}");
        // A runaway template runs out of fuel instead of hanging.
        let t = ChatTemplate::from_jinja(
            "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
        )
        .unwrap();
        assert!(t.apply(&[], false).unwrap_err().to_string().contains("fuel"));
    }

    #[test]
    fn python_methods_filters_and_globals() {
        let render =
            |src: &str| ChatTemplate::from_jinja(src).unwrap().apply(&[("user", "  Hello World  ")], true).unwrap();
        assert_eq!(render("{{ messages[0].content.strip().lower() }}"), "hello world");
        assert_eq!(render("{{ messages[0]['content'].strip().startswith('Hello') }}"), "True");
        assert_eq!(
            render("{{ 'a b'.title() }}|{{ 'x,y'.split(',') }}|{{ none }}|{{ 1.5 }}"),
            "A B|['x', 'y']|None|1.5"
        );
        assert_eq!(
            render("{% for k, v in {'a': 1, 'b': [1, 2.0]}.items() %}{{ k }}={{ v }};{% endfor %}"),
            "a=1;b=[1, 2.0];"
        );
        assert_eq!(
            render("{{ {'b': 'é<', 'a': [1, none, true]} | tojson }}|{{ {'a': 1} | tojson(indent=2) }}"),
            "{\"b\": \"é<\", \"a\": [1, null, true]}|{\n  \"a\": 1\n}"
        );
        assert_eq!(
            render("{{ {'b': 1, 'a': 2} | tojson(sort_keys=true, separators=(',', ':')) }}"),
            "{\"a\":2,\"b\":1}"
        );
        assert_eq!(
            render(
                "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.n }}"
            ),
            "1"
        );
        assert_eq!(render("{% for i in range(5) %}{% if i == 2 %}{% break %}{% endif %}{{ i }}{% endfor %}"), "01");
        // trim_blocks + lstrip_blocks, and the trailing newline dropped.
        assert_eq!(render("  {% if true %}\nA\n  {% endif %}\nB\n"), "A\nB");
        let year = chrono::Local::now().format("%Y").to_string();
        assert_eq!(render("{{ strftime_now('%Y') }}"), year);
        assert!(ChatTemplate::from_jinja("{{ strftime_now('%Q') }}").unwrap().apply(&[], false).is_err());
    }

    #[test]
    fn special_tokens_and_extra_variables() {
        let t =
            ChatTemplate::new("{{ bos_token }}{{ x }}{{ eos_token }}{{ tools is none }}", Some("<s>"), Some("</s>"))
                .unwrap();
        let mut extra = serde_json::Map::new();
        extra.insert("x".into(), serde_json::json!("mid"));
        assert_eq!(t.render(&[], false, &extra).unwrap(), "<s>mid</s>True");
        let t = ChatTemplate::from_jinja("[{{ bos_token }}]{% if eos_token is defined %}!{% endif %}").unwrap();
        assert_eq!(t.apply(&[], false).unwrap(), "[]");
    }

    #[test]
    fn the_bundled_gemma3_template_renders_gemma_turns() {
        let t = ChatTemplate::new(GEMMA3_TEMPLATE, Some("<bos>"), Some("<eos>")).unwrap();
        assert_eq!(
            t.apply(&[("system", "S"), ("user", "Hi"), ("assistant", " Yo "), ("user", "Q")], true).unwrap(),
            "<bos><start_of_turn>user\nS\n\nHi<end_of_turn>\n<start_of_turn>model\nYo<end_of_turn>\n\
             <start_of_turn>user\nQ<end_of_turn>\n<start_of_turn>model\n"
        );
    }
}
