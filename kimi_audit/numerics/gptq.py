"""GPTQ's and AWQ's packed INT weights in numpy (GPTQModel's, AutoGPTQ's and AutoAWQ's checkpoint formats).

A module [out, in] with `bits` in (2, 4, 8) is stored transposed: `qweight` I32 [in·bits/32, out] (the codes of
32/bits consecutive inputs in one word, the first in the low bits), `qzeros` I32 [groups, out·bits/32] (the
zero points of 32/bits consecutive outputs in one word), `scales` F16 [groups, out] and `g_idx` I32 [in] (the
group of each input: i // group_size, permuted under `desc_act`). `checkpoint_format: gptq` (v1) stores every
zero point minus one, `gptq_v2` as it is. The weight is ``scales[g_idx] * (q - z[g_idx])``, [in, out],
transposed: GPTQModel's TorchQuantLinear.dequantize_weight, bit for bit (tests/test_gptq.py against its own
output, written in its own venv: tests/writers/gptq_generate.py).

AWQ GEMM stores the module untransposed in words but transposed in layout: `qweight` I32 [in, out/8] and
`qzeros` I32 [groups, out/8], eight 4-bit codes a word in llm-awq's interleaved order (AWQ_REVERSE_ORDER),
`scales` [groups, out] in the model's dtype; the weight is ``(q - z) * scales`` (tests/test_awq.py against
GPTQModel's AWQ output, tests/writers/awq_generate.py).
"""

from __future__ import annotations

import numpy as np

from kimi_audit.numerics.dtypes import NumericsError, numpy_dtype, round_to, to_float32, words32

__all__ = ["dequantize_awq", "dequantize_gptq", "unpack_awq_columns", "unpack_columns", "unpack_rows"]

GPTQ_BITS = (2, 4, 8)


def _codes(words: np.ndarray, bits: int, axis: int) -> np.ndarray:
    if bits not in GPTQ_BITS:
        raise NumericsError(f"GPTQ bits must be one of {GPTQ_BITS}, got {bits}")
    u = words32(words, "GPTQ packed words")
    per = 32 // bits
    shifts = (np.arange(per, dtype=np.uint32) * bits).reshape((-1, 1) if axis == 0 else (1, -1))
    if axis == 0:  # [W, out] -> [W * per, out]
        return ((u[:, None, :] >> shifts[None, :, :]) & ((1 << bits) - 1)).reshape(-1, u.shape[1]).astype(np.uint8)
    return ((u[:, :, None] >> shifts[None, :, :]) & ((1 << bits) - 1)).reshape(u.shape[0], -1).astype(np.uint8)


def unpack_rows(qweight: np.ndarray, bits: int) -> np.ndarray:
    """uint8 codes [in, out] of qweight [in·bits/32, out]."""
    return _codes(qweight, bits, 0)


def unpack_columns(qzeros: np.ndarray, bits: int) -> np.ndarray:
    """uint8 codes [groups, out] of qzeros [groups, out·bits/32]."""
    return _codes(qzeros, bits, 1)


def dequantize_gptq(qweight: np.ndarray, qzeros: np.ndarray, scales: np.ndarray, g_idx: np.ndarray, out: int,
                    inp: int, bits: int, v1: bool, dtype: str) -> np.ndarray:
    """The weight [out, in] in `dtype` (the model's: GPTQModel casts the F16 scales to it, then computes the
    product in it, each rounding once)."""
    q = unpack_rows(qweight, bits)[:inp]
    z = unpack_columns(qzeros, bits).astype(np.int32)
    s = np.asarray(scales)
    g = np.asarray(g_idx).astype(np.int64).reshape(-1)
    if q.shape != (inp, out) or s.ndim != 2 or s.shape[1] != out or z.shape[0] != s.shape[0] or z.shape[1] < out:
        raise NumericsError(f"qweight {list(np.asarray(qweight).shape)}, qzeros {list(np.asarray(qzeros).shape)} "
                            f"and scales {list(s.shape)} do not make a [{out}, {inp}] weight in {bits} bits")
    if g.shape != (inp,) or (inp and (g.min() < 0 or g.max() >= s.shape[0])):
        raise NumericsError(f"g_idx must hold {inp} group indices in [0, {s.shape[0]})")
    if v1:
        z = (z + 1) & ((1 << bits) - 1) if bits < 8 else z + 1
    z = z[:, :out]
    target = numpy_dtype(dtype)
    s32 = to_float32(round_to(to_float32(s), target))
    with np.errstate(all="ignore"):
        w = (q.astype(np.float32) - z[g].astype(np.float32)) * s32[g]
    return round_to(np.ascontiguousarray(w.T), target)


AWQ_REVERSE_ORDER = (0, 4, 1, 5, 2, 6, 3, 7)
"""AWQ GEMM's interleave: word slot k holds column AWQ_ORDER[k] of its 8 (llm-awq's packing, for its kernel)."""


def unpack_awq_columns(words: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """uint8 4-bit codes [rows, cols] of AWQ GEMM words [rows, cols / 8], the interleave undone."""
    w = words32(words, "AWQ packed words")
    if w.shape != (rows, -(-cols // 8)):
        raise NumericsError(f"AWQ packed words {list(w.shape)} do not hold [{rows}, {cols}] 4-bit codes")
    shifts = np.arange(0, 32, 4, dtype=np.uint32)
    codes = ((w[:, :, None] >> shifts) & 0xF).astype(np.uint8).reshape(rows, -1)
    order = np.arange(codes.shape[1]).reshape(-1, 8)[:, list(AWQ_REVERSE_ORDER)].reshape(-1)
    return codes[:, order][:, :cols]


def dequantize_awq(qweight: np.ndarray, qzeros: np.ndarray, scales: np.ndarray, out: int, inp: int,
                   group: int) -> np.ndarray:
    """AWQ GEMM's weight [out, in]: ``(q - z) * scales`` per group of inputs, in the scales' dtype, rounded once
    (GPTQModel's dequantize_gemm, AutoAWQ's), transposed from its [in, out]."""
    s = np.asarray(scales)
    groups = -(-inp // group)
    if s.shape != (groups, out):
        raise NumericsError(f"scales {list(s.shape)} are not [{groups}, {out}] for [{out}, {inp}] in groups of {group}")
    q = unpack_awq_columns(qweight, inp, out).astype(np.float32)
    z = unpack_awq_columns(qzeros, groups, out).astype(np.float32)
    rows = np.arange(inp) // group
    with np.errstate(all="ignore"):
        w = np.ascontiguousarray(((q - z[rows]) * to_float32(s)[rows]).T)
    return round_to(w, s.dtype)
