//! Safetensors element types.
//!
//! Every dtype the safetensors format defines with a whole-byte element is *parsed* (so a shard
//! holding, say, `I64` position ids still indexes); the binder decides which ones a tensor may
//! use. A dtype string not listed here is an integrity error at index time.

use std::fmt;

/// Element type of a tensor, as spelled in a safetensors header.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Dtype {
    /// IEEE binary16 with an 8-bit exponent ("brain float").
    BF16,
    /// IEEE binary16.
    F16,
    /// IEEE binary32.
    F32,
    /// IEEE binary64.
    F64,
    /// Unsigned byte (MXFP4 nibble pairs and E8M0 scales in K3).
    U8,
    /// Signed byte.
    I8,
    /// Unsigned 16-bit integer.
    U16,
    /// Signed 16-bit integer.
    I16,
    /// Unsigned 32-bit integer.
    U32,
    /// Signed 32-bit integer.
    I32,
    /// Unsigned 64-bit integer.
    U64,
    /// Signed 64-bit integer.
    I64,
    /// One byte per boolean.
    BOOL,
    /// FP8 with 4 exponent bits.
    F8E4M3,
    /// FP8 with 5 exponent bits.
    F8E5M2,
    /// E8M0 exponent-only byte.
    F8E8M0,
}

impl Dtype {
    /// Parses the header spelling (`"BF16"`, `"F8_E4M3"`, …); `None` for anything else.
    pub fn parse(s: &str) -> Option<Dtype> {
        Some(match s {
            "BF16" => Dtype::BF16,
            "F16" => Dtype::F16,
            "F32" => Dtype::F32,
            "F64" => Dtype::F64,
            "U8" => Dtype::U8,
            "I8" => Dtype::I8,
            "U16" => Dtype::U16,
            "I16" => Dtype::I16,
            "U32" => Dtype::U32,
            "I32" => Dtype::I32,
            "U64" => Dtype::U64,
            "I64" => Dtype::I64,
            "BOOL" => Dtype::BOOL,
            "F8_E4M3" => Dtype::F8E4M3,
            "F8_E5M2" => Dtype::F8E5M2,
            "F8_E8M0" => Dtype::F8E8M0,
            _ => return None,
        })
    }

    /// The header spelling.
    pub fn name(self) -> &'static str {
        match self {
            Dtype::BF16 => "BF16",
            Dtype::F16 => "F16",
            Dtype::F32 => "F32",
            Dtype::F64 => "F64",
            Dtype::U8 => "U8",
            Dtype::I8 => "I8",
            Dtype::U16 => "U16",
            Dtype::I16 => "I16",
            Dtype::U32 => "U32",
            Dtype::I32 => "I32",
            Dtype::U64 => "U64",
            Dtype::I64 => "I64",
            Dtype::BOOL => "BOOL",
            Dtype::F8E4M3 => "F8_E4M3",
            Dtype::F8E5M2 => "F8_E5M2",
            Dtype::F8E8M0 => "F8_E8M0",
        }
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Dtype::U8 | Dtype::I8 | Dtype::BOOL | Dtype::F8E4M3 | Dtype::F8E5M2 | Dtype::F8E8M0 => {
                1
            }
            Dtype::BF16 | Dtype::F16 | Dtype::U16 | Dtype::I16 => 2,
            Dtype::F32 | Dtype::U32 | Dtype::I32 => 4,
            Dtype::F64 | Dtype::U64 | Dtype::I64 => 8,
        }
    }

    /// Whether `to_f32_vec` can widen this dtype (BF16, F16, F32, U8).
    pub fn widens_to_f32(self) -> bool {
        matches!(self, Dtype::BF16 | Dtype::F16 | Dtype::F32 | Dtype::U8)
    }

    /// Dense index used by the compact index entries.
    pub(crate) fn code(self) -> u8 {
        self as u8
    }

    /// Inverse of [`Dtype::code`].
    pub(crate) fn from_code(c: u8) -> Dtype {
        const ALL: [Dtype; 16] = [
            Dtype::BF16,
            Dtype::F16,
            Dtype::F32,
            Dtype::F64,
            Dtype::U8,
            Dtype::I8,
            Dtype::U16,
            Dtype::I16,
            Dtype::U32,
            Dtype::I32,
            Dtype::U64,
            Dtype::I64,
            Dtype::BOOL,
            Dtype::F8E4M3,
            Dtype::F8E5M2,
            Dtype::F8E8M0,
        ];
        ALL[usize::from(c) % ALL.len()]
    }
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_roundtrip_and_codes() {
        for c in 0..16u8 {
            let d = Dtype::from_code(c);
            assert_eq!(d.code(), c);
            assert_eq!(Dtype::parse(d.name()), Some(d));
        }
        assert_eq!(Dtype::parse("bf16"), None);
        assert_eq!(Dtype::parse("F4"), None);
        assert_eq!(Dtype::BF16.size(), 2);
        assert_eq!(Dtype::I64.size(), 8);
    }
}
