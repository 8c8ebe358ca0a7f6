"""compressed-tensors pack-quantized (W4A16, W8A16; Kimi-K2-Thinking's INT4): `weight_packed` I32
[out, ceil(in*bits/32)], `weight_scale` [out, ceil(in/group)] (group), [out, 1] (channel) or [1] (tensor),
`weight_shape` [2]; `weight_zero_point` packed along the outputs for asymmetric group / channel schemes,
`weight_g_idx` for actorder=group (PackedQuantizationCompressor).

`weight_shape` is I32 as Moonshot's releases store it (a public header dump of moonshotai/Kimi-K2.5 lists
`weight_shape` `[2]` `torch.int32` for all 69,120 expert projections; its 554.27 GB payload holds only with I32);
compressed-tensors' own compressor writes `torch.tensor(weight.shape)`, I64: a writer's width (WRITER_DTYPE info),
the values read alike."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from kimi_audit.model.kinds import PACKED, PACKED_WEIGHT, SCALE, WEIGHT_SHAPE
from kimi_audit.model.quant import bounds
from kimi_audit.model.quant.compressed.base import (
    METHOD,
    CompressedTensors,
    group_size_of,
    scale_dtype_of,
    scale_shape,
    scales_2d,
    strategy_of,
)
from kimi_audit.model.quant.scheme import Scheme, Stored, Unquantized, UnsupportedQuantization
from kimi_audit.numerics.grid import ceil_div

if TYPE_CHECKING:
    import numpy as np

__all__ = ["PackQuantized"]


@dataclass(frozen=True)
class PackQuantized(CompressedTensors):
    key: ClassVar[str] = "compressed-tensors/pack-quantized"
    formats: ClassVar[tuple[tuple[str, str | None], ...]] = ((METHOD, "pack-quantized"),)
    roles: ClassVar[tuple[tuple[str, str], ...]] = (
        *CompressedTensors.roles, (".weight_packed", PACKED_WEIGHT), (".weight_shape", WEIGHT_SHAPE))
    writer_dtypes: ClassVar[tuple[tuple[str, str, str], ...]] = (
        (".weight_shape", "I64", "compressed-tensors' compressor (torch.tensor(weight.shape))"),)
    bits: int = 4
    group_size: int = 32
    """0 for the channel and tensor strategies."""
    symmetric: bool = True
    scale_dtype: str = "BF16"
    actorder: str | None = None
    strategy: str = "group"
    dequant_bytes_per_value: ClassVar[int] = 8
    """The result, the unpacked codes and the float32 products."""

    @classmethod
    def from_group(cls, weights: dict[str, Any], group: dict[str, Any], plain: Unquantized) -> Scheme:
        fmt = "pack-quantized"
        if weights.get("type") != "int":
            raise UnsupportedQuantization(f"compressed-tensors {fmt} weights of type {weights.get('type')!r}")
        strategy = strategy_of(weights, fmt, ("group", "channel", "tensor"))
        bits = weights.get("num_bits")
        if type(bits) is not int or not 1 <= bits <= 8:
            raise UnsupportedQuantization(f"compressed-tensors {fmt} num_bits {bits!r}")
        symmetric = bool(weights.get("symmetric", True))
        if strategy == "tensor" and not symmetric:
            raise UnsupportedQuantization(f"compressed-tensors {fmt} asymmetric tensor strategy")
        actorder = weights.get("actorder")
        return cls(bits=bits, group_size=group_size_of(weights, strategy, fmt), symmetric=symmetric,
                   scale_dtype=scale_dtype_of(weights, plain.dtype), strategy=strategy,
                   actorder=actorder if isinstance(actorder, str) else None)

    @property
    def name(self) -> str:
        return f"INT{self.bits}"

    @property
    def param_dtype(self) -> str:
        return self.name

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {"method": METHOD, "format": "pack-quantized", "bits": self.bits,
                               "group_size": self.group_size or None, "strategy": self.strategy,
                               "symmetric": self.symmetric}
        if self.actorder:
            out["actorder"] = self.actorder
        return out

    def stored(self, out: int, inp: int) -> tuple[Stored, ...]:
        scale = scale_shape(self.strategy, out, inp, self.group_size, (1, 1))
        out_tensors = [Stored(".weight_packed", "I32", (out, ceil_div(inp * self.bits, 32)), PACKED, out * inp),
                       Stored(".weight_scale", self.scale_dtype, scale, SCALE),
                       Stored(".weight_shape", "I32", (2,), SCALE)]
        if not self.symmetric:  # packed along the output dimension (compressed-tensors pack_to_int32, dim 0)
            out_tensors.append(Stored(".weight_zero_point", "I32", (ceil_div(out * self.bits, 32), scale[-1]), SCALE))
        if self.actorder == "group":
            out_tensors.append(Stored(".weight_g_idx", "I32", (inp,), SCALE))
        return tuple(out_tensors)

    def describe(self) -> str:
        kind = "symmetric" if self.symmetric else "asymmetric"
        per = {"group": f"per {self.group_size} inputs", "channel": "per output channel", "tensor": "per tensor"}
        return (f"INT{self.bits} {kind}, {32 // self.bits} per I32 word, one {self.scale_dtype} scale "
                f"{per[self.strategy]} (compressed-tensors pack-quantized)")

    def error_bound(self) -> float:
        """`bits`-bit integer codes (with zero points where asymmetric), a scale per group or channel:
        bounds.uniform_grid."""
        return bounds.uniform_grid(self.bits)

    def dequantize(self, tensors: Mapping[str, np.ndarray], out: int, inp: int) -> np.ndarray:
        """compressed-tensors' decompression: unpack the codes (and an asymmetric scheme's zero points),
        then ``(q - z) * scale`` per group in the scale's dtype (BF16). `weight_shape`, when given, must
        hold [out, in]; `weight_g_idx`, when given, assigns each input its group."""
        from kimi_audit.numerics.dtypes import NumericsError
        from kimi_audit.numerics.int4 import dequantize_group, unpack_int4

        shape = tensors.get(".weight_shape")
        if shape is not None and [int(v) for v in shape.reshape(-1)] != [out, inp]:
            raise NumericsError(f"weight_shape holds {[int(v) for v in shape.reshape(-1)]}, "
                                f"the module is {[out, inp]}")
        q = unpack_int4(tensors[".weight_packed"], self.bits, inp)
        if q.shape[0] != out:
            raise NumericsError(f"weight_packed has {q.shape[0]} rows, the module {out} outputs")
        scale = scales_2d(tensors[".weight_scale"], out)
        zp = None
        if not self.symmetric:
            if ".weight_zero_point" not in tensors:
                raise NumericsError("an asymmetric scheme without its weight_zero_point")
            zp = unpack_int4(tensors[".weight_zero_point"], self.bits, out, packed_dim=0)
        return dequantize_group(q, scale, zp, self.group_size or inp, g_idx=tensors.get(".weight_g_idx"))
