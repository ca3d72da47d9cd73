//! A straightforward Llama forward for checking the fast path: weights dequantized to
//! f32 by the conformance crate's f64 twins, every sum in f64, plain loops, one token
//! at a time over a growing key/value list. It shares no code with
//! `fusebox_models::pretrained` or the CPU kernels; it only uses the GGUF reader for bytes.
//!
//! Conventions of GGUF llama files: weights `[out, in]` row-major; rotary pairs are
//! adjacent elements `(2i, 2i+1)` with angle `pos · θ^(−2i/head_dim)`; no
//! `output.weight` means the head is the token embedding.

#![allow(dead_code)]

use fusebox::DType;
use fusebox_conformance::reference::quant::dequantize;
use fusebox_models::gguf::GgufFile;

pub struct RefLayer {
    attn_norm: Vec<f32>,
    wq: Vec<f32>,
    wk: Vec<f32>,
    wv: Vec<f32>,
    wo: Vec<f32>,
    ffn_norm: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    down: Vec<f32>,
}

pub struct RefLlama {
    pub vocab: usize,
    pub dim: usize,
    pub hidden: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub eps: f64,
    pub theta: f64,
    embed: Vec<f32>,
    layers: Vec<RefLayer>,
    norm_f: Vec<f32>,
    /// `None`: the head is `embed`.
    head: Option<Vec<f32>>,
}

/// Keys and values of every position so far, per layer: `keys[l][pos]` is `[kv_heads · head_dim]`.
pub struct RefCache {
    keys: Vec<Vec<Vec<f64>>>,
    values: Vec<Vec<Vec<f64>>>,
}

fn values_f32(file: &GgufFile, name: &str) -> Vec<f32> {
    let info = file.tensor_info(name).unwrap_or_else(|| panic!("reference: no tensor {name}"));
    let bytes = file.tensor_bytes(name).unwrap();
    let shape = info.shape().unwrap();
    match info.dtype().unwrap() {
        DType::F32 => bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect(),
        DType::F16 => bytes.chunks_exact(2).map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32()).collect(),
        DType::BF16 => bytes.chunks_exact(2).map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32()).collect(),
        dtype => dequantize(dtype, bytes, &shape).data.into_iter().map(|v| v as f32).collect(),
    }
}

impl RefLlama {
    pub fn from_gguf(file: &GgufFile) -> RefLlama {
        let meta = file.metadata();
        let int = |k: &str| meta.require_u64(&format!("llama.{k}")).unwrap() as usize;
        let dim = int("embedding_length");
        let heads = int("attention.head_count");
        let n_layers = int("block_count");
        let t = |name: &str| values_f32(file, name);
        let layers = (0..n_layers)
            .map(|l| {
                let w = |part: &str| t(&format!("blk.{l}.{part}.weight"));
                RefLayer {
                    attn_norm: w("attn_norm"),
                    wq: w("attn_q"),
                    wk: w("attn_k"),
                    wv: w("attn_v"),
                    wo: w("attn_output"),
                    ffn_norm: w("ffn_norm"),
                    gate: w("ffn_gate"),
                    up: w("ffn_up"),
                    down: w("ffn_down"),
                }
            })
            .collect();
        RefLlama {
            vocab: meta.require_strings("tokenizer.ggml.tokens").unwrap().len(),
            dim,
            hidden: int("feed_forward_length"),
            heads,
            kv_heads: int("attention.head_count_kv"),
            head_dim: dim / heads,
            eps: meta.require_f64("llama.attention.layer_norm_rms_epsilon").unwrap(),
            theta: meta.require_f64("llama.rope.freq_base").unwrap(),
            embed: t("token_embd.weight"),
            layers,
            norm_f: t("output_norm.weight"),
            head: file.tensor_info("output.weight").map(|_| t("output.weight")),
        }
    }

    pub fn new_cache(&self) -> RefCache {
        RefCache { keys: vec![Vec::new(); self.layers.len()], values: vec![Vec::new(); self.layers.len()] }
    }

    /// Runs one token at the next position; returns the logits when `want_logits`.
    pub fn step(&self, token: u32, cache: &mut RefCache, want_logits: bool) -> Option<Vec<f64>> {
        let d = self.dim;
        let pos = cache.keys[0].len();
        let mut x: Vec<f64> =
            self.embed[token as usize * d..(token as usize + 1) * d].iter().map(|&v| v as f64).collect();
        for (l, layer) in self.layers.iter().enumerate() {
            let h = rms_norm(&x, &layer.attn_norm, self.eps);
            let mut q = matvec(&layer.wq, &h);
            let mut k = matvec(&layer.wk, &h);
            let v = matvec(&layer.wv, &h);
            self.rotate(&mut q, pos);
            self.rotate(&mut k, pos);
            cache.keys[l].push(k);
            cache.values[l].push(v);
            let attn = self.attend(&q, &cache.keys[l], &cache.values[l]);
            let o = matvec(&layer.wo, &attn);
            for i in 0..d {
                x[i] += o[i];
            }
            let h2 = rms_norm(&x, &layer.ffn_norm, self.eps);
            let g = matvec(&layer.gate, &h2);
            let u = matvec(&layer.up, &h2);
            let act: Vec<f64> = g.iter().zip(&u).map(|(&g, &u)| g / (1.0 + (-g).exp()) * u).collect();
            let m = matvec(&layer.down, &act);
            for i in 0..d {
                x[i] += m[i];
            }
        }
        if !want_logits {
            return None;
        }
        let h = rms_norm(&x, &self.norm_f, self.eps);
        Some(matvec(self.head.as_ref().unwrap_or(&self.embed), &h))
    }

    /// Rotates adjacent pairs of every head of `x` by `pos · θ^(−2i/head_dim)`.
    fn rotate(&self, x: &mut [f64], pos: usize) {
        let hd = self.head_dim;
        for head in x.chunks_mut(hd) {
            for i in 0..hd / 2 {
                let angle = pos as f64 * self.theta.powf(-2.0 * i as f64 / hd as f64);
                let (c, s) = (angle.cos(), angle.sin());
                let (a, b) = (head[2 * i], head[2 * i + 1]);
                head[2 * i] = a * c - b * s;
                head[2 * i + 1] = a * s + b * c;
            }
        }
    }

    /// Softmax attention of one query over every cached position, per head; query head
    /// h reads key/value head h / (heads / kv_heads).
    fn attend(&self, q: &[f64], keys: &[Vec<f64>], values: &[Vec<f64>]) -> Vec<f64> {
        let hd = self.head_dim;
        let group = self.heads / self.kv_heads;
        let scale = 1.0 / (hd as f64).sqrt();
        let mut out = vec![0.0; self.heads * hd];
        for h in 0..self.heads {
            let kvh = h / group;
            let qh = &q[h * hd..(h + 1) * hd];
            let scores: Vec<f64> =
                keys.iter().map(|k| (0..hd).map(|i| qh[i] * k[kvh * hd + i]).sum::<f64>() * scale).collect();
            let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
            let total: f64 = weights.iter().sum();
            for (w, v) in weights.iter().zip(values) {
                for i in 0..hd {
                    out[h * hd + i] += w / total * v[kvh * hd + i];
                }
            }
        }
        out
    }

    /// Greedy continuation: the prompt's last logits and `n` greedy tokens with each
    /// step's logits (the logits that chose it).
    pub fn greedy(&self, prompt: &[u32], n: usize) -> (Vec<u32>, Vec<Vec<f64>>) {
        let mut cache = self.new_cache();
        let mut logits = None;
        for (i, &t) in prompt.iter().enumerate() {
            logits = self.step(t, &mut cache, i + 1 == prompt.len());
        }
        let mut logits = logits.expect("non-empty prompt");
        let (mut tokens, mut all) = (Vec::new(), Vec::new());
        for step in 0..n {
            let next = argmax(&logits);
            tokens.push(next);
            all.push(logits);
            if step + 1 < n {
                logits = self.step(next, &mut cache, true).unwrap();
            } else {
                break;
            }
        }
        (tokens, all)
    }
}

/// `W x` for `W` `[out, in]` row-major, summed in f64.
fn matvec(w: &[f32], x: &[f64]) -> Vec<f64> {
    let n = x.len();
    w.chunks_exact(n).map(|row| row.iter().zip(x).map(|(&a, &b)| a as f64 * b).sum()).collect()
}

fn rms_norm(x: &[f64], w: &[f32], eps: f64) -> Vec<f64> {
    let ms = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
    let r = 1.0 / (ms + eps).sqrt();
    x.iter().zip(w).map(|(&v, &w)| v * r * w as f64).collect()
}

/// Index of the largest value (first on ties).
pub fn argmax(v: &[f64]) -> u32 {
    let mut best = 0;
    for i in 1..v.len() {
        if v[i] > v[best] {
            best = i;
        }
    }
    best as u32
}

/// The gap between the largest and second-largest value.
pub fn top2_gap(v: &[f64]) -> f64 {
    let (mut a, mut b) = (f64::NEG_INFINITY, f64::NEG_INFINITY);
    for &x in v {
        if x > a {
            b = a;
            a = x;
        } else if x > b {
            b = x;
        }
    }
    a - b
}

/// How the fast path's greedy run compares with the reference's on one prompt.
#[derive(Debug)]
pub struct Agreement {
    pub prompt_tokens: usize,
    pub reference_tokens: Vec<u32>,
    pub fast_tokens: Vec<u32>,
    /// Steps compared before the end or a near tie.
    pub compared: usize,
    /// The first step whose reference top-2 logits lie within `tie_margin`, if any.
    pub near_tie_at: Option<usize>,
    /// The first compared step where the tokens differ, if any (a failure).
    pub mismatch_at: Option<usize>,
    /// Largest |fast − reference| logit at the last prompt position.
    pub prompt_logit_max_diff: f64,
    /// Largest |fast − reference| logit over every compared step.
    pub max_logit_diff: f64,
    /// Largest |reference logit| at the last prompt position (for a relative figure).
    pub prompt_logit_max_abs: f64,
    /// Steps, from the start, where both chose the same token (so both saw the same
    /// context at every one of them) — past near ties too.
    pub same_prefix: usize,
    /// Largest |fast − reference| logit over those steps.
    pub same_prefix_max_logit_diff: f64,
}

/// Runs `n` greedy steps of the reference and of the fast path (`step` runs tokens after
/// what it has seen and returns the last logits) and compares them token for token up
/// to the first step where the reference's top two logits lie within `tie_margin`.
pub fn compare_greedy(
    reference: &RefLlama,
    mut step: impl FnMut(&[u32]) -> Vec<f32>,
    prompt: &[u32],
    n: usize,
    tie_margin: f64,
) -> Agreement {
    let (reference_tokens, ref_logits) = reference.greedy(prompt, n);
    let mut fast_tokens = Vec::new();
    let mut logits = step(prompt);
    let mut max_diff = 0.0f64;
    let (mut compared, mut near_tie_at, mut mismatch_at) = (0, None, None);
    let mut prompt_logit_max_diff = 0.0;
    let (mut same_prefix, mut same_prefix_max_logit_diff, mut diverged) = (0, 0.0f64, false);
    for s in 0..n {
        let r = &ref_logits[s];
        let diff = r.iter().zip(&logits).map(|(&a, &b)| (a - b as f64).abs()).fold(0.0, f64::max);
        if s == 0 {
            prompt_logit_max_diff = diff;
        }
        let fast = argmax(&logits.iter().map(|&v| v as f64).collect::<Vec<_>>());
        fast_tokens.push(fast);
        if !diverged {
            same_prefix_max_logit_diff = same_prefix_max_logit_diff.max(diff);
            if fast == reference_tokens[s] {
                same_prefix += 1;
            } else {
                diverged = true;
            }
        }
        if near_tie_at.is_none() && mismatch_at.is_none() {
            if top2_gap(r) < tie_margin {
                near_tie_at = Some(s);
            } else {
                max_diff = max_diff.max(diff);
                compared += 1;
                if fast != reference_tokens[s] {
                    mismatch_at = Some(s);
                }
            }
        }
        if s + 1 < n {
            logits = step(&[fast]);
        }
    }
    Agreement {
        prompt_tokens: prompt.len(),
        reference_tokens,
        fast_tokens,
        compared,
        near_tie_at,
        mismatch_at,
        prompt_logit_max_diff,
        max_logit_diff: max_diff,
        prompt_logit_max_abs: ref_logits[0].iter().fold(0.0, |m, v| m.max(v.abs())),
        same_prefix,
        same_prefix_max_logit_diff,
    }
}
