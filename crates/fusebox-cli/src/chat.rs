//! `fusebox chat --model M`: a multi-turn chat in the terminal with the model's own
//! chat template, the KV cache kept across turns (see `fusebox_models::pretrained::chat`).
//!
//! In a terminal: line editing and history (rustyline), the answer streamed as it
//! comes, `/reset` and `/exit`, Ctrl-C stops the current answer (at the prompt it
//! clears the line), Ctrl-D exits. From a pipe: one message per line, each answer
//! printed on its own (`--json`: one object per turn).

use std::io::{BufRead, IsTerminal, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use clap::Args;
use fusebox::{Error, Result};
use fusebox_models::chat::Part;
use fusebox_models::pretrained::chat::{ChatOptions, ChatSession, Turn, TurnEnd};
use fusebox_models::{Sampler, SamplerConfig};
use serde_json::json;

use crate::backends::backend_for;

#[derive(Args)]
pub struct ChatArgs {
    /// A GGUF file or a Hugging Face directory with a chat model.
    #[arg(long)]
    model: PathBuf,
    /// The system message (first in the conversation).
    #[arg(long)]
    system: Option<String>,
    /// Most tokens in one answer.
    #[arg(long, default_value_t = 512)]
    max_tokens: usize,
    /// 0 = greedy.
    #[arg(long, default_value_t = 0.8, allow_negative_numbers = true)]
    temperature: f32,
    /// Keep the k most likely tokens (0 = all).
    #[arg(long, default_value_t = 40)]
    top_k: usize,
    /// Nucleus sampling threshold (1 = off).
    #[arg(long, default_value_t = 0.95, allow_negative_numbers = true)]
    top_p: f32,
    /// Penalty on tokens already in the conversation (1 = off).
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    repetition_penalty: f32,
    /// Seed of the sampler's random numbers.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Positions the KV cache holds (default min(4096, the model's context)).
    #[arg(long)]
    ctx_size: Option<usize>,
    /// KV cache storage: f16 (default), bf16 or f32 (see `fusebox generate --help`).
    #[arg(long, default_value = "f16", value_parser = crate::generate::parse_cache_type)]
    cache_type: fusebox::DType,
    /// When the conversation no longer fits, drop the oldest exchanges (the system
    /// message stays) instead of stopping.
    #[arg(long)]
    context_shift: bool,
    #[command(flatten)]
    pipeline: crate::pipeline::PipelineArgs,
    /// Compute backend: cpu or wgpu.
    #[arg(long, default_value = "cpu")]
    backend: String,
    /// CPU threads (default: every core).
    #[arg(long)]
    threads: Option<usize>,
    /// One JSON object per turn instead of the answer's text (for scripts).
    #[arg(long)]
    json: bool,
}

/// Default KV-cache size when `--ctx-size` is not given (clamped to the model's context).
const DEFAULT_CTX: usize = 4096;

const HELP: &str = "/reset forgets the conversation, /exit (or Ctrl-D) leaves; Ctrl-C stops an answer";

fn sampler(args: &ChatArgs) -> Result<Sampler> {
    Sampler::new(SamplerConfig {
        temperature: args.temperature,
        top_k: args.top_k,
        top_p: args.top_p,
        repetition_penalty: args.repetition_penalty,
        seed: args.seed,
    })
    .map_err(|e| match e {
        Error::Value { what, expected, got, .. } => {
            Error::value("chat", format!("--{}", what.replace('_', "-")), expected, got)
        }
        other => other,
    })
}

/// What a line typed at the prompt asks for.
#[derive(Debug, PartialEq, Eq)]
enum Input<'a> {
    Message(&'a str),
    Reset,
    Exit,
    Help,
    Empty,
}

fn parse_input(line: &str) -> Input<'_> {
    let trimmed = line.trim();
    match trimmed {
        "" => Input::Empty,
        "/reset" | "/clear" => Input::Reset,
        "/exit" | "/quit" => Input::Exit,
        "/help" | "/?" => Input::Help,
        _ => Input::Message(line.trim_end_matches(['\r', '\n'])),
    }
}

/// Where lines come from: the line editor in a terminal, else stdin.
enum Lines {
    Editor(Box<rustyline::DefaultEditor>),
    Pipe(std::io::StdinLock<'static>),
}

enum Line {
    Text(String),
    /// Ctrl-C at the prompt.
    Cancelled,
    /// Ctrl-D, or the end of the input.
    End,
}

impl Lines {
    fn next(&mut self) -> Result<Line> {
        match self {
            Lines::Editor(ed) => match ed.readline("> ") {
                Ok(line) => {
                    if !line.trim().is_empty() {
                        let _ = ed.add_history_entry(line.as_str());
                    }
                    Ok(Line::Text(line))
                }
                Err(rustyline::error::ReadlineError::Interrupted) => Ok(Line::Cancelled),
                Err(rustyline::error::ReadlineError::Eof) => Ok(Line::End),
                Err(e) => Err(Error::Io(format!("chat: reading the terminal: {e}"))),
            },
            Lines::Pipe(stdin) => {
                let mut line = String::new();
                match stdin.read_line(&mut line) {
                    Ok(0) => Ok(Line::End),
                    Ok(_) => Ok(Line::Text(line)),
                    Err(e) => Err(Error::Io(format!("chat: reading stdin: {e}"))),
                }
            }
        }
    }
}

pub fn run(args: &ChatArgs) -> Result<()> {
    let sampler = sampler(args)?;
    if args.max_tokens == 0 {
        return Err(Error::value("chat", "--max-tokens", "at least 1", 0));
    }
    if args.threads == Some(0) {
        return Err(Error::value("chat", "--threads", "at least 1", 0));
    }
    let dist = crate::pipeline::Distributed::from_environment(&args.pipeline)?;
    dist.run(|| converse(args, sampler, &dist))
}

/// The conversation on rank 0 (or the only process); under mpirun the other ranks
/// follow its steps through their stages.
fn converse(args: &ChatArgs, mut sampler: Sampler, dist: &crate::pipeline::Distributed) -> Result<()> {
    let b = backend_for(&args.backend, args.threads)?;
    if !dist.is_lead() {
        let ctx = |context: usize| args.ctx_size.unwrap_or_else(|| DEFAULT_CTX.min(context));
        return dist.follow(b.as_ref(), &args.model, args.ctx_size, args.cache_type, 1, ctx);
    }
    let model = dist.load(b.as_ref(), &args.model, args.ctx_size, args.cache_type)?;
    let template = model.chat_template()?;
    if let Some(notice) = template.notice() {
        eprintln!("[{notice}]");
    }
    let ctx = args.ctx_size.unwrap_or_else(|| DEFAULT_CTX.min(model.context_length()));
    crate::generate::check_cache_memory(&model, ctx, args.cache_type)?;
    let options = ChatOptions { ctx_size: ctx, max_tokens: args.max_tokens, context_shift: args.context_shift };
    let mut chat = ChatSession::with_cache_dtype(&model, b.as_ref(), args.system.as_deref(), options, args.cache_type)?;

    let interactive = std::io::stdin().is_terminal();
    // Ctrl-C while an answer streams sets this; the answer stops after its next token.
    // (At the prompt the line editor has the terminal in raw mode and sees Ctrl-C itself.)
    let interrupted = Arc::new(AtomicBool::new(false));
    {
        let flag = Arc::clone(&interrupted);
        ctrlc::set_handler(move || flag.store(true, Ordering::SeqCst))
            .map_err(|e| Error::Io(format!("chat: cannot handle Ctrl-C: {e}")))?;
    }
    let mut lines = if interactive {
        let ed = rustyline::DefaultEditor::new().map_err(|e| Error::Io(format!("chat: terminal: {e}")))?;
        eprintln!("[{}] {} positions of context. {HELP}", model.description, ctx);
        Lines::Editor(Box::new(ed))
    } else {
        Lines::Pipe(std::io::stdin().lock())
    };
    let streaming = !args.json;
    let mut out = std::io::stdout();
    loop {
        let line = match lines.next()? {
            Line::Text(l) => l,
            Line::Cancelled => continue,
            Line::End => break,
        };
        let message = match parse_input(&line) {
            Input::Exit => break,
            Input::Empty => continue,
            Input::Help => {
                eprintln!("{HELP}");
                continue;
            }
            Input::Reset => {
                chat.reset();
                if interactive {
                    eprintln!("[conversation reset]");
                }
                continue;
            }
            Input::Message(m) => m,
        };
        interrupted.store(false, Ordering::SeqCst);
        // The answer goes to stdout; reasoning (harmony's analysis channel) to stderr,
        // marked, so that stdout is the answer alone.
        let mut reasoning_open = false;
        let mut write = |part: Part, text: &str| -> Result<()> {
            if !streaming || text.is_empty() {
                return Ok(());
            }
            match part {
                Part::Reasoning => {
                    if !reasoning_open {
                        eprint!("[reasoning] ");
                        reasoning_open = true;
                    }
                    eprint!("{text}");
                    Ok(())
                }
                Part::Content => {
                    if std::mem::take(&mut reasoning_open) {
                        eprintln!("\n[/reasoning]");
                    }
                    out.write_all(text.as_bytes())
                        .and_then(|()| out.flush())
                        .map_err(|e| Error::Io(format!("chat: stdout: {e}")))
                }
                // A tool call: this command runs no tools; the arguments are shown as reasoning is.
                Part::ToolCall => {
                    eprint!("{text}");
                    Ok(())
                }
            }
        };
        let turn = match chat.answer_parts(message, &mut sampler, &|| interrupted.load(Ordering::SeqCst), &mut write) {
            Ok(t) => t,
            Err(e) => {
                // The conversation is as it was: report and take the next line.
                eprintln!("error: {e}");
                continue;
            }
        };
        report(args, &turn, message, ctx)?;
    }
    drop(chat);
    dist.finish(&model)?;
    Ok(())
}

fn report(args: &ChatArgs, turn: &Turn, message: &str, ctx: usize) -> Result<()> {
    if args.json {
        let mut v = json!({
            "user": message,
            "reply": turn.reply,
            "reply_ids": turn.tokens,
            "stop_reason": turn.end.name(),
            "prompt_tokens": turn.prompt_tokens,
            "reused_tokens": turn.reused,
            "prefilled_tokens": turn.prefilled,
            "restarted": turn.restarted.is_some(),
            "dropped_turns": turn.dropped_turns,
        });
        if !turn.reasoning.is_empty() {
            v["reasoning"] = json!(turn.reasoning);
        }
        println!("{v}");
    } else {
        println!();
    }
    if turn.dropped_turns > 0 {
        eprintln!("[context shift: dropped the oldest {} exchange(s) to fit {ctx} positions]", turn.dropped_turns);
    }
    if let Some(common) = turn.restarted {
        eprintln!(
            "[the conversation re-rendered differently from what the cache held (same for {common} tokens): \
             read all {} tokens again]",
            turn.prompt_tokens
        );
    }
    match turn.end {
        TurnEnd::Interrupted => eprintln!("[stopped]"),
        TurnEnd::MaxTokens => eprintln!("[the answer reached --max-tokens {}]", args.max_tokens),
        TurnEnd::ContextFull => eprintln!(
            "[context full: {ctx} positions (--ctx-size); {}]",
            if args.context_shift {
                "the next turn drops the oldest exchanges"
            } else {
                "/reset starts over, --context-shift drops the oldest exchanges"
            }
        ),
        TurnEnd::StopToken => {}
    }
    let _ = std::io::stdout().flush();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_and_messages() {
        assert_eq!(parse_input("/reset\n"), Input::Reset);
        assert_eq!(parse_input("  /exit "), Input::Exit);
        assert_eq!(parse_input("/quit"), Input::Exit);
        assert_eq!(parse_input(" \n"), Input::Empty);
        assert_eq!(parse_input("Hi there\r\n"), Input::Message("Hi there"));
        assert_eq!(parse_input("/resetting is a word\n"), Input::Message("/resetting is a word"));
    }
}
