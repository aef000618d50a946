//! What `strict: true` asks of a JSON Schema (docs/SERVER.md "Strict schemas"): every object
//! closed and complete, as OpenAI's structured outputs require — `additionalProperties:
//! false` on every object and every property listed in `required` — so that a strict reply
//! is bounded by its schema and never runs on inventing keys until `max_tokens`. A schema that
//! is not is refused (400) naming the path of the first object that breaks a rule; nothing is
//! closed behind the client's back.

use super::ApiError;
use serde_json::{Map, Value};

/// Keywords whose value is one subschema.
const ONE: [&str; 2] = ["items", "additionalItems"];
/// Keywords whose value is an array of subschemas.
const MANY: [&str; 4] = ["anyOf", "oneOf", "allOf", "prefixItems"];
/// Keywords whose value maps names to subschemas.
const NAMED: [&str; 2] = ["$defs", "definitions"];
/// Any one of these bounds a schema's shape; a schema with none accepts any JSON value.
const SHAPED: [&str; 10] = [
    "type",
    "enum",
    "const",
    "anyOf",
    "oneOf",
    "allOf",
    "$ref",
    "properties",
    "items",
    "prefixItems",
];

/// Checks `schema`, given at field `field` (`response_format.json_schema.schema`,
/// `tools[0].function.parameters`), against the strict rules.
pub fn check(schema: &Value, field: &str) -> Result<(), ApiError> {
    walk(schema, field).map_err(|(path, rule)| {
        ApiError::invalid(
            field,
            format!("{path}: {rule}: with strict: true every object must set additionalProperties: false and list every property in required (make an optional property nullable, e.g. {{\"type\": [\"string\", \"null\"]}}), or send strict: false"),
        )
    })
}

/// The first rule broken at or under `schema` (at `path`): (path, rule).
fn walk(schema: &Value, path: &str) -> Result<(), (String, String)> {
    let map = match schema {
        Value::Object(map) => map,
        Value::Bool(true) => return Err((path.into(), "`true` accepts any value".into())),
        _ => return Ok(()),
    };
    if !SHAPED.iter().any(|k| map.contains_key(*k)) {
        return Err((
            path.into(),
            "a schema without a type accepts any value".into(),
        ));
    }
    if is_object(map) {
        closed_and_complete(map).map_err(|rule| (path.to_string(), rule))?;
    }
    if let Some(Value::Object(props)) = map.get("properties") {
        for (key, sub) in props {
            walk(sub, &format!("{path}.properties.{key}"))?;
        }
    }
    for k in ONE {
        if let Some(sub) = map.get(k) {
            walk(sub, &format!("{path}.{k}"))?;
        }
    }
    for k in MANY {
        if let Some(Value::Array(subs)) = map.get(k) {
            for (i, sub) in subs.iter().enumerate() {
                walk(sub, &format!("{path}.{k}[{i}]"))?;
            }
        }
    }
    for k in NAMED {
        if let Some(Value::Object(subs)) = map.get(k) {
            for (name, sub) in subs {
                walk(sub, &format!("{path}.{k}.{name}"))?;
            }
        }
    }
    Ok(())
}

/// Whether a schema describes an object: its type is (or includes) `object`, or it has
/// object keywords.
fn is_object(map: &Map<String, Value>) -> bool {
    let typed = match map.get("type") {
        Some(Value::String(t)) => t == "object",
        Some(Value::Array(ts)) => ts.iter().any(|t| t == "object"),
        _ => false,
    };
    typed
        || [
            "properties",
            "additionalProperties",
            "patternProperties",
            "required",
        ]
        .iter()
        .any(|k| map.contains_key(*k))
}

/// An object schema's rules: closed (`additionalProperties: false`, no `patternProperties`)
/// and complete (every property required).
fn closed_and_complete(map: &Map<String, Value>) -> Result<(), String> {
    if map.get("additionalProperties") != Some(&Value::Bool(false)) {
        return Err(match map.get("additionalProperties") {
            None => "additionalProperties is missing (an object is open unless it is false)".into(),
            Some(v) => format!("additionalProperties is {v}, not false"),
        });
    }
    if map.contains_key("patternProperties") {
        return Err("patternProperties leaves the object open".into());
    }
    let required: Vec<&str> = match map.get("required") {
        Some(Value::Array(r)) => r.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    };
    let missing: Vec<&str> = match map.get("properties") {
        Some(Value::Object(props)) => props
            .keys()
            .map(String::as_str)
            .filter(|k| !required.contains(k))
            .collect(),
        _ => Vec::new(),
    };
    if !missing.is_empty() {
        return Err(format!(
            "required does not list {}",
            missing
                .iter()
                .map(|k| format!("`{k}`"))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::check;
    use serde_json::json;

    const FIELD: &str = "response_format.json_schema.schema";

    fn refused(schema: serde_json::Value) -> String {
        check(&schema, FIELD).unwrap_err().message
    }

    #[test]
    fn closed_complete_objects_pass_at_every_depth() {
        let ok = json!({"type": "object", "additionalProperties": false, "required": ["a", "b"],
            "properties": {"a": {"type": ["string", "null"], "maxLength": 4},
                "b": {"type": "array", "items": {"type": "object", "additionalProperties": false,
                    "required": ["c"], "properties": {"c": {"enum": [1, 2]}}}}},
            "$defs": {"d": {"type": "integer"}}});
        assert!(check(&ok, FIELD).is_ok());
        assert!(check(&json!({"type": "boolean"}), FIELD).is_ok());
    }

    #[test]
    fn an_open_or_incomplete_object_is_refused_by_its_path() {
        let open = json!({"type": "object", "properties": {"text": {"type": "string",
            "maxLength": 24}, "tags": {"type": "array", "items": {"type": "string"}}},
            "required": ["text"]});
        let m = refused(open);
        assert!(
            m.starts_with(FIELD) && m.contains("additionalProperties is missing"),
            "{m}"
        );
        let incomplete = json!({"type": "object", "additionalProperties": false,
            "properties": {"text": {"type": "string"}, "tags": {"type": "string"}},
            "required": ["text"]});
        assert!(refused(incomplete).contains("required does not list `tags`"));
        let nested = json!({"type": "object", "additionalProperties": false, "required": ["a"],
            "properties": {"a": {"anyOf": [{"type": "null"},
                {"type": "object", "additionalProperties": true}]}}});
        let m = refused(nested);
        assert!(
            m.starts_with(&format!(
                "{FIELD}.properties.a.anyOf[1]: additionalProperties is true"
            )),
            "{m}"
        );
        let any = json!({"type": "object", "additionalProperties": false, "required": ["x"],
            "properties": {"x": {}}});
        assert!(refused(any).contains(".properties.x: a schema without a type"));
        let pattern = json!({"type": "object", "additionalProperties": false,
            "patternProperties": {"^x": {"type": "string"}}});
        assert!(refused(pattern).contains("patternProperties"));
    }
}
