//! The tile kernel of the AMX modes: one block of 32 weight rows × up to 32 tokens over all
//! of K, on AMX (`tdpbf16ps`) or emulated from the definition (docs/NUMERICS.md#numeric-mode-fast).
//!
//! Tiles (all 16 rows × 64 bytes): C `tmm0..3` = (rows 0–15, tokens 0–15), (rows 0–15,
//! tokens 16–31), (rows 16–31, tokens 0–15), (rows 16–31, tokens 16–31), f32; A `tmm4`,
//! `tmm5` = rows 0–15 / 16–31 × 32 bf16 columns, loaded straight from the weight rows; B
//! `tmm6`, `tmm7` = tokens 0–15 / 16–31 of one piece, row `k` holding each token's columns
//! `2k, 2k + 1` as a bf16 pair (the packed activations, one 1 KB tile per (token block,
//! column block, piece)). Per column block: load A, then per piece load B and issue up to
//! four `tdpbf16ps` — so every C element takes its blocks ascending and, per block, its
//! pieces in order: [`super::def::dot`]'s order.

use super::def::{flush, instr_wide, wide, ARITH, BLOCK};
use super::mode::NumericsError;

/// bf16 elements in one tile (16 rows × 32).
pub(crate) const TILE: usize = 512;
/// f32 elements in one C tile (16 × 16).
pub(crate) const CTILE: usize = 256;

/// Where the tile kernel runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// `tdpbf16ps` on AMX tiles (needs `fast::amx_usable`).
    Amx,
    /// The same blocks computed from [`super::def::instr`] (portable; for tests).
    Emu,
}

/// One block's operands: `w` holds 32 weight rows of bf16 bits, row `m` at `m · ws`, each
/// with `kbn · 32` readable columns; `xs[tb]` the packed activation tiles of token block `tb`
/// (`kbn · pieces` tiles, column block major); `nt` the number of token blocks (1 or 2).
pub(crate) struct Block<'a> {
    pub w: &'a [u16],
    pub ws: usize,
    pub kbn: usize,
    pub pieces: usize,
    pub xs: [&'a [u16]; 2],
    pub nt: usize,
    /// Rows and tokens of the block whose outputs are used (the emulation computes only
    /// these; the rest of `out` is unspecified).
    pub used: (usize, usize),
}

impl Block<'_> {
    fn check(&self) {
        assert!(
            self.kbn > 0 && (1..=2).contains(&self.nt),
            "tile block shape"
        );
        assert!(
            self.w.len() >= 31 * self.ws + self.kbn * BLOCK,
            "tile block weights"
        );
        let tiles = self.kbn * self.pieces * TILE;
        assert!(
            self.xs[..self.nt].iter().all(|x| x.len() >= tiles),
            "tile block activations"
        );
    }
}

/// Computes the block into `out` (C tile `2 · rb + tb` at `(2 · rb + tb) · 256`, element
/// (row `m`, token `n`) at `m · 16 + n`); tiles of absent token blocks are left as they were.
pub(crate) fn block(backend: Backend, b: &Block, out: &mut [f32; 4 * CTILE]) {
    b.check();
    match backend {
        Backend::Emu => emulate(b, out),
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the operands were checked above to cover every tile the kernel loads, and
        // `Backend::Amx` is only chosen after `enable_amx` succeeded.
        Backend::Amx => unsafe { amx::block(b, out) },
        #[cfg(not(target_arch = "x86_64"))]
        Backend::Amx => panic!("AMX tiles exist on x86-64 only"),
    }
}

/// [`block`] from the definition: the same tiles read, the same instruction order; each
/// tile element widened once.
fn emulate(b: &Block, out: &mut [f32; 4 * CTILE]) {
    let mut c = [[0.0f32; CTILE]; 4];
    let wide_flushed = |v: u16| flush(wide(v));
    for kb in 0..b.kbn {
        // A rows of both row blocks: [32][32].
        let a: Vec<[f32; BLOCK]> = (0..32)
            .map(|m| std::array::from_fn(|i| wide_flushed(b.w[m * b.ws + kb * BLOCK + i])))
            .collect();
        for p in 0..b.pieces {
            for tb in 0..b.nt {
                let xt = &b.xs[tb][(kb * b.pieces + p) * TILE..][..TILE];
                let cols: Vec<[f32; BLOCK]> = (0..16)
                    .map(|n| {
                        std::array::from_fn(|i| wide_flushed(xt[(i / 2) * 32 + n * 2 + i % 2]))
                    })
                    .collect();
                let tokens = b.used.1.saturating_sub(16 * tb).min(16);
                for rb in 0..2 {
                    for m in 0..b.used.0.saturating_sub(16 * rb).min(16) {
                        for (n, x) in cols.iter().enumerate().take(tokens) {
                            let e = &mut c[2 * rb + tb][m * 16 + n];
                            *e = instr_wide(ARITH, *e, &a[16 * rb + m], x);
                        }
                    }
                }
            }
        }
    }
    for (i, tile) in c.iter().enumerate() {
        if i % 2 < b.nt {
            out[i * CTILE..(i + 1) * CTILE].copy_from_slice(tile);
        }
    }
}

/// Asks Linux, once per process, for the AMX tile data state; the answer is cached.
pub(crate) fn enable_amx(mode: &'static str) -> Result<(), NumericsError> {
    use crate::probe::{amx_bf16, Amx};
    use std::sync::OnceLock;
    static ASKED: OnceLock<Result<(), i32>> = OnceLock::new();
    match amx_bf16() {
        Amx::NotOnCpu => {
            return Err(NumericsError::NoAmx {
                mode,
                why: "no AMX-BF16 on this CPU",
            });
        }
        Amx::NotEnabledByOs => {
            let why = "AMX on the CPU but the OS has not enabled the tile state";
            return Err(NumericsError::NoAmx { mode, why });
        }
        Amx::Available => {}
    }
    match *ASKED.get_or_init(request_tile_state) {
        Ok(()) => Ok(()),
        Err(errno) => Err(NumericsError::Refused { mode, errno }),
    }
}

/// `arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)` (Linux ≥ 5.16): the permission a
/// process needs before its first tile instruction (docs.kernel.org, "Using XSTATE features
/// in user space applications").
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn request_tile_state() -> Result<(), i32> {
    const ARCH_REQ_XCOMP_PERM: libc::c_ulong = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_ulong = 18;
    // SAFETY: a plain system call with integer arguments; it only changes this process's
    // permitted XSAVE features.
    let r = unsafe {
        libc::syscall(
            libc::SYS_arch_prctl,
            ARCH_REQ_XCOMP_PERM,
            XFEATURE_XTILEDATA,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(-1))
    }
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
fn request_tile_state() -> Result<(), i32> {
    // ENOSYS: only Linux on x86-64 is known to grant the tile state this way.
    Err(38)
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod amx {
    //! The AMX kernel: each instruction its own `asm!` (the compiler never uses tile
    //! registers itself, so they keep their contents between the statements).
    use super::{Block, BLOCK, CTILE, TILE};
    use std::arch::asm;

    /// Palette 1; tiles 0–7 all 16 rows × 64 bytes.
    #[repr(C, align(64))]
    struct TileConfig([u8; 64]);

    static CONFIG: TileConfig = TileConfig({
        let mut c = [0u8; 64];
        c[0] = 1;
        let mut t = 0;
        while t < 8 {
            c[16 + 2 * t] = 64;
            c[48 + t] = 16;
            t += 1;
        }
        c
    });

    macro_rules! load {
        ($tmm:literal, $ptr:expr, $stride:expr) => {
            asm!(concat!("tileloadd ", $tmm, ", [{p} + {s}*1]"), p = in(reg) $ptr,
                 s = in(reg) $stride, options(nostack, readonly, preserves_flags))
        };
    }
    macro_rules! dp {
        ($c:literal, $a:literal, $b:literal) => {
            asm!(
                concat!("tdpbf16ps ", $c, ", ", $a, ", ", $b),
                options(nostack, nomem, preserves_flags)
            )
        };
    }
    macro_rules! store {
        ($tmm:literal, $ptr:expr) => {
            asm!(concat!("tilestored [{p} + {s}*1], ", $tmm), p = in(reg) $ptr,
                 s = in(reg) 64usize, options(nostack, preserves_flags))
        };
    }

    /// One `tdpbf16ps` on 16 × 16 tiles: `c += a · b` (`a` 16 rows × 32 bf16, `b` 16 rows
    /// of 16 bf16 pairs), for the semantics probe.
    ///
    /// # Safety
    /// AMX must be usable (`fast::amx_usable`).
    pub unsafe fn one_instruction(c: &mut [f32; CTILE], a: &[u16; TILE], b: &[u16; TILE]) {
        asm!("ldtilecfg [{}]", in(reg) CONFIG.0.as_ptr(), options(nostack, readonly, preserves_flags));
        load!("tmm0", c.as_ptr(), 64usize);
        load!("tmm4", a.as_ptr(), 64usize);
        load!("tmm6", b.as_ptr(), 64usize);
        dp!("tmm0", "tmm4", "tmm6");
        store!("tmm0", c.as_mut_ptr());
        asm!("tilerelease", options(nostack, nomem, preserves_flags));
    }

    /// The block on AMX tiles (module docs of `tiles`).
    ///
    /// # Safety
    /// AMX must be usable, and `b` must pass `Block::check`.
    pub(crate) unsafe fn block(b: &Block, out: &mut [f32; 4 * CTILE]) {
        let wstride = b.ws * 2;
        asm!("ldtilecfg [{}]", in(reg) CONFIG.0.as_ptr(), options(nostack, readonly, preserves_flags));
        asm!(
            "tilezero tmm0",
            "tilezero tmm1",
            "tilezero tmm2",
            "tilezero tmm3",
            options(nostack, nomem, preserves_flags)
        );
        let (w, x0, x1) = (b.w.as_ptr(), b.xs[0].as_ptr(), b.xs[1].as_ptr());
        for kb in 0..b.kbn {
            load!("tmm4", w.add(kb * BLOCK), wstride);
            load!("tmm5", w.add(16 * b.ws + kb * BLOCK), wstride);
            for p in 0..b.pieces {
                let t = (kb * b.pieces + p) * TILE;
                load!("tmm6", x0.add(t), 64usize);
                dp!("tmm0", "tmm4", "tmm6");
                dp!("tmm2", "tmm5", "tmm6");
                if b.nt == 2 {
                    load!("tmm7", x1.add(t), 64usize);
                    dp!("tmm1", "tmm4", "tmm7");
                    dp!("tmm3", "tmm5", "tmm7");
                }
            }
        }
        let o = out.as_mut_ptr();
        store!("tmm0", o);
        store!("tmm2", o.add(2 * CTILE));
        if b.nt == 2 {
            store!("tmm1", o.add(CTILE));
            store!("tmm3", o.add(3 * CTILE));
        }
        asm!("tilerelease", options(nostack, nomem, preserves_flags));
    }
}
