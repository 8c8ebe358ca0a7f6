"""safetensors dtypes in numpy: decoding raw tensor bytes, and exact bit-level conversions.

Each safetensors dtype name maps to a numpy (or ml_dtypes) dtype; `decode` views a tensor's raw
little-endian bytes as an array of it without copying. The bf16 and FP8 conversions are bit-faithful
to PyTorch's CPU casts (round to nearest even; NaN -> 0x7FC0 as torch's scalar path). This module
imports numpy and ml_dtypes: only code that decodes tensor values imports it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import cache

import ml_dtypes
import numpy as np

from kimi_audit.errors import KimiAuditError

bfloat16 = np.dtype(ml_dtypes.bfloat16)
float8_e4m3fn = np.dtype(ml_dtypes.float8_e4m3fn)
float8_e5m2 = np.dtype(ml_dtypes.float8_e5m2)

FP8_E4M3_MAX = 448.0
BF16_NAN_BITS = 0x7FC0


class NumericsError(KimiAuditError):
    """Bytes that cannot be decoded as the dtype/shape a header claims, or mismatched operands."""


# safetensors dtype name -> numpy dtype (little-endian).
NP_DTYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "U8": np.dtype("u1"),
    "I8": np.dtype("i1"),
    "I16": np.dtype("<i2"),
    "U16": np.dtype("<u2"),
    "I32": np.dtype("<i4"),
    "U32": np.dtype("<u4"),
    "I64": np.dtype("<i8"),
    "U64": np.dtype("<u8"),
    "F16": np.dtype("<f2"),
    "BF16": bfloat16,
    "F32": np.dtype("<f4"),
    "F64": np.dtype("<f8"),
    "C64": np.dtype("<c8"),
    "F8_E4M3": float8_e4m3fn,
    "F8_E5M2": float8_e5m2,
    "F8_E4M3FNUZ": np.dtype(ml_dtypes.float8_e4m3fnuz),
    "F8_E5M2FNUZ": np.dtype(ml_dtypes.float8_e5m2fnuz),
    "F8_E8M0": np.dtype(ml_dtypes.float8_e8m0fnu),
}

FLOAT_DTYPES = frozenset(
    {"F16", "BF16", "F32", "F64", "F8_E4M3", "F8_E5M2", "F8_E4M3FNUZ", "F8_E5M2FNUZ", "F8_E8M0"}
)


def numpy_dtype(dtype: str) -> np.dtype:
    """The numpy (or ml_dtypes) dtype of a safetensors dtype name. NumericsError if unsupported."""
    try:
        return NP_DTYPES[dtype]
    except KeyError:
        raise NumericsError(f"dtype {dtype!r} cannot be decoded to numpy") from None


def decode(raw: bytes | bytearray | memoryview, dtype: str, shape: Sequence[int]) -> np.ndarray:
    """Decode a tensor's raw little-endian bytes (zero-copy, read-only view when possible)."""
    npd = numpy_dtype(dtype)
    shape = tuple(int(d) for d in shape)
    count = math.prod(shape)
    if len(raw) != count * npd.itemsize:
        raise NumericsError(
            f"{dtype}{list(shape)} needs {count * npd.itemsize} bytes, got {len(raw)}"
        )
    return np.frombuffer(raw, dtype=npd, count=count).reshape(shape)


# ---------------------------------------------------------------- bit-level conversions


def bits16(a: np.ndarray) -> np.ndarray:
    """The uint16 bit patterns of a 16-bit array (view)."""
    return a.view(np.uint16)


def bf16_bits_to_f32(u16: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """Exact bf16 -> float32 from uint16 bit patterns (a bf16 is the top half of a float32)."""
    u16 = np.asarray(u16)
    if out is None:
        out = np.empty(u16.shape, np.float32)
    u = out.view(np.uint32)
    np.left_shift(u16, 16, out=u, dtype=np.uint32)
    return out


def f32_to_bf16_bits(f: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """float32 -> bf16 bit patterns, round to nearest even (c10::round_to_nearest_even).

    NaN -> 0x7FC0 (torch's scalar path); +-Inf and overflow to Inf as in torch.
    """
    f = np.ascontiguousarray(f, dtype=np.float32)
    u = f.view(np.uint32)
    t = np.right_shift(u, 16)
    np.bitwise_and(t, 1, out=t)
    t += np.uint32(0x7FFF)
    t += u
    t >>= 16
    if out is None:
        out = np.empty(f.shape, np.uint16)
    np.copyto(out, t, casting="unsafe")
    nan = np.isnan(f)
    if nan.any():
        out[nan] = BF16_NAN_BITS
    return out


def round_to(f32: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """float32 values rounded (RNE) to `dtype`, as torch's casts: bf16 through f32_to_bf16_bits, other floats by
    numpy's cast, float32 unchanged."""
    if dtype == np.float32:
        return f32
    if dtype == bfloat16:
        return f32_to_bf16_bits(f32).view(bfloat16)
    return f32.astype(dtype)


def f32_to_bf16(f: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 (ml_dtypes) with round-to-nearest-even, as torch's .to(torch.bfloat16)."""
    # ml_dtypes' cast is RNE with the same rounding as c10 (tests compare it with torch bitwise).
    return np.asarray(f, dtype=np.float32).astype(bfloat16)


@cache
def _fp8_lut(dtype_name: str) -> np.ndarray:
    codes = np.arange(256, dtype=np.uint8)
    lut = codes.view(numpy_dtype(dtype_name)).astype(np.float32)
    lut.setflags(write=False)
    return lut


def fp8_e4m3_lut() -> np.ndarray:
    """float32 value of each of the 256 float8_e4m3fn codes (0x7F, 0xFF are NaN; no Inf)."""
    return _fp8_lut("F8_E4M3")


def to_float32(a: np.ndarray) -> np.ndarray:
    """Exact widening of any float array (bf16, f16, fp8, f32) to float32 (f64 is rounded)."""
    a = np.asarray(a)
    if a.dtype == bfloat16:
        return bf16_bits_to_f32(a.view(np.uint16))
    if a.dtype == float8_e4m3fn:
        return fp8_e4m3_lut().take(a.view(np.uint8))
    return a.astype(np.float32)


def words32(words: np.ndarray, what: str) -> np.ndarray:
    """Packed 32-bit integer words [rows, W] as uint32 (NumericsError naming `what` for another array)."""
    w = np.ascontiguousarray(words)
    if w.ndim != 2 or w.dtype.kind not in "iu" or w.dtype.itemsize != 4:
        raise NumericsError(f"{what} must be a 2-D 32-bit integer array, got {w.dtype} {list(w.shape)}")
    return w.view(np.uint32)
