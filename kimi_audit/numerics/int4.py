"""compressed-tensors pack-quantized INT weights in numpy: unpacking int32 words and group dequantization.

Kimi-K2-Thinking stores each routed expert projection [out, in] as `weight_packed` I32
[out, ceil(in * bits / 32)] (the bits of element i start at bit i * bits of its row, little-endian words,
so 4-bit codes are 8 nibbles per word, LSB first), each code stored offset-binary (q + 2^(bits-1)), with
one `weight_scale` per `group_size` inputs (BF16 [out, in / group_size]) and, for asymmetric schemes, a
`weight_zero_point` packed the same way along the output dimension.

* `unpack_int4` == compressed-tensors' ``unpack_from_int32(packed, num_bits, shape, packed_dim)``
  (compressors/pack_quantized/helpers.py): int8 codes in [-2^(bits-1), 2^(bits-1) - 1];
* `dequantize_group` == compressed-tensors' ``dequantize(q, scale, zero_point, args)`` for the group
  strategy (quantization/lifecycle/forward_helpers.py ``_dequantize``): ``q.to(scale.dtype)``, minus
  ``zero_point.to(scale.dtype)``, times the group's scale, all in the scale's dtype. Torch computes a
  bf16 / f16 product in float32 and rounds once; the codes, their differences (|q - z| <= 255) and the
  product of a code with a 16-bit scale are exact in float32, so the result is the float32 product
  rounded once to the scale's dtype, which is what this computes (bit for bit, tests/test_int4.py).

compressed-tensors requires `in` to be a multiple of `group_size`; here a last partial group (a scale
grid of ceil(in / group_size) columns) is accepted too, each input using the scale of its group.
"""

from __future__ import annotations

import numpy as np

from kimi_audit.numerics.dtypes import NumericsError, bfloat16, round_to, to_float32


def packed_words(count: int, num_bits: int) -> int:
    """int32 words holding `count` codes of `num_bits` bits: ceil(count * bits / 32)."""
    return -(-count * num_bits // 32)


def _check_bits(num_bits: int) -> None:
    if not 1 <= num_bits <= 8:
        raise NumericsError(f"num_bits must be in [1, 8], got {num_bits}")


def unpack_int4(packed: np.ndarray, num_bits: int, in_features: int, *, packed_dim: int = 1) -> np.ndarray:
    """int8 codes of densely packed int32 words: [rows, words] -> [rows, in_features] (packed_dim 1), or
    [words, cols] -> [in_features, cols] (packed_dim 0, as compressed-tensors packs zero points).

    The words must be exactly ceil(in_features * num_bits / 32) along `packed_dim`.
    """
    _check_bits(num_bits)
    p = np.asarray(packed)
    if p.dtype.kind not in "iu" or p.dtype.itemsize != 4:
        raise NumericsError(f"packed weights must be int32 words, got {p.dtype}")
    if p.ndim != 2 or packed_dim not in (0, 1):
        raise NumericsError(f"packed weights must be 2-D (packed_dim 0 or 1), got shape {list(p.shape)}")
    if packed_dim == 0:
        p = p.T
    rows, words = p.shape
    if in_features < 0 or words != packed_words(in_features, num_bits):
        raise NumericsError(f"{words} int32 words per row cannot hold {in_features} {num_bits}-bit codes "
                            f"(needs {packed_words(in_features, num_bits)})")
    u = np.ascontiguousarray(p).astype(p.dtype.newbyteorder("<"), copy=False).view("<u4")
    offset = 1 << (num_bits - 1)
    if num_bits == 4:  # a byte holds two codes: low nibble first
        b = u.view(np.uint8).reshape(rows, words * 4)
        codes = np.empty((rows, words * 8), np.uint8)
        np.bitwise_and(b, 0xF, out=codes[:, 0::2])
        np.right_shift(b, 4, out=codes[:, 1::2])
    else:  # element i: bits [i * bits, (i + 1) * bits) of the row, possibly across two words
        wide = np.zeros((rows, words + 1), np.uint64)
        wide[:, :words] = u
        start = np.arange(in_features, dtype=np.uint64) * np.uint64(num_bits)
        w, off = start // np.uint64(32), start % np.uint64(32)
        pair = wide[:, w] | (wide[:, w + np.uint64(1)] << np.uint64(32))
        codes = ((pair >> off) & np.uint64((1 << num_bits) - 1)).astype(np.uint8)
    out = np.subtract(codes[:, :in_features], offset, dtype=np.int16).astype(np.int8)
    return out.T.copy() if packed_dim == 0 else out


_SCALE_DTYPES = (bfloat16, np.dtype(np.float16), np.dtype(np.float32))


def dequantize_group(
    q: np.ndarray,
    scale: np.ndarray,
    zero_point: np.ndarray | None = None,
    group_size: int = 32,
    out_dtype: np.dtype | type | None = None,
    *,
    g_idx: np.ndarray | None = None,
) -> np.ndarray:
    """``(q - zero_point) * scale`` per group of `group_size` inputs, in the scale's dtype, then cast to
    `out_dtype` (default: the scale's dtype, as compressed-tensors' decompression).

    q: integer codes [out, in]; scale: bf16 / f16 / f32 [out, ceil(in / group_size)]; zero_point: integer
    [out, groups] (unpacked) or None (symmetric). g_idx: the group of each input (actorder=group), which
    compressed-tensors' own decompression does not apply; None means input i is in group i // group_size.
    """
    q = np.asarray(q)
    s = np.asarray(scale)
    if q.ndim != 2 or q.dtype.kind not in "iu":
        raise NumericsError(f"codes must be a 2-D integer array, got {q.dtype} {list(q.shape)}")
    if s.dtype not in _SCALE_DTYPES:
        raise NumericsError(f"scales must be bf16 / f16 / f32, got {s.dtype}")
    if group_size <= 0:
        raise NumericsError(f"group_size must be positive, got {group_size}")
    out_f, in_f = q.shape
    groups = -(-in_f // group_size)
    if s.shape != (out_f, groups):
        raise NumericsError(f"scale shape {list(s.shape)} != {[out_f, groups]} for codes {list(q.shape)} "
                            f"in groups of {group_size}")
    if g_idx is None:
        cols = np.repeat(np.arange(groups), group_size)[:in_f]
    else:
        cols = np.asarray(g_idx).astype(np.int64).reshape(-1)
        if cols.shape != (in_f,) or (in_f and (cols.min() < 0 or cols.max() >= groups)):
            raise NumericsError(f"g_idx must hold {in_f} group indices in [0, {groups})")
    q32 = q.astype(np.float32)
    if zero_point is not None:
        z = np.asarray(zero_point)
        if z.shape != (out_f, groups) or z.dtype.kind not in "iu":
            raise NumericsError(f"zero_point must be integer {[out_f, groups]}, got {z.dtype} {list(z.shape)}")
        q32 -= z.astype(np.float32)[:, cols]
    s32 = to_float32(s)
    with np.errstate(all="ignore"):
        q32 *= s32[:, cols]
    res = round_to(q32, s.dtype)
    target = s.dtype if out_dtype is None else np.dtype(out_dtype)
    if target == res.dtype:
        return res
    if target not in _SCALE_DTYPES:
        raise NumericsError(f"out_dtype must be bf16 / f16 / f32, got {target}")
    return round_to(to_float32(res), target)
