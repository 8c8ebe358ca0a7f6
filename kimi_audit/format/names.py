"""Tensor names with their varying indices shown as ranges: `model.layers.{1-60}.mlp.gate.weight`."""

from __future__ import annotations


def ranges(numbers: list[int]) -> str:
    nums = sorted(set(numbers))
    parts: list[str] = []
    start = prev = nums[0]
    for n in [*nums[1:], None]:
        if n is not None and n == prev + 1:
            prev = n
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if n is not None:
            start = prev = n
    return ",".join(parts)
