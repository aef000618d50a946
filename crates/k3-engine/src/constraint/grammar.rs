//! The Lark grammars (llguidance's dialect) a [`ConstraintSpec`] compiles to
//! (docs/API.md#structured-output). Control ids are named as special tokens (`<|open|>`),
//! tag text is ordinary text, JSON values are llguidance `%json` schemas with compact
//! separators (no free whitespace, so a bounded schema bounds the reply's length).

use super::ConstraintSpec;
use serde_json::{json, Map, Value};

/// Most calls one reply may make when parallel calls are allowed (each call index is its own
/// grammar rule, so the count is bounded).
pub const MAX_PARALLEL_CALLS: usize = 8;

/// The end shared by every reply: `close(message)`; the end id follows as the grammar's EOS.
const MESSAGE_END: &str = r#"<|close|> "message" <|sep|>"#;

/// A Lark string literal (Lark strings are JSON strings).
fn lit(text: &str) -> String {
    Value::String(text.to_string()).to_string()
}

/// An attribute value escaped as K3's template writes it: `&` then `"`.
fn attr(value: &str) -> String {
    value.replace('&', "&amp;").replace('"', "&quot;")
}

/// `schema` with the compile options every JSON value uses: compact separators, no free
/// whitespace; `lenient` ignores keywords llguidance does not enforce instead of refusing.
fn json_atom(schema: &Value, lenient: bool) -> Result<String, String> {
    let Value::Object(map) = schema else {
        return Err(format!("a schema must be a JSON object, got `{schema}`"));
    };
    let mut map = map.clone();
    map.insert(
        "x-guidance".into(),
        json!({ "whitespace_flexible": false, "lenient": lenient }),
    );
    Ok(format!("%json {}", Value::Object(map)))
}

/// The whole grammar for `spec`; `open_response` prefixes `open(response)` (the reply
/// started in the think channel, which the caller has already left).
pub fn lark(spec: &ConstraintSpec, open_response: bool) -> Result<String, String> {
    let prefix = if open_response {
        r#"<|open|> "response" <|sep|> "#
    } else {
        ""
    };
    let body = match spec {
        ConstraintSpec::JsonObject => {
            let atom = json_atom(&json!({ "type": "object" }), false)?;
            format!(r#"{atom} <|close|> "response" <|sep|> {MESSAGE_END}"#)
        }
        ConstraintSpec::JsonSchema { schema, strict } => {
            let atom = json_atom(schema, !strict)?;
            format!(r#"{atom} <|close|> "response" <|sep|> {MESSAGE_END}"#)
        }
        ConstraintSpec::ToolCalls {
            tools,
            named,
            parallel,
        } => return tool_calls(tools, named.as_deref(), *parallel, prefix),
    };
    Ok(format!("start: {prefix}{body}\n"))
}

/// Empty response channel, then the tools channel with one call (up to
/// [`MAX_PARALLEL_CALLS`] when `parallel`), each naming one of `tools` (only `named` when
/// given) with index 1, 2, … and arguments valid for that tool's parameters.
fn tool_calls(
    tools: &[(String, Value)],
    named: Option<&str>,
    parallel: bool,
    prefix: &str,
) -> Result<String, String> {
    if tools.is_empty() {
        return Err("tool calls were requested but no tools are declared".into());
    }
    let chosen: Vec<usize> = match named {
        Some(name) => vec![tools.iter().position(|(n, _)| n == name).ok_or_else(|| {
            format!("tool_choice names `{name}`, which is not among the declared tools")
        })?],
        None => (0..tools.len()).collect(),
    };
    let mut rules = Vec::new();
    for &t in &chosen {
        let (name, params) = &tools[t];
        let args = arguments(name, params, t, &mut rules)?;
        rules.push(format!("args_{t}: {args}"));
    }
    let max_calls = if parallel { MAX_PARALLEL_CALLS } else { 1 };
    for n in 1..=max_calls {
        let alts: Vec<String> = chosen
            .iter()
            .map(|&t| {
                let open = format!("call tool=\"{}\" index=\"{n}\"", attr(&tools[t].0));
                format!(
                    r#"<|open|> {} <|sep|> args_{t} <|close|> "call" <|sep|>"#,
                    lit(&open)
                )
            })
            .collect();
        rules.push(format!("call_{n}: {}", alts.join(" | ")));
    }
    // calls_n: call_n calls_{n+1}?  — at least one call, indices in order.
    for n in 1..=max_calls {
        let rest = if n < max_calls {
            format!(" calls_{}?", n + 1)
        } else {
            String::new()
        };
        rules.push(format!("calls_{n}: call_{n}{rest}"));
    }
    let start = format!(
        r#"start: {prefix}<|close|> "response" <|sep|> <|open|> "tools" <|sep|> calls_1 <|close|> "tools" <|sep|> {MESSAGE_END}"#
    );
    rules.insert(0, start);
    Ok(rules.join("\n") + "\n")
}

/// The argument sequence of tool `name` (index `t`): every property of `params` in its
/// declared order, required ones always, others optionally; pushes one rule per argument.
fn arguments(
    name: &str,
    params: &Value,
    t: usize,
    rules: &mut Vec<String>,
) -> Result<String, String> {
    let where_ = |what: &str| format!("tool `{name}`: {what}");
    let Value::Object(params) = params else {
        return Err(where_("its parameters must be a JSON Schema object"));
    };
    if let Some(ty) = params.get("type") {
        if ty != "object" {
            return Err(where_(&format!(
                "parameters `type` is {ty}: it must be \"object\""
            )));
        }
    }
    let empty = Map::new();
    let props = match params.get("properties") {
        None => &empty,
        Some(Value::Object(p)) => p,
        Some(_) => return Err(where_("parameters `properties` must be an object")),
    };
    let required: Vec<&str> = match params.get("required") {
        None => Vec::new(),
        Some(Value::Array(r)) => r.iter().filter_map(Value::as_str).collect(),
        Some(_) => return Err(where_("parameters `required` must be an array of names")),
    };
    if let Some(missing) = required.iter().find(|k| !props.contains_key(**k)) {
        return Err(where_(&format!(
            "required argument `{missing}` has no schema in `properties`"
        )));
    }
    let defs = shared_definitions(params);
    let mut seq = Vec::new();
    for (k, (key, schema)) in props.iter().enumerate() {
        let rule = format!("arg_{t}_{k}");
        let (ty, value) =
            argument_value(schema, &defs).map_err(|e| where_(&format!("argument `{key}`: {e}")))?;
        let open = format!("argument key=\"{}\" type=\"{ty}\"", attr(key));
        rules.push(format!(
            r#"{rule}: <|open|> {} <|sep|> {value} <|close|> "argument" <|sep|>"#,
            lit(&open)
        ));
        let optional = if required.contains(&key.as_str()) {
            ""
        } else {
            "?"
        };
        seq.push(format!("{rule}{optional}"));
    }
    Ok(if seq.is_empty() {
        "\"\"".into()
    } else {
        seq.join(" ")
    })
}

/// `$defs` / `definitions` of the parameters schema, copied into each argument's schema so
/// its `$ref`s resolve.
fn shared_definitions(params: &Map<String, Value>) -> Map<String, Value> {
    ["$defs", "definitions"]
        .iter()
        .filter_map(|k| params.get(*k).map(|v| (k.to_string(), v.clone())))
        .collect()
}

/// The `type` attribute and the grammar of one argument's value: raw text for a string
/// argument, compact JSON for any other type.
fn argument_value(schema: &Value, defs: &Map<String, Value>) -> Result<(String, String), String> {
    let Value::Object(map) = schema else {
        return Err("its schema must be a JSON object".into());
    };
    let ty = match map.get("type") {
        Some(Value::String(t)) => t.clone(),
        _ if string_choices(map).is_some() => "string".into(),
        _ => return Err("its schema needs a single `type` (the call's `type` attribute)".into()),
    };
    if ty == "string" {
        return Ok((ty, raw_string(map)?));
    }
    let mut with_defs = map.clone();
    for (k, v) in defs {
        with_defs.entry(k.clone()).or_insert_with(|| v.clone());
    }
    Ok((ty, json_atom(&Value::Object(with_defs), false)?))
}

/// `enum` / `const` values when all are strings.
fn string_choices(map: &Map<String, Value>) -> Option<Vec<&str>> {
    let values: Vec<&Value> = match (map.get("enum"), map.get("const")) {
        (Some(Value::Array(v)), _) => v.iter().collect(),
        (None, Some(c)) => vec![c],
        _ => return None,
    };
    values.iter().map(|v| v.as_str()).collect()
}

/// A string argument's raw text: one of its `enum`/`const` values, or any text of
/// `minLength..=maxLength` characters.
fn raw_string(map: &Map<String, Value>) -> Result<String, String> {
    if let Some(choices) = string_choices(map) {
        if choices.is_empty() {
            return Err("`enum` is empty: no value can satisfy it".into());
        }
        let alts: Vec<String> = choices.iter().map(|c| lit(c)).collect();
        return Ok(format!("({})", alts.join(" | ")));
    }
    for unsupported in ["pattern", "format", "enum", "const"] {
        if map.contains_key(unsupported) {
            return Err(format!(
                "`{unsupported}` is not supported on a raw string argument"
            ));
        }
    }
    let bound = |key: &str| -> Result<Option<u64>, String> {
        match map.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .map(Some)
                .ok_or_else(|| format!("`{key}` must be a non-negative integer, got {v}")),
        }
    };
    let (min, max) = (bound("minLength")?.unwrap_or(0), bound("maxLength")?);
    if max.is_some_and(|m| m < min) {
        return Err(format!(
            "`minLength` {min} exceeds `maxLength` {max:?}: unsatisfiable"
        ));
    }
    // A lexeme is never empty: zero characters is the optional form.
    let text = match max {
        Some(0) => return Ok("\"\"".into()),
        Some(m) => format!("/[\\s\\S]{{{},{m}}}/", min.max(1)),
        None => format!("/[\\s\\S]{{{},}}/", min.max(1)),
    };
    Ok(if min == 0 { format!("{text}?") } else { text })
}
