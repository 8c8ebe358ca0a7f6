"""DeepSeek's own FP8 (`quant_method: fp8`): block-wise F8_E4M3 weights, and DeepSeek-V4's FP4 routed experts.

- DeepSeek-V3 / R1 / V3.1 / V3.2 and Kimi-K2: `weight` F8_E4M3 + `weight_scale_inv` F32
  [ceil(out/b0), ceil(in/b1)], the block from `weight_block_size` ([128, 128]); `scale_fmt: ue8m0` (V3.1 on):
  every scale is meant to be a power of two.
- DeepSeek-V4 (`model_type: deepseek_v4`): the same weights with their scales under `.scale` (transformers 5.25's
  FineGrainedFP8 quantizer renames `(.+)\\.scale` to `weight_scale_inv` on load), F8_E8M0 where `scale_fmt` is
  ue8m0 (FP8Linear's `weight_scale_inv` dtype), else F32; V4.1 declares blocks of [32, 32]. With
  `expert_dtype: fp4` (top level in V4; inside quantization_config in V4.1, where transformers' config moves V4's
  too) the routed experts are FP4 E2M1 packed two a byte, I8 [out, ceil(in/2)], with one F8_E8M0 `.scale` per 32
  inputs [out, ceil(in/32)] (Fp4Experts).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from kimi_audit.errors import ConfigError
from kimi_audit.model.kinds import BLOCK_SCALE, PACKED, PARAMETER, SCALE, V4_SCALE
from kimi_audit.model.patterns import NamePatterns, compile_patterns
from kimi_audit.model.quant import bounds
from kimi_audit.model.quant.scheme import (
    DEEPSEEK_SCALE_SUFFIX,
    FP8_DTYPE,
    QuantPlan,
    ReleaseQuant,
    Scheme,
    Stored,
    Unquantized,
    packed_rows,
    stored_weight,
)
from kimi_audit.model.quant.skips import OUTPUT_HEAD
from kimi_audit.numerics.grid import DEEPSEEK_FP8_BLOCK, ceil_div, scale_grid

if TYPE_CHECKING:
    import numpy as np


__all__ = ["FP4_GROUP", "ROUTED_EXPERTS", "SCALE_SUFFIX", "V4_SCALE_SUFFIX", "Fp4Experts", "Fp8Block"]

SCALE_SUFFIX = DEEPSEEK_SCALE_SUFFIX
V4_SCALE_SUFFIX = ".scale"
"""DeepSeek-V4's FP8 block scale and FP4 expert scale (a scale only where F8_E8M0: model.roles)."""
FP4_GROUP = 32
ROUTED_EXPERTS_PATTERN = r"(?:.*\.)?experts\.\d+\."
ROUTED_EXPERTS = compile_patterns([ROUTED_EXPERTS_PATTERN], "DeepSeek-V4's routed experts")
"""A routed expert's projection (`...ffn.experts.7.w1`, `...mlp.experts.7.gate_proj`); not the shared experts."""


@dataclass(frozen=True)
class Fp8Block(Scheme):
    key: ClassVar[str] = "fp8"
    formats: ClassVar[tuple[tuple[str, str | None], ...]] = (("fp8", None),)
    roles: ClassVar[tuple[tuple[str, str], ...]] = ((SCALE_SUFFIX, BLOCK_SCALE), (V4_SCALE_SUFFIX, V4_SCALE))
    block: tuple[int, int] = DEEPSEEK_FP8_BLOCK
    scale_fmt: str | None = None
    """`ue8m0` (DeepSeek-V3.1 on): every scale is meant to be an exact power of two."""
    fmt: str | None = "e4m3"
    """quantization_config's `fmt` as written (QUANT_CONFIG checks it is e4m3)."""
    scale_suffix: str = SCALE_SUFFIX
    scale_dtype: str = "F32"

    @classmethod
    def plan(cls, q: dict[str, Any], plain: Unquantized, config: Mapping[str, Any],
             release: ReleaseQuant) -> QuantPlan:
        block = q.get("weight_block_size", list(DEEPSEEK_FP8_BLOCK))
        if not (isinstance(block, list) and len(block) == 2 and all(type(b) is int and b > 0 for b in block)):
            raise ConfigError(f"config.json quantization_config.weight_block_size {block!r} is not [rows, cols]")
        scale_fmt, fmt = q.get("scale_fmt"), q.get("fmt")
        scheme = cls(block=(block[0], block[1]), scale_fmt=scale_fmt if isinstance(scale_fmt, str) else None,
                     fmt=fmt if isinstance(fmt, str) else None, scale_suffix=release.scale_suffix,
                     scale_dtype="F8_E8M0" if release.e8m0_scales and scale_fmt == "ue8m0" else "F32")
        keep_plain = (".eh_proj", ".shared_head.head", OUTPUT_HEAD, *release.plain_suffixes)
        if not release.fp4_experts:
            return QuantPlan(scheme, plain, ignore_names=frozenset(release.plain), keep_plain=keep_plain)
        expert_dtype = q.get("expert_dtype", config.get("expert_dtype"))
        patterns: tuple[tuple[NamePatterns, Scheme], ...] = ()
        groups: tuple[dict[str, Any], ...] = ()
        if expert_dtype == "fp4":
            assert ROUTED_EXPERTS is not None
            patterns = ((ROUTED_EXPERTS, Fp4Experts()),)
            groups = ({"targets": ["Linear"]}, {"targets": [f"re:{ROUTED_EXPERTS_PATTERN}"]})
        elif expert_dtype not in (None, "fp8"):
            raise ConfigError(f"config.json expert_dtype {expert_dtype!r} is not fp4 or fp8")
        return QuantPlan(scheme, plain, patterns=patterns, ignore_names=frozenset(release.plain), keep_plain=keep_plain,
                         groups=groups)

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {"method": "fp8", "fmt": self.fmt, "block": list(self.block)}
        if self.scale_suffix != SCALE_SUFFIX:
            out.update(scale=self.scale_suffix[1:], scale_dtype=self.scale_dtype)
        return out

    @property
    def name(self) -> str:
        return "FP8"

    @property
    def power_of_two_scales(self) -> bool:
        return self.scale_fmt == "ue8m0"

    def grid(self, out: int, inp: int) -> tuple[int, int]:
        """The scale shape of an [out, in] weight: [ceil(out/b0), ceil(in/b1)], edge blocks partial."""
        return scale_grid((out, inp), self.block)

    def stored(self, out: int, inp: int) -> tuple[Stored, ...]:
        return (Stored(".weight", FP8_DTYPE, (out, inp), PARAMETER, out * inp),
                Stored(self.scale_suffix, self.scale_dtype, self.grid(out, inp), SCALE))

    def describe(self) -> str:
        fmt = f", {self.scale_fmt} scales" if self.scale_fmt else ""
        return f"FP8 e4m3, one {self.scale_dtype} scale per {self.block[0]}x{self.block[1]} block{fmt}"

    def error_bound(self) -> float:
        """FP8 E4M3 codes (3 mantissa bits), each block's scale its absmax / 448: bounds.float_grid."""
        return bounds.float_grid(3)

    def dequantize(self, tensors: Mapping[str, np.ndarray], out: int, inp: int) -> np.ndarray:
        """BF16 ``(w.float() * s_expanded).to(torch.bfloat16)`` (DeepSeek's weight_dequant; an E8M0 scale is a
        power of two, so transformers' ``w.to(bf16) * s.to(bf16)`` gives the same bits)."""
        from kimi_audit.numerics.fp4 import e8m0_to_float32
        from kimi_audit.numerics.fp8 import dequantize_fp8

        s = tensors[self.scale_suffix]
        if s.dtype.itemsize == 1:
            s = e8m0_to_float32(s)
        return dequantize_fp8(stored_weight(tensors, ".weight", out, inp), s, self.block)


@dataclass(frozen=True)
class Fp4Experts(Scheme):
    """DeepSeek-V4's routed experts with `expert_dtype: fp4`: selected by Fp8Block.plan, registered under no
    pair of its own."""

    key: ClassVar[str] = "fp8/fp4-experts"
    group: int = FP4_GROUP
    dequant_bytes_per_value: ClassVar[int] = 8

    def summary(self) -> dict[str, Any]:
        return {"method": "fp8", "expert_dtype": "fp4", "fmt": "e2m1", "scale_dtype": "F8_E8M0",
                "group_size": self.group}

    @property
    def name(self) -> str:
        return "FP4"

    @property
    def param_dtype(self) -> str:
        return "FP4"

    @property
    def power_of_two_scales(self) -> bool:
        return True

    def stored(self, out: int, inp: int) -> tuple[Stored, ...]:
        return (Stored(".weight", "I8", (out, ceil_div(inp, 2)), PACKED, out * inp),
                Stored(V4_SCALE_SUFFIX, "F8_E8M0", (out, ceil_div(inp, self.group)), SCALE))

    def describe(self) -> str:
        return f"FP4 e2m1, two per I8 byte, one F8_E8M0 scale per {self.group} inputs (DeepSeek-V4 experts)"

    def error_bound(self) -> float:
        """FP4 E2M1 codes, a power-of-two (E8M0) scale per `group` inputs: bounds.power_of_two_fp4."""
        return bounds.power_of_two_fp4(self.group)

    def dequantize(self, tensors: Mapping[str, np.ndarray], out: int, inp: int) -> np.ndarray:
        """``fp4 * 2**(e - 127)`` per 32 inputs, rounded to bf16: transformers' Fp8Dequantize (numerics.fp4)."""
        from kimi_audit.numerics.fp4 import dequantize_fp4_e8m0

        return dequantize_fp4_e8m0(packed_rows(tensors, ".weight", out), tensors[V4_SCALE_SUFFIX], inp, self.group)
