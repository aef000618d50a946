//! Helpers of the reply parser ([`super::ReplyStream`]): JSON string literals, UTF-8
//! draining of a text run, and a marker's tag and attributes.

/// A JSON string literal of `s`.
pub(super) fn json_string(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into())
}

/// Takes the decodable prefix of `bytes`: complete characters, U+FFFD for invalid bytes,
/// and (with `all`) U+FFFD for an incomplete character at the end.
pub(super) fn drain_utf8(bytes: &mut Vec<u8>, all: bool) -> String {
    let mut out = String::new();
    let mut at = 0;
    while at < bytes.len() {
        match std::str::from_utf8(&bytes[at..]) {
            Ok(s) => {
                out.push_str(s);
                at = bytes.len();
            }
            Err(e) => {
                let valid = at + e.valid_up_to();
                out.push_str(std::str::from_utf8(&bytes[at..valid]).unwrap_or_default());
                match e.error_len() {
                    Some(n) => {
                        out.push('\u{FFFD}');
                        at = valid + n;
                    }
                    None if all => {
                        out.push('\u{FFFD}');
                        at = bytes.len();
                    }
                    None => {
                        at = valid;
                        break;
                    }
                }
            }
        }
    }
    bytes.drain(..at);
    out
}

/// Splits a marker's text `tag{ key="value"}` into its tag and unescaped attributes; `None`
/// when it is not of that form.
pub(super) fn parse_tag(text: &str) -> Option<(String, Vec<(String, String)>)> {
    let (tag, mut rest) = text.split_once(' ').unwrap_or((text, ""));
    if tag.is_empty()
        || !tag
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        return None;
    }
    let mut attrs = Vec::new();
    while !rest.is_empty() {
        let (key, after) = rest.split_once("=\"")?;
        let (value, after) = after.split_once('"')?;
        if key.is_empty() || !key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
            return None;
        }
        attrs.push((key.to_string(), unescape_attr(value)));
        rest = match after.strip_prefix(' ') {
            Some(more) if !more.is_empty() => more,
            Some(_) => return None,
            None if after.is_empty() => "",
            None => return None,
        };
    }
    Some((tag.to_string(), attrs))
}

pub(super) fn attr(attrs: &[(String, String)], key: &str) -> Option<String> {
    attrs.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone())
}

/// Reverses [`super::escape_attr`] in one pass: `&quot;` → `"`, `&amp;` → `&`.
fn unescape_attr(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    let mut rest = value;
    while let Some(at) = rest.find('&') {
        out.push_str(&rest[..at]);
        rest = &rest[at..];
        if let Some(after) = rest.strip_prefix("&quot;") {
            out.push('"');
            rest = after;
        } else if let Some(after) = rest.strip_prefix("&amp;") {
            out.push('&');
            rest = after;
        } else {
            out.push('&');
            rest = &rest[1..];
        }
    }
    out.push_str(rest);
    out
}
