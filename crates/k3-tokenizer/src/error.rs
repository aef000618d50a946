//! Errors of the tokenizer crate. Every error about a file names the file and, where the
//! problem sits on a line, the 1-based line number as `file:line:`.

use std::path::PathBuf;

/// Everything that can go wrong loading or using a tokenizer.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// A file could not be read at all.
    #[error("{}: cannot read: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A `tiktoken.model` line is not `<base64> <rank>`.
    #[error("{file}:{line}: malformed line, expected `<base64> <rank>`: {reason}")]
    MalformedLine {
        /// The file.
        file: String,
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        reason: String,
    },
    /// The token field is not valid standard-alphabet, `=`-padded base64.
    #[error("{file}:{line}: malformed base64 token `{field}`: {reason}")]
    Base64 {
        /// The file.
        file: String,
        /// 1-based line number.
        line: usize,
        /// The field (possibly shortened).
        field: String,
        /// The decoder's message.
        reason: String,
    },
    /// The token field is longer than 682 base64 chars (the C loader's limit).
    #[error("{file}:{line}: base64 token field is {len} chars; the limit is 682")]
    Base64TooLong {
        /// The file.
        file: String,
        /// 1-based line number.
        line: usize,
        /// Length of the field.
        len: usize,
    },
    /// A rank is at or above the hard limit on ranks.
    #[error("{file}:{line}: rank {rank} out of range [0, {limit})")]
    RankOutOfRange {
        /// The file.
        file: String,
        /// 1-based line number.
        line: usize,
        /// The rank.
        rank: u64,
        /// Exclusive upper bound.
        limit: u64,
    },
    /// The same rank appears twice.
    #[error("{file}:{line}: duplicate rank {rank} (first at line {first})")]
    DuplicateRank {
        /// The file.
        file: String,
        /// 1-based line of the second occurrence.
        line: usize,
        /// The rank.
        rank: u32,
        /// 1-based line of the first occurrence.
        first: usize,
    },
    /// The same token bytes appear twice.
    #[error("{file}:{line}: duplicate token bytes (first at line {first})")]
    DuplicateToken {
        /// The file.
        file: String,
        /// 1-based line of the second occurrence.
        line: usize,
        /// 1-based line of the first occurrence.
        first: usize,
    },
    /// Ranks are not dense: `rank` is missing although a higher one is present.
    #[error(
        "{file}:{line}: missing rank {rank}: ranks must be 0..{count} without gaps, \
         but this line has rank {max}"
    )]
    MissingRank {
        /// The file.
        file: String,
        /// 1-based line holding the highest rank.
        line: usize,
        /// The first missing rank.
        rank: u32,
        /// Number of entries in the file.
        count: usize,
        /// The highest rank present.
        max: u32,
    },
    /// Byte-level BPE needs every single byte as a token.
    #[error("{file}: no token for the single byte 0x{byte:02x}; byte-level BPE needs all 256")]
    MissingByte {
        /// The file.
        file: String,
        /// The byte.
        byte: u8,
    },
    /// A JSON file (tokenizer config or tokenizer.json) does not parse.
    #[error("{file}:{line}:{column}: unreadable JSON: {reason}")]
    Json {
        /// The file.
        file: String,
        /// 1-based line.
        line: usize,
        /// 1-based column.
        column: usize,
        /// The parser's message.
        reason: String,
    },
    /// A tokenizer config parses but has an unusable entry.
    #[error("{file}:{line}: {reason}")]
    Config {
        /// The file.
        file: String,
        /// 1-based line of the entry (the first line when it cannot be located).
        line: usize,
        /// What is wrong.
        reason: String,
    },
    /// An added token's id is a BPE rank.
    #[error("{file}:{line}: added token {id} `{content}` collides with a BPE rank (ranks are 0..{ranks})")]
    SpecialCollidesWithRank {
        /// The file.
        file: String,
        /// 1-based line of the entry.
        line: usize,
        /// The id.
        id: u32,
        /// Its content.
        content: String,
        /// Number of ranks.
        ranks: usize,
    },
    /// An added token's id is past the 256 special slots.
    #[error(
        "{file}:{line}: added token {id} `{content}` is outside the special slots [{lo}, {hi})"
    )]
    SpecialOutOfRange {
        /// The file.
        file: String,
        /// 1-based line of the entry.
        line: usize,
        /// The id.
        id: u32,
        /// Its content.
        content: String,
        /// First special slot.
        lo: u32,
        /// One past the last special slot.
        hi: u32,
    },
    /// A `tokenizer.json` the crate cannot represent exactly.
    #[error("{file}: unsupported tokenizer.json: {reason}")]
    UnsupportedTokenizerJson {
        /// The file.
        file: String,
        /// What is unsupported.
        reason: String,
    },
    /// An error reported by the `tokenizers` crate.
    #[error("{context}: {reason}")]
    Hf {
        /// What was being done.
        context: String,
        /// The crate's message.
        reason: String,
    },
    /// A token id outside the vocabulary.
    #[error("token id {id} is not in the vocabulary (size {vocab_size})")]
    UnknownId {
        /// The id.
        id: u32,
        /// The vocabulary size.
        vocab_size: usize,
    },
}

/// Shorthand for results of this crate.
pub type Result<T, E = TokenizerError> = std::result::Result<T, E>;

/// 1-based line number of byte offset `pos` in `text`.
pub(crate) fn line_of_offset(text: &str, pos: usize) -> usize {
    text.as_bytes()[..pos.min(text.len())]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

/// 1-based line where the JSON object key `key` first appears (1 when not found).
pub(crate) fn line_of_key(text: &str, key: &str) -> usize {
    let quoted = format!("\"{key}\"");
    let mut from = 0;
    while let Some(at) = text[from..].find(&quoted) {
        let pos = from + at;
        let after = text[pos + quoted.len()..].trim_start();
        if after.starts_with(':') {
            return line_of_offset(text, pos);
        }
        from = pos + quoted.len();
    }
    1
}
