//! k3's tokenizer as llguidance sees it (docs/API.md#structured-output): a token trie of
//! every id's bytes, added tokens marked special so grammars name them (`<|open|>`) and
//! ordinary text can never spell one.

use k3_tokenizer::Tokenizer;
use llguidance::toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};
use llguidance::ParserFactory;
use std::sync::{Arc, Mutex, OnceLock};

/// The trie over `tok`'s ids plus an encoder for grammar literals.
struct K3TokEnv {
    trie: TokTrie,
    tok: Tokenizer,
}

impl TokenizerEnv for K3TokEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    /// Plain text only: a literal in a grammar never becomes a control id.
    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        match std::str::from_utf8(s) {
            Ok(text) => self.tok.encode_ordinary(text),
            Err(_) => self.trie.greedy_tokenize(s),
        }
    }
}

/// Each id's bytes as the trie stores them: an added token is the special marker byte then
/// its text; an id the tokenizer does not know, or an ordinary one starting with byte 0xFF
/// (invalid in UTF-8 text), is empty (never allowed).
fn trie_words(tok: &Tokenizer) -> Vec<Vec<u8>> {
    (0..tok.vocab_size() as u32)
        .map(|id| match tok.token_bytes(id) {
            Some(bytes) if tok.is_special(id) => {
                let mut w = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                w.extend_from_slice(bytes);
                w
            }
            // 0xFF never occurs in UTF-8, and it is the trie's special marker.
            Some(bytes) if bytes.first() == Some(&TokTrie::SPECIAL_TOKEN_MARKER) => Vec::new(),
            Some(bytes) => bytes.to_vec(),
            None => Vec::new(),
        })
        .collect()
}

/// Builds the parser factory for `tok`, whose end-of-sequence id is `eos` (the id a finished
/// grammar allows).
fn build_factory(tok: &Tokenizer, eos: u32) -> Result<ParserFactory, String> {
    let words = trie_words(tok);
    let info = TokRxInfo::new(words.len() as u32, eos);
    let trie = TokTrie::from(&info, &words);
    let env: TokEnv = Arc::new(K3TokEnv {
        trie,
        tok: tok.clone(),
    });
    let mut factory = ParserFactory::new_simple(&env).map_err(|e| e.to_string())?;
    factory.quiet();
    Ok(factory)
}

/// A fingerprint of every id's bytes (and the end id), so a cached factory is reused only
/// for the same vocabulary.
fn fingerprint(tok: &Tokenizer, eos: u32) -> u64 {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    h.update(&eos.to_le_bytes());
    for id in 0..tok.vocab_size() as u32 {
        let bytes = tok.token_bytes(id).unwrap_or(&[]);
        h.update(&(bytes.len() as u32).to_le_bytes());
        h.update(&[u8::from(tok.is_special(id))]);
        h.update(bytes);
    }
    h.digest()
}

type FactoryCache = Mutex<Vec<(u64, Arc<ParserFactory>)>>;

/// Building a factory walks the whole vocabulary (tens of ms at 163,840 ids); the factories
/// of the last few vocabularies are kept for the process.
pub(crate) fn factory(tok: &Tokenizer, eos: u32) -> Result<Arc<ParserFactory>, String> {
    static CACHE: OnceLock<FactoryCache> = OnceLock::new();
    let key = fingerprint(tok, eos);
    let cache = CACHE.get_or_init(|| Mutex::new(Vec::new()));
    if let Some((_, f)) = cache
        .lock()
        .map_err(|_| "constraint cache poisoned".to_string())?
        .iter()
        .find(|(k, _)| *k == key)
    {
        return Ok(f.clone());
    }
    let built = Arc::new(build_factory(tok, eos)?);
    let mut guard = cache
        .lock()
        .map_err(|_| "constraint cache poisoned".to_string())?;
    if guard.len() >= 4 {
        guard.remove(0);
    }
    guard.push((key, built.clone()));
    Ok(built)
}
