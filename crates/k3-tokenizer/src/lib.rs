//! Kimi K3 tokenizer for k3 (docs/TOKENIZER.md).
//!
//! Loads a Kimi tokenizer directory (`tiktoken.model` + `tokenizer_config.json`) or a
//! `tokenizer.json`, encodes exactly like tiktoken with Kimi's `pat_str`, decodes, and streams
//! decoded text. See `docs/TOKENIZER.md` for the design, parity evidence and benchmarks.
//!
//! ```no_run
//! use k3_tokenizer::Tokenizer;
//! let tok = Tokenizer::from_dir("path/to/Kimi-K3")?;
//! let ids = tok.encode_with_specials("<|open|>message<|sep|>hi");  // control tokens
//! let plain = tok.encode_ordinary("<|im_end|> is just text here");    // injection-safe
//! assert_eq!(tok.decode(&plain)?, b"<|im_end|> is just text here");
//! let mut stream = tok.stream_decoder();
//! for &id in &ids { print!("{}", stream.push(id)?); }
//! print!("{}", stream.finish());
//! # Ok::<(), k3_tokenizer::TokenizerError>(())
//! ```
//!
//! # Exactness
//! Encoding is tiktoken's algorithm on raw bytes: the text is split by a hand-written scanner
//! that reproduces tiktoken's regex engine on [`KIMI_PAT_STR`] (Unicode classes taken from the
//! same `regex-syntax` tables), each piece is looked up whole, and otherwise merged by
//! rank-BPE (lowest rank of the concatenated bytes, leftmost on ties). The `tokenizers` crate
//! is the interchange format: [`Tokenizer::to_hf`] / [`Tokenizer::export_json`] build a
//! byte-level BPE (`ignore_merges`, merges reconstructed from the ranks) with the same regex and
//! added tokens, and [`Tokenizer::from_tokenizer_json`] reads one back.
//!
//! # Special tokens
//! The 256 ids after the ranks are added tokens (`added_tokens_decoder`); unlisted slots are
//! named `<|reserved_token_{id}|>`. [`Tokenizer::encode_ordinary`] treats their text as plain
//! text; [`Tokenizer::encode_with_specials`] turns every occurrence into its id, leftmost
//! first and the longest content on ties, and encodes the text between them independently.
//!
//! # Invalid UTF-8
//! [`Tokenizer::encode_bytes`] (for `--prompt-file`, bytes read verbatim) never panics and is
//! lossless: each maximal run of bytes that are not part of valid UTF-8 becomes one piece of
//! its own, rank-BPE-encoded from its raw bytes (every byte is a token), and the valid text
//! between such runs is encoded exactly as [`Tokenizer::encode_ordinary`] would encode it
//! alone. `decode(encode_bytes(b)) == b` for every `b`. For valid UTF-8 it equals `encode`.
//!
//! # Streaming
//! [`StreamDecoder::push`] returns only complete UTF-8 characters; a trailing incomplete
//! sequence waits for the next token, and a sequence that can never become valid is emitted as
//! U+FFFD at once. [`StreamDecoder::finish`] flushes the remainder lossily (U+FFFD);
//! [`StreamDecoder::finish_bytes`] returns it raw. The concatenated output always equals
//! `String::from_utf8_lossy(&decode(ids))`.

#![forbid(unsafe_code)]
#![warn(missing_docs)]
// Untrusted data must never reach an unwrap/expect (docs/RELIABILITY.md); tests may.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

mod bpe;
mod encode;
mod error;
pub mod escape;
mod hf;
mod pretok;
mod ranks;
mod specials;
mod stream;
mod tiktoken_file;

use std::path::{Path, PathBuf};

pub use error::{Result, TokenizerError};
pub use pretok::{KimiSplitter, Pieces, KIMI_PAT_STR};
pub use specials::{SpecialToken, NUM_SPECIAL_SLOTS};
pub use stream::StreamDecoder;
pub use tiktoken_file::{MAX_BASE64_LEN, RANK_LIMIT};
/// The `tokenizers` crate this crate builds on (for [`Tokenizer::to_hf`] users).
pub use tokenizers;

use bpe::Ranks;
use error::line_of_key;
use specials::{parse_config, Specials};

/// Name of the end-of-message control token, an end id when present.
pub const END_OF_MSG: &str = "<|end_of_msg|>";

/// A loaded Kimi tokenizer. Immutable and `Sync`: share one across threads.
#[derive(Debug, Clone)]
pub struct Tokenizer {
    ranks: Ranks,
    specials: Specials,
    splitter: KimiSplitter,
    bos: Option<u32>,
    eos: Option<u32>,
}

impl Tokenizer {
    /// Loads a tokenizer directory: `tiktoken.model` + `tokenizer_config.json` when
    /// `tiktoken.model` exists, else `tokenizer.json` (with bos/eos from a
    /// `tokenizer_config.json` beside it when present).
    pub fn from_dir(dir: impl AsRef<Path>) -> Result<Tokenizer> {
        let dir = dir.as_ref();
        let model = dir.join("tiktoken.model");
        let config = dir.join("tokenizer_config.json");
        let json = dir.join("tokenizer.json");
        if model.exists() || !json.exists() {
            return Tokenizer::from_tiktoken_files(&model, &config);
        }
        let mut tok = Tokenizer::from_tokenizer_json(&json)?;
        if config.exists() {
            let text = read_text(&config)?;
            let name = config.display().to_string();
            let parsed = parse_config(&text, &name, tok.num_ranks())?;
            tok.set_bos_eos(parsed.bos, parsed.eos, &text, &name)?;
        }
        Ok(tok)
    }

    /// Loads `tiktoken.model` and `tokenizer_config.json` from explicit paths.
    pub fn from_tiktoken_files(model: &Path, config: &Path) -> Result<Tokenizer> {
        let data = std::fs::read(model).map_err(|source| TokenizerError::Io {
            path: model.to_path_buf(),
            source,
        })?;
        let text = read_text(config)?;
        Tokenizer::from_tiktoken_data(
            &data,
            &model.display().to_string(),
            &text,
            &config.display().to_string(),
        )
    }

    /// Builds a tokenizer from in-memory file contents; the names appear in error messages.
    pub fn from_tiktoken_data(
        model: &[u8],
        model_name: &str,
        config: &str,
        config_name: &str,
    ) -> Result<Tokenizer> {
        let ranks = tiktoken_file::parse(model, model_name)?;
        let parsed = parse_config(config, config_name, ranks.len())?;
        let mut tok = Tokenizer::from_parts(ranks, parsed.added)?;
        tok.set_bos_eos(parsed.bos, parsed.eos, config, config_name)?;
        Ok(tok)
    }

    /// Ranks plus added tokens (ids validated to lie in the special slots); no bos/eos yet.
    fn from_parts(ranks: Ranks, added: Vec<SpecialToken>) -> Result<Tokenizer> {
        let specials = Specials::new(ranks.len() as u32, added)?;
        Ok(Tokenizer {
            ranks,
            specials,
            splitter: KimiSplitter::new(),
            bos: None,
            eos: None,
        })
    }

    /// Resolves the config's `bos_token` / `eos_token` names through the added tokens.
    fn set_bos_eos(
        &mut self,
        bos: Option<String>,
        eos: Option<String>,
        text: &str,
        file: &str,
    ) -> Result<()> {
        let resolve = |key: &str, name: Option<String>| -> Result<Option<u32>> {
            let Some(name) = name else { return Ok(None) };
            self.token_id(&name)
                .map(Some)
                .ok_or_else(|| TokenizerError::Config {
                    file: file.to_string(),
                    line: line_of_key(text, key),
                    reason: format!("`{key}` names `{name}`, which is not an added token"),
                })
        };
        let (bos, eos) = (resolve("bos_token", bos)?, resolve("eos_token", eos)?);
        self.bos = bos;
        self.eos = eos;
        Ok(())
    }

    /// Number of BPE ranks (the added tokens start here).
    pub fn num_ranks(&self) -> usize {
        self.ranks.len()
    }

    /// Vocabulary size: ranks plus the 256 special slots (163,840 for Kimi K3).
    pub fn vocab_size(&self) -> usize {
        self.ranks.len() + NUM_SPECIAL_SLOTS as usize
    }

    /// All 256 special slots in id order.
    pub fn specials(&self) -> &[SpecialToken] {
        self.specials.tokens()
    }

    /// Id of the added token with this content, e.g. `token_id("<|open|>")`.
    pub fn token_id(&self, name: &str) -> Option<u32> {
        self.specials.id(name)
    }

    /// Whether `id` is an added (special-slot) token rather than a BPE rank.
    pub fn is_special(&self, id: u32) -> bool {
        self.specials.get(id).is_some()
    }

    /// The `bos_token` id, when the config names one.
    pub fn bos_id(&self) -> Option<u32> {
        self.bos
    }

    /// The `eos_token` id, when the config names one.
    pub fn eos_id(&self) -> Option<u32> {
        self.eos
    }

    /// Ids that end generation: EOS, then `<|end_of_msg|>` when present (deduplicated).
    pub fn end_ids(&self) -> Vec<u32> {
        let mut ids: Vec<u32> = self.eos.into_iter().collect();
        if let Some(eom) = self.token_id(END_OF_MSG) {
            if !ids.contains(&eom) {
                ids.push(eom);
            }
        }
        ids
    }

    /// The bytes id `id` decodes to (an added token decodes to its content).
    pub fn token_bytes(&self, id: u32) -> Option<&[u8]> {
        match self.ranks.bytes(id) {
            Some(bytes) => Some(bytes),
            None => self.specials.get(id).map(|t| t.content.as_bytes()),
        }
    }

    /// The pre-tokenizer pieces of `text` (for inspection; encoding uses them internally).
    pub fn pieces<'t>(&self, text: &'t str) -> Pieces<'t> {
        self.splitter.split(text)
    }

    /// Concatenated bytes of `ids`; fails on an id outside the vocabulary.
    pub fn decode(&self, ids: &[u32]) -> Result<Vec<u8>> {
        let mut out = Vec::with_capacity(ids.len() * 4);
        for &id in ids {
            out.extend_from_slice(self.token_bytes_checked(id)?);
        }
        Ok(out)
    }

    /// [`Tokenizer::decode`] as text, invalid UTF-8 replaced by U+FFFD.
    pub fn decode_lossy(&self, ids: &[u32]) -> Result<String> {
        Ok(String::from_utf8_lossy(&self.decode(ids)?).into_owned())
    }

    /// A streaming decoder over this tokenizer (see [`StreamDecoder`]).
    pub fn stream_decoder(&self) -> StreamDecoder<'_> {
        StreamDecoder::new(self)
    }

    fn token_bytes_checked(&self, id: u32) -> Result<&[u8]> {
        self.token_bytes(id).ok_or(TokenizerError::UnknownId {
            id,
            vocab_size: self.vocab_size(),
        })
    }
}

fn read_text(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|source| TokenizerError::Io {
        path: PathBuf::from(path),
        source,
    })
}
