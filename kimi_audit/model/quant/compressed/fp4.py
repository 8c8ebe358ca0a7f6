"""compressed-tensors nvfp4-pack-quantized (NVFP4A16, NVFP4): `weight_packed` U8 [out, ceil(in/2)], `weight_scale`
F8_E4M3 [out, ceil(in/16)], `weight_global_scale` F32 [1] (`input_global_scale` F32 [1] with quantized
activations); mxfp4-pack-quantized (MXFP4A16, MXFP4): `weight_packed` U8 [out, ceil(in/2)], `weight_scale` U8
holding E8M0 exponents [out, ceil(in/32)] (NVFP4PackedCompressor, MXFP4PackedCompressor)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from kimi_audit.model.kinds import GLOBAL_SCALE, PACKED, PACKED_WEIGHT, SCALE
from kimi_audit.model.quant import bounds
from kimi_audit.model.quant.compressed.base import (
    METHOD,
    CompressedTensors,
    group_size_of,
    scale_dtype_of,
    static,
    strategy_of,
)
from kimi_audit.model.quant.scheme import FP8_DTYPE, Scheme, Stored, Unquantized, UnsupportedQuantization, packed_rows
from kimi_audit.numerics.grid import ceil_div

if TYPE_CHECKING:
    import numpy as np

__all__ = ["Mxfp4PackQuantized", "Nvfp4PackQuantized"]


@dataclass(frozen=True)
class Nvfp4PackQuantized(CompressedTensors):
    """FP4 E2M1 two a byte, an F8_E4M3 scale per 16 inputs and one F32 global scale (NVFP4PackedCompressor)."""

    key: ClassVar[str] = "compressed-tensors/nvfp4-pack-quantized"
    formats: ClassVar[tuple[tuple[str, str | None], ...]] = ((METHOD, "nvfp4-pack-quantized"),)
    roles: ClassVar[tuple[tuple[str, str], ...]] = (
        *CompressedTensors.roles, (".weight_packed", PACKED_WEIGHT), (".weight_global_scale", GLOBAL_SCALE))
    format_name: ClassVar[str] = "nvfp4-pack-quantized"
    default_scale: ClassVar[str] = FP8_DTYPE
    group_size: int = 16
    scale_dtype: str = FP8_DTYPE
    input_global_scale: bool = False
    strategy: str = "tensor_group"
    dequant_bytes_per_value: ClassVar[int] = 12

    @classmethod
    def from_group(cls, weights: dict[str, Any], group: dict[str, Any], plain: Unquantized) -> Scheme:
        fmt = cls.format_name
        if weights.get("type") != "float" or weights.get("num_bits") != 4 or not weights.get("symmetric", True):
            raise UnsupportedQuantization(f"compressed-tensors {fmt} weights of type {weights.get('type')!r}, "
                                          f"num_bits {weights.get('num_bits')!r} (only symmetric float, 4)")
        strategy = strategy_of(weights, fmt, ("tensor_group", "group"))
        scale_dtype = scale_dtype_of(weights, cls.default_scale)
        if scale_dtype != cls.default_scale:
            raise UnsupportedQuantization(f"compressed-tensors {fmt} scales of {scale_dtype}")
        acts = group.get("input_activations")
        global_scale = isinstance(acts, dict) and static(acts) and acts.get("strategy") == "tensor_group"
        return cls(group_size=group_size_of(weights, strategy, fmt), scale_dtype=scale_dtype,
                   input_global_scale=global_scale, strategy=strategy)

    @property
    def name(self) -> str:
        return "NVFP4" if self.format_name.startswith("nvfp4") else "MXFP4"

    @property
    def param_dtype(self) -> str:
        return "FP4"

    def summary(self) -> dict[str, Any]:
        return {"method": METHOD, "format": self.format_name, "bits": 4, "type": "float", "strategy": self.strategy,
                "group_size": self.group_size, "scale_dtype": self.scale_dtype}

    def stored(self, out: int, inp: int) -> tuple[Stored, ...]:
        tensors = [Stored(".weight_packed", "U8", (out, ceil_div(inp, 2)), PACKED, out * inp),
                   Stored(".weight_scale", self.scale_dtype, (out, ceil_div(inp, self.group_size)), SCALE)]
        if self.default_scale == FP8_DTYPE:
            tensors.append(Stored(".weight_global_scale", "F32", (1,), SCALE))
        if self.input_global_scale:
            tensors.append(Stored(".input_global_scale", "F32", (1,), SCALE))
        return tuple(tensors)

    def describe(self) -> str:
        return (f"FP4 e2m1, two per U8 byte, one F8_E4M3 scale per {self.group_size} inputs and an F32 global "
                f"scale (compressed-tensors {self.format_name})")

    def error_bound(self) -> float:
        """FP4 E2M1 codes, an E4M3 scale per `group_size` inputs under a global scale: bounds.nvfp4."""
        return bounds.nvfp4(self.group_size)

    def dequantize(self, tensors: Mapping[str, np.ndarray], out: int, inp: int) -> np.ndarray:
        """NVFP4PackedCompressor.decompress: ``fp4 * (bf16(scale) / global_scale)`` in float32, to bf16."""
        from kimi_audit.numerics.fp4 import dequantize_nvfp4

        return dequantize_nvfp4(packed_rows(tensors, ".weight_packed", out), tensors[".weight_scale"],
                                tensors[".weight_global_scale"], inp, self.group_size)


@dataclass(frozen=True)
class Mxfp4PackQuantized(Nvfp4PackQuantized):
    """FP4 E2M1 two a byte, one E8M0 exponent (U8) per 32 inputs (MXFP4PackedCompressor)."""

    key: ClassVar[str] = "compressed-tensors/mxfp4-pack-quantized"
    formats: ClassVar[tuple[tuple[str, str | None], ...]] = ((METHOD, "mxfp4-pack-quantized"),)
    format_name: ClassVar[str] = "mxfp4-pack-quantized"
    default_scale: ClassVar[str] = "U8"
    group_size: int = 32
    scale_dtype: str = "U8"
    strategy: str = "group"

    @property
    def power_of_two_scales(self) -> bool:
        return True

    def describe(self) -> str:
        return (f"FP4 e2m1, two per U8 byte, one E8M0 exponent (U8) per {self.group_size} inputs "
                f"(compressed-tensors {self.format_name})")

    def error_bound(self) -> float:
        """MXFP4: FP4 E2M1 codes, an E8M0 scale per `group_size` inputs: bounds.power_of_two_fp4."""
        return bounds.power_of_two_fp4(self.group_size)

    def dequantize(self, tensors: Mapping[str, np.ndarray], out: int, inp: int) -> np.ndarray:
        """MXFP4PackedCompressor.decompress: ``fp4 * bf16(2 ** (e - 127))``, to bf16."""
        from kimi_audit.numerics.fp4 import dequantize_mxfp4

        return dequantize_mxfp4(packed_rows(tensors, ".weight_packed", out), tensors[".weight_scale"], inp,
                                self.group_size)
