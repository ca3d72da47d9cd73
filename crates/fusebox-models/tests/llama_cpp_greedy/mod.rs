//! llama.cpp's greedy continuations (recorded by `scripts/record_llama_cpp_greedy.py`)
//! and the comparison of a decode path with them: fed llama.cpp's own tokens
//! (teacher-forced, so each step sees the same context whatever was chosen before), our
//! greedy choice is compared with llama.cpp's at every step whose recorded top-2 gap is
//! at least the margin (a near-tie may go either way under any rounding); |Δlogit| is
//! taken at llama.cpp's recorded top ids at every step.

use std::path::Path;

use fusebox::{ComputeBackend, Result};
use fusebox_models::pretrained::Pretrained;
use serde_json::Value as Json;

/// One recorded step: llama.cpp's choice, its top-2 gap and its largest logits.
pub struct Step {
    pub token: u32,
    pub gap: f32,
    pub top: Vec<(usize, f32)>,
}

/// One prompt: its text, llama.cpp's ids for it, and the steps after it.
pub struct Prompt {
    pub text: String,
    pub ids: Vec<u32>,
    pub steps: Vec<Step>,
}

/// How one prompt went.
pub struct PromptAgreement {
    /// Steps whose recorded gap was clear.
    pub compared: usize,
    /// The clear steps whose choice differs from llama.cpp's.
    pub differing: Vec<usize>,
    /// Largest |Δlogit| at llama.cpp's top ids over every step.
    pub max_diff: f32,
}

/// Reads a record; panics with the path on a malformed one (fixtures are ours).
pub fn read(path: &Path) -> Vec<Prompt> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let json: Json = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let u32s = |v: &Json| v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect::<Vec<u32>>();
    json["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| Prompt {
            text: p["text"].as_str().unwrap().to_string(),
            ids: u32s(&p["ids"]),
            steps: p["steps"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| Step {
                    token: s["token"].as_u64().unwrap() as u32,
                    gap: s["gap"].as_f64().unwrap() as f32,
                    top: s["top"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|t| (t[0].as_u64().unwrap() as usize, t[1].as_f64().unwrap() as f32))
                        .collect(),
                })
                .collect(),
        })
        .collect()
}

/// The index of the largest logit (the first on ties, as llama.cpp's sampler picks).
pub fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best as u32
}

/// Runs `model` on `b` along `prompt`'s recorded tokens and compares each clear step.
pub fn compare(b: &dyn ComputeBackend, model: &Pretrained, prompt: &Prompt, margin: f32) -> Result<PromptAgreement> {
    let mut session = model.session(b, prompt.ids.len() + prompt.steps.len() + 1)?;
    let mut logits = session.step(b, &prompt.ids)?;
    let (mut compared, mut differing, mut max_diff) = (0, Vec::new(), 0.0f32);
    for (s, step) in prompt.steps.iter().enumerate() {
        for &(id, reference) in &step.top {
            max_diff = max_diff.max((logits[id] - reference).abs());
        }
        if step.gap >= margin {
            compared += 1;
            if argmax(&logits) != step.token {
                differing.push(s);
            }
        }
        if s + 1 < prompt.steps.len() {
            logits = session.step(b, &[step.token])?;
        }
    }
    Ok(PromptAgreement { compared, differing, max_diff })
}
