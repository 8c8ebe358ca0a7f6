"""compressed-tensors float-quantized (FP8_BLOCK, FP8_DYNAMIC, FP8) and int-quantized (INT8 W8A8): `weight`
F8_E4M3 / I8 [out, in], `weight_scale` [ceil(out/b0), ceil(in/b1)] (block), [out, 1] (channel), [out, in/group]
(group) or [1] (tensor); `input_scale` [1] when the activations are quantized statically (its naive_quantized
compressors)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from kimi_audit.errors import ConfigError
from kimi_audit.model.kinds import PARAMETER, SCALE
from kimi_audit.model.quant import bounds
from kimi_audit.model.quant.compressed.base import (
    METHOD,
    CompressedTensors,
    group_size_of,
    scale_dtype_of,
    scale_shape,
    scales_2d,
    static,
    strategy_of,
)
from kimi_audit.model.quant.scheme import FP8_DTYPE, Scheme, Stored, Unquantized, UnsupportedQuantization, stored_weight

if TYPE_CHECKING:
    import numpy as np

__all__ = ["FloatQuantized", "IntQuantized"]


@dataclass(frozen=True)
class FloatQuantized(CompressedTensors):
    """FP8 e4m3 weights with scales by block, output channel or tensor (FloatQuantizationCompressor)."""

    key: ClassVar[str] = "compressed-tensors/float-quantized"
    formats: ClassVar[tuple[tuple[str, str | None], ...]] = ((METHOD, "float-quantized"),)
    weight_type: ClassVar[str] = "float"
    weight_dtype: ClassVar[str] = FP8_DTYPE
    format_name: ClassVar[str] = "float-quantized"
    strategy: str = "channel"
    block: tuple[int, int] = (128, 128)
    """The block strategy's [rows, cols]."""
    group_size: int = 0
    scale_dtype: str = "BF16"
    input_scale: bool = False
    """The activations are quantized statically: an `input_scale` [1] per module."""
    dequant_bytes_per_value: ClassVar[int] = 8

    @classmethod
    def from_group(cls, weights: dict[str, Any], group: dict[str, Any], plain: Unquantized) -> Scheme:
        fmt = cls.format_name
        if weights.get("type") != cls.weight_type or weights.get("num_bits") != 8:
            raise UnsupportedQuantization(f"compressed-tensors {fmt} weights of type {weights.get('type')!r}, "
                                          f"num_bits {weights.get('num_bits')!r} (only {cls.weight_type}, 8)")
        if not weights.get("symmetric", True):
            raise UnsupportedQuantization(f"compressed-tensors {fmt} asymmetric weights")
        strategy = strategy_of(weights, fmt, ("block", "channel", "tensor", "group"))
        block = (1, 1)
        if strategy == "block":
            b = weights.get("block_structure")
            if not (isinstance(b, list) and len(b) == 2 and all(type(v) is int and v > 0 for v in b)):
                raise ConfigError(f"config.json compressed-tensors block_structure {b!r} is not [rows, cols]")
            block = (b[0], b[1])
        return cls(strategy=strategy, block=block, group_size=group_size_of(weights, strategy, fmt),
                   scale_dtype=scale_dtype_of(weights, plain.dtype), input_scale=static(group.get("input_activations")))

    @property
    def name(self) -> str:
        return "FP8" if self.weight_type == "float" else "INT8"

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {"method": METHOD, "format": self.format_name, "bits": 8, "type": self.weight_type,
                               "strategy": self.strategy}
        if self.strategy == "block":
            out["block"] = list(self.block)
        if self.group_size:
            out["group_size"] = self.group_size
        return out

    def scale_block(self, out: int, inp: int) -> tuple[int, int]:
        """The [rows, cols] each scale covers."""
        return {"block": self.block, "channel": (1, inp), "group": (1, self.group_size)}.get(
            self.strategy, (out, inp))

    def stored(self, out: int, inp: int) -> tuple[Stored, ...]:
        tensors = [Stored(".weight", self.weight_dtype, (out, inp), PARAMETER, out * inp),
                   Stored(".weight_scale", self.scale_dtype,
                          scale_shape(self.strategy, out, inp, self.group_size, self.block), SCALE)]
        if self.input_scale:
            tensors.append(Stored(".input_scale", self.scale_dtype, (1,), SCALE))
        return tuple(tensors)

    def describe(self) -> str:
        per = {"block": f"per {self.block[0]}x{self.block[1]} block", "channel": "per output channel",
               "group": f"per {self.group_size} inputs", "tensor": "per tensor"}[self.strategy]
        what = "FP8 e4m3" if self.weight_type == "float" else "INT8"
        return f"{what}, one {self.scale_dtype} scale {per} (compressed-tensors {self.format_name})"

    def error_bound(self) -> float:
        """FP8 E4M3 codes, a scale per block, channel or tensor (its absmax / 448): bounds.float_grid."""
        return bounds.float_grid(3)

    def dequantize(self, tensors: Mapping[str, np.ndarray], out: int, inp: int) -> np.ndarray:
        """compressed-tensors' decompression: ``w.to(scale.dtype) * scale`` (the product in float32, rounded once
        to the scale's dtype), the scale broadcast over its block, channel or tensor."""
        import numpy as np

        from kimi_audit.numerics.dtypes import NumericsError, bfloat16
        from kimi_audit.numerics.fp8 import dequantize_fp8

        w = stored_weight(tensors, ".weight", out, inp)
        s = tensors[".weight_scale"]
        b = self.scale_block(out, inp)
        s = s.reshape(1, 1) if s.ndim == 1 and s.size == 1 else s
        if s.dtype not in (bfloat16, np.dtype(np.float32)):
            raise NumericsError(f"weight_scale must be BF16 or F32 to dequantize, got {s.dtype}")
        return dequantize_fp8(w, s, b, out_dtype=s.dtype)


@dataclass(frozen=True)
class IntQuantized(FloatQuantized):
    """INT8 weights stored as I8 with float scales (IntQuantizationCompressor: W8A8)."""

    key: ClassVar[str] = "compressed-tensors/int-quantized"
    formats: ClassVar[tuple[tuple[str, str | None], ...]] = ((METHOD, "int-quantized"),)
    weight_type: ClassVar[str] = "int"
    weight_dtype: ClassVar[str] = "I8"
    format_name: ClassVar[str] = "int-quantized"

    def error_bound(self) -> float:
        """INT8 codes, a scale per channel, group or tensor: bounds.uniform_grid."""
        return bounds.uniform_grid(8)

    def dequantize(self, tensors: Mapping[str, np.ndarray], out: int, inp: int) -> np.ndarray:
        from kimi_audit.numerics.dtypes import NumericsError
        from kimi_audit.numerics.int4 import dequantize_group

        if self.strategy == "block":
            raise NumericsError("block-wise INT8 is not dequantized here")
        w = stored_weight(tensors, ".weight", out, inp)
        return dequantize_group(w, scales_2d(tensors[".weight_scale"], out), None, self.scale_block(out, inp)[1])
