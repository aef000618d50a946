//! Encoding entry points of [`Tokenizer`].

use ahash::AHashMap;

use crate::Tokenizer;

/// Pieces shorter than this are not worth caching (BPE on them is as cheap as a lookup).
const CACHE_MIN_LEN: usize = 6;

/// Per-call memo of pieces that needed BPE: piece -> where its ids were first written in the
/// output. Only lives for one `encode*` call, so the tokenizer stays immutable and `Sync`.
type PieceCache<'t> = AHashMap<&'t [u8], (usize, usize)>;

impl Tokenizer {
    /// Encodes `text` with added-token text treated as plain text (tiktoken
    /// `encode(text, disallowed_special=())`): the injection-safe mode for user content.
    pub fn encode_ordinary(&self, text: &str) -> Vec<u32> {
        let mut out = Vec::with_capacity(text.len() / 3 + 1);
        self.ordinary_into(text, &mut out, &mut PieceCache::new());
        out
    }

    /// Encodes `text` recognising every added token's content as its id (tiktoken
    /// `encode(text, allowed_special="all")`): leftmost occurrence first, longest content on
    /// ties; the text between occurrences is encoded as by [`Tokenizer::encode_ordinary`].
    pub fn encode_with_specials(&self, text: &str) -> Vec<u32> {
        let mut out = Vec::with_capacity(text.len() / 3 + 1);
        let mut cache = PieceCache::new();
        let mut rest = text;
        while let Some((start, end, id)) = self.specials.find(rest.as_bytes()) {
            // Matches are whole added-token contents, so they start and end on char boundaries.
            self.ordinary_into(&rest[..start], &mut out, &mut cache);
            out.push(id);
            rest = &rest[end..];
        }
        self.ordinary_into(rest, &mut out, &mut cache);
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
    fn ordinary_into<'t>(&self, text: &'t str, out: &mut Vec<u32>, cache: &mut PieceCache<'t>) {
        for piece in self.splitter.split(text) {
            let piece = piece.as_bytes();
            if piece.len() < CACHE_MIN_LEN {
                self.ranks.encode_piece(piece, out);
            } else if let Some(rank) = self.ranks.rank(piece) {
                out.push(rank);
            } else if let Some(&(start, len)) = cache.get(piece) {
                out.extend_from_within(start..start + len);
            } else {
                let start = out.len();
                self.ranks.merge(piece, out);
                cache.insert(piece, (start, out.len() - start));
            }
        }
    }

    /// Ordinary encoding of bytes: valid runs as text, invalid runs as single raw pieces.
    fn bytes_into(&self, bytes: &[u8], out: &mut Vec<u32>) {
        let mut cache = PieceCache::new();
        let mut invalid: Vec<u8> = Vec::new();
        for chunk in bytes.utf8_chunks() {
            if !chunk.valid().is_empty() {
                if !invalid.is_empty() {
                    self.ranks.encode_piece(&invalid, out);
                    invalid.clear();
                }
                self.ordinary_into(chunk.valid(), out, &mut cache);
            }
            invalid.extend_from_slice(chunk.invalid());
        }
        if !invalid.is_empty() {
            self.ranks.encode_piece(&invalid, out);
        }
    }
}
