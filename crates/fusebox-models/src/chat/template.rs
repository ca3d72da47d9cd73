//! [`ChatTemplate`]: a model's Jinja chat template, compiled once with `minijinja` in
//! the environment Hugging Face `transformers` renders templates in.

use std::sync::Arc;

use fusebox::{Error, Result};
use minijinja::value::Value;
use minijinja::{AutoEscape, Environment, ErrorKind};

use super::python;
use crate::tokenizer::{TokenType, Tokenizer};

/// ChatML, the fallback for a model without a template (llama.cpp's default too).
pub const CHATML_TEMPLATE: &str = "{% for message in messages %}\
{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}\
{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/// Gemma 3's template (google/gemma-3-270m-it), the fallback for a vocabulary that has
/// `<start_of_turn>` and `<end_of_turn>` but a file without a template (Gemma GGUFs
/// converted without one).
pub const GEMMA3_TEMPLATE: &str = include_str!("templates/gemma3.jinja");

/// gpt-oss's template (openai/gpt-oss-20b and -120b, the harmony format), the fallback
/// for a vocabulary that has `<|start|>`, `<|channel|>` and `<|message|>` but a file
/// without a template.
pub const GPT_OSS_TEMPLATE: &str = include_str!("templates/gpt-oss.jinja");

/// SmolLM2-Instruct's default system prompt, from its GGUF `tokenizer.chat_template`.
pub const SMOLLM2_DEFAULT_SYSTEM: &str = "You are a helpful AI assistant named SmolLM, trained by Hugging Face";

/// Instructions one rendering may run: far more than a long conversation needs with
/// any real template (about a thousand per message).
const FUEL: u64 = 5_000_000;

/// The name the compiled template is stored under in its environment.
const NAME: &str = "chat_template";

/// A chat template: Jinja source compiled with `minijinja`, rendered as
/// `transformers`' `apply_chat_template` renders it.
///
/// The environment is the one `transformers` builds: `trim_blocks` and `lstrip_blocks`
/// on, the trailing newline dropped, no auto-escaping; `raise_exception(msg)`,
/// `strftime_now(fmt)` (local time), `namespace`, `dict`, loop controls; the filter
/// `tojson` as `json.dumps(x, ensure_ascii=False)` with `indent`, `separators`,
/// `sort_keys`; the Python string and dict methods templates call (`strip`,
/// `startswith`, `split`, `title`, `items`, `get`, … from `minijinja-contrib`'s
/// pycompat); and `{{ x }}` printing `None`/`True`/`False` and floats as Python does.
/// The variables are `messages`, `add_generation_prompt`, `tools` and `documents`
/// (`none`), `bos_token` and `eos_token` when the vocabulary has them, and any extra
/// ones the caller passes.
///
/// Dict keys of the messages keep their order only where the caller's JSON did
/// (`serde_json` here sorts object keys), which templates that print whole messages
/// could show.
#[derive(Clone)]
pub struct ChatTemplate {
    source: Arc<str>,
    env: Arc<Environment<'static>>,
    bos_token: Option<String>,
    eos_token: Option<String>,
    end_of_turn: Vec<String>,
    notice: Option<String>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("source_bytes", &self.source.len())
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .field("end_of_turn", &self.end_of_turn)
            .field("notice", &self.notice)
            .finish()
    }
}

impl PartialEq for ChatTemplate {
    fn eq(&self, other: &Self) -> bool {
        self.source == other.source
            && self.bos_token == other.bos_token
            && self.eos_token == other.eos_token
            && self.end_of_turn == other.end_of_turn
    }
}

fn jinja_error(what: &str, e: &minijinja::Error) -> String {
    // `{:#}` adds the template line the error points at.
    let mut msg = format!("{e}");
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        msg.push_str(&format!(": {s}"));
        source = s.source();
    }
    format!("{what}: {msg}")
}

fn raise_exception(message: String) -> std::result::Result<Value, minijinja::Error> {
    Err(minijinja::Error::new(ErrorKind::InvalidOperation, message))
}

/// `strftime_now(format)`: the local time now, or `fixed` when the template has a fixed clock.
fn strftime_now(format: String, fixed: Option<chrono::NaiveDateTime>) -> std::result::Result<String, minijinja::Error> {
    use chrono::format::{Item, StrftimeItems};
    let items: Vec<Item<'_>> = StrftimeItems::new(&format).collect();
    if items.iter().any(|i| matches!(i, Item::Error)) {
        return Err(minijinja::Error::new(
            ErrorKind::InvalidOperation,
            format!("strftime_now: {format:?} is not a strftime format"),
        ));
    }
    let mut out = String::new();
    let written = match fixed {
        Some(t) => std::fmt::Write::write_fmt(&mut out, format_args!("{}", t.format_with_items(items.into_iter()))),
        None => std::fmt::Write::write_fmt(
            &mut out,
            format_args!("{}", chrono::Local::now().format_with_items(items.into_iter())),
        ),
    };
    written.map_err(|_| {
        minijinja::Error::new(ErrorKind::InvalidOperation, format!("strftime_now: cannot format {format:?}"))
    })?;
    Ok(out)
}

/// The `minijinja` value of a JSON value (numbers as integers where they are).
pub fn json_to_value(v: &serde_json::Value) -> Value {
    match v {
        serde_json::Value::Null => Value::from(()),
        serde_json::Value::Bool(b) => Value::from(*b),
        serde_json::Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                Value::from(i)
            } else if let Some(u) = n.as_u64() {
                Value::from(u)
            } else {
                Value::from(n.as_f64().unwrap_or(f64::NAN))
            }
        }
        serde_json::Value::String(s) => Value::from(s.as_str()),
        serde_json::Value::Array(a) => Value::from(a.iter().map(json_to_value).collect::<Vec<_>>()),
        serde_json::Value::Object(o) => {
            Value::from_pairs(o.iter().map(|(k, v)| (Value::from(k.as_str()), json_to_value(v))))
        }
    }
}

impl ChatTemplate {
    /// Compiles `source` (Jinja) with the special tokens `bos_token` and `eos_token`.
    ///
    /// A template that does not parse is an error quoting minijinja's message.
    pub fn new(source: &str, bos_token: Option<&str>, eos_token: Option<&str>) -> Result<Self> {
        Ok(ChatTemplate {
            source: Arc::from(source),
            env: Arc::new(Self::environment(source, None)?),
            bos_token: bos_token.map(str::to_owned),
            eos_token: eos_token.map(str::to_owned),
            end_of_turn: Vec::new(),
            notice: None,
        })
    }

    /// The same template with `strftime_now` answering `now` instead of the local time
    /// (gpt-oss's writes the current date into its system message): renders that do not
    /// depend on the day, for tests and reproducible prompts.
    pub fn with_fixed_now(mut self, now: chrono::NaiveDateTime) -> Result<Self> {
        self.env = Arc::new(Self::environment(&self.source, Some(now))?);
        Ok(self)
    }

    /// The minijinja environment `transformers` renders in, holding `source`.
    fn environment(source: &str, now: Option<chrono::NaiveDateTime>) -> Result<Environment<'static>> {
        let mut env = Environment::new();
        env.set_syntax(
            minijinja::syntax::SyntaxConfig::builder()
                .trim_blocks(true)
                .lstrip_blocks(true)
                .keep_trailing_newline(false)
                .build()
                .map_err(|e| Error::unsupported("chat template", jinja_error("syntax", &e)))?,
        );
        env.set_auto_escape_callback(|_| AutoEscape::None);
        // A template comes from a model file: bound its work, so a hostile one (a loop
        // over range(10**9)) ends with an error instead of hanging.
        env.set_fuel(Some(FUEL));
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.set_formatter(python::format);
        env.add_filter("tojson", python::tojson);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", move |format: String| strftime_now(format, now));
        env.add_template_owned(NAME, source.to_owned())
            .map_err(|e| Error::unsupported("chat template", jinja_error("the template does not parse", &e)))?;
        Ok(env)
    }

    /// Compiles `source` without special tokens (`bos_token`/`eos_token` undefined);
    /// see [`ChatTemplate::for_tokenizer`] for a model's template.
    pub fn from_jinja(source: &str) -> Result<Self> {
        Self::new(source, None, None)
    }

    /// ChatML with `default_system` inserted when the conversation does not start with
    /// a system turn (SmolLM2's form), without special tokens.
    pub fn chatml(default_system: Option<&str>) -> Result<Self> {
        match default_system {
            None => Self::new(CHATML_TEMPLATE, None, None),
            Some(system) => Self::new(
                &format!(
                    "{{% for message in messages %}}{{% if loop.first and messages[0]['role'] != 'system' %}}\
                     {{{{ '<|im_start|>system\\n' + {} + '<|im_end|>\\n' }}}}{{% endif %}}\
                     {{{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}}}\
                     {{% endfor %}}{{% if add_generation_prompt %}}{{{{ '<|im_start|>assistant\\n' }}}}{{% endif %}}",
                    jinja_string_literal(system)
                ),
                None,
                None,
            ),
        }
    }

    /// SmolLM2-Instruct's template: ChatML with [`SMOLLM2_DEFAULT_SYSTEM`].
    pub fn smollm2() -> Result<Self> {
        Self::chatml(Some(SMOLLM2_DEFAULT_SYSTEM))
    }

    /// A model's template: `source` (its `tokenizer.chat_template`), or when it has none
    /// a fallback with a [`notice`](Self::notice): Gemma 3's template for a vocabulary
    /// with `<start_of_turn>`/`<end_of_turn>`, gpt-oss's for one with `<|start|>`,
    /// `<|channel|>` and `<|message|>`, else ChatML. `bos_token`/`eos_token` are
    /// the vocabulary's, and [`end_of_turn`](Self::end_of_turn) is found by rendering a
    /// probe conversation: the special token that closes an assistant turn.
    pub fn for_tokenizer(source: Option<&str>, tok: &Tokenizer) -> Result<Self> {
        let text = |id: Option<u32>| id.and_then(|i| tok.token(i)).map(str::to_owned);
        let (bos, eos) = (text(tok.bos_id()), text(tok.eos_id()));
        let (source, notice) = match source {
            Some(s) => (s, None),
            None if tok.token_id("<start_of_turn>").is_some() && tok.token_id("<end_of_turn>").is_some() => (
                GEMMA3_TEMPLATE,
                Some("the model has no chat template; its vocabulary has <start_of_turn>/<end_of_turn>, so Gemma 3's is used"),
            ),
            None if ["<|start|>", "<|channel|>", "<|message|>"].iter().all(|t| tok.token_id(t).is_some()) => (
                GPT_OSS_TEMPLATE,
                Some("the model has no chat template; its vocabulary has harmony's <|start|>/<|channel|>/<|message|>, so gpt-oss's is used"),
            ),
            None => (CHATML_TEMPLATE, Some("the model has no chat template; ChatML (<|im_start|>role … <|im_end|>) is used")),
        };
        let mut t = Self::new(source, bos.as_deref(), eos.as_deref())?;
        t.notice = notice.map(str::to_owned);
        t.end_of_turn = t.probe_end_of_turn(tok);
        Ok(t)
    }

    /// The special token after an assistant message in a rendered `[user, assistant]`
    /// exchange (`<|im_end|>`, `<end_of_turn>`, `<|eot_id|>`, `</s>`), if it is a
    /// control token of `tok`.
    fn probe_end_of_turn(&self, tok: &Tokenizer) -> Vec<String> {
        const ANSWER: &str = "\u{E000}probe answer\u{E001}";
        let rendered = match self.apply(&[("user", "probe question"), ("assistant", ANSWER)], false) {
            Ok(r) => r,
            Err(_) => return Vec::new(),
        };
        let Some(at) = rendered.find(ANSWER) else { return Vec::new() };
        let rest = &rendered[at + ANSWER.len()..];
        let ids = tok.encode(rest, false);
        match ids.first() {
            Some(&id)
                if matches!(tok.token_type(id), Some(TokenType::Control | TokenType::UserDefined))
                    || tok.is_eog(id) =>
            {
                tok.token(id).map(|t| vec![t.to_owned()]).unwrap_or_default()
            }
            _ => Vec::new(),
        }
    }

    /// The Jinja source.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Why this template stands in for the model's own (the model has none), if it does.
    pub fn notice(&self) -> Option<&str> {
        self.notice.as_deref()
    }

    /// The `bos_token` the template sees.
    pub fn bos_token(&self) -> Option<&str> {
        self.bos_token.as_deref()
    }

    /// The `eos_token` the template sees.
    pub fn eos_token(&self) -> Option<&str> {
        self.eos_token.as_deref()
    }

    /// Texts of the tokens that end an assistant turn under this template (found by
    /// [`for_tokenizer`](Self::for_tokenizer); empty for a template built without a
    /// tokenizer).
    pub fn end_of_turn(&self) -> &[String] {
        &self.end_of_turn
    }

    /// The prompt text of `messages` (`(role, content)` pairs), with the generation
    /// prompt (the assistant turn's opening) when `add_generation_prompt`.
    ///
    /// A template that refuses the conversation (`raise_exception`) or fails while
    /// rendering is an error quoting its message.
    pub fn apply(&self, messages: &[(&str, &str)], add_generation_prompt: bool) -> Result<String> {
        let messages: Vec<Value> = messages
            .iter()
            .map(|(role, content)| {
                Value::from_pairs([("role", Value::from(*role)), ("content", Value::from(*content))])
            })
            .collect();
        self.render_values(messages, add_generation_prompt, &[])
    }

    /// [`apply`](Self::apply) for messages as JSON objects (`{"role", "content"}`, where
    /// `content` may be a list of parts, plus any fields the template reads, such as
    /// `tool_calls`), with extra template variables (`date_string`, `tools`, …).
    pub fn render(
        &self,
        messages: &[serde_json::Value],
        add_generation_prompt: bool,
        extra: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<String> {
        let messages: Vec<Value> = messages.iter().map(json_to_value).collect();
        let extra: Vec<(&str, Value)> = extra.iter().map(|(k, v)| (k.as_str(), json_to_value(v))).collect();
        self.render_values(messages, add_generation_prompt, &extra)
    }

    fn render_values(
        &self,
        messages: Vec<Value>,
        add_generation_prompt: bool,
        extra: &[(&str, Value)],
    ) -> Result<String> {
        let mut ctx: Vec<(&str, Value)> = vec![
            ("messages", Value::from(messages)),
            ("add_generation_prompt", Value::from(add_generation_prompt)),
            ("tools", Value::from(())),
            ("documents", Value::from(())),
        ];
        if let Some(b) = &self.bos_token {
            ctx.push(("bos_token", Value::from(b.as_str())));
        }
        if let Some(e) = &self.eos_token {
            ctx.push(("eos_token", Value::from(e.as_str())));
        }
        for (k, v) in extra {
            match ctx.iter_mut().find(|(name, _)| name == k) {
                Some(slot) => slot.1 = v.clone(),
                None => ctx.push((k, v.clone())),
            }
        }
        let template = self
            .env
            .get_template(NAME)
            .map_err(|e| Error::unsupported("chat template", jinja_error("the template is missing", &e)))?;
        template
            .render(Value::from_pairs(ctx))
            .map_err(|e| Error::unsupported("chat template", jinja_error("rendering failed", &e)))
    }

    /// Token ids of a rendered conversation: special tokens parsed, and BOS first when the
    /// tokenizer adds one and the text does not already start with it (templates that
    /// write `{{ bos_token }}` themselves would otherwise get two).
    pub fn encode(&self, tok: &Tokenizer, text: &str) -> Vec<u32> {
        let starts_with_bos = tok.bos_id().and_then(|b| tok.token(b)).is_some_and(|b| text.starts_with(b));
        tok.encode(text, tok.add_bos_default() && !starts_with_bos)
    }
}

/// `s` as a single-quoted Jinja string literal.
fn jinja_string_literal(s: &str) -> String {
    let mut out = String::from("'");
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\'' => out.push_str("\\'"),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out.push('\'');
    out
}
