//! Token sampling on one row of logits: repetition penalty, temperature, top-k, top-p, min-p,
//! in the order transformers applies its logits processors, with a seeded PRNG per sequence so
//! results do not depend on batch composition.

/// How to pick the next token.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// Softmax temperature; `0` means greedy (argmax).
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens; `0` disables.
    pub top_k: usize,
    /// Keep the smallest set of tokens whose probability reaches `top_p`; `1` disables.
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` times the most likely one; `0` disables.
    pub min_p: f32,
    /// Divide positive (multiply negative) logits of already-seen tokens by this; `1` disables.
    pub repetition_penalty: f32,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
        }
    }
}

impl SamplingParams {
    /// Greedy decoding.
    pub fn greedy() -> Self {
        SamplingParams {
            temperature: 0.0,
            ..Self::default()
        }
    }

    /// Checks ranges; the error names the parameter and its valid range.
    pub fn validate(&self) -> Result<(), String> {
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            return Err(format!(
                "temperature must be >= 0 (got {})",
                self.temperature
            ));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(format!("top_p must be in (0, 1] (got {})", self.top_p));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return Err(format!("min_p must be in [0, 1] (got {})", self.min_p));
        }
        if !(self.repetition_penalty > 0.0 && self.repetition_penalty.is_finite()) {
            return Err(format!(
                "repetition_penalty must be > 0 (got {})",
                self.repetition_penalty
            ));
        }
        Ok(())
    }

    /// Whether decoding is greedy.
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }
}

/// xoshiro256** seeded with splitmix64: small, fast, and stable across dependency versions.
#[derive(Debug, Clone)]
pub struct Rng {
    s: [u64; 4],
}

fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Rng {
    /// A generator for stream `(seed, a, b)`, e.g. (run seed, prompt index, sample index).
    pub fn new(seed: u64, a: u64, b: u64) -> Self {
        let mut st =
            seed ^ a.wrapping_mul(0xD1B5_4A32_D192_ED03) ^ b.wrapping_mul(0x8CB9_2BA7_2F3D_8DD7);
        let s = [
            splitmix64(&mut st),
            splitmix64(&mut st),
            splitmix64(&mut st),
            splitmix64(&mut st),
        ];
        Rng { s }
    }

    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let result = self.s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = self.s[1] << 17;
        self.s[2] ^= self.s[0];
        self.s[3] ^= self.s[1];
        self.s[1] ^= self.s[2];
        self.s[0] ^= self.s[3];
        self.s[2] ^= t;
        self.s[3] = self.s[3].rotate_left(45);
        result
    }

    /// Uniform in `[0, 1)` with 53 bits.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// The chosen token and its log-probability under the temperature-scaled model distribution
/// (before repetition penalty and top-k/top-p/min-p truncation: the quantity a trainer
/// recomputes; greedy uses temperature 1).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampled {
    /// Token id.
    pub token: u32,
    /// `log p(token)`.
    pub logprob: f32,
}

fn log_softmax_at(logits: &[f32], inv_t: f32, idx: usize) -> f32 {
    let max = logits.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x)) * inv_t;
    let sum: f64 = logits
        .iter()
        .map(|&x| ((x * inv_t - max) as f64).exp())
        .sum();
    (logits[idx] * inv_t - max) - sum.ln() as f32
}

/// Picks the next token from raw `logits [vocab]`, given the ids seen so far (prompt and
/// completion) for the repetition penalty.
pub fn sample(logits: &[f32], seen: &[u32], p: &SamplingParams, rng: &mut Rng) -> Sampled {
    if !p.is_greedy() && p.repetition_penalty == 1.0 && is_plain(p) {
        return sample_plain(logits, p.temperature, rng);
    }
    let report_t = if p.is_greedy() { 1.0 } else { p.temperature };
    let mut work: Vec<f32> = logits.to_vec();
    if p.repetition_penalty != 1.0 {
        for &id in seen {
            if let Some(x) = work.get_mut(id as usize) {
                *x = if *x > 0.0 {
                    *x / p.repetition_penalty
                } else {
                    *x * p.repetition_penalty
                };
            }
        }
    }
    let token = if p.is_greedy() {
        argmax(&work)
    } else {
        sample_filtered(&mut work, p, rng)
    };
    Sampled {
        token: token as u32,
        logprob: log_softmax_at(logits, 1.0 / report_t, token),
    }
}

/// The `k` most likely tokens and their log-probabilities under the same distribution
/// [`sample`] reports its log-probability in (temperature-scaled; greedy, `temperature = 0`,
/// uses 1), most likely first (lower id first on ties): OpenAI's `top_logprobs`.
pub fn top_logprobs(logits: &[f32], temperature: f32, k: usize) -> Vec<Sampled> {
    let k = k.min(logits.len());
    if k == 0 {
        return Vec::new();
    }
    let inv_t = if temperature > 0.0 {
        1.0 / temperature
    } else {
        1.0
    };
    let max = logits.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
    let probs = unnormalised(logits, max, inv_t);
    let log_total = probs.iter().map(|&x| x as f64).sum::<f64>().ln() as f32;
    let by_logit = |a: &usize, b: &usize| logits[*b].total_cmp(&logits[*a]).then(a.cmp(b));
    let mut idx: Vec<usize> = (0..logits.len()).collect();
    if k < idx.len() {
        idx.select_nth_unstable_by(k - 1, by_logit);
        idx.truncate(k);
    }
    idx.sort_unstable_by(by_logit);
    idx.into_iter()
        .map(|i| Sampled {
            token: i as u32,
            logprob: (logits[i] - max) * inv_t - log_total,
        })
        .collect()
}

/// Index of the largest value (first one on ties, as torch.argmax).
pub fn argmax(x: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in x.iter().enumerate() {
        if v > x[best] {
            best = i;
        }
    }
    best
}

/// Whether sampling draws from the whole temperature-scaled distribution (no top-k, top-p or
/// min-p truncation).
fn is_plain(p: &SamplingParams) -> bool {
    p.top_k == 0 && p.top_p >= 1.0 && p.min_p <= 0.0
}

/// `exp((x - max) / t)` for every logit: the unnormalised probabilities, vectorised.
fn unnormalised(logits: &[f32], max: f32, inv_t: f32) -> Vec<f32> {
    rlft_kernels::simd!({
        logits
            .iter()
            .map(|&x| rlft_kernels::math::exp_f32((x - max) * inv_t))
            .collect()
    })
}

/// Plain sampling at temperature `t` (the common RL rollout setting): one pass of `exp` gives
/// both the draw and the chosen token's log-probability.
fn sample_plain(logits: &[f32], t: f32, rng: &mut Rng) -> Sampled {
    let inv_t = 1.0 / t;
    let max = logits.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
    let probs = unnormalised(logits, max, inv_t);
    let total: f64 = probs.iter().map(|&x| x as f64).sum();
    let token = draw_all(&probs, total, rng);
    Sampled {
        token: token as u32,
        logprob: (logits[token] - max) * inv_t - total.ln() as f32,
    }
}

fn sample_filtered(work: &mut [f32], p: &SamplingParams, rng: &mut Rng) -> usize {
    let inv_t = 1.0 / p.temperature;
    let max = work.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
    let probs = unnormalised(work, max, inv_t);
    if is_plain(p) {
        let total: f64 = probs.iter().map(|&x| x as f64).sum();
        return draw_all(&probs, total, rng);
    }
    // Candidate set, most likely first.
    let mut idx: Vec<usize> = (0..probs.len()).collect();
    let k = if p.top_k > 0 {
        p.top_k.min(idx.len())
    } else {
        idx.len()
    };
    if k < idx.len() {
        idx.select_nth_unstable_by(k - 1, |&a, &b| probs[b].total_cmp(&probs[a]));
        idx.truncate(k);
    }
    idx.sort_unstable_by(|&a, &b| probs[b].total_cmp(&probs[a]).then(a.cmp(&b)));
    if p.top_p < 1.0 {
        let total: f64 = idx.iter().map(|&i| probs[i] as f64).sum();
        let mut acc = 0.0f64;
        let mut keep = idx.len();
        for (n, &i) in idx.iter().enumerate() {
            acc += probs[i] as f64 / total;
            if acc >= p.top_p as f64 {
                keep = n + 1;
                break;
            }
        }
        idx.truncate(keep.max(1));
    }
    if p.min_p > 0.0 {
        let top = probs[idx[0]];
        idx.retain(|&i| probs[i] >= p.min_p * top);
    }
    draw(&probs, &idx, rng)
}

/// Draws an index with probability `probs[i] / total` (`total` = the sum of `probs`).
fn draw_all(probs: &[f32], total: f64, rng: &mut Rng) -> usize {
    let target = rng.next_f64() * total;
    let mut acc = 0.0f64;
    for (i, &x) in probs.iter().enumerate() {
        acc += x as f64;
        if acc > target {
            return i;
        }
    }
    probs.iter().rposition(|&x| x > 0.0).unwrap_or(0)
}

fn draw(probs: &[f32], idx: &[usize], rng: &mut Rng) -> usize {
    let total: f64 = idx.iter().map(|&i| probs[i] as f64).sum();
    let target = rng.next_f64() * total;
    let mut acc = 0.0f64;
    for &i in idx {
        acc += probs[i] as f64;
        if acc > target {
            return i;
        }
    }
    *idx.last().expect("at least one candidate")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(logits: &[f32], p: &SamplingParams, n: usize) -> Vec<usize> {
        let mut rng = Rng::new(7, 0, 0);
        let mut c = vec![0; logits.len()];
        for _ in 0..n {
            c[sample(logits, &[], p, &mut rng).token as usize] += 1;
        }
        c
    }

    #[test]
    fn greedy_picks_argmax_with_its_logprob() {
        let l = [1.0, 3.0, 2.0];
        let s = sample(&l, &[], &SamplingParams::greedy(), &mut Rng::new(0, 0, 0));
        assert_eq!(s.token, 1);
        let z: f32 = l.iter().map(|x| x.exp()).sum();
        assert!((s.logprob - (3.0f32.exp() / z).ln()).abs() < 1e-6);
    }

    #[test]
    fn frequencies_follow_the_distribution() {
        let l = [0.0, (2.0f32).ln(), (3.0f32).ln()];
        let c = counts(&l, &SamplingParams::default(), 60_000);
        for (i, w) in [1.0, 2.0, 3.0].iter().enumerate() {
            let f = c[i] as f64 / 60_000.0;
            assert!((f - w / 6.0).abs() < 0.01, "{c:?}");
        }
    }

    #[test]
    fn plain_sampling_reports_the_tempered_logprob() {
        // The one-pass path (plain sampling) against the general formula, at T = 1 and T = 0.7,
        // over a vocabulary with very unlikely and -inf entries.
        let l: Vec<f32> = (0..1000)
            .map(|i| match i % 7 {
                0 => f32::NEG_INFINITY,
                k => (i as f32 * 0.37).sin() * 9.0 - k as f32,
            })
            .collect();
        for t in [1.0f32, 0.7] {
            let p = SamplingParams {
                temperature: t,
                ..SamplingParams::default()
            };
            let mut rng = Rng::new(5, 0, 0);
            for _ in 0..50 {
                let s = sample(&l, &[], &p, &mut rng);
                assert!(l[s.token as usize].is_finite());
                let want = log_softmax_at(&l, 1.0 / t, s.token as usize);
                assert!(
                    (s.logprob - want).abs() < 1e-5,
                    "T {t}: {} vs {want}",
                    s.logprob
                );
            }
        }
    }

    #[test]
    fn top_logprobs_are_the_sampled_distribution() {
        let l: Vec<f32> = (0..500).map(|i| (i as f32 * 0.91).sin() * 6.0).collect();
        for t in [0.0f32, 1.0, 0.6] {
            let top = top_logprobs(&l, t, 5);
            assert_eq!(top.len(), 5);
            let inv_t = if t > 0.0 { 1.0 / t } else { 1.0 };
            for (j, s) in top.iter().enumerate() {
                let want = log_softmax_at(&l, inv_t, s.token as usize);
                assert!(
                    (s.logprob - want).abs() < 1e-5,
                    "T {t}: {} vs {want}",
                    s.logprob
                );
                if j > 0 {
                    assert!(s.logprob <= top[j - 1].logprob);
                }
            }
            let p = SamplingParams {
                temperature: t,
                ..SamplingParams::default()
            };
            // The greedy pick is the first entry, with the same log-probability.
            if t == 0.0 {
                let s = sample(&l, &[], &p, &mut Rng::new(0, 0, 0));
                assert_eq!(s.token, top[0].token);
                assert!((s.logprob - top[0].logprob).abs() < 1e-6);
            }
        }
        assert!(top_logprobs(&l, 1.0, 0).is_empty());
        assert_eq!(top_logprobs(&[1.0, 2.0], 1.0, 9).len(), 2);
    }

    #[test]
    fn truncation_rules() {
        let l = [0.0, 1.0, 2.0, 3.0, 4.0];
        let top_k = SamplingParams {
            top_k: 2,
            ..Default::default()
        };
        let c = counts(&l, &top_k, 2000);
        assert_eq!(c[0] + c[1] + c[2], 0);
        let top_p = SamplingParams {
            top_p: 0.5,
            ..Default::default()
        };
        let c = counts(&l, &top_p, 2000);
        assert_eq!(
            c[..4].iter().sum::<usize>(),
            0,
            "top token holds > 0.5: {c:?}"
        );
        let min_p = SamplingParams {
            min_p: 0.3,
            ..Default::default()
        };
        let c = counts(&l, &min_p, 2000);
        // exp(-1) = 0.37 >= 0.3 keeps token 3; exp(-2) = 0.14 drops token 2.
        assert_eq!(c[..3].iter().sum::<usize>(), 0);
        assert!(c[3] > 0 && c[4] > 0);
    }

    #[test]
    fn repetition_penalty_discourages_seen_tokens() {
        let l = [2.0, 2.1];
        let p = SamplingParams {
            repetition_penalty: 2.0,
            ..SamplingParams::greedy()
        };
        assert_eq!(sample(&l, &[1], &p, &mut Rng::new(0, 0, 0)).token, 0);
        assert_eq!(sample(&l, &[], &p, &mut Rng::new(0, 0, 0)).token, 1);
    }

    #[test]
    fn seeded_streams_repeat_and_differ() {
        let mut a = Rng::new(1, 2, 3);
        let mut b = Rng::new(1, 2, 3);
        let mut c = Rng::new(1, 2, 4);
        let xa: Vec<u64> = (0..4).map(|_| a.next_u64()).collect();
        let xb: Vec<u64> = (0..4).map(|_| b.next_u64()).collect();
        let xc: Vec<u64> = (0..4).map(|_| c.next_u64()).collect();
        assert_eq!(xa, xb);
        assert_ne!(xa, xc);
    }

    #[test]
    fn validation_names_the_parameter() {
        let p = SamplingParams {
            top_p: 0.0,
            ..Default::default()
        };
        assert!(p.validate().unwrap_err().contains("top_p"));
    }
}
