//! `tokenizer.json` interchange through the `tokenizers` crate: export a byte-level BPE that
//! other tools load, and read one back into a [`Tokenizer`].

use std::path::Path;
use std::str::FromStr;

use serde_json::{json, Value};
use tokenizers::decoders::byte_level::ByteLevel;
use tokenizers::models::bpe::BPE;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, ModelWrapper, PreTokenizerWrapper, SplitDelimiterBehavior};

use crate::bpe::Ranks;
use crate::error::{line_of_offset, Result, TokenizerError};
use crate::specials::{SpecialToken, NUM_SPECIAL_SLOTS};
use crate::{read_text, Tokenizer, KIMI_PAT_STR};

/// GPT-2's byte-level alphabet: byte -> printable char (printable Latin-1 bytes map to
/// themselves, the other 68 bytes to U+0100.. in byte order).
fn byte_to_char() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut next = 256u32;
    for b in 0..=255u8 {
        let printable = matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        let cp = if printable {
            u32::from(b)
        } else {
            next += 1;
            next - 1
        };
        table[b as usize] = char::from_u32(cp).unwrap_or('\0');
    }
    table
}

fn to_byte_level(bytes: &[u8], table: &[char; 256]) -> String {
    bytes.iter().map(|&b| table[b as usize]).collect()
}

/// Inverse of [`byte_to_char`], indexed by code point (all are below U+0144).
fn char_to_byte(table: &[char; 256]) -> [Option<u8>; 0x144] {
    let mut inverse = [None; 0x144];
    for (b, &c) in table.iter().enumerate() {
        inverse[c as usize] = Some(b as u8);
    }
    inverse
}

fn from_byte_level(text: &str, inverse: &[Option<u8>; 0x144]) -> Option<Vec<u8>> {
    text.chars()
        .map(|c| inverse.get(c as usize).copied().flatten())
        .collect()
}

fn hf_err(context: &str) -> impl FnOnce(tokenizers::Error) -> TokenizerError + '_ {
    move |e| TokenizerError::Hf {
        context: context.to_string(),
        reason: e.to_string(),
    }
}

impl Tokenizer {
    /// This tokenizer as a `tokenizers::Tokenizer`: byte-level BPE over the ranks with
    /// `ignore_merges` (whole-piece lookup first) and every merge `(a, b)` whose parts and
    /// concatenation are tokens, ordered by the concatenation's rank; pre-tokenizer
    /// `Split(KIMI_PAT_STR, Isolated)` + `ByteLevel(use_regex=false)`; ByteLevel decoder; the
    /// 256 special slots as added tokens with their ids.
    pub fn to_hf(&self) -> Result<tokenizers::Tokenizer> {
        let table = byte_to_char();
        let n = self.num_ranks() as u32;
        let strings: Vec<String> = (0..n)
            .map(|r| to_byte_level(self.ranks.bytes(r).unwrap_or_default(), &table))
            .collect();
        let vocab: ahash::AHashMap<String, u32> = strings.iter().cloned().zip(0..n).collect();
        let merges = self.merges(&strings);
        let bpe = BPE::builder()
            .vocab_and_merges(vocab, merges)
            .ignore_merges(true)
            .build()
            .map_err(hf_err("building the BPE model"))?;
        let mut hf = tokenizers::Tokenizer::new(bpe);
        let split = Split::new(
            SplitPattern::Regex(KIMI_PAT_STR.to_string()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .map_err(hf_err("compiling the split regex"))?;
        let byte_level = ByteLevel::new(false, false, false);
        hf.with_pre_tokenizer(Some(PreTokenizerWrapper::Sequence(Sequence::new(vec![
            PreTokenizerWrapper::Split(split),
            PreTokenizerWrapper::ByteLevel(byte_level),
        ]))));
        hf.with_decoder(Some(byte_level));
        let added: Vec<AddedToken> = self
            .specials()
            .iter()
            .map(|t| AddedToken::from(t.content.clone(), t.special).normalized(false))
            .collect();
        hf.add_tokens(&added);
        for t in self.specials() {
            if hf.token_to_id(&t.content) != Some(t.id) {
                return Err(TokenizerError::Hf {
                    context: "adding special tokens".into(),
                    reason: format!("`{}` does not get its id {}", t.content, t.id),
                });
            }
        }
        Ok(hf)
    }

    /// Every split `(a, b)` of every multi-byte rank `t` with `a`, `b` ranks, in rank order of
    /// `t`: HF's BPE then merges the lowest-ranked concatenation first, like tiktoken.
    fn merges(&self, strings: &[String]) -> Vec<(String, String)> {
        let mut merges = Vec::new();
        for rank in 0..self.num_ranks() as u32 {
            let bytes = self.ranks.bytes(rank).unwrap_or_default();
            for cut in 1..bytes.len() {
                let (a, b) = (
                    self.ranks.rank(&bytes[..cut]),
                    self.ranks.rank(&bytes[cut..]),
                );
                if let (Some(a), Some(b)) = (a, b) {
                    merges.push((strings[a as usize].clone(), strings[b as usize].clone()));
                }
            }
        }
        merges
    }

    /// The `tokenizer.json` text of [`Tokenizer::to_hf`] (what `k3 tokenize --export` writes).
    pub fn export_json(&self, pretty: bool) -> Result<String> {
        self.to_hf()?
            .to_string(pretty)
            .map_err(|e| TokenizerError::Hf {
                context: "serialising tokenizer.json".into(),
                reason: e.to_string(),
            })
    }

    /// Loads a `tokenizer.json` file (see [`Tokenizer::from_tokenizer_json_str`]).
    pub fn from_tokenizer_json(path: &Path) -> Result<Tokenizer> {
        let text = read_text(path)?;
        Tokenizer::from_tokenizer_json_str(&text, &path.display().to_string())
    }

    /// Loads `tokenizer.json` text (`name` appears in errors). Accepted: a byte-level BPE
    /// whose ids `0..n` are the ranks (as tiktoken conversions and [`Tokenizer::export_json`]
    /// produce; the merges list is implied by the ranks and not consulted), no normalizer,
    /// pre-tokenizer `Split(KIMI_PAT_STR)` + `ByteLevel`, added tokens in the 256 slots after
    /// the ranks. bos/eos are `[BOS]` / `[EOS]` when present (a tokenizer.json has no such
    /// fields; [`Tokenizer::from_dir`] takes them from `tokenizer_config.json`).
    pub fn from_tokenizer_json_str(text: &str, name: &str) -> Result<Tokenizer> {
        let value: Value = serde_json::from_str(text).map_err(|e| TokenizerError::Json {
            file: name.to_string(),
            line: e.line(),
            column: e.column(),
            reason: e.to_string(),
        })?;
        let unsupported = |reason: String| TokenizerError::UnsupportedTokenizerJson {
            file: name.to_string(),
            reason,
        };
        check_pipeline(&value).map_err(unsupported)?;
        let hf = tokenizers::Tokenizer::from_str(text).map_err(|e| TokenizerError::Hf {
            context: format!("{name}: reading tokenizer.json"),
            reason: e.to_string(),
        })?;
        let ModelWrapper::BPE(bpe) = hf.get_model() else {
            return Err(unsupported("the model is not BPE".into()));
        };
        let ranks = ranks_from_vocab(bpe.get_vocab(), name)?;
        let added = added_tokens(&hf, text, name, ranks.len() as u32)?;
        let mut tok = Tokenizer::from_parts(ranks, added)?;
        tok.bos = tok.token_id("[BOS]");
        tok.eos = tok.token_id("[EOS]");
        Ok(tok)
    }
}

/// The normalizer and pre-tokenizer must be exactly what the scanner reproduces.
fn check_pipeline(value: &Value) -> std::result::Result<(), String> {
    if !value.get("normalizer").is_none_or(Value::is_null) {
        return Err("a normalizer is set; only none is supported".into());
    }
    let expected_split = json!({"Regex": KIMI_PAT_STR});
    let pre = value.get("pre_tokenizer").cloned().unwrap_or(Value::Null);
    let steps = pre.get("pretokenizers").and_then(Value::as_array);
    let ok = matches!(steps, Some(s) if s.len() == 2
        && s[0]["type"] == "Split"
        && s[0]["pattern"] == expected_split
        && s[0]["behavior"] == "Isolated"
        && s[0]["invert"] == false
        && s[1]["type"] == "ByteLevel"
        && s[1]["use_regex"] == false
        && s[1]["add_prefix_space"] == false);
    if ok {
        Ok(())
    } else {
        Err(
            "the pre-tokenizer must be Sequence[Split(Kimi pat_str, Isolated), \
             ByteLevel(add_prefix_space=false, use_regex=false)]"
                .into(),
        )
    }
}

/// BPE vocab (byte-level strings) -> dense rank table with every single byte.
fn ranks_from_vocab(vocab: std::collections::HashMap<String, u32>, name: &str) -> Result<Ranks> {
    let inverse = char_to_byte(&byte_to_char());
    let unsupported = |reason: String| TokenizerError::UnsupportedTokenizerJson {
        file: name.to_string(),
        reason,
    };
    let mut tokens: Vec<Option<Vec<u8>>> = vec![None; vocab.len()];
    for (text, id) in vocab {
        let bytes = from_byte_level(&text, &inverse)
            .ok_or_else(|| unsupported(format!("vocab entry `{text}` is not byte-level")))?;
        let slot = tokens
            .get_mut(id as usize)
            .ok_or_else(|| unsupported(format!("vocab ids are not dense: id {id}")))?;
        if slot.is_some() {
            // Two strings with one id: one of them would be silently dropped.
            return Err(unsupported(format!(
                "vocab id {id} is given to more than one token (`{text}` and another)"
            )));
        }
        *slot = Some(bytes);
    }
    // ids < vocab.len() and none repeats, so every slot is filled.
    let tokens: Vec<Vec<u8>> = tokens.into_iter().map(Option::unwrap_or_default).collect();
    let ranks = Ranks::from_tokens(&tokens)
        .map_err(|(second, first)| unsupported(format!("ids {first} and {second} share bytes")))?;
    if let Some(byte) = (0..=255u8).find(|&b| ranks.rank(&[b]).is_none()) {
        return Err(TokenizerError::MissingByte {
            file: name.to_string(),
            byte,
        });
    }
    Ok(ranks)
}

/// Added tokens of a loaded tokenizer.json, validated to lie in the special slots.
fn added_tokens(
    hf: &tokenizers::Tokenizer,
    text: &str,
    name: &str,
    ranks: u32,
) -> Result<Vec<SpecialToken>> {
    let mut added = Vec::new();
    for (id, token) in hf.get_added_tokens_decoder() {
        let line = text
            .find(&format!("\"id\": {id},"))
            .or_else(|| text.find(&format!("\"id\":{id},")))
            .map_or(1, |pos| line_of_offset(text, pos));
        let content = token.content;
        if id < ranks {
            return Err(TokenizerError::SpecialCollidesWithRank {
                file: name.to_string(),
                line,
                id,
                content,
                ranks: ranks as usize,
            });
        }
        if id >= ranks + NUM_SPECIAL_SLOTS {
            return Err(TokenizerError::SpecialOutOfRange {
                file: name.to_string(),
                line,
                id,
                content,
                lo: ranks,
                hi: ranks + NUM_SPECIAL_SLOTS,
            });
        }
        added.push(SpecialToken {
            id,
            content,
            special: token.special,
        });
    }
    Ok(added)
}
