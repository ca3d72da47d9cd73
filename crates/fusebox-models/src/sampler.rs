//! Choosing the next token from logits: greedy, temperature, top-k, top-p (nucleus),
//! min-p, a repetition penalty and OpenAI's presence and frequency penalties, seeded.
//!
//! The order, as vLLM applies them: the penalties adjust the logits (repetition over
//! every token seen, presence and frequency over the generated ones); greedy takes the
//! argmax of the adjusted logits; otherwise the temperature scales them, top-k keeps the
//! k best, top-p the nucleus of the renormalised distribution, and min-p the tokens
//! whose probability is at least `min_p` times the most likely one's.

use fusebox::{Error, Result};

use crate::rng::Rng;

/// Sampling settings. `temperature == 0` means greedy.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplerConfig {
    /// Softmax temperature (0: greedy).
    pub temperature: f32,
    /// Keep only the k most likely tokens (0 = all).
    pub top_k: usize,
    /// Keep the smallest set of tokens whose probability reaches `top_p` (1 = all).
    pub top_p: f32,
    /// Divide positive logits (multiply negative ones) of already seen tokens by this (1 = off).
    pub repetition_penalty: f32,
    /// Seed of the sampler's random stream.
    pub seed: u64,
}

impl Default for SamplerConfig {
    fn default() -> Self {
        SamplerConfig { temperature: 0.0, top_k: 0, top_p: 1.0, repetition_penalty: 1.0, seed: 0 }
    }
}

/// Settings beyond [`SamplerConfig`] that the OpenAI API adds; the defaults turn each off.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SamplerExtras {
    /// Keep only tokens whose probability (after the temperature) is at least `min_p`
    /// times the most likely token's, in [0, 1] (0 = off).
    pub min_p: f32,
    /// Subtracted once from the logit of every token generated so far, in [-2, 2]
    /// (OpenAI's `presence_penalty`; 0 = off).
    pub presence_penalty: f32,
    /// Subtracted from a token's logit once per time it was generated so far, in
    /// [-2, 2] (OpenAI's `frequency_penalty`; 0 = off).
    pub frequency_penalty: f32,
}

/// A seeded sampler.
#[derive(Debug, Clone)]
pub struct Sampler {
    /// Its settings.
    pub config: SamplerConfig,
    /// Min-p and the presence and frequency penalties.
    pub extras: SamplerExtras,
    rng: Rng,
}

impl Sampler {
    /// Validates the settings.
    pub fn new(config: SamplerConfig) -> Result<Sampler> {
        Sampler::with_extras(config, SamplerExtras::default())
    }

    /// Validates the settings, with min-p and the OpenAI penalties.
    pub fn with_extras(config: SamplerConfig, extras: SamplerExtras) -> Result<Sampler> {
        let bad = |what: &str, expected: &str, got: String| Err(Error::value("Sampler", what, expected, got));
        if !(0.0..=1.0).contains(&extras.min_p) {
            return bad("min_p", "in [0, 1]", extras.min_p.to_string());
        }
        for (name, v) in
            [("presence_penalty", extras.presence_penalty), ("frequency_penalty", extras.frequency_penalty)]
        {
            if !(-2.0..=2.0).contains(&v) {
                return bad(name, "in [-2, 2]", v.to_string());
            }
        }
        if !(config.temperature >= 0.0 && config.temperature.is_finite()) {
            return bad("temperature", "a finite value ≥ 0", config.temperature.to_string());
        }
        if !(config.top_p > 0.0 && config.top_p <= 1.0) {
            return bad("top_p", "in (0, 1]", config.top_p.to_string());
        }
        if !(config.repetition_penalty > 0.0 && config.repetition_penalty.is_finite()) {
            return bad("repetition_penalty", "a finite value > 0", config.repetition_penalty.to_string());
        }
        let rng = Rng::new(config.seed);
        Ok(Sampler { config, extras, rng })
    }

    /// Whether the presence or frequency penalty is on (then
    /// [`sample_with`](Self::sample_with) needs the generated tokens).
    pub fn counts_generated(&self) -> bool {
        self.extras.presence_penalty != 0.0 || self.extras.frequency_penalty != 0.0
    }

    /// Picks the next token from `logits` given the tokens seen so far (the presence
    /// and frequency penalties, if set, count `seen` too).
    pub fn sample(&mut self, logits: &[f32], seen: &[u32]) -> Result<u32> {
        self.sample_with(logits, seen, seen)
    }

    /// Picks the next token from `logits`: the repetition penalty applies to the tokens
    /// in `seen` (prompt and output), the presence and frequency penalties to those in
    /// `generated` (the output so far), as vLLM applies them.
    pub fn sample_with(&mut self, logits: &[f32], seen: &[u32], generated: &[u32]) -> Result<u32> {
        if logits.is_empty() {
            return Err(Error::value("Sampler::sample", "logits", "at least one value", "none"));
        }
        let penalized = self.config.repetition_penalty != 1.0 || self.counts_generated();
        if self.config.temperature == 0.0 && !penalized {
            return Ok(argmax(logits)); // greedy, nothing to adjust: no copy of the logits
        }
        let mut logits = logits.to_vec();
        if self.config.repetition_penalty != 1.0 {
            let p = self.config.repetition_penalty;
            // Once per distinct token, however often it was seen.
            let mut done = std::collections::HashSet::with_capacity(seen.len());
            for &id in seen {
                if !done.insert(id) {
                    continue;
                }
                if let Some(l) = logits.get_mut(id as usize) {
                    *l = if *l > 0.0 { *l / p } else { *l * p };
                }
            }
        }
        if self.counts_generated() {
            // l -= presence·[count > 0] + frequency·count
            let mut counts = std::collections::HashMap::<u32, u32>::with_capacity(generated.len());
            for &id in generated {
                *counts.entry(id).or_default() += 1;
            }
            let (presence, frequency) = (self.extras.presence_penalty, self.extras.frequency_penalty);
            for (id, n) in counts {
                if let Some(l) = logits.get_mut(id as usize) {
                    *l -= presence + frequency * n as f32;
                }
            }
        }
        if self.config.temperature == 0.0 {
            return Ok(argmax(&logits));
        }
        // Candidates sorted by logit, ties by id: a total order, so the result is
        // deterministic. With top-k, the k best are selected first (linear time) and only
        // they are sorted: sorting a 49k vocabulary every token cost a tenth of decoding.
        let mut order: Vec<usize> = (0..logits.len()).filter(|&i| !logits[i].is_nan()).collect();
        if order.is_empty() {
            return Err(Error::value("Sampler::sample", "logits", "at least one that is not NaN", "all NaN"));
        }
        let by_logit = |&a: &usize, &b: &usize| logits[b].total_cmp(&logits[a]).then(a.cmp(&b));
        let k = self.config.top_k;
        if k > 0 && k < order.len() {
            order.select_nth_unstable_by(k - 1, by_logit);
            order.truncate(k);
        }
        order.sort_unstable_by(by_logit);
        let t = self.config.temperature;
        let max = logits[order[0]];
        let mut probs: Vec<f32> = order.iter().map(|&i| ((logits[i] - max) / t).exp()).collect();
        let total: f32 = probs.iter().sum();
        probs.iter_mut().for_each(|p| *p /= total);
        if self.config.top_p < 1.0 {
            let mut cumulative = 0.0;
            let mut keep = probs.len();
            for (i, p) in probs.iter().enumerate() {
                cumulative += p;
                if cumulative >= self.config.top_p {
                    keep = i + 1;
                    break;
                }
            }
            probs.truncate(keep);
            order.truncate(keep);
            let total: f32 = probs.iter().sum();
            probs.iter_mut().for_each(|p| *p /= total);
        }
        if self.extras.min_p > 0.0 {
            // Sorted descending: the kept tokens are a prefix, the first always among them.
            let floor = self.extras.min_p * probs[0];
            let keep = probs.iter().position(|&p| p < floor).unwrap_or(probs.len()).max(1);
            probs.truncate(keep);
            order.truncate(keep);
            let total: f32 = probs.iter().sum();
            probs.iter_mut().for_each(|p| *p /= total);
        }
        let r = self.rng.uniform();
        let mut cumulative = 0.0;
        for (p, &id) in probs.iter().zip(&order) {
            cumulative += p;
            if r < cumulative {
                return Ok(id as u32);
            }
        }
        Ok(*order.last().unwrap_or(&0) as u32)
    }

    /// The sampler's random state (saved to resume a stream exactly).
    pub fn rng_state(&self) -> u64 {
        self.rng.state
    }
}

/// Index of the largest value (first on ties; NaN never wins).
///
/// One pass in 16 independent lanes, which the compiler turns into vector compares and
/// blends (a decode step's greedy choice over Gemma 3's 262,144 logits took 0.7 ms with
/// the one-element loop): lane j keeps the largest value of elements `16·c + j` and its
/// first index; the answer is the smallest index among the lanes holding the overall
/// largest. Only values above −∞ enter a lane, so NaN never does; when none is above
/// −∞, [`argmax_scalar`]'s rule decides.
pub fn argmax(v: &[f32]) -> u32 {
    const LANES: usize = 16;
    let mut best = [f32::NEG_INFINITY; LANES];
    let mut at = [u32::MAX; LANES];
    let chunks = v.chunks_exact(LANES);
    let tail = chunks.remainder();
    for (c, chunk) in chunks.enumerate() {
        for j in 0..LANES {
            // Strictly greater: a lane keeps its first maximum; false for NaN.
            if chunk[j] > best[j] {
                best[j] = chunk[j];
                at[j] = (c * LANES + j) as u32;
            }
        }
    }
    let base = v.len() - tail.len();
    for (j, &x) in tail.iter().enumerate() {
        if x > best[j] {
            best[j] = x;
            at[j] = (base + j) as u32;
        }
    }
    let top = best.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    match (0..LANES).filter(|&j| at[j] != u32::MAX && best[j] == top).map(|j| at[j]).min() {
        Some(i) => i,
        // Every value is −∞ or NaN.
        None => argmax_scalar(v),
    }
}

/// [`argmax`] one element at a time: the definition it is tested against.
pub fn argmax_scalar(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] || v[best].is_nan() {
            best = i;
        }
    }
    best as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lane_wise_argmax_is_the_one_element_loops() {
        let mut rng = Rng::new(7);
        let mut cases: Vec<Vec<f32>> = vec![
            vec![],
            vec![f32::NAN],
            vec![f32::NAN; 40],
            vec![f32::NEG_INFINITY; 37],
            vec![f32::NAN, f32::NEG_INFINITY, f32::NAN],
            vec![2.0; 50],
            vec![f32::INFINITY, 1.0, f32::INFINITY],
        ];
        for n in [1usize, 15, 16, 17, 33, 100, 1000] {
            for ties in [false, true] {
                let mut v: Vec<f32> =
                    (0..n).map(|_| if ties { (rng.uniform() * 4.0).floor() } else { rng.uniform() - 0.5 }).collect();
                cases.push(v.clone());
                for i in (0..n).step_by(3) {
                    v[i] = f32::NAN;
                }
                cases.push(v.clone());
                v[n - 1] = f32::INFINITY;
                cases.push(v);
            }
        }
        for v in &cases {
            if v.is_empty() {
                assert_eq!(argmax(v), 0);
            } else {
                assert_eq!(argmax(v), argmax_scalar(v), "{v:?}");
            }
        }
    }

    #[test]
    fn greedy_takes_the_argmax() {
        let mut s = Sampler::new(SamplerConfig::default()).unwrap();
        assert_eq!(s.sample(&[0.1, 3.0, -1.0, 2.9], &[]).unwrap(), 1);
    }

    #[test]
    fn repetition_penalty_demotes_seen_tokens() {
        let cfg = SamplerConfig { repetition_penalty: 2.0, ..Default::default() };
        let mut s = Sampler::new(cfg).unwrap();
        assert_eq!(s.sample(&[0.1, 3.0, -1.0, 2.0], &[1]).unwrap(), 3);
    }

    #[test]
    fn top_k_one_is_greedy_and_sampling_is_seeded() {
        let cfg = SamplerConfig { temperature: 1.0, top_k: 1, seed: 7, ..Default::default() };
        let mut s = Sampler::new(cfg).unwrap();
        assert_eq!(s.sample(&[0.1, 3.0, -1.0, 2.9], &[]).unwrap(), 1);
        let cfg = SamplerConfig { temperature: 1.0, seed: 7, ..Default::default() };
        let draw = |cfg: &SamplerConfig| {
            let mut s = Sampler::new(cfg.clone()).unwrap();
            (0..20).map(|_| s.sample(&[0.0, 0.0, 0.0, 0.0], &[]).unwrap()).collect::<Vec<_>>()
        };
        assert_eq!(draw(&cfg), draw(&cfg));
        assert!(draw(&cfg).iter().any(|&x| x != draw(&cfg)[0]));
    }

    #[test]
    fn top_p_keeps_the_nucleus() {
        // probabilities ≈ [0.0, 0.84, 0.0, 0.16]: top_p 0.5 keeps only token 1.
        let cfg = SamplerConfig { temperature: 1.0, top_p: 0.5, seed: 3, ..Default::default() };
        let mut s = Sampler::new(cfg).unwrap();
        for _ in 0..20 {
            assert_eq!(s.sample(&[-10.0, 3.0, -10.0, 1.35], &[]).unwrap(), 1);
        }
    }

    #[test]
    fn top_k_draws_only_the_k_best_ties_broken_by_id() {
        // Logits 0..64 shuffled, with ties: the best 5 by (logit, then lower id) are
        // ids 3 (9.0), 10 (9.0), 7 (8.5), 0 (8.0), 60 (8.0); 61 (8.0) is sixth.
        let mut logits: Vec<f32> = (0..64).map(|i| ((i * 37) % 64) as f32 / 10.0).collect();
        for (id, l) in [(3, 9.0), (10, 9.0), (7, 8.5), (0, 8.0), (60, 8.0), (61, 8.0)] {
            logits[id] = l;
        }
        let cfg = SamplerConfig { temperature: 100.0, top_k: 5, seed: 11, ..Default::default() };
        let mut s = Sampler::new(cfg).unwrap();
        let drawn: std::collections::BTreeSet<u32> = (0..400).map(|_| s.sample(&logits, &[]).unwrap()).collect();
        assert_eq!(drawn, [0, 3, 7, 10, 60].into_iter().collect());
    }

    #[test]
    fn all_nan_logits_are_an_error() {
        let cfg = SamplerConfig { temperature: 1.0, ..Default::default() };
        let err = Sampler::new(cfg).unwrap().sample(&[f32::NAN, f32::NAN], &[]).unwrap_err();
        assert!(err.to_string().contains("NaN"), "{err}");
    }

    #[test]
    fn bad_settings_are_errors() {
        assert!(Sampler::new(SamplerConfig { temperature: -1.0, ..Default::default() }).is_err());
        assert!(Sampler::new(SamplerConfig { top_p: 0.0, ..Default::default() }).is_err());
        let extras = |e: SamplerExtras| Sampler::with_extras(SamplerConfig::default(), e);
        for bad in [
            SamplerExtras { min_p: -0.1, ..Default::default() },
            SamplerExtras { min_p: 1.5, ..Default::default() },
            SamplerExtras { min_p: f32::NAN, ..Default::default() },
            SamplerExtras { presence_penalty: 2.5, ..Default::default() },
            SamplerExtras { frequency_penalty: -2.01, ..Default::default() },
            SamplerExtras { frequency_penalty: f32::NAN, ..Default::default() },
        ] {
            let e = extras(bad.clone()).unwrap_err().to_string();
            assert!(e.contains("min_p") || e.contains("penalty"), "{bad:?}: {e}");
        }
        assert!(extras(SamplerExtras { min_p: 1.0, presence_penalty: -2.0, frequency_penalty: 2.0 }).is_ok());
    }

    #[test]
    fn repetition_penalty_counts_each_seen_token_once() {
        // 3.0 / 2 = 1.5 > 1.2 whether token 1 was seen once or three times (applied per
        // occurrence it would be 3 / 8 = 0.375 < 1.2 and token 3 would win).
        let cfg = SamplerConfig { repetition_penalty: 2.0, ..Default::default() };
        let mut s = Sampler::new(cfg).unwrap();
        assert_eq!(s.sample(&[0.1, 3.0, -1.0, 1.2], &[1, 1, 1]).unwrap(), 1);
        // A negative logit is multiplied instead: −1 · 2 = −2 falls below token 0's −1.5.
        assert_eq!(s.sample(&[-1.5, -1.0, -1.8, -3.0], &[1, 1]).unwrap(), 0);
    }

    #[test]
    fn presence_penalty_subtracts_once_per_generated_token() {
        let extras = SamplerExtras { presence_penalty: 1.0, ..Default::default() };
        let mut s = Sampler::with_extras(SamplerConfig::default(), extras).unwrap();
        // Token 1 generated 3 times: 3.0 − 1 = 2.0 < 2.5 (token 3) wins…
        assert_eq!(s.sample_with(&[0.0, 3.0, 0.0, 2.5], &[], &[1, 1, 1]).unwrap(), 3);
        // …while 3.0 − 1 = 2.0 > 1.9 still wins over an unpenalised 1.9, however often seen.
        assert_eq!(s.sample_with(&[0.0, 3.0, 0.0, 1.9], &[], &[1, 1, 1, 1, 1]).unwrap(), 1);
        // Only the generated tokens count: the prompt's (in `seen`) do not.
        assert_eq!(s.sample_with(&[0.0, 3.0, 0.0, 2.5], &[1, 1], &[]).unwrap(), 1);
        // A negative penalty encourages repetition.
        let extras = SamplerExtras { presence_penalty: -1.0, ..Default::default() };
        let mut s = Sampler::with_extras(SamplerConfig::default(), extras).unwrap();
        assert_eq!(s.sample_with(&[0.0, 2.5, 0.0, 3.0], &[], &[1]).unwrap(), 1);
    }

    #[test]
    fn frequency_penalty_grows_with_the_count() {
        let extras = SamplerExtras { frequency_penalty: 0.5, ..Default::default() };
        let mut s = Sampler::with_extras(SamplerConfig::default(), extras).unwrap();
        // 3.0 − 0.5·1 = 2.5 > 2.2; 3.0 − 0.5·2 = 2.0 < 2.2.
        assert_eq!(s.sample_with(&[0.0, 3.0, 0.0, 2.2], &[], &[1]).unwrap(), 1);
        assert_eq!(s.sample_with(&[0.0, 3.0, 0.0, 2.2], &[], &[1, 1]).unwrap(), 3);
        // `sample` counts `seen` as the generated tokens.
        assert_eq!(s.sample(&[0.0, 3.0, 0.0, 2.2], &[1, 0, 1]).unwrap(), 3);
    }

    #[test]
    fn min_p_keeps_tokens_near_the_best() {
        // Probabilities ∝ e^[2, 2 − ln 2, 2 − ln 10, −20]: 1, 0.5, 0.1 and ≈0 of the best.
        let logits = [2.0, 2.0 - 2f32.ln(), 2.0 - 10f32.ln(), -20.0];
        let draw = |min_p: f32| {
            let extras = SamplerExtras { min_p, ..Default::default() };
            let cfg = SamplerConfig { temperature: 1.0, seed: 5, ..Default::default() };
            let mut s = Sampler::with_extras(cfg, extras).unwrap();
            (0..500).map(|_| s.sample(&logits, &[]).unwrap()).collect::<std::collections::BTreeSet<u32>>()
        };
        assert_eq!(draw(0.0), [0, 1, 2].into_iter().collect()); // token 3 has p ≈ 1e-10
        assert_eq!(draw(0.3), [0, 1].into_iter().collect());
        assert_eq!(draw(0.09), [0, 1, 2].into_iter().collect());
        assert_eq!(draw(0.6), [0].into_iter().collect());
        assert_eq!(draw(1.0), [0].into_iter().collect());
        // After the temperature: at T = 0.5 the ratios square (0.25, 0.01), so 0.3 keeps one.
        let extras = SamplerExtras { min_p: 0.3, ..Default::default() };
        let cfg = SamplerConfig { temperature: 0.5, seed: 5, ..Default::default() };
        let mut s = Sampler::with_extras(cfg, extras).unwrap();
        assert!((0..200).all(|_| s.sample(&logits, &[]).unwrap() == 0));
    }
}
