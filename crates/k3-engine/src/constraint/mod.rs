//! Structured output by constrained decoding (docs/API.md#structured-output): a
//! [`Constraint`] masks, before each pick, every id that would take the reply outside a
//! grammar — one JSON value valid for a schema in the response channel, or tool calls whose
//! arguments are valid for their tools' parameters in the tools channel — and advances on
//! the id picked. The grammar engine is llguidance over k3's tokenizer; the think channel
//! stays free.

mod grammar;
mod tok_env;

pub use grammar::MAX_PARALLEL_CALLS;

use crate::EngineError;
use k3_tokenizer::Tokenizer;
use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::SimpleVob;
use llguidance::{Matcher, ParserFactory};
use serde_json::Value;
use std::sync::Arc;

/// What the reply must be.
#[derive(Clone, Debug, PartialEq)]
pub enum ConstraintSpec {
    /// The response is one JSON object (OpenAI `response_format: json_object`).
    JsonObject,
    /// The response is one JSON value valid for `schema` (`response_format: json_schema`).
    /// With `strict`, a keyword the grammar cannot enforce is refused up front; without, it
    /// is ignored (the output is still JSON of the schema's shape).
    JsonSchema { schema: Value, strict: bool },
    /// An empty response, then the tools channel with at least one call (exactly one unless
    /// `parallel`; at most [`MAX_PARALLEL_CALLS`]) of one of `tools` (`(name, parameters
    /// schema)`), only `named` when set (`tool_choice` `required` or a named function).
    ToolCalls {
        tools: Vec<(String, Value)>,
        named: Option<String>,
        parallel: bool,
    },
}

/// Where generation starts: right after `open(think)` (thinking on) or `open(response)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplyStart {
    Think,
    Response,
}

/// Free-think tracking: the reply leaves the think channel at `close(think)` (`<|close|>`,
/// text `think`, `<|sep|>`); the tag text may come in any tokenization.
#[derive(Clone, Debug)]
enum Think {
    Free,
    /// After `<|close|>`: the tag text so far.
    Closing(Vec<u8>),
}

/// A compiled constraint and where the reply is in it; one per reply.
#[derive(Clone)]
pub struct Constraint {
    factory: Arc<ParserFactory>,
    matcher: Matcher,
    think: Option<Think>,
    close: u32,
    sep: u32,
    /// `<|end_of_msg|>`, the id that follows a finished grammar.
    eom: u32,
    /// Ids a reply must not end with while still thinking.
    end_ids: Vec<u32>,
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constraint")
            .field("think", &self.think)
            .field("finished", &self.is_finished())
            .finish_non_exhaustive()
    }
}

fn refused(what: impl std::fmt::Display) -> EngineError {
    EngineError::Invalid(format!("structured output: {what}"))
}

impl Constraint {
    /// Compiles `spec` for `tok`'s vocabulary; the reply starts at `start`. Unsatisfiable or
    /// unsupported schemas are refused here, the error naming the schema part.
    pub fn new(
        tok: &Tokenizer,
        spec: &ConstraintSpec,
        start: ReplyStart,
    ) -> Result<Constraint, EngineError> {
        let id = |name: &str| {
            tok.token_id(name).ok_or_else(|| {
                refused(format!(
                    "the tokenizer has no `{name}` token: constraints need Kimi K3's chat markers"
                ))
            })
        };
        let (close, sep, eom) = (
            id("<|close|>")?,
            id("<|sep|>")?,
            id(k3_tokenizer::END_OF_MSG)?,
        );
        id("<|open|>")?;
        let factory = tok_env::factory(tok, eom).map_err(refused)?;
        let text = grammar::lark(spec, start == ReplyStart::Think).map_err(refused)?;
        let parser = factory.create_parser(TopLevelGrammar::from_lark(text));
        let matcher = Matcher::new(parser);
        if let Some(e) = matcher.get_error() {
            // llguidance appends the grammar with a caret; its first line names the part.
            let first = e.lines().next().unwrap_or_default();
            let cause = first.split_once("): ").map_or(first, |(_, rest)| rest);
            return Err(refused(cause));
        }
        Ok(Constraint {
            factory,
            matcher,
            think: (start == ReplyStart::Think).then_some(Think::Free),
            close,
            sep,
            eom,
            end_ids: tok.end_ids(),
        })
    }

    /// `<|end_of_msg|>`: the id that ends a finished reply.
    pub fn end_id(&self) -> u32 {
        self.eom
    }

    /// Whether the reply is still in the (free) think channel.
    pub fn in_think(&self) -> bool {
        self.think.is_some()
    }

    /// Whether the grammar is complete (only the end id may follow).
    pub fn is_finished(&self) -> bool {
        self.matcher.is_stopped()
    }

    /// The ids allowed next (`None`: all but the end ids, while thinking).
    fn allowed(&mut self) -> Result<Option<SimpleVob>, EngineError> {
        if self.think.is_some() {
            return Ok(None);
        }
        let mask = self.matcher.compute_mask_or_eos().map_err(refused)?;
        if mask.is_zero() {
            return Err(refused(
                "no token can continue the reply (the grammar is stuck)",
            ));
        }
        Ok(Some(mask))
    }

    /// Sets every disallowed logit to −∞ (ids past the tokenizer's vocabulary included).
    pub fn mask(&mut self, logits: &mut [f32]) -> Result<(), EngineError> {
        match self.allowed()? {
            None => {
                for &e in &self.end_ids {
                    if let Some(l) = logits.get_mut(e as usize) {
                        *l = f32::NEG_INFINITY;
                    }
                }
            }
            Some(mask) => {
                let vocab = self.factory.tok_env().tok_trie().vocab_size();
                for (i, l) in logits.iter_mut().enumerate() {
                    if i >= vocab || !mask.is_allowed(i as u32) {
                        *l = f32::NEG_INFINITY;
                    }
                }
            }
        }
        Ok(())
    }

    /// Advances past `id`, the id picked; an id the mask excluded is an error.
    pub fn advance(&mut self, id: u32) -> Result<(), EngineError> {
        let Some(think) = self.think.take() else {
            if self.matcher.is_stopped() {
                return Ok(());
            }
            return self.matcher.consume_token(id).map_err(refused);
        };
        let trie = self.factory.tok_env().tok_trie();
        self.think = match think {
            _ if id == self.close => Some(Think::Closing(Vec::new())),
            Think::Closing(text) if id == self.sep && text == b"think" => None,
            Think::Closing(mut text) if !trie.is_special_token(id) => {
                text.extend_from_slice(trie.token(id));
                Some(if b"think".starts_with(&text) {
                    Think::Closing(text)
                } else {
                    Think::Free
                })
            }
            _ => Some(Think::Free),
        };
        Ok(())
    }
}

#[cfg(test)]
#[path = "tests.rs"]
mod tests;
