//! AVX2 + FMA paths for f32 and bf16 rows, and the GEMM microkernel of every storage.
//!
//! The 16 f32 lanes of one dot live in two `ymm` in natural order (`[0]` = lanes 0..8, `[1]`
//! = lanes 8..16); every update is `_mm256_fmadd_ps`, i.e. the scalar `f32::mul_add`. The
//! kernels return the lanes; the caller applies the scalar tree (`dot::reduce16`).

use std::arch::x86_64::*;

/// Two vectors: 16 consecutive lanes.
pub(super) type V16 = [__m256; 2];

/// A weight element of a 16-lane row: f32, or bf16 as raw bits.
pub(super) trait Ld16: Copy {
    /// The padding weight of a partial last block: `−0` (its product with the `+0`
    /// activation padding is `−0`, which leaves a lane's bits unchanged).
    const PAD: Self;
    /// The activation padding of a partial last block: `+0`, or `−0` where `PAD` widens to
    /// `+0` (int8), so the padded product is `−0` either way.
    const XPAD: f32 = 0.0;
    /// Mat-vec software prefetch distance, in elements of each row.
    const PF_DIST: usize = 512;
    /// The mat-vec kernels prefetch once per this many elements (one cache line or less).
    const PF_STEP: usize = 16;
    /// # Safety
    /// 16 elements readable at `p`; the CPU has AVX2 and FMA.
    unsafe fn ld16(p: *const Self) -> V16;
}

impl Ld16 for f32 {
    const PAD: f32 = -0.0;
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn ld16(p: *const f32) -> V16 {
        // SAFETY: the caller guarantees 16 readable f32 at `p`; unaligned loads.
        unsafe { [_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8))] }
    }
}

impl Ld16 for u16 {
    const PAD: u16 = 0x8000;
    /// bf16 bits zero-extended to 32 bits and shifted into the high half: exact.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn ld16(p: *const u16) -> V16 {
        // SAFETY: the caller guarantees 16 readable u16 (32 bytes) at `p`; unaligned loads.
        let (a, b) = unsafe { (_mm_loadu_si128(p.cast()), _mm_loadu_si128(p.add(8).cast())) };
        [bf16x8(a), bf16x8(b)]
    }
}

impl Ld16 for i8 {
    const PAD: i8 = 0;
    const XPAD: f32 = -0.0;
    const PF_DIST: usize = PF_DIST_Q8;
    const PF_STEP: usize = 64;
    /// int8 sign-extended to 32 bits (`vpmovsxbd`) and converted (`vcvtdq2ps`): exact.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn ld16(p: *const i8) -> V16 {
        // SAFETY: the caller guarantees 16 readable bytes at `p`; unaligned 8-byte loads.
        let (a, b) = unsafe { (_mm_loadl_epi64(p.cast()), _mm_loadl_epi64(p.add(8).cast())) };
        [
            _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(a)),
            _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)),
        ]
    }
}

/// Eight bf16 bits → eight f32 (`bits << 16`).
#[inline]
#[target_feature(enable = "avx2,fma")]
fn bf16x8(v: __m128i) -> __m256 {
    _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(v)))
}

/// The 16 lanes held in `v`, in register order.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) fn store16(v: V16) -> [f32; 16] {
    let mut out = [0f32; 16];
    // SAFETY: `out` has room for 16 f32; unaligned stores.
    unsafe {
        _mm256_storeu_ps(out.as_mut_ptr(), v[0]);
        _mm256_storeu_ps(out.as_mut_ptr().add(8), v[1]);
    }
    out
}

/// Mat-vec prefetch distance of int8 rows, in elements (= bytes).
const PF_DIST_Q8: usize = 1024;

/// The 16 lanes (natural order) of `R` weight rows dotted with one activation row `x` (the
/// mat-vec kernel: `x` is loaded once per block and shared by the rows). Every `ws[r]` must
/// have `x.len()` elements (checked by the dispatcher; a shorter row only shortens the dot).
#[target_feature(enable = "avx2,fma")]
pub(super) fn rows16<W: Ld16, const R: usize>(ws: [&[W]; R], x: &[f32]) -> [[f32; 16]; R] {
    let n = ws.iter().fold(x.len(), |m, w| m.min(w.len()));
    let full = n / 16 * 16;
    let mut acc = [[_mm256_setzero_ps(); 2]; R];
    let mut i = 0;
    while i < full {
        // SAFETY: `i + 16 <= full <= n <= x.len()`.
        let xv = unsafe { f32::ld16(x.as_ptr().add(i)) };
        for (a, w) in acc.iter_mut().zip(&ws) {
            // A hint only (never dereferenced): past the row's end it points into the same
            // row of the next block of `R` (a matrix's rows are contiguous), so the next
            // block's rows are on their way before it starts.
            let ahead = i + W::PF_DIST;
            let skip = if ahead < n { 0 } else { (R - 1) * n };
            if i % W::PF_STEP == 0 {
                _mm_prefetch::<_MM_HINT_T0>(w.as_ptr().wrapping_add(ahead + skip).cast());
            }
            // SAFETY: `i + 16 <= full <= n <= w.len()`.
            let wv = unsafe { W::ld16(w.as_ptr().add(i)) };
            a[0] = _mm256_fmadd_ps(wv[0], xv[0], a[0]);
            a[1] = _mm256_fmadd_ps(wv[1], xv[1], a[1]);
        }
        i += 16;
    }
    if full < n {
        let mut xb = [W::XPAD; 16];
        xb[..n - full].copy_from_slice(&x[full..n]);
        // SAFETY: `xb` holds 16 f32.
        let xv = unsafe { f32::ld16(xb.as_ptr()) };
        for (a, w) in acc.iter_mut().zip(&ws) {
            let mut wb = [W::PAD; 16];
            wb[..n - full].copy_from_slice(&w[full..n]);
            // SAFETY: `wb` holds 16 elements.
            let wv = unsafe { W::ld16(wb.as_ptr()) };
            a[0] = _mm256_fmadd_ps(wv[0], xv[0], a[0]);
            a[1] = _mm256_fmadd_ps(wv[1], xv[1], a[1]);
        }
    }
    acc.map(|v| store16(v))
}

/// Widens the bf16 bits `src` into `dst` in the GEMM's halves order ([`widen`]).
#[target_feature(enable = "avx2,fma")]
pub(super) fn widen_bf16(src: &[u16], dst: &mut [f32]) {
    widen(src, dst)
}

/// Widens the int8 values `src` into `dst` in halves order ([`widen`]).
#[target_feature(enable = "avx2,fma")]
pub(super) fn widen_q8(src: &[i8], dst: &mut [f32]) {
    widen(src, dst)
}

/// Copies the f32 `src` into `dst` in halves order ([`widen`]).
#[target_feature(enable = "avx2,fma")]
pub(super) fn copy_f32(src: &[f32], dst: &mut [f32]) {
    widen(src, dst)
}

/// [`widen_bf16`] / [`widen_q8`] / [`copy_f32`]: `src` (one panel chunk, `n = src.len()` a
/// multiple of 16, `dst.len() == n`; checked by the caller, a violation only shortens the
/// copy) widened into the GEMM's **halves** order (docs/NUMERICS.md#gemm): register positions
/// 0..8 of 16-element step `s` at `dst[8s ..]`, positions 8..16 at `dst[n/2 + 8s ..]`, so
/// each of the microkernel's two passes ([`micro`]) reads one contiguous half.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn widen<W: Ld16>(src: &[W], dst: &mut [f32]) {
    let n = src.len().min(dst.len()) / 16 * 16;
    let half = n / 2;
    let mut i = 0;
    while i < n {
        // SAFETY: `i + 16 <= n` elements of `src` are in bounds; `i / 2 + 8 <= half` and
        // `half + i / 2 + 8 <= n` f32 of `dst` are.
        unsafe {
            let v = W::ld16(src.as_ptr().add(i));
            _mm256_storeu_ps(dst.as_mut_ptr().add(i / 2), v[0]);
            _mm256_storeu_ps(dst.as_mut_ptr().add(half + i / 2), v[1]);
        }
        i += 16;
    }
}

/// `dot::reduce16` of the 16 lanes stored at `p` in register order (`layout`: natural, or
/// the MXFP4 [`super::avx2_mx::Q16`] order), with the tree's additions done four or eight at
/// a time: the same pairs in the same order as the scalar tree, so the same bits.
///
/// Natural: `b = v0 + v1` (lane `j` + lane `j+8`), then the low and high 128 bits, then
/// `c0 + c2, c1 + c3`, then their sum. Q16: lane `l` sits at register position
/// `4·(l % 4) + l / 4`, so lane `j + 8` is 2 positions after lane `j`, `b[j + 4]` one after
/// `b[j]`, and `c[j + 2]` 8 after `c[j]`: two in-lane shuffles, then one cross add.
///
/// # Safety
/// The CPU has AVX2 and FMA; 16 f32 are readable at `p`.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn reduce16_at(layout: super::layout::Layout, p: *const f32) -> f32 {
    // SAFETY: 16 readable f32 at `p` (caller); unaligned loads.
    let (v0, v1) = unsafe { (_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8))) };
    reduce16_v(layout, v0, v1)
}

/// [`reduce16_at`] of the lanes held in `v0` (register positions 0..8) and `v1` (8..16).
#[inline]
#[target_feature(enable = "avx2,fma")]
fn reduce16_v(layout: super::layout::Layout, v0: __m256, v1: __m256) -> f32 {
    match layout {
        super::layout::Layout::Natural => {
            let b = _mm256_add_ps(v0, v1);
            let c = _mm_add_ps(_mm256_castps256_ps128(b), _mm256_extractf128_ps::<1>(b));
            let d = _mm_add_ps(c, _mm_movehl_ps(c, c));
            _mm_cvtss_f32(_mm_add_ss(d, _mm_movehdup_ps(d)))
        }
        super::layout::Layout::Q16 => {
            // Positions p % 4 ∈ {0, 1} of each 128-bit half: lane j + lane j + 8.
            let b0 = _mm256_add_ps(v0, _mm256_permute_ps::<0b01_00_11_10>(v0));
            let b1 = _mm256_add_ps(v1, _mm256_permute_ps::<0b01_00_11_10>(v1));
            // Positions 0 and 4 of each vector: c[j] = b[j] + b[j + 4].
            let c0 = _mm256_add_ps(b0, _mm256_permute_ps::<0b10_11_00_01>(b0));
            let c1 = _mm256_add_ps(b1, _mm256_permute_ps::<0b10_11_00_01>(b1));
            // d0 = c0 + c2 at position 0, d1 = c1 + c3 at position 4.
            let d = _mm256_add_ps(c0, c1);
            let (lo, hi) = (_mm256_castps256_ps128(d), _mm256_extractf128_ps::<1>(d));
            _mm_cvtss_f32(_mm_add_ss(lo, hi))
        }
    }
}

/// Rows per GEMM microkernel call.
pub(super) const MR: usize = 4;
/// Most tokens per GEMM microkernel call. The kernel adds the two 8-lane halves of every
/// (row, token) in two passes over the chunk — a lane's sum never meets another lane's before
/// the tree, so the halves are independent — reading each pass's half of the panel rows and
/// activations contiguously (the chunk's halves order, [`widen`]). 4 × 3 one-`ymm`
/// accumulators, the 3 activation vectors and one weight vector fill the 16 `ymm`, and each
/// step loads 7 vectors for 12 FMAs. The full-width 2 × 3 tile it replaced loaded
/// 16: its activations were memory operands, read once per row (L1-resident kernels alone,
/// Zen 4, 1 thread: 2 × 3 full-width 70 %, 2 × 6 halves interleaved 73 %, 2 × 6 halves
/// ordered 80 %, 4 × 3 halves ordered 82–88 % of the FMA peak;
/// docs/PERFORMANCE.md#gemm-design-what-is-kept-and-why).
pub(super) const TB: usize = 3;

/// The GEMM microkernel: for `M` f32 weight rows `w[r]` and `N` activation rows at
/// `x + t·xs` (both one chunk of `kc` columns in the level's lane layout and the halves
/// order, [`widen`]), adds the chunk to the 16 lanes (register order) held at
/// `st + r·ss + 16t`. With `done` (the chunk ends its rows) the lanes are reduced in
/// registers instead and each (row, token) output written to `done`'s slot.
///
/// # Safety
/// The CPU has AVX2 and FMA; `kc` is a multiple of 16; `kc` f32 are readable at every `w[r]`
/// and every `x + t·xs`; 16 f32 are readable and writable at every `st + r·ss + 16t`, and
/// those state slots do not overlap each other or the inputs.
#[allow(clippy::too_many_arguments)]
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn micro<const M: usize, const N: usize>(
    w: [*const f32; M],
    x: *const f32,
    xs: usize,
    kc: usize,
    st: *mut f32,
    ss: usize,
    fresh: bool,
    mut pf: super::gemm::plan::Spread<'_>,
    done: Option<super::gemm::plan::Done>,
) {
    let half = kc / 2;
    // Pass `h`: register positions `8h .. 8h + 8` of every lane set, read at `h · kc/2 ..`
    // of the panel and activations.
    for h in 0..2 {
        let mut acc = [[_mm256_setzero_ps(); N]; M];
        // A fresh state (the first chunk) starts at +0, the lanes' initial value.
        if !fresh {
            for (r, ar) in acc.iter_mut().enumerate() {
                for (t, a) in ar.iter_mut().enumerate() {
                    // SAFETY: 16 readable f32 at `st + r·ss + 16t` (caller).
                    *a = unsafe { _mm256_loadu_ps(st.wrapping_add(r * ss + 16 * t + 8 * h)) };
                }
            }
        }
        let (w, x) = (
            w.map(|p| p.wrapping_add(h * half)),
            x.wrapping_add(h * half),
        );
        let mut k = 0;
        while k < half {
            pf.tick();
            // SAFETY: `h·half + k + 8 <= kc` f32 are readable at every `w[r]` and
            // `x + t·xs` (caller).
            unsafe { step(&mut acc, &w, x, xs, k) };
            k += 8;
        }
        for (r, ar) in acc.iter().enumerate() {
            for (t, &a) in ar.iter().enumerate() {
                let s = st.wrapping_add(r * ss + 16 * t);
                match done {
                    // The row's last chunk: the tree of its 16 lanes, positions 0..8 from
                    // the state (pass 0) and 8..16 still in `a`; the output goes to `done`.
                    // SAFETY: 8 readable f32 at `s`, the output slot writable (caller).
                    Some(d) if h == 1 => unsafe {
                        d.at(r, t).write(reduce16_v(d.lay, _mm256_loadu_ps(s), a))
                    },
                    // SAFETY: 16 writable f32 at `s`, not aliased (caller).
                    _ => unsafe { _mm256_storeu_ps(s.wrapping_add(8 * h), a) },
                }
            }
        }
    }
    pf.finish();
}

/// One 8-column step of [`micro`]'s passes: `acc[r][t] += w[r][k..k+8] · x[t][k..k+8]`, the `N`
/// activation vectors loaded once and each weight vector once.
///
/// # Safety
/// The CPU has AVX2 and FMA; 8 f32 readable at every `w[r] + k` and `x + t·xs + k`.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn step<const M: usize, const N: usize>(
    acc: &mut [[__m256; N]; M],
    w: &[*const f32; M],
    x: *const f32,
    xs: usize,
    k: usize,
) {
    let mut xv = [_mm256_setzero_ps(); N];
    for (t, v) in xv.iter_mut().enumerate() {
        // SAFETY: 8 readable f32 at `x + t·xs + k` (caller).
        *v = unsafe { _mm256_loadu_ps(x.wrapping_add(t * xs + k)) };
    }
    for (ar, &wr) in acc.iter_mut().zip(w) {
        // SAFETY: 8 readable f32 at `w[r] + k` (caller).
        let wv = unsafe { _mm256_loadu_ps(wr.wrapping_add(k)) };
        for (a, &xt) in ar.iter_mut().zip(&xv) {
            *a = _mm256_fmadd_ps(wv, xt, *a);
        }
    }
}
