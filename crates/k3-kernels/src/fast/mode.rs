//! The numeric modes ([`Numerics`]) and why one cannot be switched on ([`NumericsError`]).
//! A leaf: it imports nothing of the crate.

/// A numeric mode: which arithmetic the weight products use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Numerics {
    /// Contract v2 (docs/NUMERICS.md#row-dot-contract-v2), the default: the same bits on
    /// every machine and level.
    V2,
    /// bf16 and MXFP4 weight products on AMX tiles, each activation cut into `pieces` bf16
    /// pieces (1..=3). `pieces: 3` is the mode `fast`; 1 and 2 exist for measurements
    /// (docs/NUMERICS.md#numeric-mode-fast: their logits leave the oracle tolerance).
    Amx { pieces: u8 },
}

impl Numerics {
    /// The opt-in mode: AMX tiles, three pieces.
    pub const FAST: Numerics = Numerics::Amx { pieces: 3 };

    /// The name used by `--numerics` and in reports: `v2`, `fast`, `amx-bf16x1`, `amx-bf16x2`.
    pub fn name(self) -> &'static str {
        match self {
            Numerics::V2 => "v2",
            Numerics::Amx { pieces: 3 } => "fast",
            Numerics::Amx { pieces: 2 } => "amx-bf16x2",
            Numerics::Amx { .. } => "amx-bf16x1",
        }
    }

    /// Parses a [`Numerics::name`] (`amx-bf16x3` is `fast`); `None` for anything else.
    pub fn parse(s: &str) -> Option<Numerics> {
        match s {
            "v2" => Some(Numerics::V2),
            "fast" | "amx-bf16x3" => Some(Numerics::FAST),
            "amx-bf16x2" => Some(Numerics::Amx { pieces: 2 }),
            "amx-bf16x1" => Some(Numerics::Amx { pieces: 1 }),
            _ => None,
        }
    }

    /// The mode of a [`Numerics::code`].
    pub fn from_code(code: u8) -> Numerics {
        match code {
            0 => Numerics::V2,
            pieces => Numerics::Amx { pieces },
        }
    }

    /// A small code for fingerprints and session files (0 = v2, else the piece count).
    pub fn code(self) -> u8 {
        match self {
            Numerics::V2 => 0,
            Numerics::Amx { pieces } => pieces,
        }
    }
}

/// Why a numeric mode cannot be switched on here.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NumericsError {
    /// The CPU or OS has no AMX-BF16 tiles.
    #[error("numeric mode {mode} needs AMX-BF16 tiles, and this machine has {why}; run without --numerics (contract v2)")]
    NoAmx {
        mode: &'static str,
        why: &'static str,
    },
    /// Linux refused the tile data state to this process.
    #[error("numeric mode {mode}: Linux refused the AMX tile state (arch_prctl ARCH_REQ_XCOMP_PERM failed, errno {errno}); run without --numerics (contract v2)")]
    Refused { mode: &'static str, errno: i32 },
    /// A piece count outside 1..=3.
    #[error("numeric mode with {0} bf16 pieces: only 1, 2 or 3 exist")]
    Pieces(u8),
}
