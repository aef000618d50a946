//! OpenAI request fields that k3 does not implement (tools, `tool_choice`,
//! `parallel_tool_calls` and `response_format` are parsed by `openai.rs`): one table says, for each, whether it is
//! accepted (informational, unused) or refused with a 400 naming it. Any other field not
//! parsed by the request types is refused as unknown, so nothing is silently ignored.

use super::ApiError;
use serde_json::{Map, Value};

/// Which values of a field are accepted; anything else is refused with the message.
type Accepts = fn(&Value) -> bool;

/// Field → (accepted values, message when refused).
const FIELDS: &[(&str, Accepts, &str)] = &[
    ("user", any, ""),
    ("metadata", any, ""),
    ("store", any, ""),
    ("service_tier", any, ""),
    (
        "functions",
        null,
        "functions is the deprecated form of tools: send tools",
    ),
    (
        "function_call",
        null,
        "function_call is the deprecated form of tool_choice: send tool_choice",
    ),
    (
        "logit_bias",
        empty_object,
        "logit_bias is not supported (only an empty object is accepted)",
    ),
];

fn any(_: &Value) -> bool {
    true
}

fn null(v: &Value) -> bool {
    v.is_null()
}

fn empty_object(v: &Value) -> bool {
    v.is_null() || v.as_object().is_some_and(Map::is_empty)
}

/// Checks every field the request types did not parse against [`FIELDS`]; the first refusal
/// (in name order) names its field.
pub fn validate_extra(extra: &Map<String, Value>) -> Result<(), ApiError> {
    let mut names: Vec<&String> = extra.keys().collect();
    names.sort();
    for name in names {
        let value = &extra[name.as_str()];
        match FIELDS.iter().find(|(f, _, _)| f == name) {
            Some((_, accepts, _)) if accepts(value) => {}
            Some((field, _, message)) => return Err(ApiError::invalid(field, *message)),
            None => {
                return Err(ApiError::invalid(
                    name,
                    format!("unknown field `{name}`: not supported by this server"),
                ))
            }
        }
    }
    Ok(())
}

/// `stream_options`: an object whose only key is `include_usage` (a boolean), allowed only
/// with `stream: true`. Returns whether the final usage chunk is sent (absent ⇒ yes).
pub fn include_usage(options: Option<&Value>, stream: bool) -> Result<bool, ApiError> {
    let bad = |param: &str, message: &str| Err(ApiError::invalid(param, message));
    let Some(options) = options.filter(|v| !v.is_null()) else {
        return Ok(true);
    };
    if !stream {
        return bad(
            "stream_options",
            "stream_options is only allowed when stream is true",
        );
    }
    let Some(map) = options.as_object() else {
        return bad("stream_options", "stream_options must be an object");
    };
    let mut include = true;
    for (key, value) in map {
        match (key.as_str(), value) {
            ("include_usage", Value::Bool(b)) => include = *b,
            ("include_usage", Value::Null) => {}
            ("include_usage", _) => {
                return bad(
                    "stream_options.include_usage",
                    "stream_options.include_usage must be a boolean",
                )
            }
            (other, _) => {
                return Err(ApiError::invalid(
                    &format!("stream_options.{other}"),
                    format!("unknown field `stream_options.{other}`: not supported by this server"),
                ))
            }
        }
    }
    Ok(include)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn check(v: Value) -> Result<(), Option<String>> {
        let map = v.as_object().cloned().unwrap_or_default();
        validate_extra(&map).map_err(|e| e.param)
    }

    #[test]
    fn the_table_accepts_and_refuses_by_value() {
        assert_eq!(
            check(
                json!({"user": "u", "metadata": {"a": 1}, "store": false, "service_tier": "auto"})
            ),
            Ok(())
        );
        assert_eq!(check(json!({"logit_bias": {}, "functions": null})), Ok(()));
        for (field, value) in [
            ("functions", json!([])),
            ("function_call", json!("none")),
            ("logit_bias", json!({"5": 10})),
            ("best_of", json!(2)),
        ] {
            assert_eq!(
                check(json!({field: value})),
                Err(Some(field.to_string())),
                "{field}"
            );
        }
    }

    #[test]
    fn stream_options_include_usage() {
        assert_eq!(include_usage(None, false).ok(), Some(true));
        assert_eq!(
            include_usage(Some(&json!({"include_usage": false})), true).ok(),
            Some(false)
        );
        assert_eq!(include_usage(Some(&json!({})), true).ok(), Some(true));
        let param = |v: Value, stream| include_usage(Some(&v), stream).err().and_then(|e| e.param);
        assert_eq!(
            param(json!({"include_usage": true}), false).as_deref(),
            Some("stream_options")
        );
        assert_eq!(
            param(json!({"include_usage": 1}), true).as_deref(),
            Some("stream_options.include_usage")
        );
        assert_eq!(
            param(json!({"x": 1}), true).as_deref(),
            Some("stream_options.x")
        );
    }
}
