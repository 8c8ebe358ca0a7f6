"""MLX's affine quantization in numpy: unpacking its uint32 words and dequantizing groups.

mx.quantize(w, group_size, bits) (mode `affine`) stores each row of w [.., in] as uint32 words
[.., in * bits / 32] (the bits of element i start at bit i * bits of the row's little-endian bit stream, so
3-, 5- and 6-bit codes cross word boundaries) with one scale and one bias per `group_size` inputs, in w's dtype;
element i is ``scales[g] * q[i] + biases[g]``. `dequantize_affine` == ``mx.dequantize(w, scales, biases,
group_size, bits)`` bit for bit (tests/test_mlx.py, against mlx 0.32 on this CPU): mlx computes in the scales'
dtype, so the product is rounded to it before the bias is added, and the sum rounded again.
"""

from __future__ import annotations

import numpy as np

from kimi_audit.numerics.dtypes import NumericsError, round_to, to_float32, words32

__all__ = ["dequantize_affine", "unpack_bits"]

AFFINE_BITS = (2, 3, 4, 5, 6, 8)
"""The bit widths mx.quantize's affine mode writes."""


def unpack_bits(words: np.ndarray, bits: int, count: int) -> np.ndarray:
    """uint8 codes [rows, count] of a little-endian bit stream of uint32 words [rows, W]."""
    if bits not in AFFINE_BITS:
        raise NumericsError(f"bits must be one of {AFFINE_BITS}, got {bits}")
    w = words32(words, "packed words")
    if w.shape[1] * 32 < count * bits:
        raise NumericsError(f"{w.shape[1]} words per row hold fewer than {count} codes of {bits} bits")
    stream = np.unpackbits(w.astype("<u4").view(np.uint8), axis=1, bitorder="little")
    codes = stream[:, : count * bits].reshape(w.shape[0], count, bits)
    return np.packbits(codes, axis=2, bitorder="little").reshape(w.shape[0], count)


def dequantize_affine(words: np.ndarray, scales: np.ndarray, biases: np.ndarray, group_size: int,
                      bits: int) -> np.ndarray:
    """``scales * q + biases`` per group of `group_size` inputs in the scales' dtype (each operation rounded to
    it, as mx.dequantize): [rows, in] from words [rows, in * bits / 32] and scales, biases
    [rows, in / group_size]."""
    s, b = np.asarray(scales), np.asarray(biases)
    if s.ndim != 2 or s.shape != b.shape or s.shape[0] != np.asarray(words).shape[0]:
        raise NumericsError(f"scales {list(s.shape)} and biases {list(b.shape)} do not match words "
                            f"{list(np.asarray(words).shape)} row for row")
    inp = s.shape[1] * group_size
    q = unpack_bits(words, bits, inp).astype(np.float32).reshape(s.shape[0], s.shape[1], group_size)
    with np.errstate(all="ignore"):
        product = to_float32(round_to(q * to_float32(s)[:, :, None], s.dtype))
        f = round_to(product + to_float32(b)[:, :, None], s.dtype)
    return f.reshape(s.shape[0], inp)
