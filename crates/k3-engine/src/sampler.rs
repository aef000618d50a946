//! Token sampling: repeat, presence and frequency penalties, temperature, top-k, top-p, min-p, and a seeded PRNG.
//!
//! Everything here is deterministic: every ordering is fixed (candidates sort by probability
//! descending, then id ascending), sums run in a fixed order in f64, and the random stream is
//! a splitmix64 generator owned by the [`Sampler`]. Because k3's logits are bit-identical at
//! every memory budget and thread count, a fixed seed gives the same tokens there too.

use crate::constraint::Constraint;
use crate::EngineError;
use serde::Serialize;

/// How the next token is chosen from the logits.
///
/// The default is greedy: temperature 0 takes the argmax (ties → lowest id), identical to
/// [`crate::argmax`] unless a repeat penalty is set. A filter at its neutral value is off:
/// `top_k` 0, `top_p` 1, `min_p` 0, `repeat_penalty` 1.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SamplingParams {
    /// Softmax temperature, ≥ 0; 0 means greedy (`--temp`).
    pub temperature: f32,
    /// Keep only the `top_k` most probable tokens; 0 keeps all (`--top-k`).
    pub top_k: usize,
    /// Nucleus: keep the smallest most-probable set whose probability reaches `top_p`, in
    /// (0, 1]; 1 keeps all (`--top-p`).
    pub top_p: f32,
    /// Drop tokens whose probability is below `min_p` × the most probable one's, in [0, 1];
    /// 0 keeps all (`--min-p`).
    pub min_p: f32,
    /// Penalty (> 0) on tokens seen in the last `repeat_last_n` of the history: a positive
    /// logit is divided by it, a negative one multiplied; 1 is off (`--repeat-penalty`).
    pub repeat_penalty: f32,
    /// How many of the most recent tokens the repeat, presence and frequency penalties look
    /// at; 0 turns all three off (`--repeat-last-n`).
    pub repeat_last_n: usize,
    /// Subtracted once from the logit of every token seen in the window, in [-2, 2]; 0 is off
    /// (`--presence-penalty`, OpenAI's `presence_penalty`).
    pub presence_penalty: f32,
    /// Subtracted from a token's logit once per occurrence in the window, in [-2, 2]; 0 is
    /// off (`--frequency-penalty`, OpenAI's `frequency_penalty`).
    pub frequency_penalty: f32,
    /// Seed of the random stream (`--seed`). Unused at temperature 0.
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            seed: 0,
        }
    }
}

impl SamplingParams {
    /// Greedy decoding (temperature 0, no penalty): the same tokens as [`crate::argmax`].
    pub fn greedy() -> Self {
        SamplingParams::default()
    }

    /// Checks every field; the error names the CLI flag, the field and the offending value.
    pub fn validate(&self) -> Result<(), EngineError> {
        let bad = |flag: &str, field: &str, rule: &str, value: f32| {
            Err(EngineError::Invalid(format!(
                "invalid sampling parameter {flag} ({field}) = {value}: {rule}"
            )))
        };
        if !self.temperature.is_finite() || self.temperature < 0.0 {
            return bad(
                "--temp",
                "temperature",
                "must be a finite number ≥ 0 (0 = greedy)",
                self.temperature,
            );
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad(
                "--top-p",
                "top_p",
                "must be in (0, 1] (1 = off)",
                self.top_p,
            );
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return bad(
                "--min-p",
                "min_p",
                "must be in [0, 1] (0 = off)",
                self.min_p,
            );
        }
        if !self.repeat_penalty.is_finite() || self.repeat_penalty <= 0.0 {
            return bad(
                "--repeat-penalty",
                "repeat_penalty",
                "must be a finite number > 0 (1 = off)",
                self.repeat_penalty,
            );
        }
        for (flag, field, v) in [
            (
                "--presence-penalty",
                "presence_penalty",
                self.presence_penalty,
            ),
            (
                "--frequency-penalty",
                "frequency_penalty",
                self.frequency_penalty,
            ),
        ] {
            if !(v.is_finite() && (-2.0..=2.0).contains(&v)) {
                return bad(
                    flag,
                    field,
                    "must be a finite number in [-2, 2] (0 = off)",
                    v,
                );
            }
        }
        Ok(())
    }

    /// Whether these parameters always pick the argmax of the (penalised) logits.
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }
}

/// splitmix64 (Steele, Lea & Flood, 2014): a 64-bit counter advanced by the golden-ratio
/// increment, then mixed by two xor-shift-multiply rounds. Tiny, fast, every seed is valid
/// and the stream is fully determined by the seed — all k3 needs from a PRNG.
#[derive(Clone, Debug)]
struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1) with 53 random bits.
    fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// Chooses tokens from logits under [`SamplingParams`], with its own seeded random stream.
///
/// One random number is drawn per sampled token whenever the temperature is above 0 (even
/// when a single candidate survives the filters), so the stream stays aligned however the
/// filters cut; at temperature 0 nothing is drawn.
#[derive(Clone, Debug)]
pub struct Sampler {
    params: SamplingParams,
    rng: SplitMix64,
    /// Structured output: masks each pick and advances on it (docs/API.md#structured-output).
    constraint: Option<Box<Constraint>>,
    /// Why the constraint failed, when [`Sampler::sample`] (which cannot fail) met an error.
    failure: Option<String>,
}

impl Sampler {
    /// A sampler with validated `params`, its stream seeded by `params.seed`.
    pub fn new(params: SamplingParams) -> Result<Sampler, EngineError> {
        params.validate()?;
        let rng = SplitMix64 { state: params.seed };
        Ok(Sampler {
            params,
            rng,
            constraint: None,
            failure: None,
        })
    }

    /// This sampler constrained by `constraint`: every pick (greedy or sampled, on every
    /// decode path) is made among the ids the constraint allows — the others' logits are
    /// −∞ before penalties and temperature — and advances it. A constraint serves one reply.
    pub fn with_constraint(mut self, constraint: Constraint) -> Sampler {
        self.constraint = Some(Box::new(constraint));
        self
    }

    /// The constraint in force, if any.
    pub fn constraint(&self) -> Option<&Constraint> {
        self.constraint.as_deref()
    }

    /// Removes and returns the constraint in force (a chat that constrains one reply and not
    /// the next keeps its random stream this way), clearing any recorded failure.
    pub fn take_constraint(&mut self) -> Option<Constraint> {
        self.failure = None;
        self.constraint.take().map(|c| *c)
    }

    /// Advances the constraint (if any) past `id`, an id the caller fed instead of sampling
    /// (the server's forced think→response transition, docs/SERVER.md "Anthropic Messages
    /// API"); an id the grammar does not allow is an error.
    pub fn advance_constraint(&mut self, id: u32) -> Result<(), EngineError> {
        match self.constraint.as_deref_mut() {
            Some(c) => c.advance(id),
            None => Ok(()),
        }
    }

    /// Why a constrained [`Sampler::sample`] failed (it then returned an end id), if it did.
    pub fn constraint_failure(&self) -> Option<&str> {
        self.failure.as_deref()
    }

    /// The greedy sampler (argmax, ties → lowest id).
    pub fn greedy() -> Sampler {
        Sampler {
            params: SamplingParams::greedy(),
            rng: SplitMix64 { state: 0 },
            constraint: None,
            failure: None,
        }
    }

    /// The parameters in force.
    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Restarts the random stream from `params.seed`.
    pub fn reset(&mut self) {
        self.rng = SplitMix64 {
            state: self.params.seed,
        };
    }

    /// Picks the next token from `logits`; `history` is the conversation so far (prompt and
    /// generated tokens), of which the last `repeat_last_n` feed the repeat penalty.
    ///
    /// Order: repeat penalty, then presence and frequency penalties; temperature 0 ⇒ argmax; else softmax (f64) of logits /
    /// temperature, top-k, renormalise, top-p, min-p, renormalise, draw. Non-finite logits
    /// never win a draw. Empty `logits` give id 0.
    ///
    /// With a constraint, a failure of it (it cannot happen with a compiled grammar and
    /// logits of the tokenizer's vocabulary) ends the reply: the id returned is an end id
    /// and [`Sampler::constraint_failure`] says why; [`Sampler::try_sample`] returns the
    /// error instead.
    pub fn sample(&mut self, logits: &[f32], history: &[u32]) -> u32 {
        match self.try_sample(logits, history) {
            Ok(id) => id,
            Err(e) => {
                self.failure = Some(e.to_string());
                self.constraint.as_ref().map_or(0, |c| c.end_id())
            }
        }
    }

    /// [`Sampler::sample`], with a constraint's failure as an error.
    pub fn try_sample(&mut self, logits: &[f32], history: &[u32]) -> Result<u32, EngineError> {
        let Some(mut constraint) = self.constraint.take() else {
            return Ok(self.pick(logits, history));
        };
        let mut masked = logits.to_vec();
        let picked = constraint.mask(&mut masked).and_then(|()| {
            let id = self.pick(&masked, history);
            constraint.advance(id).map(|()| id)
        });
        self.constraint = Some(constraint);
        picked
    }

    /// The unconstrained pick of [`Sampler::sample`].
    fn pick(&mut self, logits: &[f32], history: &[u32]) -> u32 {
        let penalised;
        let logits = if self.penalty_active() {
            penalised = self.penalise(logits, history);
            &penalised[..]
        } else {
            logits
        };
        if self.params.is_greedy() {
            return crate::argmax(logits);
        }
        let u = self.rng.next_f64();
        let candidates = self.candidates(logits);
        if candidates.is_empty() {
            return crate::argmax(logits);
        }
        draw(&candidates, u)
    }

    fn penalty_active(&self) -> bool {
        let p = &self.params;
        p.repeat_last_n > 0
            && (p.repeat_penalty != 1.0 || p.presence_penalty != 0.0 || p.frequency_penalty != 0.0)
    }

    /// llama.cpp semantics over the last `repeat_last_n` history tokens, for each distinct id
    /// seen there (ids beyond the vocabulary ignored), in ascending id order: first the repeat
    /// penalty — a positive logit divided by it, a negative one multiplied — then
    /// `logit -= frequency × count + presence`.
    fn penalise(&self, logits: &[f32], history: &[u32]) -> Vec<f32> {
        let mut out = logits.to_vec();
        let mut counts = std::collections::BTreeMap::<usize, u32>::new();
        let recent = &history[history.len().saturating_sub(self.params.repeat_last_n)..];
        for &id in recent {
            if (id as usize) < out.len() {
                *counts.entry(id as usize).or_insert(0) += 1;
            }
        }
        let r = self.params.repeat_penalty;
        let (presence, frequency) = (self.params.presence_penalty, self.params.frequency_penalty);
        for (i, count) in counts {
            if r != 1.0 {
                out[i] = if out[i] > 0.0 { out[i] / r } else { out[i] * r };
            }
            out[i] -= frequency * count as f32 + presence;
        }
        out
    }

    /// The surviving `(probability, id)` pairs, sorted by probability descending then id
    /// ascending, renormalised to sum to 1.
    fn candidates(&self, logits: &[f32]) -> Vec<(f64, u32)> {
        let t = f64::from(self.params.temperature);
        let max = logits
            .iter()
            .filter(|v| v.is_finite())
            .map(|&v| f64::from(v) / t)
            .fold(f64::NEG_INFINITY, f64::max);
        if !max.is_finite() {
            return Vec::new();
        }
        let mut c: Vec<(f64, u32)> = logits
            .iter()
            .enumerate()
            .filter(|(_, v)| v.is_finite())
            .map(|(i, &v)| ((f64::from(v) / t - max).exp(), i as u32))
            .collect();
        // (prob desc, id asc) is a strict total order: any sort gives the same result.
        let order = |a: &(f64, u32), b: &(f64, u32)| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1));
        let k = self.params.top_k;
        if k > 0 && k < c.len() {
            c.select_nth_unstable_by(k - 1, order);
            c.truncate(k);
        }
        c.sort_unstable_by(order);
        normalise(&mut c);
        let top_p = f64::from(self.params.top_p);
        if top_p < 1.0 {
            let mut cum = 0.0;
            let mut keep = c.len();
            for (i, (p, _)) in c.iter().enumerate() {
                cum += p;
                if cum >= top_p {
                    keep = i + 1;
                    break;
                }
            }
            c.truncate(keep);
        }
        let min_p = f64::from(self.params.min_p);
        if min_p > 0.0 {
            let floor = c.first().map_or(0.0, |(p, _)| p * min_p);
            c.retain(|(p, _)| *p >= floor);
        }
        normalise(&mut c);
        c
    }
}

/// Scales the probabilities to sum to 1 (summed in order).
fn normalise(c: &mut [(f64, u32)]) {
    let sum: f64 = c.iter().map(|(p, _)| p).sum();
    if sum > 0.0 {
        c.iter_mut().for_each(|(p, _)| *p /= sum);
    }
}

/// The first candidate whose cumulative probability exceeds `u` ∈ [0, 1).
fn draw(c: &[(f64, u32)], u: f64) -> u32 {
    let mut cum = 0.0;
    for &(p, id) in c {
        cum += p;
        if u < cum {
            return id;
        }
    }
    c.last().map_or(0, |&(_, id)| id)
}

#[cfg(test)]
#[path = "sampler_tests.rs"]
mod tests;
