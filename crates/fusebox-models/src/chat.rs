//! Chat templates: turning `(role, content)` messages into the prompt text a
//! chat model was trained on.
//!
//! Only ChatML is implemented, as SmolLM2-Instruct's `tokenizer.chat_template`
//! (a Jinja template) writes it:
//!
//! ```text
//! <|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n
//! <|im_start|>user\nHi!<|im_end|>\n
//! <|im_start|>assistant\n
//! ```
//!
//! (one line per turn here; the real text has no line break after each `\n`).
//! The default system turn is inserted only when the first message is not a
//! system message; the trailing `<|im_start|>assistant\n` is the generation prompt.

use fusebox::{Error, Result};

/// SmolLM2-Instruct's default system prompt, from its GGUF `tokenizer.chat_template`.
pub const SMOLLM2_DEFAULT_SYSTEM: &str = "You are a helpful AI assistant named SmolLM, trained by Hugging Face";

/// A ChatML template with an optional default system prompt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatTemplate {
    default_system: Option<String>,
}

impl ChatTemplate {
    /// ChatML with `default_system` inserted when the conversation has no system turn first.
    pub fn chatml(default_system: Option<&str>) -> Self {
        ChatTemplate { default_system: default_system.map(str::to_owned) }
    }

    /// SmolLM2-Instruct's template: ChatML with [`SMOLLM2_DEFAULT_SYSTEM`].
    pub fn smollm2() -> Self {
        Self::chatml(Some(SMOLLM2_DEFAULT_SYSTEM))
    }

    /// The template a GGUF `tokenizer.chat_template` (Jinja source) stands for.
    ///
    /// Recognises ChatML (`<|im_start|>` ... `<|im_end|>`); a default system
    /// prompt is taken from a literal `'<|im_start|>system\n...<|im_end|>` in the source.
    pub fn from_jinja(source: &str) -> Result<Self> {
        if !(source.contains("<|im_start|>") && source.contains("<|im_end|>")) {
            return Err(Error::unsupported(
                "ChatTemplate::from_jinja",
                "only ChatML templates (<|im_start|> role ... <|im_end|>) are supported",
            ));
        }
        const OPEN: &str = "<|im_start|>system\n";
        let default_system = source.find(OPEN).and_then(|at| {
            let rest = &source[at + OPEN.len()..];
            rest.find("<|im_end|>").map(|end| &rest[..end])
        });
        Ok(Self::chatml(default_system))
    }

    /// The default system prompt, if any.
    pub fn default_system(&self) -> Option<&str> {
        self.default_system.as_deref()
    }

    /// The prompt text of `messages` (`(role, content)` pairs); ends with
    /// `<|im_start|>assistant\n` when `add_generation_prompt`.
    pub fn apply(&self, messages: &[(&str, &str)], add_generation_prompt: bool) -> String {
        let mut out = String::new();
        let first_is_system = messages.first().is_some_and(|(role, _)| *role == "system");
        if let Some(system) = self.default_system.as_deref().filter(|_| !messages.is_empty() && !first_is_system) {
            push_turn(&mut out, "system", system);
        }
        for (role, content) in messages {
            push_turn(&mut out, role, content);
        }
        if add_generation_prompt {
            out.push_str("<|im_start|>assistant\n");
        }
        out
    }
}

fn push_turn(out: &mut String, role: &str, content: &str) {
    out.push_str("<|im_start|>");
    out.push_str(role);
    out.push('\n');
    out.push_str(content);
    out.push_str("<|im_end|>\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smollm2_inserts_default_system() {
        let t = ChatTemplate::smollm2();
        assert_eq!(
            t.apply(&[("user", "Hi!")], true),
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n\
             <|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n"
        );
        assert_eq!(
            t.apply(&[("system", "Be brief."), ("user", "Hi!"), ("assistant", "Hello.")], false),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n\
             <|im_start|>assistant\nHello.<|im_end|>\n"
        );
        // The Jinja loop never runs for no messages, so no system turn either.
        assert_eq!(t.apply(&[], true), "<|im_start|>assistant\n");
    }

    #[test]
    fn reads_default_system_from_jinja() {
        let src = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}\
                   {{ '<|im_start|>system\nYou are X<|im_end|>\n' }}{% endif %}\
                   {{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}";
        assert_eq!(
            ChatTemplate::from_jinja(src).map(|t| t.default_system().map(str::to_owned)),
            Ok(Some("You are X".into()))
        );
        assert!(ChatTemplate::from_jinja("{{ bos_token }}[INST]").is_err());
    }
}
