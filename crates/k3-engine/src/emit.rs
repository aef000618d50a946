//! One generated id at a time, whichever decode path produced it (plain, speculative, hybrid,
//! block): the caller's callback, end ids, stop strings on the decoded text.

use crate::stop::{Generation, StopConditions, StopReason, StopScanner};
use k3_tokenizer::StreamDecoder;

/// What happens to each generated id, whichever decode path produced it: the caller's
/// callback, end ids, stop strings on the decoded text.
pub(crate) struct Emitter<'s, F> {
    stop: &'s StopConditions,
    decoder: Option<StreamDecoder<'s>>,
    scanner: StopScanner,
    text: String,
    ids: Vec<u32>,
    on_token: F,
}

impl<'s, F: FnMut(u32) -> bool> Emitter<'s, F> {
    /// An emitter for up to `n` ids, decoding text with `decoder` when there is a tokenizer.
    pub(crate) fn new(
        stop: &'s StopConditions,
        decoder: Option<StreamDecoder<'s>>,
        n: usize,
        on_token: F,
    ) -> Self {
        Emitter {
            stop,
            decoder,
            scanner: StopScanner::new(&stop.stop_strings),
            text: String::new(),
            ids: Vec::with_capacity(n),
            on_token,
        }
    }

    /// Records `id`; `Some(reason)` when generation must end at it (end id, stop string,
    /// callback — in that order of precedence).
    pub(crate) fn push(&mut self, id: u32) -> Option<StopReason> {
        self.ids.push(id);
        let keep_going = (self.on_token)(id);
        let mut stopped = None;
        if self.stop.end_ids.contains(&id) {
            stopped = Some(StopReason::EndToken(id));
        } else if let Some(d) = self.decoder.as_mut() {
            // Ids the tokenizer does not know (padding rows of the vocabulary) decode to nothing.
            let step = self.scanner.push(&d.push(id).unwrap_or_default());
            self.text.push_str(&step.emit);
            stopped = step.hit.map(StopReason::StopText);
        }
        if stopped.is_none() && !keep_going {
            stopped = Some(StopReason::Callback);
        }
        stopped
    }

    /// The generation so far, ended for `reason` (flushes the decoder, which may still
    /// complete a stop string).
    pub(crate) fn finish(self, mut reason: StopReason) -> Generation {
        let Emitter {
            decoder,
            mut scanner,
            mut text,
            ids,
            ..
        } = self;
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
        Generation {
            ids,
            text,
            stop_reason: reason,
        }
    }
}
