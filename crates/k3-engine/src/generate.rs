//! Generation with a [`Sampler`] and [`StopConditions`]: [`Session::generate_with`].

use crate::stop::{Generation, StopConditions, StopReason, StopScanner};
use crate::{DecodeMode, EngineError, Sampler, Session};

impl Session<'_> {
    /// Generates up to `n` tokens chosen by `sampler`, stopping early at an end id of `stop`,
    /// at one of its stop strings (matched on the decoded text so far, across tokens), or when
    /// `on_token` — which sees every generated id, an end id included — returns `false`.
    ///
    /// The repeat penalty's history is the whole conversation (prompt and generated tokens).
    /// The last generated id stays pending and is fed lazily by the next call (see
    /// [`Session`]), whatever the stop reason. When several reasons hold for the same token,
    /// the first of end id, stop string, callback, length wins. Stop strings need a
    /// tokenizer; [`Generation::text`] is `None` without one.
    pub fn generate_with(
        &mut self,
        n: usize,
        mode: DecodeMode,
        sampler: &mut Sampler,
        stop: &StopConditions,
        mut on_token: impl FnMut(u32) -> bool,
    ) -> Result<Generation, EngineError> {
        let tokenizer = self.owner().tokenizer();
        if tokenizer.is_none() && stop.stop_strings.iter().any(|s| !s.is_empty()) {
            return Err(EngineError::Invalid(
                "stop strings need a tokenizer (tiktoken.model or tokenizer.json in the model directory, or --tok)".into(),
            ));
        }
        if n > 0 && self.logits().is_empty() {
            return Err(EngineError::Invalid(
                "generate needs fresh logits: feed a prompt first".into(),
            ));
        }
        let mut decoder = tokenizer.map(|t| t.stream_decoder());
        let mut scanner = StopScanner::new(&stop.stop_strings);
        let mut text = String::new();
        let mut ids = Vec::with_capacity(n);
        let mut reason = StopReason::Length;
        for i in 0..n {
            let id = sampler.sample(self.logits(), self.history());
            ids.push(id);
            let keep_going = on_token(id);
            let mut stopped = None;
            if stop.end_ids.contains(&id) {
                stopped = Some(StopReason::EndToken(id));
            } else if let Some(d) = decoder.as_mut() {
                // Ids the tokenizer does not know (padding rows of the vocabulary) decode to nothing.
                let step = scanner.push(&d.push(id).unwrap_or_default());
                text.push_str(&step.emit);
                stopped = step.hit.map(StopReason::StopText);
            }
            if stopped.is_none() && !keep_going {
                stopped = Some(StopReason::Callback);
            }
            if stopped.is_some() || i + 1 == n {
                reason = stopped.unwrap_or(StopReason::Length);
                self.keep_pending(id)?;
                break;
            }
            self.step(id, mode)?;
        }
        let text = decoder.map(|d| {
            if !matches!(reason, StopReason::StopText(_)) {
                // An incomplete trailing character flushes as U+FFFD and may still complete a stop.
                let step = scanner.push(&d.finish());
                text.push_str(&step.emit);
                match step.hit {
                    Some(s) if !matches!(reason, StopReason::EndToken(_)) => {
                        reason = StopReason::StopText(s)
                    }
                    Some(_) => {}
                    None => text.push_str(&scanner.finish()),
                }
            }
            text
        });
        Ok(Generation {
            ids,
            text,
            stop_reason: reason,
        })
    }
}
