//! Added (special) tokens: the 256 slots right after the BPE ranks, as listed in
//! `tokenizer_config.json` `added_tokens_decoder`, and their matcher for text.

use std::collections::HashMap;

use aho_corasick::{AhoCorasick, MatchKind};
use serde_json::Value;

use crate::error::{line_of_key, Result, TokenizerError};

/// Number of special-token slots after the ranks (ids `ranks..ranks + 256`).
pub const NUM_SPECIAL_SLOTS: u32 = 256;

/// One added token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecialToken {
    /// Its id (`>=` the number of ranks).
    pub id: u32,
    /// Its text.
    pub content: String,
    /// The config's `special` flag (`true` for control tokens). Matching in text does not
    /// depend on it: with specials allowed every added token is recognised, as in tiktoken.
    pub special: bool,
}

/// What `tokenizer_config.json` contributes: the added tokens and the bos/eos names.
#[derive(Debug, Clone, Default)]
pub(crate) struct ConfigTokens {
    pub(crate) added: Vec<SpecialToken>,
    pub(crate) bos: Option<String>,
    pub(crate) eos: Option<String>,
}

/// Parses `tokenizer_config.json` (`file` names it in errors) for a vocabulary of `ranks`
/// ranks. Ids must lie in the special slots; unlisted slots are filled by the caller.
pub(crate) fn parse_config(text: &str, file: &str, ranks: usize) -> Result<ConfigTokens> {
    let json: Value = serde_json::from_str(text).map_err(|e| TokenizerError::Json {
        file: file.to_string(),
        line: e.line(),
        column: e.column(),
        reason: e.to_string(),
    })?;
    let config_err = |line: usize, reason: String| TokenizerError::Config {
        file: file.to_string(),
        line,
        reason,
    };
    let Some(root) = json.as_object() else {
        return Err(config_err(1, "the config is not a JSON object".into()));
    };
    let mut out = ConfigTokens::default();
    match root.get("added_tokens_decoder") {
        None | Some(Value::Null) => {}
        Some(Value::Object(map)) => {
            for (key, entry) in map {
                let line = line_of_key(text, key);
                out.added
                    .push(parse_entry(key, entry, line, ranks, file, &config_err)?);
            }
        }
        Some(_) => {
            let line = line_of_key(text, "added_tokens_decoder");
            return Err(config_err(
                line,
                "`added_tokens_decoder` is not an object".into(),
            ));
        }
    }
    for (name, slot) in [("bos_token", &mut out.bos), ("eos_token", &mut out.eos)] {
        *slot = match root.get(name) {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(Value::Object(o)) => match o.get("content") {
                Some(Value::String(s)) => Some(s.clone()),
                _ => {
                    let line = line_of_key(text, name);
                    return Err(config_err(
                        line,
                        format!("`{name}` has no string `content`"),
                    ));
                }
            },
            Some(_) => {
                let line = line_of_key(text, name);
                return Err(config_err(
                    line,
                    format!("`{name}` is neither a string nor {{content}}"),
                ));
            }
        };
    }
    Ok(out)
}

fn parse_entry(
    key: &str,
    entry: &Value,
    line: usize,
    ranks: usize,
    file: &str,
    config_err: &dyn Fn(usize, String) -> TokenizerError,
) -> Result<SpecialToken> {
    let id: u32 = key
        .parse()
        .map_err(|_| config_err(line, format!("added token key `{key}` is not an id")))?;
    let content = match entry.get("content") {
        Some(Value::String(s)) if !s.is_empty() => s.clone(),
        _ => {
            return Err(config_err(
                line,
                format!("added token {id} has no non-empty `content`"),
            ))
        }
    };
    let special = entry
        .get("special")
        .and_then(Value::as_bool)
        .unwrap_or(true);
    let (lo, hi) = (ranks as u32, ranks as u32 + NUM_SPECIAL_SLOTS);
    if id < lo {
        return Err(TokenizerError::SpecialCollidesWithRank {
            file: file.to_string(),
            line,
            id,
            content,
            ranks,
        });
    }
    if id >= hi {
        return Err(TokenizerError::SpecialOutOfRange {
            file: file.to_string(),
            line,
            id,
            content,
            lo,
            hi,
        });
    }
    Ok(SpecialToken {
        id,
        content,
        special,
    })
}

/// The full special table: all 256 slots (unlisted ones named `<|reserved_token_{id}|>`, as
/// Kimi's `tokenization_kimi.py` names them) and a leftmost-longest matcher over their contents.
#[derive(Debug, Clone)]
pub(crate) struct Specials {
    tokens: Vec<SpecialToken>,
    by_content: HashMap<String, u32>,
    matcher: AhoCorasick,
}

impl Specials {
    /// Fills the slots `base..base + 256` from `added` (ids already validated to lie there).
    pub(crate) fn new(base: u32, added: Vec<SpecialToken>) -> Result<Specials> {
        let mut tokens: Vec<SpecialToken> = (base..base + NUM_SPECIAL_SLOTS)
            .map(|id| SpecialToken {
                id,
                content: format!("<|reserved_token_{id}|>"),
                special: true,
            })
            .collect();
        for token in added {
            let slot = (token.id - base) as usize;
            tokens[slot] = token;
        }
        // Like tiktoken's `{content: id}` dict: a repeated content resolves to its highest id.
        let by_content = tokens.iter().map(|t| (t.content.clone(), t.id)).collect();
        let matcher = AhoCorasick::builder()
            .match_kind(MatchKind::LeftmostLongest)
            .build(tokens.iter().map(|t| t.content.as_bytes()))
            .map_err(|e| TokenizerError::Hf {
                context: "building the special-token matcher".into(),
                reason: e.to_string(),
            })?;
        Ok(Specials {
            tokens,
            by_content,
            matcher,
        })
    }

    /// All slots in id order.
    pub(crate) fn tokens(&self) -> &[SpecialToken] {
        &self.tokens
    }

    /// Id of the token whose content is `name`.
    pub(crate) fn id(&self, name: &str) -> Option<u32> {
        self.by_content.get(name).copied()
    }

    /// Token by id, if `id` is a special slot.
    pub(crate) fn get(&self, id: u32) -> Option<&SpecialToken> {
        let first = self.tokens.first()?.id;
        self.tokens.get(id.checked_sub(first)? as usize)
    }

    /// The leftmost (then longest) special occurrence in `hay`: `(start, end, id)`.
    pub(crate) fn find(&self, hay: &[u8]) -> Option<(usize, usize, u32)> {
        let m = self.matcher.find(hay)?;
        let content = &self.tokens[m.pattern().as_usize()].content;
        Some((m.start(), m.end(), self.by_content[content]))
    }
}
