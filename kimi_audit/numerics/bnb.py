"""bitsandbytes' 4-bit (NF4, FP4) and int8 formats in numpy.

4-bit (bitsandbytes.functional.quantize_4bit): the weight [out, in] flattened, two codes a byte, the first in
the high nibble, stored U8 [ceil(n / 2), 1]; one F32 `absmax` per `blocksize` values; the value of a code is
`quant_map[code] * absmax[block]` in float32, rounded once to the weight's dtype (`dequantize_4bit`). With
double quantization the absmax are themselves U8 codes of 256-value blocks: `nested_quant_map[c] *
nested_absmax[block] + offset` in float32 (`dequantize_blockwise`, then `+ quant_state.offset`).
int8 (LLM.int8, `int8_vectorwise_quant`): I8 codes [out, in] and one F32 `SCB` per row; the value is
`code * SCB * (1 / 127)` in float32 (`int8_vectorwise_dequant`).
Both are bit for bit bitsandbytes 0.50's on this CPU (tests/test_bnb.py).
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from kimi_audit.numerics.dtypes import NumericsError, numpy_dtype, round_to

__all__ = ["dequantize_4bit", "dequantize_int8", "quant_state_json", "read_quant_state"]

INV_127 = np.float32(7.874015718698502e-3)
"""bitsandbytes' reciprocal of 127 (ops int8_vectorwise_dequant)."""
TORCH_DTYPES = {"BF16": "bfloat16", "F16": "float16", "F32": "float32"}


def quant_state_json(quant_type: str, blocksize: int, dtype: str, shape: tuple[int, ...]) -> bytes:
    """The serialized quant_state bitsandbytes writes for a 4-bit weight without double quantization
    (QuantState.as_dict(packed=True): `json.dumps` of its non-tensor items, UTF-8)."""
    return json.dumps({"quant_type": quant_type, "blocksize": blocksize, "dtype": TORCH_DTYPES.get(dtype, dtype),
                       "shape": list(shape)}).encode()


MAX_QUANT_STATE_BYTES = 1 << 16
"""A serialized QuantState is a JSON object of a few hundred bytes."""


def read_quant_state(raw: np.ndarray) -> dict[str, Any]:
    """The quant_state's items (NumericsError where it is not the JSON object bitsandbytes writes)."""
    data = np.ascontiguousarray(raw, dtype=np.uint8).tobytes()
    if len(data) > MAX_QUANT_STATE_BYTES:
        raise NumericsError(f"the serialized quant_state is {len(data):,} bytes (bitsandbytes writes a few hundred)")
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise NumericsError(f"the serialized quant_state is not JSON ({str(e)[:120]})") from None
    if not isinstance(doc, dict):
        raise NumericsError("the serialized quant_state is not a JSON object")
    for key in ("shape", "blocksize"):  # integers of thousands of digits: no size bitsandbytes writes
        value = doc.get(key)
        numbers = value if isinstance(value, list) else [value]
        if any(type(v) is int and not 0 <= v < 2**62 for v in numbers):
            raise NumericsError(f"the serialized quant_state's {key} holds an integer out of range")
    return doc


def _blockwise(values: np.ndarray, absmax: np.ndarray, blocksize: int) -> np.ndarray:
    n = values.size
    blocks = -(-n // blocksize)
    if absmax.shape != (blocks,):
        raise NumericsError(f"absmax holds {list(absmax.shape)}, {n:,} values in blocks of {blocksize} need [{blocks}]")
    return values * np.repeat(absmax.astype(np.float32), blocksize)[:n]


def dequantize_4bit(packed: np.ndarray, absmax: np.ndarray, quant_map: np.ndarray, out: int, inp: int,
                    blocksize: int, dtype: str, nested: tuple[np.ndarray, np.ndarray, float] | None = None
                    ) -> np.ndarray:
    """The weight [out, in] of 4-bit codes (`nested`: the double-quantized absmax's (nested_absmax,
    nested_quant_map, offset))."""
    p = np.asarray(packed).reshape(-1)
    n = out * inp
    if p.dtype != np.uint8 or p.size != -(-n // 2):
        raise NumericsError(f"packed 4-bit weight holds {p.size:,} {p.dtype} bytes, [{out}, {inp}] needs "
                            f"{-(-n // 2):,}")
    qm = np.asarray(quant_map, dtype=np.float32).reshape(-1)
    if qm.size != 16:
        raise NumericsError(f"quant_map holds {qm.size} values, not 16")
    codes = np.empty(p.size * 2, np.uint8)
    np.right_shift(p, 4, out=codes[0::2])
    np.bitwise_and(p, 0xF, out=codes[1::2])
    a = np.asarray(absmax).reshape(-1)
    if nested is not None:
        nested_absmax, nested_map, offset = nested
        nm = np.asarray(nested_map, dtype=np.float32).reshape(-1)
        if a.dtype != np.uint8 or nm.size != 256:
            raise NumericsError("double-quantized absmax must be U8 codes of a 256-entry nested_quant_map")
        with np.errstate(all="ignore"):
            a = _blockwise(nm.take(a), np.asarray(nested_absmax).reshape(-1), 256) + np.float32(offset)
    with np.errstate(all="ignore"):
        f = _blockwise(qm.take(codes[:n]), a.astype(np.float32), blocksize).reshape(out, inp)
    return round_to(f, numpy_dtype(dtype))


def dequantize_int8(codes: np.ndarray, scb: np.ndarray) -> np.ndarray:
    """float32 `code * SCB[row] * (1 / 127)`."""
    c = np.asarray(codes)
    s = np.asarray(scb, dtype=np.float32).reshape(-1)
    if c.ndim != 2 or c.dtype != np.int8 or s.shape != (c.shape[0],):
        raise NumericsError(f"int8 weight {c.dtype} {list(c.shape)} and SCB {list(s.shape)} do not match row for row")
    with np.errstate(all="ignore"):
        out: np.ndarray = c.astype(np.float32) * s[:, None] * INV_127
    return out
