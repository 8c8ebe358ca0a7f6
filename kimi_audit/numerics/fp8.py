"""FP8 block dequantization, bit-identical to torch: ``(w.float() * s_expanded).to(torch.bfloat16)``.

A DeepseekV3 FP8 weight is float8_e4m3fn with one float32 `weight_scale_inv` per 128 x 128 block
(partial blocks at the edges); `dequantize_fp8` multiplies each element by its block's scale in
float32 and rounds once to bfloat16 (or returns the float32 product).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kimi_audit.numerics.dtypes import (
    NumericsError,
    bfloat16,
    f32_to_bf16_bits,
    float8_e4m3fn,
    fp8_e4m3_lut,
    to_float32,
)
from kimi_audit.numerics.grid import DEEPSEEK_FP8_BLOCK, scale_grid
from kimi_audit.numerics.parallel import run_each, worker_count


def _as_fp8_codes(w: np.ndarray) -> np.ndarray:
    w = np.asarray(w)
    if w.dtype == float8_e4m3fn:
        return w.view(np.uint8)
    if w.dtype == np.uint8:
        return w
    raise NumericsError(f"FP8 weight must be float8_e4m3fn (or its uint8 codes), got {w.dtype}")


def dequantize_fp8(
    w: np.ndarray,
    scale_inv: np.ndarray,
    block: Sequence[int] = DEEPSEEK_FP8_BLOCK,
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
    grid = scale_grid(codes.shape, (bo, bi))
    if s.shape != grid:
        raise NumericsError(
            f"scale_inv shape {list(s.shape)} != {list(grid)} for weight {list(codes.shape)}"
            f" with block {[bo, bi]}"
        )
    out_dtype = np.dtype(out_dtype)
    rows, cols = codes.shape
    lut = fp8_e4m3_lut()
    n_workers = worker_count(threads, rows * cols)

    if out_dtype == np.float32:
        out = np.empty((rows, cols), np.float32)

        def do_f32(rb: int) -> None:
            r0, r1 = rb * bo, min(rows, rb * bo + bo)
            srow = np.repeat(s[rb], bi)[:cols]
            blk = out[r0:r1]
            lut.take(codes[r0:r1], out=blk)
            with np.errstate(all="ignore"):
                blk *= srow

        run_each(do_f32, range(grid[0]), n_workers)
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

    run_each(do_bf16, range(grid[0]), n_workers)
    return out_bits.view(bfloat16)
