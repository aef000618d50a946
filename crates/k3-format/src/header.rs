//! Streaming parse of a safetensors JSON header into compact raw entries.
//!
//! The header is parsed with serde visitors straight into a `Vec<RawEntry>` whose names borrow
//! from the header text whenever they contain no escapes (zero-copy), and whose shapes live in
//! one shared `dims` pool. No `serde_json::Value` tree is ever built, so a 5,000-tensor header
//! costs a few hundred kilobytes transiently and nothing afterwards.

use crate::dtype::Dtype;
use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserializer;
use std::borrow::Cow;
use std::fmt;

/// A string that borrows from the input when it can.
pub(crate) struct CowStr<'de>(pub Cow<'de, str>);

impl<'de> de::Deserialize<'de> for CowStr<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_str(CowStrVisitor)
    }
}

struct CowStrVisitor;

impl<'de> Visitor<'de> for CowStrVisitor {
    type Value = CowStr<'de>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string")
    }
    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
        Ok(CowStr(Cow::Borrowed(v)))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok(CowStr(Cow::Owned(v.to_owned())))
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
        Ok(CowStr(Cow::Owned(v)))
    }
}

/// A dtype as written: known, or the unknown spelling kept for the error message.
#[derive(Debug)]
pub(crate) enum DtypeTok<'a> {
    Known(Dtype),
    Unknown(Cow<'a, str>),
}

/// One header entry before validation.
#[derive(Debug)]
pub(crate) struct RawEntry<'a> {
    pub name: Cow<'a, str>,
    pub dtype: DtypeTok<'a>,
    /// Start of this entry's dims in [`RawHeader::dims`].
    pub dims_at: usize,
    /// Number of dims (rank).
    pub rank: usize,
    pub start: u64,
    pub end: u64,
}

/// All entries of one header, `__metadata__` skipped.
#[derive(Debug, Default)]
pub(crate) struct RawHeader<'a> {
    pub entries: Vec<RawEntry<'a>>,
    pub dims: Vec<u64>,
}

impl RawHeader<'_> {
    /// The shape of entry `e`.
    pub fn shape(&self, e: &RawEntry<'_>) -> &[u64] {
        &self.dims[e.dims_at..e.dims_at + e.rank]
    }
}

/// Why a header did not parse.
#[derive(Debug)]
pub(crate) enum HeaderError {
    /// The header as a whole: not JSON, not an object, text after it.
    Json(serde_json::Error),
    /// One tensor's entry: its name and what is wrong with it (no JSON positions).
    Tensor { name: String, detail: String },
}

/// Where the parse is: the tensor entry and the field being read, for error messages.
#[derive(Default)]
struct Cursor<'de> {
    tensor: Option<Cow<'de, str>>,
    field: Option<&'static str>,
}

/// Parses header JSON text (already known to be UTF-8). A type or value error inside a
/// tensor's entry is reported as [`HeaderError::Tensor`], naming the tensor.
pub(crate) fn parse(text: &str) -> Result<RawHeader<'_>, HeaderError> {
    let mut out = RawHeader {
        entries: Vec::with_capacity(text.len() / 96),
        dims: Vec::with_capacity(text.len() / 48),
    };
    let mut at = Cursor::default();
    let mut de = serde_json::Deserializer::from_str(text);
    let parsed = HeaderSeed {
        out: &mut out,
        at: &mut at,
    }
    .deserialize(&mut de)
    .and_then(|()| de.end());
    match parsed {
        Ok(()) => Ok(out),
        Err(e) => Err(match at.tensor {
            Some(name) if e.classify() == serde_json::error::Category::Data => {
                HeaderError::Tensor {
                    name: name.into_owned(),
                    detail: describe(&e, at.field),
                }
            }
            _ => HeaderError::Json(e),
        }),
    }
}

/// The parser's message without its JSON position, after the field it is about.
fn describe(e: &serde_json::Error, field: Option<&str>) -> String {
    let full = e.to_string();
    let suffix = format!(" at line {} column {}", e.line(), e.column());
    let msg = full.strip_suffix(&suffix).unwrap_or(&full);
    match field {
        Some(f) => format!("`{f}`: {msg}"),
        None => msg.to_string(),
    }
}

struct HeaderSeed<'p, 'de> {
    out: &'p mut RawHeader<'de>,
    at: &'p mut Cursor<'de>,
}

impl<'de> DeserializeSeed<'de> for HeaderSeed<'_, 'de> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for HeaderSeed<'_, 'de> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object mapping tensor names to {dtype, shape, data_offsets}")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(CowStr(name)) = map.next_key::<CowStr<'de>>()? {
            if name == "__metadata__" {
                map.next_value::<IgnoredAny>()?;
                continue;
            }
            let dims_at = self.out.dims.len();
            self.at.tensor = Some(name.clone());
            let fields = map.next_value_seed(EntrySeed {
                dims: &mut self.out.dims,
                field: &mut self.at.field,
            })?;
            self.at.tensor = None;
            self.out.entries.push(RawEntry {
                name,
                dtype: fields.dtype,
                dims_at,
                rank: self.out.dims.len() - dims_at,
                start: fields.offsets.0,
                end: fields.offsets.1,
            });
        }
        Ok(())
    }
}

struct EntryFields<'a> {
    dtype: DtypeTok<'a>,
    offsets: (u64, u64),
}

struct EntrySeed<'p> {
    dims: &'p mut Vec<u64>,
    /// The field being read (`None` between fields), for error messages.
    field: &'p mut Option<&'static str>,
}

impl<'de> DeserializeSeed<'de> for EntrySeed<'_> {
    type Value = EntryFields<'de>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for EntrySeed<'_> {
    type Value = EntryFields<'de>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object {\"dtype\", \"shape\", \"data_offsets\"}")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut dtype = None;
        let mut shape_seen = false;
        let mut offsets = None;
        while let Some(CowStr(key)) = map.next_key::<CowStr<'de>>()? {
            match key.as_ref() {
                "dtype" if dtype.is_none() => {
                    *self.field = Some("dtype");
                    dtype = Some(map.next_value_seed(DtypeSeed)?);
                }
                "shape" if !shape_seen => {
                    *self.field = Some("shape");
                    shape_seen = true;
                    map.next_value_seed(ShapeSeed { dims: self.dims })?;
                }
                "data_offsets" if offsets.is_none() => {
                    *self.field = Some("data_offsets");
                    offsets = Some(map.next_value_seed(OffsetsSeed)?);
                }
                "dtype" | "shape" | "data_offsets" => {
                    return Err(de::Error::custom(format_args!("duplicate field `{key}`")));
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
            *self.field = None;
        }
        let dtype = dtype.ok_or_else(|| de::Error::missing_field("dtype"))?;
        if !shape_seen {
            return Err(de::Error::missing_field("shape"));
        }
        let offsets = offsets.ok_or_else(|| de::Error::missing_field("data_offsets"))?;
        Ok(EntryFields { dtype, offsets })
    }
}

/// A dtype string, known or not (an unknown one is refused later, by name).
struct DtypeSeed;

impl<'de> DeserializeSeed<'de> for DtypeSeed {
    type Value = DtypeTok<'de>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for DtypeSeed {
    type Value = DtypeTok<'de>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a dtype string such as \"BF16\"")
    }
    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
        Ok(dtype_tok(Cow::Borrowed(v)))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok(dtype_tok(Cow::Owned(v.to_owned())))
    }
}

fn dtype_tok(s: Cow<'_, str>) -> DtypeTok<'_> {
    match Dtype::parse(&s) {
        Some(d) => DtypeTok::Known(d),
        None => DtypeTok::Unknown(s),
    }
}

/// Which integer a [`UintSeed`] reads, for messages.
#[derive(Clone, Copy)]
enum Uint {
    Dim(usize),
    Start,
    End,
}

impl fmt::Display for Uint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Uint::Dim(i) => write!(f, "dimension {i}"),
            Uint::Start => f.write_str("start"),
            Uint::End => f.write_str("end"),
        }
    }
}

/// One non-negative integer of a shape or of `data_offsets`.
struct UintSeed(Uint);

impl<'de> DeserializeSeed<'de> for UintSeed {
    type Value = u64;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<u64, D::Error> {
        d.deserialize_u64(self)
    }
}

impl<'de> Visitor<'de> for UintSeed {
    type Value = u64;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a non-negative integer for {}", self.0)
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<u64, E> {
        Ok(v)
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<u64, E> {
        u64::try_from(v).map_err(|_| {
            E::custom(format_args!(
                "{} is {v}: it must be a non-negative integer",
                self.0
            ))
        })
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<u64, E> {
        let why = if v.fract() == 0.0 && v >= 0.0 {
            "larger than 2^64 - 1"
        } else {
            "not a non-negative integer"
        };
        Err(E::custom(format_args!("{} is {v:?}: {why}", self.0)))
    }
}

struct ShapeSeed<'p> {
    dims: &'p mut Vec<u64>,
}

impl<'de> DeserializeSeed<'de> for ShapeSeed<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for ShapeSeed<'_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a shape: an array of non-negative integers")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let mut i = 0usize;
        while let Some(d) = seq.next_element_seed(UintSeed(Uint::Dim(i)))? {
            self.dims.push(d);
            i += 1;
        }
        Ok(())
    }
}

/// `data_offsets`: exactly `[start, end]`.
struct OffsetsSeed;

impl<'de> DeserializeSeed<'de> for OffsetsSeed {
    type Value = (u64, u64);
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(u64, u64), D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for OffsetsSeed {
    type Value = (u64, u64);
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[start, end]: two non-negative integers")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(u64, u64), A::Error> {
        let few = || de::Error::custom("fewer than two numbers: it must be [start, end]");
        let start = seq
            .next_element_seed(UintSeed(Uint::Start))?
            .ok_or_else(few)?;
        let end = seq
            .next_element_seed(UintSeed(Uint::End))?
            .ok_or_else(few)?;
        if seq.next_element::<IgnoredAny>()?.is_some() {
            return Err(de::Error::custom(
                "more than two numbers: it must be [start, end]",
            ));
        }
        Ok((start, end))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_entries_and_skips_metadata() {
        let text = r#"{"__metadata__":{"format":"pt"},
            "a":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,12]},
            "b\"q":{"shape":[],"data_offsets":[12,16],"dtype":"F32","extra":1}}"#;
        let h = parse(text).unwrap();
        assert_eq!(h.entries.len(), 2);
        assert!(matches!(h.entries[0].name, Cow::Borrowed("a")));
        assert_eq!(h.shape(&h.entries[0]), &[2, 3]);
        assert_eq!(h.entries[1].name, "b\"q");
        assert_eq!(h.entries[1].rank, 0);
        assert_eq!((h.entries[1].start, h.entries[1].end), (12, 16));
    }

    #[test]
    fn rejects_structural_defects() {
        for bad in [
            r#"[]"#,
            r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}} x"#,
            r#"{"a":{"dtype":"F32","#,
        ] {
            assert!(
                matches!(parse(bad), Err(HeaderError::Json(_))),
                "accepted {bad}"
            );
        }
    }

    /// Every defect inside one tensor's entry names the tensor and says what is wrong, in
    /// words and without JSON positions.
    #[test]
    fn per_tensor_defects_name_the_tensor() {
        for (bad, want) in [
            (
                r#"{"a":{"dtype":"F32","shape":[1]}}"#,
                "missing field `data_offsets`",
            ),
            (
                r#"{"a":{"dtype":"F32","data_offsets":[0,4]}}"#,
                "missing field `shape`",
            ),
            (
                r#"{"a":{"shape":[1],"data_offsets":[0,4]}}"#,
                "missing field `dtype`",
            ),
            (
                r#"{"a":{"dtype":"F32","shape":[1,-1],"data_offsets":[0,4]}}"#,
                "`shape`: dimension 1 is -1: it must be a non-negative integer",
            ),
            (
                r#"{"a":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}}"#,
                "`shape`: dimension 0 is 1.5: not a non-negative integer",
            ),
            (
                r#"{"a":{"dtype":"F32","shape":[18446744073709551616],"data_offsets":[0,4]}}"#,
                "larger than 2^64 - 1",
            ),
            (
                r#"{"a":{"dtype":"F32","shape":"1","data_offsets":[0,4]}}"#,
                "`shape`: invalid type: string \"1\", expected a shape: an array",
            ),
            (
                r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4,8]}}"#,
                "`data_offsets`: more than two numbers",
            ),
            (
                r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0]}}"#,
                "`data_offsets`: fewer than two numbers",
            ),
            (
                r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}}"#,
                "`data_offsets`: start is -4",
            ),
            (
                r#"{"a":{"dtype":"F32","dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#,
                "duplicate field `dtype`",
            ),
            (
                r#"{"a":{"dtype":7,"shape":[1],"data_offsets":[0,4]}}"#,
                "`dtype`: invalid type: integer `7`, expected a dtype string",
            ),
            (
                r#"{"a":1}"#,
                "invalid type: integer `1`, expected an object",
            ),
        ] {
            match parse(bad) {
                Err(HeaderError::Tensor { name, detail }) => {
                    assert_eq!(name, "a", "{bad}");
                    assert!(detail.contains(want), "{bad}: {detail}");
                    assert!(!detail.contains("line 1"), "{bad}: {detail}");
                }
                other => panic!("{bad}: {other:?}"),
            }
        }
    }
}
