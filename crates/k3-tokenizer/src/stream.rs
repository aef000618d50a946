//! Incremental decoding for streamed generation output.

use crate::{Result, Tokenizer};

/// Turns a stream of token ids into text, emitting only complete UTF-8 characters.
///
/// Bytes of a character split across tokens are held until the character is complete. A byte
/// sequence that can never become valid UTF-8 is emitted as U+FFFD as soon as that is known
/// (one U+FFFD per maximal invalid subpart, as [`String::from_utf8_lossy`] does). At the end,
/// [`StreamDecoder::finish`] flushes a held incomplete sequence as U+FFFD, or
/// [`StreamDecoder::finish_bytes`] returns it raw. The concatenated output of all `push`
/// calls and `finish` equals `String::from_utf8_lossy(&tokenizer.decode(ids)?)`.
#[derive(Debug)]
pub struct StreamDecoder<'t> {
    tokenizer: &'t Tokenizer,
    pending: Vec<u8>,
}

impl<'t> StreamDecoder<'t> {
    pub(crate) fn new(tokenizer: &'t Tokenizer) -> StreamDecoder<'t> {
        StreamDecoder {
            tokenizer,
            pending: Vec::new(),
        }
    }

    /// Adds one token; returns the text completed by it (possibly empty). Fails only on an id
    /// outside the vocabulary, leaving the decoder unchanged.
    pub fn push(&mut self, id: u32) -> Result<String> {
        let bytes = self.tokenizer.token_bytes_checked(id)?;
        self.pending.extend_from_slice(bytes);
        Ok(self.drain_complete())
    }

    /// Bytes held back because they end in an incomplete character.
    pub fn pending(&self) -> &[u8] {
        &self.pending
    }

    /// Ends the stream: the held bytes as text, an incomplete character as U+FFFD.
    pub fn finish(self) -> String {
        String::from_utf8_lossy(&self.pending).into_owned()
    }

    /// Ends the stream: the held bytes, unchanged.
    pub fn finish_bytes(self) -> Vec<u8> {
        self.pending
    }

    /// Emits everything except a trailing sequence that may still become a character.
    fn drain_complete(&mut self) -> String {
        let mut out = String::new();
        let mut at = 0;
        while at < self.pending.len() {
            match std::str::from_utf8(&self.pending[at..]) {
                Ok(text) => {
                    out.push_str(text);
                    at = self.pending.len();
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    // The prefix up to `valid_up_to` is valid UTF-8 by definition.
                    out.push_str(&String::from_utf8_lossy(&self.pending[at..at + valid]));
                    at += valid;
                    match e.error_len() {
                        Some(n) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            at += n;
                        }
                        None => break, // incomplete: wait for more bytes
                    }
                }
            }
        }
        self.pending.drain(..at);
        out
    }
}
