//! Key lookup (docs/MODEL.md#config-key-lookup): candidate objects txt → lin → root, primary name before alias,
//! numbers must be JSON numbers, every missing required key collected before failing.

use super::error::ConfigError;
use super::ConfigShape;
use serde_json::{Map, Value};

/// Where a field is looked up.
#[derive(Clone, Copy)]
pub(super) enum Order {
    /// text_config, linear_attn_config, root (the C loader's order).
    TxtLinRoot,
    /// linear_attn_config first (KDA geometry; docs/MODEL.md#config-key-lookup), then txt, root.
    LinTxtRoot,
}

/// The candidate objects of one document.
pub(super) struct Doc<'a> {
    txt: Option<&'a Map<String, Value>>,
    lin: Option<&'a Map<String, Value>>,
    root: &'a Map<String, Value>,
    pub source: String,
    pub shape: ConfigShape,
    /// Required fields that were not found, with the reason, in table order.
    pub missing: Vec<(String, String)>,
    /// First non-integral value of an integer field.
    pub bad: Option<ConfigError>,
}

impl<'a> Doc<'a> {
    /// Splits a parsed document into its candidate objects; unwraps a `{"config": {...}}` root.
    pub fn new(value: &'a Value, source: &str) -> Result<Doc<'a>, ConfigError> {
        let Value::Object(root) = value else {
            return Err(ConfigError::NotAnObject {
                source_name: source.to_string(),
                found: json_type(value),
            });
        };
        let root = match root.get("config") {
            Some(Value::Object(inner)) => inner,
            _ => root,
        };
        let txt = root.get("text_config").and_then(Value::as_object);
        let lin = txt
            .unwrap_or(root)
            .get("linear_attn_config")
            .and_then(Value::as_object);
        let shape = if txt.is_some() {
            ConfigShape::Nested
        } else {
            ConfigShape::Flat
        };
        Ok(Doc {
            txt,
            lin,
            root,
            source: source.to_string(),
            shape,
            missing: Vec::new(),
            bad: None,
        })
    }

    /// First hit of `primary` (then `alias`) over the candidate objects in `order`.
    pub fn find(
        &self,
        primary: &'static str,
        alias: Option<&'static str>,
        order: Order,
    ) -> Option<(&'static str, &'a Value)> {
        let objs = match order {
            Order::TxtLinRoot => [self.txt, self.lin, Some(self.root)],
            Order::LinTxtRoot => [self.lin, self.txt, Some(self.root)],
        };
        objs.into_iter().flatten().find_map(|o| {
            o.get(primary)
                .map(|v| (primary, v))
                .or_else(|| alias.and_then(|a| o.get(a).map(|v| (a, v))))
        })
    }

    fn miss(&mut self, primary: &str, alias: Option<&str>, why: String) {
        let key = match alias {
            Some(a) => format!("{primary} (alias {a})"),
            None => primary.to_string(),
        };
        self.missing.push((key, why));
    }

    /// A required number, or `None` (recorded as missing when absent or not a number).
    pub fn number(
        &mut self,
        primary: &'static str,
        alias: Option<&'static str>,
        order: Order,
    ) -> Option<(&'static str, &'a Value)> {
        match self.find(primary, alias, order) {
            None => {
                self.miss(primary, alias, "absent".into());
                None
            }
            Some((key, v)) if !v.is_number() => {
                let why = format!("`{key}` is {} ({}), not a number", show(v), json_type(v));
                self.miss(primary, alias, why);
                None
            }
            Some(hit) => Some(hit),
        }
    }

    /// A required integer; non-integral values are recorded in `bad`. Returns 0 when unusable
    /// (the load fails before the value is used).
    pub fn int(&mut self, primary: &'static str, alias: Option<&'static str>, order: Order) -> i64 {
        let Some((key, v)) = self.number(primary, alias, order) else {
            return 0;
        };
        match as_integer(v) {
            Some(i) => i,
            None => {
                if self.bad.is_none() {
                    self.bad = Some(ConfigError::NotInteger {
                        source_name: self.source.clone(),
                        key: key.to_string(),
                        value: v.to_string(),
                    });
                }
                0
            }
        }
    }

    /// A required float (f64).
    pub fn float(&mut self, primary: &'static str, alias: Option<&'static str>) -> f64 {
        self.number(primary, alias, Order::TxtLinRoot)
            .and_then(|(_, v)| v.as_f64())
            .unwrap_or(0.0)
    }

    /// An optional bool: JSON bool, or a number (non-zero ⇒ true); anything else ⇒ `default`.
    pub fn boolean(&self, key: &'static str, default: bool) -> bool {
        match self.find(key, None, Order::TxtLinRoot) {
            Some((_, Value::Bool(b))) => *b,
            Some((_, Value::Number(n))) => n.as_f64().is_some_and(|x| x != 0.0),
            _ => default,
        }
    }

    /// The required non-empty `full_attn_layers` array (entries validated later).
    pub fn layer_list(&mut self) -> Option<&'a Vec<Value>> {
        const KEY: &str = "full_attn_layers";
        match self.find(KEY, None, Order::TxtLinRoot) {
            None => self.miss(KEY, None, "absent".into()),
            Some((_, Value::Array(a))) if a.is_empty() => {
                self.miss(KEY, None, "an empty array".into())
            }
            Some((_, Value::Array(a))) => return Some(a),
            Some((_, v)) => self.miss(
                KEY,
                None,
                format!("{} ({}), not an array", show(v), json_type(v)),
            ),
        }
        None
    }
}

/// A JSON number as an exact integer: integers as is, floats only when integral and in range.
pub(super) fn as_integer(v: &Value) -> Option<i64> {
    if let Some(i) = v.as_i64() {
        return Some(i);
    }
    if v.is_u64() {
        return None; // above i64::MAX
    }
    let f = v.as_f64()?;
    let in_range = (-9.0e18..=9.0e18).contains(&f);
    (f.fract() == 0.0 && in_range).then_some(f as i64)
}

/// The JSON type name of a value, for messages.
pub(super) fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a bool",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// A value's JSON text, shortened to 40 characters for messages.
pub(super) fn show(v: &Value) -> String {
    let s = v.to_string();
    match s.char_indices().nth(40) {
        Some((cut, _)) => format!("{}…", &s[..cut]),
        None => s,
    }
}
