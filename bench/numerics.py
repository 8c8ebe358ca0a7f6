"""Benchmark: numpy numerics (kimi_audit.numerics.kernels) vs torch CPU, exactness checked in the same run.

    python bench/numerics.py [--repeats N]

RMSNorm (DeepseekV3RMSNorm arithmetic) on [8, 4096, 1536] bf16 activations with a bf16 gain, and
FP8 block dequantization of a [7168, 2048] float8_e4m3fn expert weight with its [56, 16] scales,
`(w.float() * s_expanded).to(torch.bfloat16)`.  Best-of-N wall times; ratio = numpy throughput /
torch throughput (>= 0.5 is the target).  torch is a benchmark-only dependency.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import ml_dtypes
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from kimi_audit.numerics import kernels as nm

try:
    import torch
except ImportError:  # pragma: no cover
    sys.exit("bench/numerics.py needs torch (pip install torch==2.13.0)")


def torch_rms(x, w, eps=1e-6):
    input_dtype = x.dtype
    h = x.to(torch.float32)
    var = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(var + eps)
    return w * h.to(input_dtype)


def torch_dequant(w, s):
    rows, cols = w.shape
    se = s.repeat_interleave(128, 0).repeat_interleave(128, 1)[:rows, :cols]
    return (w.float() * se).to(torch.bfloat16)


def bits(t):
    return t.contiguous().view(torch.int16).numpy().view(np.uint16)


def best(fn, repeats):
    times = []
    out = None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return min(times), out


def differing(a, b):
    """Elements whose bits differ, NaN vs NaN counted equal."""
    both_nan = np.isnan(a.view(ml_dtypes.bfloat16).astype(np.float32)) & np.isnan(
        b.view(ml_dtypes.bfloat16).astype(np.float32)
    )
    return int(((a != b) & ~both_nan).sum())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    torch.manual_seed(0)
    print(f"torch {torch.__version__} ({torch.backends.cpu.get_cpu_capability()}, "
          f"{torch.get_num_threads()} threads); numpy {np.__version__}; cpus {os.cpu_count()}")

    x = (torch.randn(8, 4096, 1536) * torch.exp(torch.empty(8, 4096, 1).uniform_(-4, 4))).to(
        torch.bfloat16
    )
    g = (torch.rand(1536) * 2 + 0.05).to(torch.bfloat16)
    xn = bits(x).view(ml_dtypes.bfloat16)
    gn = bits(g).view(ml_dtypes.bfloat16)
    t_t, y_t = best(lambda: torch_rms(x, g), args.repeats)
    t_n, y_n = best(lambda: nm.rms_norm(xn, gn), args.repeats)
    n = x.numel()
    diff = differing(y_n.view(np.uint16), bits(y_t))
    print(f"rmsnorm [8,4096,1536] bf16: torch {t_t*1e3:8.1f} ms ({n/t_t/1e6:7.1f} Melem/s)  "
          f"numpy {t_n*1e3:8.1f} ms ({n/t_n/1e6:7.1f} Melem/s)  ratio {t_t/t_n:5.2f}x  "
          f"differing elements {diff}")

    codes = torch.randint(0, 256, (7168, 2048), dtype=torch.int32).to(torch.uint8)
    codes[codes == 0x7F] = 0x7E  # finite weights (NaN codes are tested in tests/)
    codes[codes == 0xFF] = 0xFE
    w = codes.view(torch.float8_e4m3fn)
    s = torch.exp(torch.empty(56, 16).uniform_(-10, 0))
    wn = codes.numpy()
    sn = s.numpy()
    t_t2, d_t = best(lambda: torch_dequant(w, s), args.repeats)
    t_n2, d_n = best(lambda: nm.dequantize_fp8(wn, sn), args.repeats)
    n2 = w.numel()
    diff2 = differing(d_n.view(np.uint16), bits(d_t))
    print(f"dequant [7168,2048] fp8->bf16: torch {t_t2*1e3:8.1f} ms ({n2/t_t2/1e6:7.1f} Melem/s)  "
          f"numpy {t_n2*1e3:8.1f} ms ({n2/t_n2/1e6:7.1f} Melem/s)  ratio {t_t2/t_n2:5.2f}x  "
          f"differing elements {diff2}")
    ok = diff == 0 and diff2 == 0 and t_t / t_n >= 0.5 and t_t2 / t_n2 >= 0.5
    print("target (exact, >= 0.5x torch throughput):", "met" if ok else "NOT met")


if __name__ == "__main__":
    main()
