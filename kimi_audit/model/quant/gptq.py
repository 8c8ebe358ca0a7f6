"""GPTQ (`quant_method: gptq`), as GPTQModel and AutoGPTQ write it.

quantization_config: `bits` (2, 4 or 8 here), `group_size` (-1: one group), `desc_act`, `sym`,
`checkpoint_format` (or `format`) `gptq` (v1: zero points stored minus one) or `gptq_v2`, `lm_head` (whether the
output head is quantized), `pack_dtype` int32. Every Linear module of the model (GPTQModel's module tree for
DeepseekV3: attention, dense MLP, shared and routed experts, each expert its own module; the router gate is no
Linear) is stored as `qweight` I32 [in·bits/32, out], `qzeros` I32 [groups, out·bits/32], `scales` F16
[groups, out] and `g_idx` I32 [in] (numerics.gptq); `lm_head` stays in the model's dtype unless `lm_head` is
true. Reference: GPTQModel 7.7 nn_modules/qlinear (TorchQuantLinear), utils/model.py (v1 <-> v2).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from kimi_audit.errors import ConfigError
from kimi_audit.model.kinds import AFFINE_SCALE, GROUP_INDEX, PACKED, PACKED_WEIGHT, SCALE, ZERO_POINT
from kimi_audit.model.quant import bounds
from kimi_audit.model.quant.scheme import QuantPlan, ReleaseQuant, Scheme, Stored, Unquantized, UnsupportedQuantization
from kimi_audit.model.quant.skips import output_head

if TYPE_CHECKING:
    import numpy as np

__all__ = ["Gptq"]

FORMATS = ("gptq", "gptq_v2")


@dataclass(frozen=True)
class Gptq(Scheme):
    key: ClassVar[str] = "gptq"
    formats: ClassVar[tuple[tuple[str, str | None], ...]] = (("gptq", None),)
    roles: ClassVar[tuple[tuple[str, str], ...]] = (
        (".qweight", PACKED_WEIGHT), (".qzeros", ZERO_POINT), (".scales", AFFINE_SCALE), (".g_idx", GROUP_INDEX))
    dequant_bytes_per_value: ClassVar[int] = 16
    bits: int = 4
    group_size: int = 128
    v1: bool = True
    desc_act: bool = False
    sym: bool = True
    dtype: str = "BF16"
    g_idx: bool = True
    """Whether `g_idx` is stored (GPTQModel, AutoGPTQ); AutoRound's `auto_round:auto_gptq` packing stores none: each
    input's group is then its index // group_size."""

    @classmethod
    def plan(cls, q: dict[str, Any], plain: Unquantized, config: Mapping[str, Any],
             release: ReleaseQuant) -> QuantPlan:
        bits, group = q.get("bits", 4), q.get("group_size", 128)
        if type(bits) is not int or bits not in (2, 3, 4, 8):
            raise ConfigError(f"config.json quantization_config bits {bits!r} is not 2, 3, 4 or 8")
        if bits == 3:
            raise UnsupportedQuantization("gptq bits 3")
        if type(group) is not int or not (group == -1 or group > 0):
            raise ConfigError(f"config.json quantization_config group_size {group!r} is not -1 or a positive integer")
        fmt = q.get("checkpoint_format", q.get("format", "gptq"))
        if fmt not in FORMATS:
            raise UnsupportedQuantization(f"gptq checkpoint_format {fmt!r}")
        if q.get("pack_dtype", "int32") != "int32":
            raise UnsupportedQuantization(f"gptq pack_dtype {q.get('pack_dtype')!r}")
        scheme = cls(bits, group, fmt == "gptq", bool(q.get("desc_act")), bool(q.get("sym", True)), plain.dtype)
        return QuantPlan(scheme, plain, ignore_names=output_head(release, q))

    def summary(self) -> dict[str, Any]:
        return {"method": "gptq", "bits": self.bits, "group_size": self.group_size,
                "checkpoint_format": "gptq" if self.v1 else "gptq_v2", "desc_act": self.desc_act, "sym": self.sym}

    @property
    def name(self) -> str:
        return f"GPTQ INT{self.bits}"

    @property
    def param_dtype(self) -> str:
        return f"INT{self.bits}"

    def groups(self, inp: int) -> int:
        return 1 if self.group_size == -1 else -(-inp // self.group_size)

    def stored(self, out: int, inp: int) -> tuple[Stored, ...]:
        per = 32 // self.bits
        g = self.groups(inp)
        tensors = (Stored(".qweight", "I32", (-(-inp // per), out), PACKED, out * inp),
                   Stored(".qzeros", "I32", (g, -(-out // per)), SCALE), Stored(".scales", "F16", (g, out), SCALE))
        return (*tensors, Stored(".g_idx", "I32", (inp,), SCALE)) if self.g_idx else tensors

    def module_shape(self, weight: tuple[int, ...], logical: int) -> tuple[int, int] | None:
        """qweight is [in·bits/32, out]: out is its last dimension."""
        return (weight[-1], logical // weight[-1]) if len(weight) == 2 and weight[-1] else None

    def describe(self) -> str:
        group = "per output channel" if self.group_size == -1 else f"per {self.group_size} inputs"
        return (f"GPTQ INT{self.bits} ({'gptq' if self.v1 else 'gptq_v2'}), {32 // self.bits} codes per I32 word, "
                f"an F16 scale and packed zero point {group}, g_idx")

    def error_bound(self) -> float:
        """`bits`-bit integer codes per group, scaled to its range: bounds.uniform_grid."""
        return bounds.uniform_grid(self.bits)

    def dequantize(self, tensors: Mapping[str, np.ndarray], out: int, inp: int) -> np.ndarray:
        """``scales[g_idx] * (q - z[g_idx])`` in the model's dtype (numerics.gptq)."""
        import numpy as np

        from kimi_audit.numerics.gptq import dequantize_gptq

        group = inp if self.group_size == -1 else self.group_size
        g_idx = tensors[".g_idx"] if self.g_idx else np.arange(inp, dtype=np.int32) // group
        return dequantize_gptq(tensors[".qweight"], tensors[".qzeros"], tensors[".scales"], g_idx, out, inp,
                               self.bits, self.v1, self.dtype)
