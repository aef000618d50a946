//! Engine- and server-level fuzz targets: the session-file (K3SS) reader, and the request
//! decoding of `k3 serve` (JSON body → request struct → validation → prompt tokens).

use super::mutate::{self, Rng};
use super::{workspace_root, Target};
use k3_api::anthropic::{validate_messages, MessagesRequest};
use k3_api::{
    parse_body, validate_chat, validate_completion, ApiError, ChatRequest, CompletionRequest,
};
use k3_engine::{DecodeMode, Engine, EngineOptions, Tokenizer};
use xxhash_rust::xxh3::xxh3_64;

/// Context of the sessions the fuzzer restores into.
const CTX: usize = 64;

/// `Engine::session_from_bytes` on the tiny model, then one generated token if it loads.
pub struct SessionFile {
    engine: Engine,
}

impl SessionFile {
    pub fn new() -> Result<SessionFile, String> {
        let dir = workspace_root().join("fixtures/tiny-k3");
        let engine = Engine::open(
            &dir,
            EngineOptions {
                threads: Some(1),
                ..EngineOptions::default()
            },
        )
        .map_err(|e| format!("{}: {e}", dir.display()))?;
        Ok(SessionFile { engine })
    }

    fn saved(&self, feed: &[u32], gen: usize) -> Result<Vec<u8>, String> {
        let mut s = self.engine.new_session(CTX).map_err(|e| e.to_string())?;
        s.feed(feed).map_err(|e| e.to_string())?;
        if gen > 0 {
            s.generate(gen, DecodeMode::Incremental, |_| true)
                .map_err(|e| e.to_string())?;
        }
        s.to_bytes().map_err(|e| e.to_string())
    }
}

/// Fixes body_len and re-seals the checksum, so the mutation reaches the body parser.
fn seal(b: &mut [u8], fix_len: bool) {
    if b.len() < 32 {
        return;
    }
    let end = b.len() - 8;
    if fix_len {
        let body = (end - 24) as u64;
        b[16..24].copy_from_slice(&body.to_le_bytes());
    }
    let sum = xxh3_64(&b[..end]);
    b[end..].copy_from_slice(&sum.to_le_bytes());
}

impl Target for SessionFile {
    fn seeds(&self) -> Vec<Vec<u8>> {
        [
            self.saved(&[637, 229, 263, 638, 730, 42, 197], 2),
            self.saved(&[1], 0),
            self.saved(&[], 0),
            self.saved(&[5, 6, 7], 1),
        ]
        .into_iter()
        .flatten()
        .collect()
    }
    fn mutate(&self, input: &[u8], rng: &mut Rng) -> Option<Vec<u8>> {
        let mut b = input.to_vec();
        if rng.chance(2) && b.len() >= 56 {
            // Header and count fields: version, body_len, max_ctx, pos, n_tokens.
            let at = *rng.pick(&[4usize, 16, 24, 32, 40]);
            let v = mutate::interesting_u64(rng, b.len());
            let w = if at == 4 { 4 } else { 8 };
            b[at..at + w].copy_from_slice(&v.to_le_bytes()[..w]);
        } else {
            b = mutate::mutate(&b, &[], &[], rng);
        }
        seal(&mut b, rng.below(3) != 0);
        Some(b)
    }
    fn run(&self, input: &[u8]) -> Result<(), String> {
        let mut s = self
            .engine
            .session_from_bytes(input, CTX)
            .map_err(|e| e.to_string())?;
        // A restored session must be usable (or refuse by name), never panic.
        if s.tokens().len() < CTX {
            s.generate(1, DecodeMode::Incremental, |_| true)
                .map_err(|e| format!("after load: {e}"))?;
        }
        Ok(())
    }
}

/// Body decoding of `/v1/chat/completions` and `/v1/completions`, as the routes do it.
pub struct Serve {
    tok: Tokenizer,
}

impl Serve {
    pub fn new() -> Result<Serve, String> {
        let dir = workspace_root().join("fixtures/tiny-k3");
        let tok = Tokenizer::from_dir(&dir).map_err(|e| e.to_string())?;
        Ok(Serve { tok })
    }
}

fn api(e: ApiError) -> String {
    format!("{} {:?}: {}", e.status, e.param, e.message)
}

impl Target for Serve {
    fn seeds(&self) -> Vec<Vec<u8>> {
        [
            r#"{"messages":[{"role":"user","content":"Hi"}]}"#,
            r#"{"model":"tiny-k3","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},{"role":"assistant","content":"x","reasoning_content":"why"}],"temperature":0.7,"top_p":0.9,"top_k":40,"min_p":0.05,"repeat_penalty":1.1,"repeat_last_n":64,"seed":-3,"max_tokens":8,"stop":["\n","END"],"stream":true}"#,
            r#"{"messages":[{"role":"developer","content":null}],"reasoning_effort":"high","max_completion_tokens":2}"#,
            r#"{"messages":[{"role":"user","content":"q"}],"thinking":{"type":"enabled"},"stop":"."}"#,
            r#"{"prompt":"The train left at","max_tokens":4,"ignore_eos":true,"temperature":0}"#,
            r#"{"prompt":["one"],"stream":false,"seed":7,"top_k":0}"#,
            r#"{"prompt":"x","stream":true,"stream_options":{"include_usage":false},"presence_penalty":0.5,"frequency_penalty":-1,"user":"u","n":1,"response_format":{"type":"text"}}"#,
            r#"{"messages":[{"role":"user","content":"w?"},{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}}]},{"role":"tool","tool_call_id":"c1","content":"ok"}],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}],"tool_choice":"auto","response_format":{"type":"json_schema","json_schema":{"name":"n","schema":{}}}}"#,
            r#"{"model":"m","max_tokens":9,"system":[{"type":"text","text":"s"}],"thinking":{"type":"enabled","budget_tokens":4},"stop_sequences":["x"],"messages":[{"role":"user","content":"Hi"},{"role":"assistant","content":[{"type":"thinking","thinking":"t","signature":"s"},{"type":"text","text":"a"}]},{"role":"user","content":[{"type":"text","text":"b"}]}]}"#,
            r#"{"max_tokens":5,"tools":[{"name":"f","input_schema":{"type":"object"}}],"tool_choice":{"type":"tool","name":"f"},"messages":[{"role":"user","content":"q"},{"role":"assistant","content":[{"type":"tool_use","id":"t","name":"f","input":{}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":"r"}]}]}"#,
        ]
        .iter()
        .map(|s| s.as_bytes().to_vec())
        .collect()
    }
    fn dict(&self) -> Vec<&'static [u8]> {
        vec![
            b"messages",
            b"role",
            b"content",
            b"user",
            b"assistant",
            b"system",
            b"prompt",
            b"temperature",
            b"top_p",
            b"top_k",
            b"min_p",
            b"max_tokens",
            b"stop",
            b"stream",
            b"thinking",
            b"reasoning_effort",
            b"seed",
            b"repeat_penalty",
            b"presence_penalty",
            b"frequency_penalty",
            b"stream_options",
            b"include_usage",
            b"response_format",
            b"tools",
            b"logit_bias",
            b"tool_choice",
            b"tool_calls",
            b"tool_call_id",
            b"system",
            b"stop_sequences",
            b"budget_tokens",
            b"tool_use",
            b"tool_result",
            b"tool_use_id",
            b"input_schema",
            b"json_schema",
            b"type",
            b"text",
            b"enabled",
            b"<|im_end|>",
            b"[EOS]",
        ]
    }
    fn run(&self, input: &[u8]) -> Result<(), String> {
        let mut refusals = Vec::new();
        let chat = parse_body::<ChatRequest>(input)
            .and_then(|r| validate_chat(&r))
            .and_then(|r| Ok((r.to_template()?, r)));
        match chat {
            Ok((messages, request)) => {
                check_settings(&request.settings);
                let thinking = request.thinking;
                let ids = k3_engine::chat_template::render(&self.tok, &messages, thinking, true)
                    .map_err(|e| format!("render: {e}"))?;
                assert!(ids.iter().all(|&id| (id as usize) < self.tok.vocab_size()));
            }
            Err(e) => refusals.push(api(e)),
        }
        match parse_body::<CompletionRequest>(input).and_then(|r| validate_completion(&r)) {
            Ok((settings, k3_api::Prompt::Text(text))) => {
                check_settings(&settings);
                let ids = self.tok.encode(&text, false);
                assert!(ids.iter().all(|&id| (id as usize) < self.tok.vocab_size()));
            }
            Ok((settings, k3_api::Prompt::Ids(ids))) => {
                check_settings(&settings);
                assert!(!ids.is_empty());
            }
            Err(e) => refusals.push(api(e)),
        }
        // The Anthropic Messages body goes through the same neutral request.
        let messages = parse_body::<MessagesRequest>(input)
            .and_then(|r| validate_messages(&r, false))
            .and_then(|r| Ok((r.to_template()?, r)));
        match messages {
            Ok((messages, request)) => {
                check_settings(&request.settings);
                let ids =
                    k3_engine::chat_template::render(&self.tok, &messages, request.thinking, true)
                        .map_err(|e| format!("render: {e}"))?;
                assert!(ids.iter().all(|&id| (id as usize) < self.tok.vocab_size()));
            }
            Err(e) => refusals.push(api(e)),
        }
        if refusals.len() == 3 {
            return Err(refusals.join(" | "));
        }
        Ok(())
    }
}

/// What an accepted request guarantees the worker.
fn check_settings(s: &k3_api::GenSettings) {
    let p = &s.params;
    assert!(
        p.validate().is_ok(),
        "validated params pass the engine's check"
    );
    assert!(p.temperature.is_finite() && p.top_p.is_finite() && p.min_p.is_finite());
    assert!(s.max_tokens.is_none_or(|n| n >= 1));
    assert!(s.stop.len() <= 16 && s.stop.iter().all(|x| !x.is_empty()));
}
