"""Torch-exact RMSNorm in numpy, and the torch-ordered float32 sum it needs.

Everything here is bit-faithful to what PyTorch (CPU) computes for the same expressions:

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

import numpy as np

from kimi_audit.numerics.dtypes import NumericsError, bfloat16, to_float32
from kimi_audit.numerics.parallel import run_each, worker_count

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
            zero_plus_b: np.ndarray = np.add(b, np.float32(0.0))  # 0 + b, as the zero-filled accumulator does
            return zero_plus_b
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
    for ``gain * normalized.to(x.dtype)``: bf16 for the model's bf16 gains and activations; float32
    for DeepSeek-V3.2's F32 gains, where torch promotes ``f32 * bf16`` to float32 (the bf16 value
    widened exactly, one float32 multiply, no rounding back to bf16).
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
    workers = worker_count(threads, n * d)

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
        hb = h if in_dtype == np.float32 else h.astype(in_dtype)  # .to(input_dtype), RNE
        if out_dtype == in_dtype and in_dtype != np.float32:
            # gain * hb in the 16-bit dtype: the product is computed in float32 and rounded once
            prod = to_float32(hb)
            prod *= g32
            _round_to(prod, out_dtype, out[r0:r1])
        else:
            prod = to_float32(hb) if hb is not h else h
            prod *= g32
            np.copyto(out[r0:r1], prod)

    run_each(do, starts, workers)
    return out.reshape(x.shape[:-1] + (d,))
