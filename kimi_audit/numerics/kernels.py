"""Pure numpy numerics: safetensors dtype decoding, FP8 block dequantization, torch-exact RMSNorm.

Everything here is bit-faithful to what PyTorch (CPU) computes for the same expressions:

* `dequantize_fp8(w, s)` == ``(w.float() * s_expanded).to(torch.bfloat16)``
* `rms_norm(x, g, eps)` == ``DeepseekV3RMSNorm.forward`` (modeling_deepseek.py)::

      input_dtype = hidden_states.dtype
      hidden_states = hidden_states.to(torch.float32)
      variance = hidden_states.pow(2).mean(-1, keepdim=True)
      hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
      return self.weight * hidden_states.to(input_dtype)

The one step that is not a single correctly rounded IEEE operation per element is the float32
reduction in ``mean(-1)``: torch CPU computes it as ``sum(-1) / n``, and its sum kernel
(aten/src/ATen/native/cpu/SumKernel.cpp, ``cascade_sum`` -> ``vectorized_inner_sum``) adds in a
fixed order: 8 float32 lanes, 4 interleaved vector accumulators ("ilp"), a 4-level cascade of
partial sums flushed every 16 steps, then the 4 accumulators, then the tail scalars, then the
8 lanes left to right.  `torch_sum_f32` reproduces that order exactly (the kernel is dispatched
with 8 lanes even where torch reports the AVX512 capability: the sum kernel is not registered for
AVX512).  NaN bit patterns are not reproduced (torch's own vector and scalar paths differ);
NaN positions are.

No torch at run time: torch is a test-time reference only.
"""

from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from typing import Iterable, Sequence

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
_NP_DTYPES: dict[str, np.dtype] = {
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
        return _NP_DTYPES[dtype]
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


def f32_to_bf16(f: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 (ml_dtypes) with round-to-nearest-even, as torch's .to(torch.bfloat16)."""
    # ml_dtypes' cast is RNE with the same rounding as c10 (tests compare it with torch bitwise).
    return np.asarray(f, dtype=np.float32).astype(bfloat16)


@lru_cache(maxsize=None)
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


# ---------------------------------------------------------------- FP8 block dequantization


def _as_fp8_codes(w: np.ndarray) -> np.ndarray:
    w = np.asarray(w)
    if w.dtype == float8_e4m3fn:
        return w.view(np.uint8)
    if w.dtype == np.uint8:
        return w
    raise NumericsError(f"FP8 weight must be float8_e4m3fn (or its uint8 codes), got {w.dtype}")


def scale_grid_shape(shape: Sequence[int], block: Sequence[int] = (128, 128)) -> tuple[int, int]:
    """Shape of the weight_scale_inv grid for a 2-D weight: [ceil(out/bo), ceil(in/bi)]."""
    out_f, in_f = shape
    bo, bi = block
    return (-(-out_f // bo), -(-in_f // bi))


def dequantize_fp8(
    w: np.ndarray,
    scale_inv: np.ndarray,
    block: Sequence[int] = (128, 128),
    out_dtype: np.dtype | type = bfloat16,
    *,
    threads: int | None = None,
) -> np.ndarray:
    """``w[o, i] * scale_inv[o // bo, i // bi]`` in float32, then cast to `out_dtype`.

    Bit-identical to ``(w.float() * s_expanded).to(out_dtype)`` in torch, including partial edge
    blocks (the grid must be exactly [ceil(out/bo), ceil(in/bi)]).  `out_dtype` is bfloat16 (the
    model's compute dtype) or float32 (the unrounded product).

    For bfloat16 the product of each (code, scale) pair is evaluated once per block into a
    256-entry table and the weight is mapped through it: the same float32 multiply and the same
    rounding as computing element by element, at one table lookup per element.
    """
    codes = _as_fp8_codes(w)
    if codes.ndim != 2:
        raise NumericsError(f"FP8 weight must be 2-D, got shape {list(codes.shape)}")
    s = np.asarray(scale_inv)
    if s.dtype != np.float32:
        if s.dtype == bfloat16 or s.dtype.kind == "f":
            s = to_float32(s)
        else:
            raise NumericsError(f"scale_inv must be a float array, got {s.dtype}")
    bo, bi = (int(b) for b in block)
    if bo <= 0 or bi <= 0:
        raise NumericsError(f"block {list(block)} must be positive")
    grid = scale_grid_shape(codes.shape, (bo, bi))
    if s.shape != grid:
        raise NumericsError(
            f"scale_inv shape {list(s.shape)} != {list(grid)} for weight {list(codes.shape)}"
            f" with block {[bo, bi]}"
        )
    out_dtype = np.dtype(out_dtype)
    rows, cols = codes.shape
    lut = fp8_e4m3_lut()
    n_workers = _workers(threads, rows * cols)

    if out_dtype == np.float32:
        out = np.empty((rows, cols), np.float32)

        def do_f32(rb: int) -> None:
            r0, r1 = rb * bo, min(rows, rb * bo + bo)
            srow = np.repeat(s[rb], bi)[:cols]
            blk = out[r0:r1]
            lut.take(codes[r0:r1], out=blk)
            with np.errstate(all="ignore"):
                blk *= srow

        _run(do_f32, range(grid[0]), n_workers)
        return out

    if out_dtype != bfloat16:
        raise NumericsError(f"out_dtype must be bfloat16 or float32, got {out_dtype}")

    # tables[rb, cb, code] = bf16(lut[code] * s[rb, cb]) as bit patterns
    with np.errstate(all="ignore"):
        tables = f32_to_bf16_bits(lut[None, None, :] * s[:, :, None])
    col_base = (np.arange(cols, dtype=np.uint16) // bi) * np.uint16(256) if grid[1] <= 256 else None
    out_bits = np.empty((rows, cols), np.uint16)

    def do_bf16(rb: int) -> None:
        r0, r1 = rb * bo, min(rows, rb * bo + bo)
        table = tables[rb].reshape(-1)
        if col_base is not None:
            idx = np.add(codes[r0:r1], col_base, dtype=np.uint16)
            table.take(idx, out=out_bits[r0:r1])
        else:  # more than 256 column blocks: index with a wider type
            base = (np.arange(cols, dtype=np.uint32) // bi) * np.uint32(256)
            idx = np.add(codes[r0:r1], base, dtype=np.uint32)
            table.take(idx, out=out_bits[r0:r1])

    _run(do_bf16, range(grid[0]), n_workers)
    return out_bits.view(bfloat16)


# ---------------------------------------------------------------- torch-ordered float32 sum

_SUM_LANES = 8  # Vectorized<float>::size() of the dispatched sum kernel (AVX2 / default / NEON)
_SUM_ILP = 4
_SUM_LEVELS = 4


def _ceil_log2(x: int) -> int:
    return 1 if x <= 2 else (x - 1).bit_length()


def _multi_row_sum(v: np.ndarray) -> np.ndarray:
    """torch's multi_row_sum: v [n, size, nrows, lanes] -> [n, nrows, lanes], cascade order."""
    size = v.shape[1]
    level_power = max(4, _ceil_log2(size) // _SUM_LEVELS)
    step = 1 << level_power
    mask = step - 1
    acc: list[np.ndarray | None] = [None] * _SUM_LEVELS  # None == all zeros

    def add(a: np.ndarray | None, b: np.ndarray | None) -> np.ndarray | None:
        if b is None:
            return a
        if a is None:
            return np.add(b, np.float32(0.0))  # 0 + b, as the zero-filled accumulator does
        a += b
        return a

    i = 0
    while i + step <= size:
        # acc[0] runs `step` sequential adds starting from zero
        a0 = acc[0]
        for _ in range(step):
            a0 = add(a0, v[:, i])
            i += 1
        acc[0] = a0
        for j in range(1, _SUM_LEVELS):
            acc[j] = add(acc[j], acc[j - 1])
            acc[j - 1] = None
            if i & (mask << (j * level_power)):
                break
    a0 = acc[0]
    while i < size:
        a0 = add(a0, v[:, i])
        i += 1
    acc[0] = a0
    for j in range(1, _SUM_LEVELS):
        acc[0] = add(acc[0], acc[j])
    if acc[0] is None:
        return np.zeros((v.shape[0],) + v.shape[2:], np.float32)
    return acc[0]


def _row_sum(vecs: np.ndarray) -> np.ndarray:
    """torch's row_sum over [n, size, lanes] (vectors of `lanes`) -> [n, lanes]."""
    n, size, lanes = vecs.shape
    size_ilp = size // _SUM_ILP
    ps = _multi_row_sum(vecs[:, : size_ilp * _SUM_ILP].reshape(n, size_ilp, _SUM_ILP, lanes))
    p0 = ps[:, 0].copy()
    for i in range(size_ilp * _SUM_ILP, size):
        p0 += vecs[:, i]
    for k in range(1, _SUM_ILP):
        p0 += ps[:, k]
    return p0


def torch_sum_f32(a: np.ndarray) -> np.ndarray:
    """Sum of a float32 array over its last axis, in the order torch CPU's sum kernel uses.

    Exact for a contiguous last axis of any width up to 32768 elements per row (wider single
    rows are split across threads by torch's two-pass reduction; that order is not modelled).
    """
    a = np.ascontiguousarray(a, dtype=np.float32)
    lead = a.shape[:-1]
    width = a.shape[-1]
    a2 = a.reshape(-1, width)
    n = a2.shape[0]
    if width == 0:
        return np.zeros(lead, np.float32)
    if width < _SUM_LANES:  # scalar_inner_sum: row_sum over scalars
        return _row_sum(a2.reshape(n, width, 1))[:, 0].reshape(lead)
    lanes = _SUM_LANES
    vec_size = width // lanes
    p = _row_sum(a2[:, : vec_size * lanes].reshape(n, vec_size, lanes))
    final = np.zeros(n, np.float32)
    for k in range(vec_size * lanes, width):
        final += a2[:, k]
    for k in range(lanes):
        final += p[:, k]
    return final.reshape(lead)


# ---------------------------------------------------------------- RMSNorm


def _workers(threads: int | None, work: int) -> int:
    if threads is not None:
        return max(1, int(threads))
    if work < 1 << 20:
        return 1
    return max(1, min(8, os.cpu_count() or 1))


def _run(fn, items: Iterable[int], workers: int) -> None:
    items = list(items)
    if workers <= 1 or len(items) <= 1:
        for it in items:
            fn(it)
        return
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for _ in pool.map(fn, items):
            pass


_ROUNDABLE = (bfloat16, np.dtype(np.float16), np.dtype(np.float32))


def _round_to(f32: np.ndarray, dtype: np.dtype, out: np.ndarray) -> None:
    """Round float32 values to `dtype` (RNE) into `out` (an array of that dtype)."""
    if dtype == np.float32:
        np.copyto(out, f32)
    else:
        np.copyto(out, f32, casting="unsafe")  # ml_dtypes / numpy RNE casts


def _promote(a: np.dtype, b: np.dtype) -> np.dtype:
    """torch's promotion among bf16, f16, f32 (bf16 x f16 -> f32)."""
    if a == b:
        return a
    return np.dtype(np.float32)


def rms_norm(
    x: np.ndarray,
    gain: np.ndarray,
    eps: float = 1e-6,
    *,
    threads: int | None = None,
    chunk_rows: int = 256,
) -> np.ndarray:
    """DeepseekV3RMSNorm, step for step, bit-identical to torch CPU.

    x: [..., d] bf16 / f16 / f32; gain: [d] bf16 / f16 / f32.  Returns the dtype torch returns
    for ``gain * normalized.to(x.dtype)`` (bf16 for the model's bf16 gains and activations).
    """
    x = np.asarray(x)
    gain = np.asarray(gain)
    if x.dtype not in _ROUNDABLE or gain.dtype not in _ROUNDABLE:
        raise NumericsError(f"rms_norm supports bf16/f16/f32, got x {x.dtype}, gain {gain.dtype}")
    if x.ndim < 1 or gain.shape != (x.shape[-1],):
        raise NumericsError(f"gain shape {list(gain.shape)} does not match x {list(x.shape)}")
    d = x.shape[-1]
    in_dtype = x.dtype
    out_dtype = _promote(gain.dtype, in_dtype)
    x2 = np.ascontiguousarray(x).reshape(-1, d)
    n = x2.shape[0]
    out = np.empty((n, d), out_dtype)
    g32 = to_float32(gain)
    eps32 = np.float32(eps)
    nd = np.float32(d)
    one = np.float32(1.0)
    chunk_rows = max(1, int(chunk_rows))
    starts = range(0, n, chunk_rows)
    workers = _workers(threads, n * d)

    def do(r0: int) -> None:
        with np.errstate(all="ignore"):  # overflow to Inf / NaN propagate as in torch
            _rms_chunk(r0)

    def _rms_chunk(r0: int) -> None:
        r1 = min(n, r0 + chunk_rows)
        xs = x2[r0:r1]
        h = to_float32(xs)  # input dtype -> float32 (exact)
        sq = h * h  # pow(2): exact for bf16/f16 inputs, one rounding for f32
        var = torch_sum_f32(sq)  # mean(-1) == sum(-1) / d (torch CPU)
        var /= nd
        var += eps32  # + variance_epsilon (as float32)
        np.sqrt(var, out=var)  # rsqrt == 1 / sqrt (torch CPU, vector and scalar paths)
        np.divide(one, var, out=var)
        h *= var[:, None]
        if in_dtype == np.float32:
            hb = h
        else:
            hb = h.astype(in_dtype)  # .to(input_dtype), RNE
        if out_dtype == in_dtype and in_dtype != np.float32:
            # gain * hb in the 16-bit dtype: the product is computed in float32 and rounded once
            prod = to_float32(hb)
            prod *= g32
            _round_to(prod, out_dtype, out[r0:r1])
        else:
            prod = to_float32(hb) if hb is not h else h
            prod *= g32
            np.copyto(out[r0:r1], prod)

    _run(do, starts, workers)
    return out.reshape(x.shape[:-1] + (d,))


# ---------------------------------------------------------------- statistics


@dataclass(frozen=True)
class TensorStats:
    """Summary of a tensor's values (computed in float64 over the finite elements)."""

    dtype: str
    shape: tuple[int, ...]
    count: int
    nan: int
    posinf: int
    neginf: int
    zeros: int
    finite: int
    min: float | None
    max: float | None
    mean: float | None
    std: float | None
    rms: float | None
    saturated: int | None = None
    """FP8 e4m3 elements at |x| == 448 (the format's max), None for other dtypes."""

    @property
    def inf(self) -> int:
        return self.posinf + self.neginf

    @property
    def all_zero(self) -> bool:
        return self.count > 0 and self.zeros == self.count

    @property
    def healthy(self) -> bool:
        return self.nan == 0 and self.inf == 0

    def to_json(self) -> dict:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        d["shape"] = list(self.shape)
        return d


def _dtype_label(a: np.ndarray) -> str:
    for name, dt in _NP_DTYPES.items():
        if a.dtype == dt:
            return name
    return str(a.dtype)


def tensor_stats(a: np.ndarray, *, dtype: str | None = None, chunk: int = 1 << 22) -> TensorStats:
    """Statistics of any numeric array (bf16 / fp8 / f32 ...), streaming in chunks."""
    a = np.asarray(a)
    label = dtype or _dtype_label(a)
    flat = a.reshape(-1)
    count = int(flat.size)
    is_fp8 = a.dtype == float8_e4m3fn
    nan = posinf = neginf = zeros = sat = 0
    finite = 0
    s2 = 0.0
    mn = math.inf
    mx = -math.inf
    mean_acc = 0.0  # streaming mean/M2 (Chan et al.) for a stable std
    m2 = 0.0
    for c0 in range(0, count, chunk):
        part = flat[c0 : c0 + chunk]
        if a.dtype.kind in "biu":
            f = part.astype(np.float64)
        else:
            f = to_float32(part).astype(np.float64) if a.dtype != np.float64 else part
        isn = np.isnan(f)
        nan += int(isn.sum())
        posinf += int(np.isposinf(f).sum())
        neginf += int(np.isneginf(f).sum())
        zeros += int((f == 0).sum())
        if is_fp8:
            sat += int((np.abs(f) == FP8_E4M3_MAX).sum())
        fin = f[np.isfinite(f)]
        k = int(fin.size)
        if k:
            mn = min(mn, float(fin.min()))
            mx = max(mx, float(fin.max()))
            cm = float(fin.mean())
            cm2 = float(((fin - cm) ** 2).sum())
            tot = finite + k
            delta = cm - mean_acc
            mean_acc += delta * k / tot
            m2 += cm2 + delta * delta * finite * k / tot
            s2 += float(np.dot(fin, fin))
            finite = tot
    if finite:
        mean = mean_acc
        std = math.sqrt(m2 / finite)
        rms = math.sqrt(s2 / finite)
        mn_v, mx_v = mn, mx
    else:
        mean = std = rms = mn_v = mx_v = None
    return TensorStats(
        dtype=label,
        shape=tuple(int(s) for s in a.shape),
        count=count,
        nan=nan,
        posinf=posinf,
        neginf=neginf,
        zeros=zeros,
        finite=finite,
        min=mn_v,
        max=mx_v,
        mean=mean,
        std=std,
        rms=rms,
        saturated=sat if is_fp8 else None,
    )
