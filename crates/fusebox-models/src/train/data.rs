//! [`DataSource`]: where a run's micro-batches and held-out examples come from — the
//! from-scratch tasks ([`Task`]: addition, byte-level text, random tokens) and token
//! sequences in a pretrained model's vocabulary ([`Sequences`]: text, chat JSONL,
//! addition as chat).

use fusebox::{ComputeBackend, Error, Result, Tensor};

use super::TrainConfig;
use crate::data::addition::{self, Addition};
use crate::data::sequences::{self, Sequences, IGNORE};
use crate::data::text::{self, TextData};
use crate::rng::Rng;
use crate::transformer::Arch;

/// One micro-batch: `rows` sequences of `seq` tokens, row-major.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    /// Input ids, `[rows, seq]`.
    pub ids: Vec<u32>,
    /// Next-token targets, `[rows, seq]`; the source's ignore index does not count.
    pub targets: Vec<u32>,
    /// Sequences.
    pub rows: usize,
    /// Tokens per sequence (padded to the longest).
    pub seq: usize,
    /// Tokens of the data it holds (padding excluded), for throughput.
    pub tokens: usize,
}

impl Batch {
    /// The ids and targets as `[rows, seq]` U32 tensors on `b`.
    pub fn upload(self, b: &dyn ComputeBackend) -> Result<(Tensor, Tensor)> {
        let (rows, seq) = (self.rows, self.seq);
        Ok((
            b.upload(&Tensor::from_vec(self.ids, [rows, seq])?)?,
            b.upload(&Tensor::from_vec(self.targets, [rows, seq])?)?,
        ))
    }
}

/// The held-out examples of an evaluation, in batches.
#[derive(Debug, Clone)]
pub struct HeldOut {
    /// Each batch with its weight in the mean loss (its sequences, its counted targets, or
    /// 1); a batch of weight 0 is skipped.
    pub batches: Vec<(Batch, f64)>,
    /// Whether greedy exact match is measured (every counted target the arg-max).
    pub exact_match: bool,
}

/// Training and held-out data for a [`super::Trainer`].
pub trait DataSource {
    /// What `trainer.json` records as `"task"` (`fusebox generate` reads it to tokenize a
    /// from-scratch checkpoint's prompt).
    fn name(&self) -> &'static str;

    /// One line saying what the data is.
    fn description(&self) -> String;

    /// An error unless the data fits a network of architecture `arch` with `config`:
    /// token ids within its vocabulary, sequences within its context.
    fn check(&self, arch: &Arch, config: &TrainConfig) -> Result<()>;

    /// The target id that does not count in the loss.
    fn ignore_index(&self) -> Option<u32>;

    /// The next training micro-batch of `config.batch` sequences, drawn with `rng`.
    fn draw(&self, rng: &mut Rng, config: &TrainConfig) -> Batch;

    /// The held-out examples of an evaluation (the same ones every time).
    fn held_out(&self, config: &TrainConfig) -> Result<HeldOut>;

    /// The most tokens a training sequence holds (`config.seq_len` unless the data fixes
    /// its own), for the memory estimates.
    fn max_seq_len(&self, config: &TrainConfig) -> usize {
        config.seq_len
    }
}

/// A from-scratch run's data.
#[derive(Debug, Clone)]
pub enum Task {
    /// The built-in addition task.
    Addition(Addition),
    /// Byte-level text.
    Text(TextData),
    /// Uniformly random tokens of a vocabulary (benchmarks).
    Random {
        /// Tokens are drawn from `0..vocab_size`.
        vocab_size: usize,
    },
}

impl Task {
    /// Vocabulary the model needs.
    pub fn vocab_size(&self) -> usize {
        match self {
            Task::Addition(_) => addition::VOCAB,
            Task::Text(_) => text::VOCAB,
            Task::Random { vocab_size } => *vocab_size,
        }
    }

    /// Tokens per training sequence.
    pub fn seq_len(&self, cfg: &TrainConfig) -> usize {
        match self {
            Task::Addition(_) => addition::SEQ_LEN - 1,
            Task::Text(_) | Task::Random { .. } => cfg.seq_len,
        }
    }
}

impl DataSource for Task {
    fn max_seq_len(&self, config: &TrainConfig) -> usize {
        self.seq_len(config)
    }

    fn name(&self) -> &'static str {
        match self {
            Task::Addition(_) => "addition",
            Task::Text(_) => "text",
            Task::Random { .. } => "random",
        }
    }

    fn description(&self) -> String {
        match self {
            Task::Addition(_) => {
                "3-digit addition, answers reversed; 1000 held-out problems (and their b+a twins) never trained on"
                    .into()
            }
            Task::Text(t) => format!("byte-level text, {} train / {} validation bytes", t.train.len(), t.valid.len()),
            Task::Random { vocab_size } => format!("uniformly random tokens below {vocab_size}"),
        }
    }

    /// The model's vocabulary must be the task's exactly (its head predicts the task's
    /// tokens), and a training sequence fit its context.
    fn check(&self, arch: &Arch, config: &TrainConfig) -> Result<()> {
        if arch.vocab_size != self.vocab_size() {
            return Err(Error::value("Trainer", "vocab_size", self.vocab_size(), arch.vocab_size));
        }
        let seq = self.seq_len(config);
        if seq > arch.context_length {
            return Err(Error::value("Trainer", "seq_len", format!("≤ max_seq {}", arch.context_length), seq));
        }
        Ok(())
    }

    fn ignore_index(&self) -> Option<u32> {
        match self {
            Task::Addition(_) => Some(addition::PAD),
            Task::Text(_) | Task::Random { .. } => None,
        }
    }

    fn draw(&self, rng: &mut Rng, config: &TrainConfig) -> Batch {
        let (rows, seq) = (config.batch, self.seq_len(config));
        let (ids, targets) = match self {
            Task::Addition(a) => a.train_batch(rng, rows),
            Task::Text(t) => TextData::batch(&t.train, rng, rows, seq),
            Task::Random { vocab_size } => {
                let n = rows * seq;
                let ids = (0..n).map(|_| rng.below(*vocab_size) as u32).collect();
                let targets = (0..n).map(|_| rng.below(*vocab_size) as u32).collect();
                (ids, targets)
            }
        };
        Batch { ids, targets, rows, seq, tokens: rows * seq }
    }

    /// Addition: every held-out problem, in batches of 250, each weighing its problems;
    /// text: `eval_batches` random windows of the validation bytes (the same ones at
    /// every evaluation), each weighing 1.
    fn held_out(&self, config: &TrainConfig) -> Result<HeldOut> {
        match self {
            Task::Addition(task) => {
                let seq = addition::SEQ_LEN - 1;
                let batches = task
                    .eval
                    .chunks(250)
                    .map(|chunk| {
                        let (mut ids, mut targets) = (Vec::new(), Vec::new());
                        for &(x, y) in chunk {
                            let (i, t) = Addition::example(x, y);
                            ids.extend(i);
                            targets.extend(t);
                        }
                        let rows = chunk.len();
                        (Batch { ids, targets, rows, seq, tokens: rows * seq }, rows as f64)
                    })
                    .collect();
                Ok(HeldOut { batches, exact_match: true })
            }
            Task::Text(data) => {
                let (rows, seq) = (config.batch, config.seq_len);
                let mut rng = Rng::new(config.seed ^ 0xE7A1);
                let batches = (0..config.eval_batches.max(1))
                    .map(|_| {
                        let (ids, targets) = TextData::batch(&data.valid, &mut rng, rows, seq);
                        (Batch { ids, targets, rows, seq, tokens: rows * seq }, 1.0)
                    })
                    .collect();
                Ok(HeldOut { batches, exact_match: false })
            }
            Task::Random { .. } => {
                Err(Error::unsupported("evaluate", "random-token benchmark data has no held-out set"))
            }
        }
    }
}

impl DataSource for Sequences {
    fn name(&self) -> &'static str {
        "sequences"
    }

    fn description(&self) -> String {
        self.description.clone()
    }

    /// Every sequence within the context, every id and counted target below the
    /// vocabulary, and at least one sequence to train on and one held out.
    fn check(&self, arch: &Arch, _config: &TrainConfig) -> Result<()> {
        let (vocab, ctx) = (arch.vocab_size, arch.context_length);
        for s in self.train.iter().chain(&self.valid) {
            if s.ids.len() > ctx {
                return Err(Error::value(
                    "fine-tuning data",
                    "sequence length",
                    format!("≤ the model's context length {ctx}"),
                    s.ids.len(),
                ));
            }
            if let Some(&bad) =
                s.ids.iter().chain(s.targets.iter().filter(|&&t| t != IGNORE)).find(|&&t| t as usize >= vocab)
            {
                return Err(Error::value("fine-tuning data", "token id", format!("< vocab size {vocab}"), bad));
            }
        }
        if self.train.is_empty() || self.valid.is_empty() {
            return Err(Error::value(
                "fine-tuning data",
                "sequences",
                "at least one for training and one held out",
                format!("{} and {}", self.train.len(), self.valid.len()),
            ));
        }
        Ok(())
    }

    fn ignore_index(&self) -> Option<u32> {
        Some(IGNORE)
    }

    /// `config.batch` training sequences drawn uniformly with replacement, padded to the
    /// longest.
    fn draw(&self, rng: &mut Rng, config: &TrainConfig) -> Batch {
        let picks: Vec<&sequences::Sequence> =
            (0..config.batch).map(|_| &self.train[rng.below(self.train.len())]).collect();
        let tokens = picks.iter().map(|s| s.ids.len()).sum();
        let (ids, targets, seq) = sequences::batch(&picks, self.pad);
        Batch { ids, targets, rows: picks.len(), seq, tokens }
    }

    /// Chat data: every held-out conversation (exact match is measured on the answers);
    /// text: the first `eval_batches · batch` windows. Batches of `config.batch`, each
    /// weighing its counted targets, so the loss is the mean over counted tokens.
    fn held_out(&self, config: &TrainConfig) -> Result<HeldOut> {
        let limit = if self.answers { usize::MAX } else { config.eval_batches.max(1) * config.batch };
        let valid: Vec<&sequences::Sequence> = self.valid.iter().take(limit).collect();
        let batches = valid
            .chunks(config.batch.max(1))
            .map(|chunk| {
                let (ids, targets, seq) = sequences::batch(chunk, self.pad);
                let counted: usize = chunk.iter().map(|s| s.counted()).sum();
                let tokens = chunk.iter().map(|s| s.ids.len()).sum();
                (Batch { ids, targets, rows: chunk.len(), seq, tokens }, counted as f64)
            })
            .collect();
        Ok(HeldOut { batches, exact_match: self.answers })
    }
}
