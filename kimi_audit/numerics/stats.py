"""Value statistics of a decoded tensor: NaN/Inf/zero counts, range, mean, std, RMS, FP8 saturation."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from kimi_audit.numerics.dtypes import FP8_E4M3_MAX, NP_DTYPES, float8_e4m3fn, to_float32


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

    def to_json(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        d["shape"] = list(self.shape)
        return d


def _dtype_label(a: np.ndarray) -> str:
    for name, dt in NP_DTYPES.items():
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
    mean: float | None
    std: float | None
    rms: float | None
    mn_v: float | None
    mx_v: float | None
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
