//! Request bodies, their validation, and the error responses: the pure layer of the server
//! (no I/O), shared by the OpenAI ([`openai`]) and Anthropic ([`anthropic`]) adapters, which
//! both produce one protocol-neutral request ([`neutral::Request`]).
//!
//! Bodies are parsed by hand from the raw bytes (not with axum's `Json` extractor) so that
//! every rejection — malformed JSON, a wrong type, an out-of-range sampling value — comes back
//! as an error naming the field's path (docs/SERVER.md "Request fields").

pub use http::StatusCode;
use k3_engine::SamplingParams;
use serde::Deserialize;
use serde_json::{json, Value};

pub mod anthropic;
mod fields;
pub mod neutral;
pub mod openai;
mod strict_schema;

pub use openai::{validate_chat, ChatRequest};

/// An API error: HTTP status plus OpenAI's `{"error": {...}}` body.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub kind: &'static str,
    pub param: Option<String>,
    pub code: Option<&'static str>,
}

impl ApiError {
    /// 400 `invalid_request_error` about `param`.
    pub fn invalid(param: &str, message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: Some(param.to_string()),
            code: None,
        }
    }

    /// Any status, no parameter.
    pub fn new(
        status: StatusCode,
        kind: &'static str,
        code: Option<&'static str>,
        message: impl Into<String>,
    ) -> Self {
        ApiError {
            status,
            message: message.into(),
            kind,
            param: None,
            code,
        }
    }

    pub fn with_code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }
}

impl ApiError {
    /// OpenAI's `{"error": {...}}` body; the message names the field when there is one.
    pub fn body(&self) -> Value {
        let message = match &self.param {
            Some(p) if !self.message.contains(p.as_str()) => format!("{p}: {}", self.message),
            _ => self.message.clone(),
        };
        json!({
            "error": {
                "message": message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        })
    }

    /// Whether the client should retry after a second (`Retry-After: 1`): the queue was full.
    pub fn retry_after(&self) -> bool {
        self.status == StatusCode::TOO_MANY_REQUESTS
    }
}

/// `stop`: one string or an array of strings.
#[derive(Deserialize, Debug, Clone)]
#[serde(untagged)]
pub enum StopField {
    One(String),
    Many(Vec<String>),
}

/// Sampling and length fields shared by both endpoints (numbers kept wide so out-of-range
/// values are reported by name rather than as a type error).
#[derive(Deserialize, Debug, Default)]
pub struct SamplingFields {
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<i64>,
    pub min_p: Option<f64>,
    pub repeat_penalty: Option<f64>,
    pub repeat_last_n: Option<i64>,
    pub presence_penalty: Option<f64>,
    pub frequency_penalty: Option<f64>,
    pub seed: Option<i64>,
    pub max_tokens: Option<i64>,
    pub max_completion_tokens: Option<i64>,
    /// Choices to generate (run as one batch).
    pub n: Option<i64>,
    /// Chat: `true` for the chosen tokens' log-probabilities; completions: how many top
    /// alternatives to list (0..=20).
    pub logprobs: Option<Value>,
    /// Chat: alternatives per token (0..=20), with `logprobs: true`.
    pub top_logprobs: Option<Value>,
    pub stop: Option<StopField>,
    #[serde(default)]
    pub stream: bool,
    /// `{"include_usage": bool}`; checked by [`fields::include_usage`].
    pub stream_options: Option<Value>,
    /// Keep generating past end ids (as in llama.cpp and vLLM).
    #[serde(default)]
    pub ignore_eos: bool,
    /// Also return each choice's generated token ids (`tokens`, llama-server's name).
    #[serde(default)]
    pub return_tokens: bool,
    /// Any name is accepted (the one served model answers), as llama-server does; parsed
    /// only so that it is a known field and must be a string.
    #[allow(dead_code)]
    pub model: Option<String>,
    /// Every other field of the body (filled by [`extra_fields`]), checked by
    /// [`fields::validate_extra`].
    #[serde(skip)]
    pub extra: serde_json::Map<String, Value>,
}

impl Body for SamplingFields {
    fn from_value(body: &Value) -> Result<Self, ApiError> {
        typed(body, "")
    }
}

/// A `/v1/completions` body.
#[derive(Debug)]
pub struct CompletionRequest {
    pub prompt: Value,
    pub common: SamplingFields,
}

#[derive(Deserialize)]
struct PromptField {
    prompt: Value,
}

impl Body for CompletionRequest {
    fn from_value(body: &Value) -> Result<Self, ApiError> {
        let mut common: SamplingFields = typed(body, "")?;
        let PromptField { prompt } = typed(body, "")?;
        let known = [
            field_names::<SamplingFields>(),
            field_names::<PromptField>(),
        ];
        common.extra = extra_fields(body, &known);
        Ok(CompletionRequest { prompt, common })
    }
}

/// Validated generation settings.
#[derive(Debug, Clone)]
pub struct GenSettings {
    pub params: SamplingParams,
    /// Requested most new tokens (`None`: the default).
    pub max_tokens: Option<usize>,
    pub stop: Vec<String>,
    pub stream: bool,
    /// Streaming: send the final chunk's `usage` and `timings` (`stream_options`).
    pub include_usage: bool,
    /// Choices to generate, 1..=[`MAX_CHOICES`].
    pub n: usize,
    /// Return the generated ids beside the text.
    pub return_tokens: bool,
    /// Report each generated token's log-probability with this many alternatives.
    pub logprobs: Option<usize>,
}

/// Most alternatives per token `top_logprobs` (and completions' `logprobs`) may ask for.
pub const MAX_TOP_LOGPROBS: usize = 20;

/// `logprobs` / `top_logprobs` → alternatives per token, or off (`None`).
fn logprobs_of(f: &SamplingFields) -> Result<Option<usize>, ApiError> {
    let count = |param: &str, v: &Value| -> Result<usize, ApiError> {
        v.as_u64()
            .filter(|&k| k <= MAX_TOP_LOGPROBS as u64)
            .map(|k| k as usize)
            .ok_or_else(|| {
                ApiError::invalid(
                    param,
                    format!("{param} must be an integer from 0 to {MAX_TOP_LOGPROBS}"),
                )
            })
    };
    let top = match &f.top_logprobs {
        None | Some(Value::Null) => None,
        Some(v) => Some(count("top_logprobs", v)?),
    };
    match &f.logprobs {
        None | Some(Value::Null) | Some(Value::Bool(false)) => match top {
            Some(k) if k > 0 => Err(ApiError::invalid(
                "top_logprobs",
                "top_logprobs needs logprobs: true",
            )),
            _ => Ok(None),
        },
        Some(Value::Bool(true)) => Ok(Some(top.unwrap_or(0))),
        Some(v) if v.is_number() => Ok(Some(count("logprobs", v)?.max(top.unwrap_or(0)))),
        Some(_) => Err(ApiError::invalid(
            "logprobs",
            "logprobs must be a boolean (chat) or an integer (completions)",
        )),
    }
}

/// Most choices one request may ask for (`n`).
pub const MAX_CHOICES: usize = 16;

/// A request body: built from the parsed JSON object, each type error naming its path.
pub trait Body: Sized {
    fn from_value(body: &Value) -> Result<Self, ApiError>;
}

/// Parses a JSON body (an object) into `T`: malformed JSON is a 400 without a field, a wrongly
/// typed field a 400 whose `param` is its path (`max_tokens`, `messages[1].content`).
pub fn parse_body<T: Body>(bytes: &[u8]) -> Result<T, ApiError> {
    let body: Value = serde_json::from_slice(bytes).map_err(|e| {
        let what = if e.is_syntax() || e.is_eof() {
            "malformed JSON"
        } else {
            "invalid request body"
        };
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            None,
            format!("{what}: {e}"),
        )
    })?;
    if !body.is_object() {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            None,
            "the request body must be a JSON object",
        ));
    }
    T::from_value(&body)
}

/// `prefix` and a path below it joined (`messages[1]` + `content`).
pub fn join_path(prefix: &str, path: &str) -> String {
    match (prefix.is_empty(), path.is_empty() || path == ".") {
        (_, true) => prefix.to_string(),
        (true, false) => path.to_string(),
        (false, false) if path.starts_with('[') => format!("{prefix}{path}"),
        (false, false) => format!("{prefix}.{path}"),
    }
}

/// Deserializes `T` from a JSON value found at `prefix`; a type error's `param` is its full
/// path, and the message starts with it.
pub fn typed<T: serde::de::DeserializeOwned>(v: &Value, prefix: &str) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(v).map_err(|e| {
        let param = join_path(prefix, &e.path().to_string());
        let inner = e.into_inner();
        if param.is_empty() {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                None,
                format!("invalid request body: {inner}"),
            )
        } else {
            ApiError::invalid(&param, format!("{param}: {inner}"))
        }
    })
}

/// The field names a derived struct reads (serde passes them to `deserialize_struct`).
pub fn field_names<T: serde::de::DeserializeOwned>() -> &'static [&'static str] {
    use serde::de::{Error, Visitor};
    struct Names<'a>(&'a mut &'static [&'static str]);
    impl<'de> serde::Deserializer<'de> for Names<'_> {
        type Error = serde::de::value::Error;
        fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
            Err(Self::Error::custom("not a struct"))
        }
        fn deserialize_struct<V: Visitor<'de>>(
            self,
            _: &'static str,
            fields: &'static [&'static str],
            _: V,
        ) -> Result<V::Value, Self::Error> {
            *self.0 = fields;
            Err(Self::Error::custom("names only"))
        }
        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes
            byte_buf option unit unit_struct newtype_struct seq tuple tuple_struct map enum
            identifier ignored_any
        }
    }
    let mut names: &'static [&'static str] = &[];
    let _ = T::deserialize(Names(&mut names));
    names
}

/// The body's fields that none of `known` reads (checked by [`fields::validate_extra`]).
pub fn extra_fields(body: &Value, known: &[&[&str]]) -> serde_json::Map<String, Value> {
    body.as_object()
        .map(|m| {
            m.iter()
                .filter(|(k, _)| !known.iter().any(|names| names.contains(&k.as_str())))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        })
        .unwrap_or_default()
}

fn finite(param: &str, v: f64) -> Result<f32, ApiError> {
    if !v.is_finite() {
        return Err(ApiError::invalid(
            param,
            format!("{param} must be a finite number"),
        ));
    }
    Ok(v as f32)
}

/// A presence or frequency penalty: finite, in [-2, 2].
fn penalty(param: &str, v: Option<f64>) -> Result<Option<f32>, ApiError> {
    let Some(v) = v else { return Ok(None) };
    let v = finite(param, v)?;
    if !(-2.0..=2.0).contains(&v) {
        return Err(ApiError::invalid(
            param,
            format!("{param} must be in [-2, 2]"),
        ));
    }
    Ok(Some(v))
}

/// Checks the sampling fields (each error names its field) and builds the engine's params.
pub fn validate_sampling(f: &SamplingFields) -> Result<GenSettings, ApiError> {
    fields::validate_extra(&f.extra)?;
    let include_usage = fields::include_usage(f.stream_options.as_ref(), f.stream)?;
    let d = SamplingParams::default();
    let mut p = d;
    if let Some(v) = penalty("presence_penalty", f.presence_penalty)? {
        p.presence_penalty = v;
    }
    if let Some(v) = penalty("frequency_penalty", f.frequency_penalty)? {
        p.frequency_penalty = v;
    }
    if let Some(t) = f.temperature {
        let t = finite("temperature", t)?;
        if !(0.0..=100.0).contains(&t) {
            return Err(ApiError::invalid(
                "temperature",
                "temperature must be in [0, 100]",
            ));
        }
        p.temperature = t;
    }
    if let Some(v) = f.top_p {
        let v = finite("top_p", v)?;
        if !(v > 0.0 && v <= 1.0) {
            return Err(ApiError::invalid("top_p", "top_p must be in (0, 1]"));
        }
        p.top_p = v;
    }
    if let Some(v) = f.top_k {
        p.top_k = usize::try_from(v)
            .map_err(|_| ApiError::invalid("top_k", "top_k must be >= 0 (0 = off)"))?;
    }
    if let Some(v) = f.min_p {
        let v = finite("min_p", v)?;
        if !(0.0..=1.0).contains(&v) {
            return Err(ApiError::invalid("min_p", "min_p must be in [0, 1]"));
        }
        p.min_p = v;
    }
    if let Some(v) = f.repeat_penalty {
        let v = finite("repeat_penalty", v)?;
        if v <= 0.0 {
            return Err(ApiError::invalid(
                "repeat_penalty",
                "repeat_penalty must be > 0",
            ));
        }
        p.repeat_penalty = v;
    }
    if let Some(v) = f.repeat_last_n {
        p.repeat_last_n = usize::try_from(v)
            .map_err(|_| ApiError::invalid("repeat_last_n", "repeat_last_n must be >= 0"))?;
    }
    if let Some(v) = f.seed {
        // Negative seeds are accepted as their two's-complement bit pattern.
        p.seed = v as u64;
    }
    // The engine's own check is the backstop for combinations the field checks miss.
    p.validate()
        .map_err(|e| ApiError::invalid("temperature", e.to_string()))?;
    let max_tokens = match f.max_completion_tokens.or(f.max_tokens) {
        None => None,
        Some(v) if v >= 1 => Some(v as usize),
        Some(_) => return Err(ApiError::invalid("max_tokens", "max_tokens must be >= 1")),
    };
    let stop = match &f.stop {
        None => Vec::new(),
        Some(StopField::One(s)) => vec![s.clone()],
        Some(StopField::Many(v)) => v.clone(),
    };
    if stop.len() > 16 {
        return Err(ApiError::invalid("stop", "at most 16 stop strings"));
    }
    let stop = stop.into_iter().filter(|s| !s.is_empty()).collect();
    let n = match f.n {
        None => 1,
        Some(v) if (1..=MAX_CHOICES as i64).contains(&v) => v as usize,
        Some(_) => {
            return Err(ApiError::invalid(
                "n",
                format!("n must be an integer from 1 to {MAX_CHOICES}"),
            ))
        }
    };
    Ok(GenSettings {
        params: p,
        max_tokens,
        stop,
        stream: f.stream,
        include_usage,
        n,
        return_tokens: f.return_tokens,
        logprobs: logprobs_of(f)?,
    })
}

/// The raw prompt of `/v1/completions`: a string, or an array holding one string.
pub fn prompt_of(req: &CompletionRequest) -> Result<Prompt, ApiError> {
    let ids = |a: &[Value]| -> Option<Vec<u32>> {
        a.iter()
            .map(|v| v.as_u64().and_then(|id| u32::try_from(id).ok()))
            .collect()
    };
    match &req.prompt {
        Value::String(s) => Ok(Prompt::Text(s.clone())),
        Value::Array(a) if a.len() == 1 && a[0].is_string() => {
            Ok(Prompt::Text(a[0].as_str().unwrap_or_default().to_string()))
        }
        Value::Array(a) if !a.is_empty() && a.iter().all(Value::is_number) => ids(a)
            .map(Prompt::Ids)
            .ok_or_else(|| ApiError::invalid("prompt", "token ids must be integers >= 0")),
        _ => Err(ApiError::invalid(
            "prompt",
            "prompt must be a string, an array of exactly one string, or an array of token ids",
        )),
    }
}

/// A completion prompt: text to tokenize, or token ids as given.
#[derive(Debug, Clone, PartialEq)]
pub enum Prompt {
    Text(String),
    Ids(Vec<u32>),
}

/// The pure part of `/v1/completions` after the body parsed and the model matched.
pub fn validate_completion(req: &CompletionRequest) -> Result<(GenSettings, Prompt), ApiError> {
    let settings = validate_sampling(&req.common)?;
    let text = prompt_of(req)?;
    Ok((settings, text))
}
