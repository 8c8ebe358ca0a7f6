"""FP4 (E2M1) and E8M0 in numpy: unpacking two FP4 codes a byte, decoding E8M0 exponents, and the
dequantization of the formats that store them, each computed as its writer's decompression computes it.

* FP4 E2M1 (OCP MX): sign, two exponent bits, one mantissa bit; the 16 codes are ±{0, 0.5, 1, 1.5, 2, 3, 4, 6}
  (no NaN, no Inf). Two codes a byte, the first element in the low nibble: compressed-tensors'
  ``pack_fp4_to_uint8`` / ``unpack_fp4_from_uint8`` (compressors/nvfp4/helpers.py), and DeepSeek-V4's routed
  experts (I8 bytes, the same nibble order as torch's float4_e2m1fn_x2).
* E8M0: a biased power-of-two exponent, 2**(e - 127); 0xFF is NaN (ml_dtypes float8_e8m0fnu, torch's
  float8_e8m0fnu). compressed-tensors stores MXFP4 scales as U8 holding these codes
  (compressors/mx_utils.py ``decompress_mx_scale``: ``2.0 ** (scale - 127)`` in bf16, which is 2**128 = Inf for
  0xFF); DeepSeek-V4 stores them as F8_E8M0.

Dequantization, bit for bit:

* `dequantize_nvfp4` == compressed-tensors' NVFP4PackedCompressor.decompress: the F8_E4M3 group scale cast to
  bf16, divided by the F32 global scale (torch promotes to float32), times the FP4 value in float32, rounded
  once to bf16;
* `dequantize_mxfp4` == MXFP4PackedCompressor.decompress: the FP4 value times the bf16 power of two, rounded
  to bf16 (exact but for overflow and subnormals);
* `dequantize_fp4_e8m0` (DeepSeek-V4's FP4 experts) == transformers 5.25's ``Fp8Dequantize._dequantize_one``
  (integrations/finegrained_fp8.py, its load-time dequantization of `expert_dtype: fp4` weights): the E2M1 value
  times the F8_E8M0 scale of its 32 inputs, both float32, rounded once to bf16 (DeepSeek's
  ``fp4 * 2**(e - 127)``; MXFP4's arithmetic with F8_E8M0 scales in place of U8 codes).
"""

from __future__ import annotations

from functools import cache

import ml_dtypes
import numpy as np

from kimi_audit.numerics.dtypes import NumericsError, bfloat16, fp8_e4m3_lut, round_to

float4_e2m1fn = np.dtype(ml_dtypes.float4_e2m1fn)
float8_e8m0fnu = np.dtype(ml_dtypes.float8_e8m0fnu)

E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
E8M0_NAN = 0xFF


@cache
def fp4_lut() -> np.ndarray:
    """float32 value of each of the 16 E2M1 codes (code 8 is -0.0)."""
    lut = np.array([*E2M1_VALUES, *(-v for v in E2M1_VALUES)], np.float32)
    lut.setflags(write=False)
    return lut


@cache
def e8m0_lut() -> np.ndarray:
    """float32 value of each of the 256 E8M0 codes: 2**(e - 127), NaN for 0xFF."""
    lut: np.ndarray = np.arange(256, dtype=np.uint8).view(float8_e8m0fnu).astype(np.float32)
    lut.setflags(write=False)
    return lut


def _bytes(a: np.ndarray, what: str) -> np.ndarray:
    a = np.asarray(a)
    if a.dtype.itemsize != 1 or a.dtype.kind not in "iuV":
        raise NumericsError(f"{what} must be bytes (U8 / I8 / F8_E8M0), got {a.dtype}")
    return a.view(np.uint8)


def unpack_fp4(packed: np.ndarray, in_features: int) -> np.ndarray:
    """float32 values [rows, in_features] of FP4 codes packed two a byte, low nibble first."""
    p = _bytes(packed, "packed FP4")
    if p.ndim != 2:
        raise NumericsError(f"packed FP4 must be 2-D, got shape {list(p.shape)}")
    rows, cols = p.shape
    if cols != -(-in_features // 2):
        raise NumericsError(f"{cols} bytes per row cannot hold {in_features} FP4 codes "
                            f"(needs {-(-in_features // 2)})")
    codes = np.empty((rows, cols * 2), np.uint8)
    np.bitwise_and(p, 0xF, out=codes[:, 0::2])
    np.right_shift(p, 4, out=codes[:, 1::2])
    return fp4_lut().take(codes[:, :in_features])


def e8m0_to_float32(scale: np.ndarray) -> np.ndarray:
    """float32 values of E8M0 codes (U8 or float8_e8m0fnu): 2**(e - 127), NaN for 0xFF."""
    out: np.ndarray = e8m0_lut().take(_bytes(scale, "E8M0 scales"))
    return out


def _group_scales(scale: np.ndarray, rows: int, in_features: int, group: int) -> np.ndarray:
    """[rows, in] float32 from [rows, ceil(in / group)] scales."""
    groups = -(-in_features // group)
    if scale.shape != (rows, groups):
        raise NumericsError(f"scale shape {list(scale.shape)} != {[rows, groups]} for {in_features} inputs "
                            f"in groups of {group}")
    return np.repeat(scale, group, axis=1)[:, :in_features]


def _bf16(f32: np.ndarray) -> np.ndarray:
    return round_to(f32, bfloat16)


def _nvfp4_scales(scale: np.ndarray, global_scale: np.ndarray, what: str) -> tuple[np.ndarray, np.float32]:
    """NVFP4's F8_E4M3 block scales as float32 (exact) and its one F32 second-level scale, each checked."""
    s = np.asarray(scale)
    if s.dtype != np.dtype(ml_dtypes.float8_e4m3fn):
        raise NumericsError(f"NVFP4 scales must be F8_E4M3, got {s.dtype}")
    g = np.asarray(global_scale).reshape(-1)
    if g.shape != (1,) or g.dtype != np.float32:
        raise NumericsError(f"{what} must be one F32 value, got {g.dtype} {list(g.shape)}")
    return fp8_e4m3_lut().take(s.view(np.uint8)), g[0]


def dequantize_nvfp4(packed: np.ndarray, scale: np.ndarray, global_scale: np.ndarray, in_features: int,
                     group: int = 16) -> np.ndarray:
    """bf16 ``fp4 * (bf16(scale) / global_scale)``, the product in float32 (compressed-tensors' decompress)."""
    s32, g = _nvfp4_scales(scale, global_scale, "the NVFP4 global scale")  # F8_E4M3 -> bf16 is exact
    values = unpack_fp4(packed, in_features)
    with np.errstate(all="ignore"):
        eff = s32 / g
        values *= _group_scales(eff, values.shape[0], in_features, group)
    return _bf16(values)


def dequantize_fp4_e8m0(packed: np.ndarray, scale: np.ndarray, in_features: int, group: int = 32) -> np.ndarray:
    """bf16 ``fp4 * 2**(e - 127)`` per group of inputs (MXFP4's U8 codes, DeepSeek-V4's F8_E8M0 scales)."""
    values = unpack_fp4(packed, in_features)
    s = e8m0_to_float32(scale)
    with np.errstate(all="ignore"):
        values *= _group_scales(s, values.shape[0], in_features, group)
    return _bf16(values)


def dequantize_mxfp4(packed: np.ndarray, scale: np.ndarray, in_features: int, group: int = 32) -> np.ndarray:
    """compressed-tensors' MXFP4 decompression: its bf16 ``2.0 ** (e - 127)`` is Inf for e = 0xFF, not NaN."""
    s = _bytes(scale, "MXFP4 scales")
    f = e8m0_to_float32(s)
    f[s == E8M0_NAN] = np.inf
    values = unpack_fp4(packed, in_features)
    with np.errstate(all="ignore"):
        values *= _group_scales(f, values.shape[0], in_features, group)
    return _bf16(values)


__all__ = ["E2M1_VALUES", "dequantize_fp4_e8m0", "dequantize_mxfp4", "dequantize_nvfp4", "e8m0_to_float32",
           "float4_e2m1fn", "float8_e8m0fnu", "fp4_lut", "unpack_fp4"]


def dequantize_mlx_fp(words: np.ndarray, scale: np.ndarray, in_features: int, mode: str, group: int) -> np.ndarray:
    """mx.dequantize of MLX's `mxfp4`, `nvfp4` and `mxfp8` modes (bf16, its default): the codes in U32 words
    (FP4 E2M1 two a byte, low nibble first; mxfp8: FP8 E4M3 bytes) times their group's U8 scale (E8M0
    exponents; nvfp4: F8_E4M3 bits), the float32 product rounded once (tests/test_mlx.py, against mlx 0.32)."""
    w = np.ascontiguousarray(words)
    if w.ndim != 2 or w.dtype.itemsize != 4:
        raise NumericsError(f"packed words must be 2-D 32-bit, got {w.dtype} {list(w.shape)}")
    codes = w.astype("<u4").view(np.uint8)
    s = _bytes(scale, "MLX scales")
    if mode == "mxfp8":
        if codes.shape[1] < in_features:
            raise NumericsError(f"{codes.shape[1]} FP8 codes per row, the module has {in_features} inputs")
        values = fp8_e4m3_lut().take(codes[:, :in_features])
    else:
        values = unpack_fp4(codes, in_features)
    f = fp8_e4m3_lut().take(s) if mode == "nvfp4" else e8m0_to_float32(s)
    with np.errstate(all="ignore"):
        values = values * _group_scales(f, values.shape[0], in_features, group)
    return _bf16(values)


def dequantize_modelopt_nvfp4(packed: np.ndarray, scale: np.ndarray, scale_2: np.ndarray, in_features: int,
                              group: int = 16) -> np.ndarray:
    """NVIDIA ModelOpt's NVFP4QTensor.dequantize: bf16 ``fp4 * (f32(scale) * weight_scale_2)``, the per-block scale
    and the product in float32, code 8 (E2M1's -0) as +0 as its value table has it."""
    s32, g = _nvfp4_scales(scale, scale_2, "weight_scale_2")
    values = unpack_fp4(packed, in_features)
    values[values == 0] = 0  # ModelOpt's e2m1 table holds +0 for code 8 (E2M1's -0)
    with np.errstate(all="ignore"):
        values *= _group_scales((s32 * g).astype(np.float32), values.shape[0], in_features, group)
    return _bf16(values)


def dequantize_mx_f32(packed: np.ndarray, scale: np.ndarray, in_features: int, group: int = 32) -> np.ndarray:
    """float32 ``e2m1 * 2 ** (e - 127)`` per group of inputs, unrounded (AMD Quark's importer)."""
    values = unpack_fp4(packed, in_features)
    with np.errstate(all="ignore"):
        values *= _group_scales(e8m0_to_float32(_bytes(scale, "MXFP4 scales")), values.shape[0], in_features, group)
    return values
