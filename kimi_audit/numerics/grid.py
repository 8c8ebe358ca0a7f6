"""Block-scale grids, with no numpy: what the header-only path (layout, verify's plan) needs of them.

A block-quantized 2-D weight [out, in] carries one scale per [b0, b1] block, edge blocks partial: a grid of
[ceil(out/b0), ceil(in/b1)] scales. `scale_grid` is the one place that grid is computed; the block size
comes from the quantization scheme (model.quant.Fp8Block.block), whose default is DEEPSEEK_FP8_BLOCK.
"""

from __future__ import annotations

from collections.abc import Sequence

DEEPSEEK_FP8_BLOCK = (128, 128)
"""DeepSeek-V3's `weight_block_size` (and the default of the FP8 kernels here)."""


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def scale_grid(shape: Sequence[int], block: Sequence[int]) -> tuple[int, int]:
    """The scale grid of a 2-D weight of `shape` in blocks of `block`: [ceil(out/b0), ceil(in/b1)]."""
    out_f, in_f = shape
    b0, b1 = block
    return ceil_div(out_f, b0), ceil_div(in_f, b1)
