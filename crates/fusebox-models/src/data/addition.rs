//! The built-in task: multi-digit addition, written "123+456=9750\n" — the sum's digits
//! reversed (least significant first, padded to 4 digits) so a left-to-right model
//! can carry. Operands have 3 digits. 1,000 held-out problems, never seen in
//! training, not even as their commuted twin b+a, are scored by greedy exact match.

use std::collections::HashSet;

use crate::rng::Rng;

/// Tokens: digits 0–9, then `+`, `=`, end of answer, and padding.
pub const PLUS: u32 = 10;
/// The `=` token.
pub const EQUALS: u32 = 11;
/// End of the answer.
pub const END: u32 = 12;
/// Padding (ignored by the loss).
pub const PAD: u32 = 13;
/// Size of the vocabulary.
pub const VOCAB: usize = 14;
/// Digits of the (reversed, zero-padded) answer.
pub const ANSWER_DIGITS: usize = 4;
/// Longest problem: "999+999=" (8) + 4 answer digits + END.
pub const SEQ_LEN: usize = 13;
/// Operands have 3 digits: fixed positions make the digit alignment learnable in minutes.
pub const MIN_OPERAND: u32 = 100;
/// Largest operand.
pub const MAX_OPERAND: u32 = 999;
/// Held-out problems.
pub const EVAL_PROBLEMS: usize = 1000;

/// The addition task: its held-out problems and the training sampler's exclusions.
#[derive(Debug, Clone)]
pub struct Addition {
    /// The held-out problems `(a, b)`, never sampled for training (nor `(b, a)`).
    pub eval: Vec<(u32, u32)>,
    excluded: HashSet<(u32, u32)>,
}

fn digits(n: u32) -> Vec<u32> {
    n.to_string().bytes().map(|b| (b - b'0') as u32).collect()
}

/// Tokens of the prompt "a+b=".
pub fn prompt_tokens(a: u32, b: u32) -> Vec<u32> {
    let mut t = digits(a);
    t.push(PLUS);
    t.extend(digits(b));
    t.push(EQUALS);
    t
}

/// Tokens of the answer: the sum's digits reversed, padded to 4, then END.
pub fn answer_tokens(a: u32, b: u32) -> Vec<u32> {
    let mut s = a + b;
    let mut t = Vec::with_capacity(ANSWER_DIGITS + 1);
    for _ in 0..ANSWER_DIGITS {
        t.push(s % 10);
        s /= 10;
    }
    t.push(END);
    t
}

/// Human-readable text of tokens ("12+34=640" style; END shown as nothing).
pub fn render(tokens: &[u32]) -> String {
    tokens
        .iter()
        .map(|&t| match t {
            0..=9 => char::from(b'0' + t as u8).to_string(),
            PLUS => "+".into(),
            EQUALS => "=".into(),
            _ => String::new(),
        })
        .collect()
}

/// The sum a reversed answer encodes, if it is well formed.
pub fn read_answer(tokens: &[u32]) -> Option<u32> {
    if tokens.len() < ANSWER_DIGITS + 1 || tokens[ANSWER_DIGITS] != END {
        return None;
    }
    let mut v = 0;
    for &d in tokens[..ANSWER_DIGITS].iter().rev() {
        if d > 9 {
            return None;
        }
        v = v * 10 + d;
    }
    Some(v)
}

impl Addition {
    /// The task with held-out problems drawn from `seed` (fixed for a run).
    pub fn new(seed: u64) -> Addition {
        let mut rng = Rng::new(seed ^ 0xADD);
        let mut eval = Vec::with_capacity(EVAL_PROBLEMS);
        let mut excluded = HashSet::new();
        while eval.len() < EVAL_PROBLEMS {
            let a = rng.range(MIN_OPERAND as u64, MAX_OPERAND as u64) as u32;
            let b = rng.range(MIN_OPERAND as u64, MAX_OPERAND as u64) as u32;
            if excluded.insert((a, b)) {
                excluded.insert((b, a));
                eval.push((a, b));
            }
        }
        Addition { eval, excluded }
    }

    /// Whether (a, b) or (b, a) is held out.
    pub fn is_held_out(&self, a: u32, b: u32) -> bool {
        self.excluded.contains(&(a, b))
    }

    /// A training problem never held out.
    pub fn sample_train(&self, rng: &mut Rng) -> (u32, u32) {
        loop {
            let a = rng.range(MIN_OPERAND as u64, MAX_OPERAND as u64) as u32;
            let b = rng.range(MIN_OPERAND as u64, MAX_OPERAND as u64) as u32;
            if !self.is_held_out(a, b) {
                return (a, b);
            }
        }
    }

    /// Inputs and targets `[SEQ_LEN − 1]` of one problem: targets are PAD (ignored)
    /// except at the positions that predict the answer and END.
    pub fn example(a: u32, b: u32) -> (Vec<u32>, Vec<u32>) {
        let prompt = prompt_tokens(a, b);
        let mut seq = prompt.clone();
        seq.extend(answer_tokens(a, b));
        seq.resize(SEQ_LEN, PAD);
        let inputs = seq[..SEQ_LEN - 1].to_vec();
        let mut targets = vec![PAD; SEQ_LEN - 1];
        // Position i predicts token i + 1: the last prompt token predicts the first answer
        // digit, the last answer digit predicts END.
        let first = prompt.len() - 1;
        targets[first..first + ANSWER_DIGITS + 1].copy_from_slice(&seq[first + 1..first + ANSWER_DIGITS + 2]);
        (inputs, targets)
    }

    /// A training batch: flattened inputs and targets `[batch · (SEQ_LEN − 1)]`.
    pub fn train_batch(&self, rng: &mut Rng, batch: usize) -> (Vec<u32>, Vec<u32>) {
        let mut ids = Vec::with_capacity(batch * (SEQ_LEN - 1));
        let mut targets = Vec::with_capacity(batch * (SEQ_LEN - 1));
        for _ in 0..batch {
            let (a, b) = self.sample_train(rng);
            let (i, t) = Self::example(a, b);
            ids.extend(i);
            targets.extend(t);
        }
        (ids, targets)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn examples_encode_reversed_answers() {
        let (inputs, targets) = Addition::example(157, 968);
        assert_eq!(render(&inputs), "157+968=5211");
        // "157+968=" is 8 tokens; the targets from position 7 are the answer and END.
        assert_eq!(&targets[7..12], &[5, 2, 1, 1, END]);
        assert!(targets[..7].iter().all(|&t| t == PAD));
        assert_eq!(read_answer(&answer_tokens(157, 968)), Some(1125));
    }

    #[test]
    fn held_out_problems_and_twins_never_train() {
        let task = Addition::new(1);
        assert_eq!(task.eval.len(), EVAL_PROBLEMS);
        let mut rng = Rng::new(5);
        for _ in 0..20_000 {
            let (a, b) = task.sample_train(&mut rng);
            assert!(!task.is_held_out(a, b) && !task.is_held_out(b, a));
        }
        for &(a, b) in &task.eval {
            assert!(task.is_held_out(b, a));
        }
    }
}
