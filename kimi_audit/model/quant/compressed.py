"""compressed-tensors' formats (`quant_method: compressed-tensors`), one class each, as its compressors write
them (compressed_tensors.compressors, 0.19-0.20):

- pack-quantized (W4A16, W8A16; Kimi-K2-Thinking's INT4): `weight_packed` I32 [out, ceil(in*bits/32)],
  `weight_scale` [out, ceil(in/group)] (group), [out, 1] (channel) or [1] (tensor), `weight_shape` I64 [2];
  `weight_zero_point` packed along the outputs for asymmetric group/channel schemes, `weight_g_idx` for
  actorder=group;
- float-quantized (FP8_BLOCK, FP8_DYNAMIC, FP8): `weight` F8_E4M3 [out, in], `weight_scale`
  [ceil(out/b0), ceil(in/b1)] (block), [out, 1] (channel) or [1] (tensor); `input_scale` [1] when the
  activations are quantized statically;
- int-quantized (INT8 W8A8): `weight` I8 [out, in] and `weight_scale` as float-quantized's;
- nvfp4-pack-quantized (NVFP4A16, NVFP4): `weight_packed` U8 [out, ceil(in/2)], `weight_scale` F8_E4M3
  [out, ceil(in/16)], `weight_global_scale` F32 [1]; `input_global_scale` F32 [1] with quantized activations;
- mxfp4-pack-quantized (MXFP4A16, MXFP4): `weight_packed` U8 [out, ceil(in/2)], `weight_scale` U8 holding E8M0
  exponents [out, ceil(in/32)].

A scale's dtype is the group's `scale_dtype` where written, else the model's dtype (the observers' output).
`compressed_tensors_plan` reads `config_groups` (several allowed, each with its own targets and, as
compressed-tensors allows, its own `format`) and `ignore`, names (exact) or `re:` patterns (re.match).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from kimi_audit.errors import ConfigError
from kimi_audit.model.kinds import PACKED, PARAMETER, SCALE
from kimi_audit.model.quant.scheme import (
    FP8_DTYPE,
    Scheme,
    Stored,
    Unquantized,
    UnsupportedQuantization,
    packed_rows,
    stored_weight,
)
from kimi_audit.numerics.grid import ceil_div, scale_grid

if TYPE_CHECKING:
    import numpy as np

    from kimi_audit.model.quant.plan import QuantPlan

__all__ = ["CompressedTensors", "FloatQuantized", "IntQuantized", "Mxfp4PackQuantized", "Nvfp4PackQuantized",
           "PackQuantized", "compressed_tensors_plan"]

METHOD = "compressed-tensors"
TORCH_DTYPES = {"torch.bfloat16": "BF16", "torch.float16": "F16", "torch.float32": "F32",
                "torch.float8_e4m3fn": FP8_DTYPE, "torch.uint8": "U8"}
"""`scale_dtype` as compressed-tensors serializes it -> the safetensors dtype."""
LINEAR = "Linear"
MIXED = "mixed-precision"
"""The config's `format` when each config group names its own."""


def _scale_dtype(weights: Mapping[str, Any], default: str) -> str:
    v = weights.get("scale_dtype")
    if v is None:
        return default
    dtype = TORCH_DTYPES.get(v) if isinstance(v, str) else None
    if dtype is None:
        raise UnsupportedQuantization(f"compressed-tensors scale_dtype {v!r}")
    return dtype


def _static(activations: Any) -> bool:
    """Activations quantized with a stored scale (`dynamic` false or 'local')."""
    return isinstance(activations, dict) and activations.get("dynamic") is not True


def _scale_shape(strategy: str, out: int, inp: int, group: int, block: tuple[int, int]) -> tuple[int, ...]:
    if strategy in ("group", "tensor_group"):
        return (out, ceil_div(inp, group))
    if strategy == "channel":
        return (out, 1)
    if strategy == "block":
        return scale_grid((out, inp), block)
    return (1,)


def _scales_2d(scale: np.ndarray, out: int) -> np.ndarray:
    """A per-tensor scale [1] as [out, 1] (one group spanning the inputs)."""
    import numpy as np

    return np.broadcast_to(scale.reshape(1, 1), (out, 1)) if scale.ndim == 1 else scale


@dataclass(frozen=True)
class CompressedTensors(Scheme):
    """A compressed-tensors format: built per config group (`from_group`), planned together."""

    @classmethod
    def plan(cls, q: dict[str, Any], plain: Unquantized, config: Mapping[str, Any]) -> QuantPlan:
        return compressed_tensors_plan(q, plain)

    @classmethod
    def from_group(cls, weights: dict[str, Any], group: dict[str, Any], plain: Unquantized) -> Scheme:
        """The scheme of one config group (UnsupportedQuantization for settings the class does not read)."""
        raise NotImplementedError


def _strategy(weights: Mapping[str, Any], fmt: str, allowed: tuple[str, ...]) -> str:
    strategy = weights.get("strategy")
    if strategy not in allowed:
        raise UnsupportedQuantization(f"compressed-tensors {fmt} strategy {strategy!r} (only {', '.join(allowed)})")
    return str(strategy)


def _group_size(weights: Mapping[str, Any], strategy: str, fmt: str) -> int:
    if strategy not in ("group", "tensor_group"):
        return 0
    g = weights.get("group_size")
    if type(g) is not int or g <= 0:
        raise UnsupportedQuantization(f"compressed-tensors {fmt} group_size {g!r}")
    return g


@dataclass(frozen=True)
class PackQuantized(CompressedTensors):
    key: ClassVar[str] = "compressed-tensors/pack-quantized"
    formats: ClassVar[tuple[tuple[str, str | None], ...]] = ((METHOD, "pack-quantized"),)
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
        strategy = _strategy(weights, fmt, ("group", "channel", "tensor"))
        bits = weights.get("num_bits")
        if type(bits) is not int or not 1 <= bits <= 8:
            raise UnsupportedQuantization(f"compressed-tensors {fmt} num_bits {bits!r}")
        symmetric = bool(weights.get("symmetric", True))
        if strategy == "tensor" and not symmetric:
            raise UnsupportedQuantization(f"compressed-tensors {fmt} asymmetric tensor strategy")
        actorder = weights.get("actorder")
        return cls(bits=bits, group_size=_group_size(weights, strategy, fmt), symmetric=symmetric,
                   scale_dtype=_scale_dtype(weights, plain.dtype), strategy=strategy,
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
        scale = _scale_shape(self.strategy, out, inp, self.group_size, (1, 1))
        out_tensors = [Stored(".weight_packed", "I32", (out, ceil_div(inp * self.bits, 32)), PACKED, out * inp),
                       Stored(".weight_scale", self.scale_dtype, scale, SCALE),
                       Stored(".weight_shape", "I64", (2,), SCALE)]
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
        scale = _scales_2d(tensors[".weight_scale"], out)
        zp = None
        if not self.symmetric:
            if ".weight_zero_point" not in tensors:
                raise NumericsError("an asymmetric scheme without its weight_zero_point")
            zp = unpack_int4(tensors[".weight_zero_point"], self.bits, out, packed_dim=0)
        return dequantize_group(q, scale, zp, self.group_size or inp, g_idx=tensors.get(".weight_g_idx"))


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
        strategy = _strategy(weights, fmt, ("block", "channel", "tensor", "group"))
        block = (1, 1)
        if strategy == "block":
            b = weights.get("block_structure")
            if not (isinstance(b, list) and len(b) == 2 and all(type(v) is int and v > 0 for v in b)):
                raise ConfigError(f"config.json compressed-tensors block_structure {b!r} is not [rows, cols]")
            block = (b[0], b[1])
        return cls(strategy=strategy, block=block, group_size=_group_size(weights, strategy, fmt),
                   scale_dtype=_scale_dtype(weights, plain.dtype), input_scale=_static(group.get("input_activations")))

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
                          _scale_shape(self.strategy, out, inp, self.group_size, self.block), SCALE)]
        if self.input_scale:
            tensors.append(Stored(".input_scale", self.scale_dtype, (1,), SCALE))
        return tuple(tensors)

    def describe(self) -> str:
        per = {"block": f"per {self.block[0]}x{self.block[1]} block", "channel": "per output channel",
               "group": f"per {self.group_size} inputs", "tensor": "per tensor"}[self.strategy]
        what = "FP8 e4m3" if self.weight_type == "float" else "INT8"
        return f"{what}, one {self.scale_dtype} scale {per} (compressed-tensors {self.format_name})"

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

    def dequantize(self, tensors: Mapping[str, np.ndarray], out: int, inp: int) -> np.ndarray:
        from kimi_audit.numerics.dtypes import NumericsError
        from kimi_audit.numerics.int4 import dequantize_group

        if self.strategy == "block":
            raise NumericsError("block-wise INT8 is not dequantized here")
        w = stored_weight(tensors, ".weight", out, inp)
        return dequantize_group(w, _scales_2d(tensors[".weight_scale"], out), None, self.scale_block(out, inp)[1])


@dataclass(frozen=True)
class Nvfp4PackQuantized(CompressedTensors):
    """FP4 E2M1 two a byte, an F8_E4M3 scale per 16 inputs and one F32 global scale (NVFP4PackedCompressor)."""

    key: ClassVar[str] = "compressed-tensors/nvfp4-pack-quantized"
    formats: ClassVar[tuple[tuple[str, str | None], ...]] = ((METHOD, "nvfp4-pack-quantized"),)
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
        strategy = _strategy(weights, fmt, ("tensor_group", "group"))
        scale_dtype = _scale_dtype(weights, cls.default_scale)
        if scale_dtype != cls.default_scale:
            raise UnsupportedQuantization(f"compressed-tensors {fmt} scales of {scale_dtype}")
        acts = group.get("input_activations")
        static = isinstance(acts, dict) and _static(acts) and acts.get("strategy") == "tensor_group"
        return cls(group_size=_group_size(weights, strategy, fmt), scale_dtype=scale_dtype, input_global_scale=static,
                   strategy=strategy)

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

    def dequantize(self, tensors: Mapping[str, np.ndarray], out: int, inp: int) -> np.ndarray:
        """MXFP4PackedCompressor.decompress: ``fp4 * bf16(2 ** (e - 127))``, to bf16."""
        from kimi_audit.numerics.fp4 import dequantize_mxfp4

        return dequantize_mxfp4(packed_rows(tensors, ".weight_packed", out), tensors[".weight_scale"], inp,
                                self.group_size)


def _matchers(entries: Any, what: str) -> tuple[set[str], list[str], bool]:
    """(exact names, `re:` patterns, whether the class target `Linear` is among them) of targets or ignore."""
    names: set[str] = set()
    patterns: list[str] = []
    linear = False
    for entry in entries or []:
        if not isinstance(entry, str):
            raise ConfigError(f"config.json quantization_config {what} holds {entry!r}, not a string")
        if entry == LINEAR:
            linear = True
        elif entry.startswith("re:"):
            patterns.append(entry[3:])
        else:
            names.add(entry)
    return names, patterns, linear


def _compile(pattern: str) -> re.Pattern[str]:
    try:
        return re.compile(pattern)
    except re.error as e:
        raise ConfigError(f"config.json quantization_config holds an invalid regex {pattern!r}: {e}") from None


def compressed_tensors_plan(q: dict[str, Any], plain: Unquantized) -> QuantPlan:
    """The plan of a compressed-tensors quantization_config: each config group's scheme (by the group's
    `format`, else the config's) for its targets, `ignore` left plain."""
    from kimi_audit.model.quant.plan import QuantPlan

    top = q.get("format")
    if top is not None and top != MIXED and (METHOD, top) not in Scheme.registry:
        raise UnsupportedQuantization(f"{METHOD} format {top!r}")
    groups = q.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        raise UnsupportedQuantization("compressed-tensors without config_groups")
    every: Scheme | None = None
    exact: dict[str, Scheme] = {}
    patterns: dict[str, Scheme] = {}
    summaries: list[tuple[Scheme, dict[str, Any]]] = []
    for name, group in groups.items():
        weights = group.get("weights") if isinstance(group, dict) else None
        if not isinstance(group, dict) or not isinstance(weights, dict):
            raise UnsupportedQuantization(f"compressed-tensors config group {name!r} without weights")
        fmt = group.get("format") or q.get("format")
        cls = Scheme.registry.get((METHOD, fmt)) if isinstance(fmt, str) else None
        if cls is None or not issubclass(cls, CompressedTensors):
            raise UnsupportedQuantization(f"{METHOD} format {fmt!r}")
        scheme = cls.from_group(weights, group, plain)
        names, regexes, linear = _matchers(group.get("targets"), "targets")
        if not (names or regexes or linear):
            raise UnsupportedQuantization(f"compressed-tensors targets {group.get('targets')!r}")
        for n in names:  # a target written twice: the later group's, as compressed-tensors' target_to_scheme
            exact[n] = scheme
        for p in regexes:
            patterns[p] = scheme
        if linear:
            every = scheme
        summaries.append((scheme, {"targets": list(group.get("targets") or [])}))
    ig_names, ig_patterns, ig_linear = _matchers(q.get("ignore"), "ignore")
    if ig_linear:
        every = None
    ignore_re = _compile("|".join(f"(?:{p})" for p in ig_patterns)) if ig_patterns else None
    plan = QuantPlan(every, plain, exact, tuple((_compile(p), patterns[p]) for p in sorted(patterns)),
                     frozenset(ig_names), ignore_re, by_name=True)
    groups_out = tuple(next(g for t, g in summaries if t is s) for s in plan.schemes)
    return dataclasses.replace(plan, groups=groups_out)
