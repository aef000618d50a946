"""MXFP4 (OCP MX FP4) decode / encode for the routed experts (docs/MODEL.md#mxfp4).

packed[rows][cols/2] U8: two E2M1 codes per byte, LOW nibble = EVEN element.
scales[rows][cols/32] U8 E8M0: multiplier 2^(s-127); s = 255 (NaN in the OCP spec) -> 0.
value = E2M1[nibble] * E8M0[scale of group i // 32].
"""
import numpy as np

GROUP = 32
# index = 4-bit code, bit 3 = sign (docs/MODEL.md#mxfp4)
E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                 -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], dtype=np.float64)


def e8m0_to_float(s):
    """E8M0 byte(s) -> float64 multiplier; 255 -> 0 (group contributes nothing)."""
    s = np.asarray(s, dtype=np.int64)
    v = np.ldexp(1.0, s - 127)  # exact in float64 (s = 0 -> 2^-127)
    return np.where(s == 255, 0.0, v)


def unpack_codes(packed, swap_nibbles=False):
    """packed [rows, cols/2] u8 -> codes [rows, cols]; low nibble is the even element."""
    packed = np.asarray(packed, dtype=np.uint8)
    lo = packed & 0x0F
    hi = packed >> 4
    if swap_nibbles:  # the classic bug: right values, wrong places
        lo, hi = hi, lo
    rows, half = packed.shape
    codes = np.empty((rows, half * 2), dtype=np.uint8)
    codes[:, 0::2] = lo
    codes[:, 1::2] = hi
    return codes


def dequantize(packed, scales, swap_nibbles=False):
    """packed [rows, cols/2] u8, scales [rows, cols/32] u8 -> float64 [rows, cols]."""
    codes = unpack_codes(packed, swap_nibbles)                    # [rows, cols]
    rows, cols = codes.shape
    scales = np.asarray(scales, dtype=np.uint8)
    # group size check as the engine does it (docs/MODEL.md#routed-experts): scale.cols * 32 == packed.cols * 2
    assert scales.shape == (rows, cols // GROUP), (scales.shape, rows, cols)
    mult = np.repeat(e8m0_to_float(scales), GROUP, axis=1)        # [rows, cols]
    return E2M1[codes] * mult


def quantize(w, rng=None):
    """float matrix [rows, cols] -> (packed u8 [rows, cols/2], scales u8 [rows, cols/32]).
    Per 32-group: s = smallest E8M0 with max|w| / 2^(s-127) <= 6, codes = nearest E2M1
    (ties to the lower magnitude). Deterministic; used only by the fixture generator."""
    w = np.asarray(w, dtype=np.float64)
    rows, cols = w.shape
    assert cols % GROUP == 0
    g = w.reshape(rows, cols // GROUP, GROUP)
    amax = np.abs(g).max(axis=2)                                   # [rows, ngroups]
    amax = np.where(amax > 0, amax, 1.0)
    s = np.ceil(np.log2(amax / 6.0)).astype(np.int64) + 127
    s = np.clip(s, 1, 254)
    scale = np.ldexp(1.0, s - 127)[:, :, None]                     # [rows, ngroups, 1]
    mag = np.abs(g) / scale                                        # in [0, 6]
    pos = E2M1[:8]                                                 # non-negative values
    idx = np.abs(mag[..., None] - pos).argmin(axis=-1)             # nearest (lowest on tie)
    codes = idx + np.where(g < 0, 8, 0)                            # sign bit 3
    codes = codes.reshape(rows, cols).astype(np.uint8)
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)
    return packed, s.astype(np.uint8)
