//! Showing decoded text safely: control characters (which a terminal would obey) become
//! visible escapes such as `\x1b`, and bytes that are not UTF-8 become `\xff` — for a program
//! that prints what a model generated, or one token's bytes. [`unescape`] reads such escapes
//! back when a prompt is given with them.

use std::borrow::Cow;

/// How much of the text's own layout to keep.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Style {
    /// Generated text on a terminal: newlines and tabs are kept, every other control character
    /// is escaped.
    Text,
    /// One token shown in quotes: newlines, tabs, quotes and backslashes are escaped too, so
    /// the quoted form shows exactly what the token holds.
    Quoted,
}

/// `text` with its control characters escaped for `style`; borrowed when nothing changes.
pub fn escape_str(text: &str, style: Style) -> Cow<'_, str> {
    if !text.chars().any(|c| needs_escape(c, style)) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        push_char(&mut out, c, style);
    }
    Cow::Owned(out)
}

/// `bytes` shown as text: valid UTF-8 as [`escape_str`] shows it, every byte of an invalid
/// sequence as `\xNN`.
pub fn escape_bytes(bytes: &[u8], style: Style) -> String {
    let mut out = String::with_capacity(bytes.len() + 8);
    for chunk in bytes.utf8_chunks() {
        out.push_str(&escape_str(chunk.valid(), style));
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out
}

fn needs_escape(c: char, style: Style) -> bool {
    match style {
        Style::Text => c.is_control() && c != '\n' && c != '\t',
        Style::Quoted => c.is_control() || c == '"' || c == '\\',
    }
}

fn push_char(out: &mut String, c: char, style: Style) {
    if !needs_escape(c, style) {
        out.push(c);
        return;
    }
    match c {
        '\n' => out.push_str("\\n"),
        '\t' => out.push_str("\\t"),
        '\r' => out.push_str("\\r"),
        '"' => out.push_str("\\\""),
        '\\' => out.push_str("\\\\"),
        c if (c as u32) < 0x80 => out.push_str(&format!("\\x{:02x}", c as u32)),
        c => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
    }
}

/// The bytes of `text` with its backslash escapes processed (`k3 run -e`, llama.cpp's
/// `--escape`, whose set this is): `\n \r \t \\ \' \"`, and `\xNN` as one byte (two hex
/// digits). Any other backslash is kept as written (`\0` too).
pub fn unescape(text: &str) -> Vec<u8> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let (b, next) = (bytes[i], bytes.get(i + 1).copied());
        let simple = match next {
            Some(b'n') => Some(b'\n'),
            Some(b'r') => Some(b'\r'),
            Some(b't') => Some(b'\t'),
            Some(c @ (b'\\' | b'\'' | b'"')) => Some(c),
            _ => None,
        };
        let hex = bytes
            .get(i + 2..i + 4)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        let (byte, width) = match (b, simple, next, hex) {
            (b'\\', Some(c), _, _) => (c, 2),
            (b'\\', None, Some(b'x'), Some(h)) => (h, 4),
            _ => (b, 1),
        };
        out.push(byte);
        i += width;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unescape_processes_llama_cpp_escapes() {
        assert_eq!(
            unescape(r#"a\nb\t\"q\"\\ \x41\xff\q\"#),
            b"a\nb\t\"q\"\\ A\xff\\q\\".to_vec()
        );
        assert_eq!(unescape("é\\x4"), "é\\x4".as_bytes());
        assert_eq!(unescape("\\0\\xg1"), b"\\0\\xg1".to_vec());
    }

    #[test]
    fn text_keeps_layout_and_escapes_the_rest() {
        assert!(matches!(
            escape_str("plain\ttext\n", Style::Text),
            Cow::Borrowed(_)
        ));
        assert_eq!(
            escape_str("a\x1b[2Jb\r\u{7f}\u{9b}\n", Style::Text),
            "a\\x1b[2Jb\\r\\x7f\\u{9b}\n"
        );
    }

    #[test]
    fn quoted_escapes_layout_quotes_and_invalid_bytes() {
        assert_eq!(
            escape_bytes(b"\"a\\\"\n\t\xe4\xb8", Style::Quoted),
            "\\\"a\\\\\\\"\\n\\t\\xe4\\xb8"
        );
        assert_eq!(escape_bytes("é x".as_bytes(), Style::Quoted), "é x");
    }
}
