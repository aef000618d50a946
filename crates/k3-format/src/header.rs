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

/// Parses header JSON text (already known to be UTF-8).
pub(crate) fn parse(text: &str) -> Result<RawHeader<'_>, serde_json::Error> {
    let mut out = RawHeader {
        entries: Vec::with_capacity(text.len() / 96),
        dims: Vec::with_capacity(text.len() / 48),
    };
    let mut de = serde_json::Deserializer::from_str(text);
    HeaderSeed { out: &mut out }.deserialize(&mut de)?;
    de.end()?;
    Ok(out)
}

struct HeaderSeed<'p, 'de> {
    out: &'p mut RawHeader<'de>,
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
            let fields = map.next_value_seed(EntrySeed {
                dims: &mut self.out.dims,
            })?;
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
        f.write_str("a tensor entry {\"dtype\", \"shape\", \"data_offsets\"}")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut dtype = None;
        let mut shape_seen = false;
        let mut offsets = None;
        while let Some(CowStr(key)) = map.next_key::<CowStr<'de>>()? {
            match key.as_ref() {
                "dtype" if dtype.is_none() => {
                    let CowStr(s) = map.next_value::<CowStr<'de>>()?;
                    dtype = Some(match Dtype::parse(&s) {
                        Some(d) => DtypeTok::Known(d),
                        None => DtypeTok::Unknown(s),
                    });
                }
                "shape" if !shape_seen => {
                    shape_seen = true;
                    map.next_value_seed(ShapeSeed { dims: self.dims })?;
                }
                "data_offsets" if offsets.is_none() => {
                    offsets = Some(map.next_value::<(u64, u64)>()?);
                }
                "dtype" | "shape" | "data_offsets" => {
                    return Err(de::Error::custom(format_args!("duplicate field `{key}`")));
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        let dtype = dtype.ok_or_else(|| de::Error::missing_field("dtype"))?;
        if !shape_seen {
            return Err(de::Error::missing_field("shape"));
        }
        let offsets = offsets.ok_or_else(|| de::Error::missing_field("data_offsets"))?;
        Ok(EntryFields { dtype, offsets })
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
        while let Some(d) = seq.next_element::<u64>()? {
            self.dims.push(d);
        }
        Ok(())
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
            r#"{"a":{"dtype":"F32","shape":[1]}}"#,
            r#"{"a":{"dtype":"F32","data_offsets":[0,4]}}"#,
            r#"{"a":{"shape":[1],"data_offsets":[0,4]}}"#,
            r#"{"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}}"#,
            r#"{"a":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}}"#,
            r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4,8]}}"#,
            r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0]}}"#,
            r#"{"a":{"dtype":"F32","dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#,
            r#"{"a":{"dtype":7,"shape":[1],"data_offsets":[0,4]}}"#,
            r#"{"a":1}"#,
            r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}} x"#,
        ] {
            assert!(parse(bad).is_err(), "accepted {bad}");
        }
    }
}
