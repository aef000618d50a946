//! Encoding entry points of [`Tokenizer`].

use crate::Tokenizer;

impl Tokenizer {
    /// Encodes `text` with added-token text treated as plain text (tiktoken
    /// `encode(text, disallowed_special=())`): the injection-safe mode for user content.
    pub fn encode_ordinary(&self, text: &str) -> Vec<u32> {
        let mut out = Vec::with_capacity(text.len() / 3 + 1);
        self.ordinary_into(text, &mut out);
        out
    }

    /// Encodes `text` recognising every added token's content as its id (tiktoken
    /// `encode(text, allowed_special="all")`): leftmost occurrence first, longest content on
    /// ties; the text between occurrences is encoded as by [`Tokenizer::encode_ordinary`].
    pub fn encode_with_specials(&self, text: &str) -> Vec<u32> {
        let mut out = Vec::with_capacity(text.len() / 3 + 1);
        let mut rest = text;
        while let Some((start, end, id)) = self.specials.find(rest.as_bytes()) {
            // Matches are whole added-token contents, so they start and end on char boundaries.
            self.ordinary_into(&rest[..start], &mut out);
            out.push(id);
            rest = &rest[end..];
        }
        self.ordinary_into(rest, &mut out);
        out
    }

    /// [`Tokenizer::encode_with_specials`] when `allow_specials`, else
    /// [`Tokenizer::encode_ordinary`].
    pub fn encode(&self, text: &str, allow_specials: bool) -> Vec<u32> {
        if allow_specials {
            self.encode_with_specials(text)
        } else {
            self.encode_ordinary(text)
        }
    }

    /// Encodes raw bytes that may not be UTF-8 (e.g. a prompt file read verbatim). Never
    /// panics; lossless: each maximal run of invalid bytes is a piece of its own, BPE-encoded
    /// from its raw bytes, and valid text between runs is encoded as
    /// [`Tokenizer::encode_ordinary`] would encode it alone. With `allow_specials`, added
    /// tokens are matched on the bytes first. Equals [`Tokenizer::encode`] on valid UTF-8.
    pub fn encode_bytes(&self, bytes: &[u8], allow_specials: bool) -> Vec<u32> {
        let mut out = Vec::with_capacity(bytes.len() / 3 + 1);
        let mut rest = bytes;
        if allow_specials {
            while let Some((start, end, id)) = self.specials.find(rest) {
                self.bytes_into(&rest[..start], &mut out);
                out.push(id);
                rest = &rest[end..];
            }
        }
        self.bytes_into(rest, &mut out);
        out
    }

    /// Ordinary encoding of text without added-token matching.
    fn ordinary_into(&self, text: &str, out: &mut Vec<u32>) {
        for piece in self.splitter.split(text) {
            self.ranks.encode_piece(piece.as_bytes(), out);
        }
    }

    /// Ordinary encoding of bytes: valid runs as text, invalid runs as single raw pieces.
    fn bytes_into(&self, bytes: &[u8], out: &mut Vec<u32>) {
        let mut invalid: Vec<u8> = Vec::new();
        for chunk in bytes.utf8_chunks() {
            if !chunk.valid().is_empty() {
                if !invalid.is_empty() {
                    self.ranks.encode_piece(&invalid, out);
                    invalid.clear();
                }
                self.ordinary_into(chunk.valid(), out);
            }
            invalid.extend_from_slice(chunk.invalid());
        }
        if !invalid.is_empty() {
            self.ranks.encode_piece(&invalid, out);
        }
    }
}
