"""Quantization schemes as data: which tensors store one Linear module, and what they count for.

Each scheme is one small class registered under the (quant_method, format) pairs it reads
(`Scheme.registry`, filled by `__init_subclass__`, as gguf-py registers one class per quantization type);
`quant_plan` looks the config's pair up there and asks that class for the plan, so a new format is one new
class and nothing else. The layout asks the checkpoint's QuantPlan, per Linear module, for its scheme, and the scheme
for the tensors that store the module's weight [out, in]:

- none: `weight` in the config's dtype;
- fp8 (block-wise, DeepSeek-V3): `weight` F8_E4M3 + `weight_scale_inv` F32 [ceil(out/b0), ceil(in/b1)];
- compressed-tensors pack-quantized (Kimi-K2-Thinking's INT4): `weight_packed` I32 [out, ceil(in*bits/32)],
  `weight_scale` [out, ceil(in/group)], `weight_shape` I64 [2]; `weight_zero_point` for asymmetric
  schemes, `weight_g_idx` for actorder=group.

What a tensor counts for: a PARAMETER's elements are parameters; a PACKED tensor stands for the out x in
logical parameters of its module; SCALE tensors (scales, shapes, zero points, group indices) are
quantization metadata, never counted.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from itertools import repeat
from operator import not_, or_
from typing import TYPE_CHECKING, Any, ClassVar

from kimi_audit.errors import ConfigError
from kimi_audit.model.kinds import METADATA_SUFFIXES, PACKED, PARAMETER, SCALE
from kimi_audit.model.patterns import NamePatterns, compile_patterns
from kimi_audit.numerics.grid import DEEPSEEK_FP8_BLOCK, ceil_div, scale_grid

__all__ = ["FP8_DTYPE", "METADATA_SUFFIXES", "SCALE_SUFFIX", "Fp8Block", "PackQuantized", "QuantPlan", "Scheme",
           "Stored", "Unquantized", "UnsupportedQuantization", "ceil_div", "fp8_block", "quant_plan"]

if TYPE_CHECKING:
    import numpy as np

FP8_DTYPE = "F8_E4M3"
SCALE_SUFFIX = ".weight_scale_inv"
"""The FP8 block scale; every quantization-metadata suffix is in METADATA_SUFFIXES (model.kinds)."""


@dataclass(frozen=True)
class Stored:
    """One tensor a module's weight is stored in, named relative to the module."""

    suffix: str
    dtype: str
    shape: tuple[int, ...]
    kind: str
    logical: int = 0
    """Parameters this tensor counts for: numel for a PARAMETER, out x in for PACKED words, else 0."""


class UnsupportedQuantization(ConfigError):
    """quantization_config names a method or format no Scheme implements (QUANT_UNSUPPORTED)."""


@dataclass(frozen=True)
class Scheme:
    """How one Linear module's weight [out, in] is stored.

    A subclass that names `formats` (the (quant_method, format) pairs of quantization_config it reads; format
    None where the method has no `format` key) is registered under them, and `quant_plan` dispatches to its
    `plan()`: a new format is one class and nothing else."""

    key: ClassVar[str] = ""
    formats: ClassVar[tuple[tuple[str, str | None], ...]] = ()
    dequant_bytes_per_value: ClassVar[int] = 2
    """Memory `dequantize` needs per weight value (its result, and what it computes on)."""
    registry: ClassVar[dict[tuple[str, str | None], type[Scheme]]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for pair in cls.formats:
            Scheme.registry[pair] = cls

    @classmethod
    def plan(cls, q: dict[str, Any], plain: Unquantized) -> QuantPlan:
        """The plan of a quantization_config this class is registered for (UnsupportedQuantization for
        settings it does not implement, ConfigError for malformed ones)."""
        raise NotImplementedError

    def summary(self) -> dict[str, Any]:
        """The scheme's settings as plain data (`model.quantization` in `audit --json`)."""
        raise NotImplementedError

    @property
    def name(self) -> str:
        """A short name of how the weight is stored (`FP8`, `INT4`, `BF16`)."""
        raise NotImplementedError

    @property
    def param_dtype(self) -> str:
        """The parameters' dtype where the stored weight packs them into another (`INT4` in I32 words); "" where
        the weight tensor holds them as they are."""
        return ""

    @property
    def power_of_two_scales(self) -> bool:
        """Every block scale is meant to be an exact power of two (the values pass checks SCALE_NOT_UE8M0)."""
        return False

    def stored(self, out: int, inp: int) -> tuple[Stored, ...]:
        raise NotImplementedError

    def describe(self) -> str:
        raise NotImplementedError

    def dequantize(self, tensors: Mapping[str, np.ndarray], out: int, inp: int) -> np.ndarray:
        """The module's weight [out, in] from its stored tensors (decoded, keyed by the suffixes of
        `stored`), computed as the scheme's reference code does (kimi_audit.numerics, imported here)."""
        raise NotImplementedError


def _stored_weight(tensors: Mapping[str, np.ndarray], suffix: str, out: int, inp: int) -> np.ndarray:
    from kimi_audit.numerics.dtypes import NumericsError

    w = tensors[suffix]
    if w.shape != (out, inp):
        raise NumericsError(f"{suffix[1:]} has shape {list(w.shape)}, the module is {[out, inp]}")
    return w


@dataclass(frozen=True)
class Unquantized(Scheme):
    key: ClassVar[str] = "none"
    dtype: str = "BF16"

    def summary(self) -> dict[str, Any]:
        return {"method": None, "dtype": self.dtype}

    @property
    def name(self) -> str:
        return self.dtype

    def stored(self, out: int, inp: int) -> tuple[Stored, ...]:
        return (Stored(".weight", self.dtype, (out, inp), PARAMETER, out * inp),)

    def describe(self) -> str:
        return f"{self.dtype}, not quantized"

    def dequantize(self, tensors: Mapping[str, np.ndarray], out: int, inp: int) -> np.ndarray:
        return _stored_weight(tensors, ".weight", out, inp)


@dataclass(frozen=True)
class Fp8Block(Scheme):
    key: ClassVar[str] = "fp8"
    formats: ClassVar[tuple[tuple[str, str | None], ...]] = (("fp8", None),)
    block: tuple[int, int] = DEEPSEEK_FP8_BLOCK
    scale_fmt: str | None = None
    """`ue8m0` (DeepSeek-V3.1 on): every scale is meant to be an exact power of two."""
    fmt: str | None = "e4m3"
    """quantization_config's `fmt` as written (QUANT_CONFIG checks it is e4m3)."""

    @classmethod
    def plan(cls, q: dict[str, Any], plain: Unquantized) -> QuantPlan:
        block = q.get("weight_block_size", list(DEEPSEEK_FP8_BLOCK))
        if not (isinstance(block, list) and len(block) == 2 and all(type(b) is int and b > 0 for b in block)):
            raise ConfigError(f"config.json quantization_config.weight_block_size {block!r} is not [rows, cols]")
        scale_fmt, fmt = q.get("scale_fmt"), q.get("fmt")
        scheme = cls(block=(block[0], block[1]), scale_fmt=scale_fmt if isinstance(scale_fmt, str) else None,
                     fmt=fmt if isinstance(fmt, str) else None)
        return QuantPlan(scheme, plain, keep_plain=(".eh_proj", ".shared_head.head", "lm_head"))

    def summary(self) -> dict[str, Any]:
        return {"method": "fp8", "fmt": self.fmt, "block": list(self.block)}

    @property
    def name(self) -> str:
        return "FP8"

    @property
    def power_of_two_scales(self) -> bool:
        return self.scale_fmt == "ue8m0"

    def grid(self, out: int, inp: int) -> tuple[int, int]:
        """The weight_scale_inv shape of an [out, in] weight: [ceil(out/b0), ceil(in/b1)], edge blocks partial."""
        return scale_grid((out, inp), self.block)

    def stored(self, out: int, inp: int) -> tuple[Stored, ...]:
        return (Stored(".weight", FP8_DTYPE, (out, inp), PARAMETER, out * inp),
                Stored(SCALE_SUFFIX, "F32", self.grid(out, inp), SCALE))

    def describe(self) -> str:
        fmt = f", {self.scale_fmt} scales" if self.scale_fmt else ""
        return f"FP8 e4m3, one F32 scale per {self.block[0]}x{self.block[1]} block{fmt}"

    def dequantize(self, tensors: Mapping[str, np.ndarray], out: int, inp: int) -> np.ndarray:
        """BF16 ``(w.float() * s_expanded).to(torch.bfloat16)`` (DeepSeek's weight_dequant)."""
        from kimi_audit.numerics.fp8 import dequantize_fp8

        return dequantize_fp8(_stored_weight(tensors, ".weight", out, inp), tensors[SCALE_SUFFIX], self.block)


@dataclass(frozen=True)
class PackQuantized(Scheme):
    key: ClassVar[str] = "compressed-tensors/pack-quantized"
    formats: ClassVar[tuple[tuple[str, str | None], ...]] = (("compressed-tensors", "pack-quantized"),)
    bits: int = 4
    group_size: int = 32
    symmetric: bool = True
    scale_dtype: str = "BF16"
    actorder: str | None = None
    strategy: str = "group"
    dequant_bytes_per_value: ClassVar[int] = 8
    """The result, the unpacked codes and the float32 products."""

    @property
    def name(self) -> str:
        return f"INT{self.bits}"

    @property
    def param_dtype(self) -> str:
        return self.name

    @classmethod
    def plan(cls, q: dict[str, Any], plain: Unquantized) -> QuantPlan:
        return _compressed_tensors(q, plain)

    def summary(self) -> dict[str, Any]:
        return {"method": "compressed-tensors", "format": "pack-quantized", "bits": self.bits,
                "group_size": self.group_size, "strategy": self.strategy, "symmetric": self.symmetric}

    def stored(self, out: int, inp: int) -> tuple[Stored, ...]:
        groups = ceil_div(inp, self.group_size)
        out_tensors = [Stored(".weight_packed", "I32", (out, ceil_div(inp * self.bits, 32)), PACKED, out * inp),
                       Stored(".weight_scale", self.scale_dtype, (out, groups), SCALE),
                       Stored(".weight_shape", "I64", (2,), SCALE)]
        if not self.symmetric:  # packed along the output dimension (compressed-tensors pack_to_int32, dim 0)
            out_tensors.append(Stored(".weight_zero_point", "I32", (ceil_div(out * self.bits, 32), groups), SCALE))
        if self.actorder == "group":
            out_tensors.append(Stored(".weight_g_idx", "I32", (inp,), SCALE))
        return tuple(out_tensors)

    def describe(self) -> str:
        kind = "symmetric" if self.symmetric else "asymmetric"
        return (f"INT{self.bits} {kind}, {32 // self.bits} per I32 word, one {self.scale_dtype} scale per "
                f"{self.group_size} inputs (compressed-tensors pack-quantized)")

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
        zp = None
        if not self.symmetric:
            if ".weight_zero_point" not in tensors:
                raise NumericsError("an asymmetric scheme without its weight_zero_point")
            zp = unpack_int4(tensors[".weight_zero_point"], self.bits, out, packed_dim=0)
        return dequantize_group(q, tensors[".weight_scale"], zp, self.group_size,
                                g_idx=tensors.get(".weight_g_idx"))


@dataclass(frozen=True)
class QuantPlan:
    """Which scheme stores each Linear module (by its full name, e.g. `model.layers.3.self_attn.q_a_proj`)."""

    quantized: Scheme
    plain: Unquantized
    ignore_names: frozenset[str] = frozenset()
    ignore_re: NamePatterns | None = None
    """compressed-tensors `re:` entries of `ignore`, full-matched against module names (RE2, linear time)."""
    keep_plain: tuple[str, ...] = ()
    """Module-name suffixes a format leaves unquantized by convention (FP8: the MTP layer's projections)."""
    by_name: bool = field(default=False)
    """Whether the choice depends on more than the module's kind (an ignore list): then every layer is asked."""

    def summary(self) -> dict[str, Any]:
        """The quantized modules' scheme as plain data (`model.quantization` in `audit --json`)."""
        return self.quantized.summary()

    def scheme_for(self, module: str) -> Scheme:
        if module in self.ignore_names or (self.ignore_re is not None and self.ignore_re.fullmatch(module)):
            return self.plain
        if module.endswith(self.keep_plain):
            return self.plain
        return self.quantized

    def quantized_mask(self, modules: list[str]) -> tuple[bool, ...]:
        """scheme_for(m) is self.quantized, for every module of a layer at once (builtin speed)."""
        plain = map(str.endswith, modules, repeat(self.keep_plain))
        if self.ignore_names:
            plain = map(or_, plain, map(self.ignore_names.__contains__, modules))
        if self.ignore_re is not None:
            plain = map(or_, plain, map(self.ignore_re.fullmatch, modules))
        return tuple(map(not_, plain))


def fp8_block(plan: QuantPlan | None) -> tuple[int, int]:
    """The block of FP8 weights' scales: the plan's, else Fp8Block's default (FP8 weights a config does not
    describe are read as DeepSeek's)."""
    scheme = plan.quantized if plan is not None else None
    return scheme.block if isinstance(scheme, Fp8Block) else Fp8Block.block


def quant_plan(q: Any, dtype: str) -> QuantPlan | None:
    """The plan quantization_config describes (None: nothing quantized), made by the scheme class registered
    for its (quant_method, format). UnsupportedQuantization names an unknown method or format."""
    if q is None:
        return None
    if not isinstance(q, dict):
        raise ConfigError(f"config.json quantization_config is a {type(q).__name__}, not an object")
    method, fmt = q.get("quant_method"), q.get("format")
    scheme = None
    if isinstance(method, str):
        scheme = Scheme.registry.get((method, fmt if isinstance(fmt, str) else None))
        if scheme is None and fmt is not None:
            scheme = Scheme.registry.get((method, None))
    if scheme is None:
        if any(m == method for m, _ in Scheme.registry):
            raise UnsupportedQuantization(f"{method} format {fmt!r}")
        raise UnsupportedQuantization(f"quant_method {method!r}")
    return scheme.plan(q, Unquantized(dtype))


def _compressed_tensors(q: dict[str, Any], plain: Unquantized) -> QuantPlan:
    groups = q.get("config_groups")
    if not isinstance(groups, dict) or len(groups) != 1:
        raise UnsupportedQuantization("compressed-tensors with other than one config group")
    (group,) = groups.values()
    targets = group.get("targets") if isinstance(group, dict) else None
    weights = group.get("weights") if isinstance(group, dict) else None
    if targets != ["Linear"] or not isinstance(weights, dict):
        raise UnsupportedQuantization(f"compressed-tensors targets {targets!r} (only ['Linear'])")
    if weights.get("type") != "int" or weights.get("strategy") != "group":
        raise UnsupportedQuantization(f"compressed-tensors weights of type {weights.get('type')!r}, strategy "
                                      f"{weights.get('strategy')!r} (only int, group)")
    bits, group_size = weights.get("num_bits"), weights.get("group_size")
    if bits not in (4, 8) or type(group_size) is not int or group_size <= 0:
        raise UnsupportedQuantization(f"compressed-tensors num_bits {bits!r}, group_size {group_size!r}")
    scheme = PackQuantized(bits=bits, group_size=group_size, symmetric=bool(weights.get("symmetric", True)),
                           scale_dtype=plain.dtype, actorder=weights.get("actorder"))
    names, patterns = set(), []
    for entry in q.get("ignore") or []:
        if isinstance(entry, str) and entry.startswith("re:"):
            patterns.append(entry[3:])
        elif isinstance(entry, str):
            names.add(entry)
    ignore_re = compile_patterns(patterns, "config.json quantization_config.ignore")
    return QuantPlan(scheme, plain, frozenset(names), ignore_re, by_name=True)
