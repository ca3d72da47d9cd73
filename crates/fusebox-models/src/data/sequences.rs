//! Fine-tuning data in a pretrained model's own tokens: sequences of input ids and
//! next-token targets, where a target [`IGNORE`] does not count in the loss.
//!
//! - **Text** (`--data FILE.txt`): the file tokenized with the model's tokenizer (BOS
//!   first when the tokenizer adds one), split 90/10 into training and held-out tokens,
//!   each part packed into windows of `seq + 1` tokens (inputs `w[..seq]`, targets
//!   `w[1..]`).
//! - **Chat** (`--data FILE.jsonl`): one `{"messages": [{"role", "content"}, …]}` per
//!   line, rendered by the model's chat template; the loss counts only the tokens of
//!   assistant turns (their content and the template's end of turn). The text is split
//!   at each assistant turn's boundaries, found by rendering the conversation up to it
//!   with and without the turn (`add_generation_prompt` before it), and each piece is
//!   tokenized on its own — the prompt exactly as inference tokenizes it, the answer as
//!   the model would emit it. One conversation in ten (at least one) is held out.
//! - **Addition as chat** (`--data addition-chat`): 3-digit sums as one user and one
//!   assistant turn (`What is 123 + 456?` → `579`); the held-out problems are the
//!   built-in task's (never trained on, nor their `b + a` twins).

use std::path::Path;

use fusebox::{Error, Result};
use serde_json::Value;

use crate::chat::ChatTemplate;
use crate::data::addition::Addition;
use crate::rng::Rng;
use crate::tokenizer::Tokenizer;

/// A target that does not count in the loss (the ignore index of `cross_entropy`).
pub const IGNORE: u32 = u32::MAX;

/// One training sequence: `targets[i]` is the token after `ids[i]`, or [`IGNORE`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sequence {
    /// Input token ids.
    pub ids: Vec<u32>,
    /// Next-token targets, as many as `ids`.
    pub targets: Vec<u32>,
}

impl Sequence {
    /// The sequence of `tokens` whose targets count where `counts[i + 1]` (the target
    /// is token `i + 1`); `None` with fewer than two tokens.
    pub fn from_tokens(tokens: &[u32], counts: &[bool]) -> Option<Sequence> {
        if tokens.len() < 2 {
            return None;
        }
        let ids = tokens[..tokens.len() - 1].to_vec();
        let targets = (1..tokens.len()).map(|i| if counts[i] { tokens[i] } else { IGNORE }).collect();
        Some(Sequence { ids, targets })
    }

    /// Targets that count in the loss.
    pub fn counted(&self) -> usize {
        self.targets.iter().filter(|&&t| t != IGNORE).count()
    }
}

/// Training and held-out sequences, and what was skipped.
#[derive(Debug, Clone)]
pub struct Sequences {
    /// Training sequences.
    pub train: Vec<Sequence>,
    /// Held-out sequences (eval loss, exact match).
    pub valid: Vec<Sequence>,
    /// Whether exact match (every counted target the arg-max) is meaningful: chat data,
    /// where each held-out sequence ends in one answer.
    pub answers: bool,
    /// One line per skipped input line (`--skip-bad-lines`).
    pub skipped: Vec<String>,
    /// What the data is, for messages.
    pub description: String,
    /// The input id of padding positions in a batch (their targets are [`IGNORE`]): the
    /// tokenizer's pad (see [`pad_of`]).
    pub pad: u32,
}

/// The padding id of `tok`'s sequences: its pad token, else EOS, else 0.
pub fn pad_of(tok: &Tokenizer) -> u32 {
    tok.pad_id().or(tok.eos_id()).unwrap_or(0)
}

/// `seq + 1`-token windows of `tokens` (the last partial one kept when it has at least
/// two tokens), all targets counted.
pub fn pack(tokens: &[u32], seq: usize) -> Vec<Sequence> {
    let all = vec![true; seq + 1];
    let mut out = Vec::new();
    let mut start = 0;
    // Each window also predicts the first token of the next one.
    while start + 1 < tokens.len() {
        let end = (start + seq + 1).min(tokens.len());
        out.extend(Sequence::from_tokens(&tokens[start..end], &all[..end - start]));
        start += seq;
    }
    out
}

/// A UTF-8 text file tokenized with `tok` and packed into `seq`-token windows, 90% for
/// training and the last 10% held out.
pub fn text_file(path: &Path, tok: &Tokenizer, seq: usize) -> Result<Sequences> {
    let at = |m: String| Error::Io(format!("{}: {m}", path.display()));
    let bytes = std::fs::read(path).map_err(|e| at(e.to_string()))?;
    let text = std::str::from_utf8(&bytes)
        .map_err(|e| at(format!("not UTF-8 text (invalid byte at offset {})", e.valid_up_to())))?;
    let tokens = tok.encode_ordinary(text, tok.add_bos_default());
    let split = tokens.len() * 9 / 10;
    if split < 2 || tokens.len() - split < 2 {
        return Err(at(format!("{} tokens: too short to hold out a tenth (needs at least 20)", tokens.len())));
    }
    let (train, valid) = (pack(&tokens[..split], seq), pack(&tokens[split..], seq));
    Ok(Sequences {
        description: format!(
            "{}: {} tokens, {} training and {} held-out windows of ≤ {seq}",
            path.display(),
            tokens.len(),
            train.len(),
            valid.len()
        ),
        train,
        valid,
        answers: false,
        skipped: Vec::new(),
        pad: pad_of(tok),
    })
}

/// One conversation rendered by `template` and tokenized by `tok`, the loss on its
/// assistant turns only (see the module docs). Errors say why (a template that does not
/// render the turns as prefixes of the whole, no assistant turn, too long for `seq`).
pub fn conversation(
    messages: &[(String, String)],
    tok: &Tokenizer,
    template: &ChatTemplate,
    seq: usize,
) -> Result<Sequence> {
    const OP: &str = "chat data";
    let pairs: Vec<(&str, &str)> = messages.iter().map(|(r, c)| (r.as_str(), c.as_str())).collect();
    let full = template.apply(&pairs, false)?;
    // Character boundaries: (start of an assistant answer, its end).
    let mut spans = Vec::new();
    for (i, (role, _)) in pairs.iter().enumerate() {
        if *role != "assistant" {
            continue;
        }
        let before = template.apply(&pairs[..i], true)?;
        let through = template.apply(&pairs[..=i], false)?;
        if !full.starts_with(&before) || !through.starts_with(&before) || !full.starts_with(&through) {
            return Err(Error::unsupported(
                OP,
                format!(
                    "the chat template does not render turn {} as a prefix of the whole conversation, so its \
                     assistant tokens cannot be told apart",
                    i + 1
                ),
            ));
        }
        spans.push((before.len(), through.len()));
    }
    if spans.is_empty() {
        return Err(Error::value(
            OP,
            "messages",
            "at least one assistant turn (the loss is on assistant tokens)",
            "none",
        ));
    }
    let mut tokens = Vec::new();
    let mut counts = Vec::new();
    let mut at = 0;
    for (i, &(start, end)) in spans.iter().enumerate() {
        let prompt = &full[at..start];
        let ids = if i == 0 { template.encode(tok, prompt) } else { tok.encode(prompt, false) };
        counts.extend(std::iter::repeat_n(false, ids.len()));
        tokens.extend(ids);
        let answer = tok.encode(&full[start..end], false);
        counts.extend(std::iter::repeat_n(true, answer.len()));
        tokens.extend(answer);
        at = end;
    }
    if at < full.len() {
        let rest = tok.encode(&full[at..], false);
        counts.extend(std::iter::repeat_n(false, rest.len()));
        tokens.extend(rest);
    }
    if tokens.len() > seq + 1 {
        return Err(Error::value(
            OP,
            "conversation length",
            format!("at most --seq + 1 = {} tokens", seq + 1),
            format!("{} tokens", tokens.len()),
        ));
    }
    Sequence::from_tokens(&tokens, &counts)
        .filter(|s| s.counted() > 0)
        .ok_or_else(|| Error::value(OP, "assistant turns", "at least one token of answer", "empty answers"))
}

/// The `(role, content)` pairs of one JSONL line.
fn messages_of(line: &str) -> std::result::Result<Vec<(String, String)>, String> {
    let v: Value = serde_json::from_str(line).map_err(|e| format!("not valid JSON: {e}"))?;
    let list = v
        .get("messages")
        .and_then(Value::as_array)
        .ok_or("expected an object with a \"messages\" list of {\"role\", \"content\"}")?;
    list.iter()
        .enumerate()
        .map(|(i, m)| {
            let role = m.get("role").and_then(Value::as_str);
            let content = m.get("content").and_then(Value::as_str);
            match (role, content) {
                (Some(r), Some(c)) => Ok((r.to_string(), c.to_string())),
                _ => Err(format!("message {}: expected string \"role\" and \"content\"", i + 1)),
            }
        })
        .collect()
}

/// Holds out one sequence in ten (at least one) by a seeded shuffle.
fn split(mut all: Vec<Sequence>, seed: u64) -> (Vec<Sequence>, Vec<Sequence>) {
    let mut rng = Rng::new(seed ^ 0x5EED_CAFE);
    for i in (1..all.len()).rev() {
        all.swap(i, rng.below(i + 1));
    }
    let n_valid = (all.len() / 10).max(1);
    let valid = all.split_off(all.len() - n_valid);
    (all, valid)
}

/// A JSONL file of chat conversations (see the module docs). A malformed line is an
/// error naming its line number, or with `skip_bad_lines` a note in `skipped`.
pub fn chat_jsonl(
    path: &Path,
    tok: &Tokenizer,
    template: &ChatTemplate,
    seq: usize,
    skip_bad_lines: bool,
    seed: u64,
) -> Result<Sequences> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::Io(format!("{}: {e}", path.display())))?;
    let (mut all, mut skipped) = (Vec::new(), Vec::new());
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let r = messages_of(line).and_then(|m| conversation(&m, tok, template, seq).map_err(|e| e.to_string()));
        match r {
            Ok(s) => all.push(s),
            Err(why) => {
                let msg = format!("{}:{}: {why}", path.display(), n + 1);
                if !skip_bad_lines {
                    return Err(Error::Io(format!("{msg} (--skip-bad-lines skips such lines)")));
                }
                skipped.push(msg);
            }
        }
    }
    if all.len() < 2 {
        return Err(Error::Io(format!(
            "{}: {} usable conversations; at least 2 are needed (one is held out)",
            path.display(),
            all.len()
        )));
    }
    let (train, valid) = split(all, seed);
    Ok(Sequences {
        description: format!(
            "{}: {} training and {} held-out conversations{}",
            path.display(),
            train.len(),
            valid.len(),
            if skipped.is_empty() { String::new() } else { format!(", {} bad lines skipped", skipped.len()) }
        ),
        train,
        valid,
        answers: true,
        skipped,
        pad: pad_of(tok),
    })
}

/// The chat turns of the sum `a + b`.
pub fn addition_messages(a: u32, b: u32) -> Vec<(String, String)> {
    vec![("user".to_string(), format!("What is {a} + {b}?")), ("assistant".to_string(), (a + b).to_string())]
}

/// The built-in addition task as chat turns: `train` training problems drawn from
/// `seed` and `valid` of the task's held-out problems (see the module docs).
pub fn addition_chat(
    tok: &Tokenizer,
    template: &ChatTemplate,
    seed: u64,
    train: usize,
    valid: usize,
) -> Result<Sequences> {
    let task = Addition::new(seed);
    let mut rng = Rng::new(seed.wrapping_add(7));
    let seq = usize::MAX - 1;
    let train_set = (0..train)
        .map(|_| {
            let (a, b) = task.sample_train(&mut rng);
            conversation(&addition_messages(a, b), tok, template, seq)
        })
        .collect::<Result<Vec<_>>>()?;
    let valid_set = task
        .eval
        .iter()
        .take(valid)
        .map(|&(a, b)| conversation(&addition_messages(a, b), tok, template, seq))
        .collect::<Result<Vec<_>>>()?;
    Ok(Sequences {
        description: format!(
            "addition-chat: 3-digit sums as chat turns, {} training and {} held-out problems",
            train_set.len(),
            valid_set.len()
        ),
        train: train_set,
        valid: valid_set,
        answers: true,
        skipped: Vec::new(),
        pad: pad_of(tok),
    })
}

/// A batch of `examples`: ids and targets `[B, T]` with T the longest, shorter ones
/// padded with `pad` inputs and [`IGNORE`] targets (causal attention: padding after a
/// sequence does not change its positions).
pub fn batch(examples: &[&Sequence], pad: u32) -> (Vec<u32>, Vec<u32>, usize) {
    let t = examples.iter().map(|s| s.ids.len()).max().unwrap_or(0);
    let (mut ids, mut targets) = (Vec::with_capacity(examples.len() * t), Vec::with_capacity(examples.len() * t));
    for s in examples {
        ids.extend(&s.ids);
        ids.extend(std::iter::repeat_n(pad, t - s.ids.len()));
        targets.extend(&s.targets);
        targets.extend(std::iter::repeat_n(IGNORE, t - s.ids.len()));
    }
    (ids, targets, t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_cover_every_next_token_once() {
        let tokens: Vec<u32> = (0..10).collect();
        let w = pack(&tokens, 4);
        assert_eq!(w.len(), 3);
        assert_eq!(w[0], Sequence { ids: vec![0, 1, 2, 3], targets: vec![1, 2, 3, 4] });
        assert_eq!(w[1], Sequence { ids: vec![4, 5, 6, 7], targets: vec![5, 6, 7, 8] });
        assert_eq!(w[2], Sequence { ids: vec![8], targets: vec![9] });
        let all: Vec<u32> = w.iter().flat_map(|s| s.targets.clone()).collect();
        assert_eq!(all, (1..10).collect::<Vec<_>>());
    }

    #[test]
    fn batches_pad_with_ignored_targets() {
        let a = Sequence { ids: vec![1, 2, 3], targets: vec![2, 3, IGNORE] };
        let b = Sequence { ids: vec![5], targets: vec![6] };
        let (ids, targets, t) = batch(&[&a, &b], 0);
        assert_eq!(t, 3);
        assert_eq!(ids, [1, 2, 3, 5, 0, 0]);
        assert_eq!(targets, [2, 3, IGNORE, 6, IGNORE, IGNORE]);
    }

    #[test]
    fn bad_lines_name_their_line() {
        assert!(messages_of("{").unwrap_err().contains("JSON"));
        assert!(messages_of("{\"messages\": [{\"role\": \"user\"}]}").unwrap_err().contains("message 1"));
        assert!(messages_of("[]").unwrap_err().contains("messages"));
        let m = messages_of("{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}").unwrap();
        assert_eq!(m, [("user".to_string(), "hi".to_string())]);
    }
}
