"""Mistral's own FP8 (its release format: params.json's `quantization: {qformat_weight: fp8_e4m3}` beside
consolidated shards): each quantized Linear module stores `weight` F8_E4M3 [out, in], `qscale_weight` and
`qscale_act`, one F32 scale each.

As llama.cpp's converter reads it (ggml-org/llama.cpp@0c1e57098 `conversion/mistral.py` MistralModel.dequant_model,
lines 41-51: the format is `{activation_scheme: static, quant_method: fp8, weight_block_size: None}`;
`conversion/base.py` lines 465-475: `qscale_weight` multiplies its weight whole, `dequant_simple` with no block,
and `qscale_act` is dropped; MistralMoeModel.filter_tensors renames them `weight_scale` / `input_scale`). Which
modules stay plain is the architecture's (ReleaseQuant.plain and .unreached: Mistral's output head and vision
tower). The scales' dtype (F32) and shape (a scalar) are read from that converter, which broadcasts any scale
shape over the weight; no published shard was at hand to hold them to.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from kimi_audit.model.kinds import GROUP_SCALE, INPUT_SCALE, PARAMETER, SCALE
from kimi_audit.model.patterns import compile_patterns
from kimi_audit.model.quant.scheme import (
    FP8_DTYPE,
    QuantPlan,
    ReleaseQuant,
    Scheme,
    Stored,
    Unquantized,
    UnsupportedQuantization,
    stored_weight,
)

if TYPE_CHECKING:
    import numpy as np

__all__ = ["MistralFp8"]

FORMAT_KEY = "qformat_weight"
ACT_KEY = "qscheme_act"
ACT_SCHEMES = {None: True, "TENSOR": True, "NO_SCALES": False}
"""`quantization.qscheme_act` -> whether each module stores a static `qscale_act`, as vLLM's adapter reads it
(vllm-project/vllm@01da88c5 transformers_utils/configs/mistral.py _remap_mistral_quantization_args: TENSOR or absent
is `activation_scheme: static`, NO_SCALES `dynamic`; any other value it asserts against)."""
WEIGHT_SCALE = ".qscale_weight"
ACT_SCALE = ".qscale_act"


@dataclass(frozen=True)
class MistralFp8(Scheme):
    key: ClassVar[str] = "mistral/fp8"
    roles: ClassVar[tuple[tuple[str, str], ...]] = ((WEIGHT_SCALE, GROUP_SCALE), (ACT_SCALE, INPUT_SCALE))
    static_activations: bool = True
    """A `qscale_act` beside each weight (qscheme_act TENSOR, the default); NO_SCALES: dynamic, none stored."""

    @classmethod
    def claims(cls, q: dict[str, Any], config: Mapping[str, Any]) -> bool:
        return FORMAT_KEY in q

    @classmethod
    def plan(cls, q: dict[str, Any], plain: Unquantized, config: Mapping[str, Any],
             release: ReleaseQuant) -> QuantPlan:
        fmt = q.get(FORMAT_KEY)
        if fmt != "fp8_e4m3":  # llama.cpp's converter asserts it
            raise UnsupportedQuantization(f"Mistral {FORMAT_KEY} {fmt!r}")
        act = q.get(ACT_KEY)
        if not isinstance(act, (str, type(None))) or act not in ACT_SCHEMES:  # vLLM's adapter asserts it
            raise UnsupportedQuantization(f"Mistral {ACT_KEY} {act!r}")
        return QuantPlan(cls(static_activations=ACT_SCHEMES[act]), plain, ignore_names=frozenset(release.plain),
                         ignore_re=compile_patterns(release.unreached, "the architecture's unquantized modules"),
                         by_name=bool(release.plain or release.unreached))

    def summary(self) -> dict[str, Any]:
        return {"method": "mistral", FORMAT_KEY: "fp8_e4m3", "scale": "per-tensor",
                "activations": "static" if self.static_activations else "dynamic"}

    @property
    def name(self) -> str:
        return "FP8"

    def stored(self, out: int, inp: int) -> tuple[Stored, ...]:
        act = (Stored(ACT_SCALE, "F32", (), SCALE),) if self.static_activations else ()
        return (Stored(".weight", FP8_DTYPE, (out, inp), PARAMETER, out * inp), Stored(WEIGHT_SCALE, "F32", (), SCALE),
                *act)

    def describe(self) -> str:
        act = "a static qscale_act" if self.static_activations else "dynamic activations (no qscale_act)"
        return f"FP8 e4m3, one F32 qscale_weight per tensor, {act} (Mistral's format)"

    def dequantize(self, tensors: Mapping[str, np.ndarray], out: int, inp: int) -> np.ndarray:
        """``weight.float() * qscale_weight``, rounded to bf16 (llama.cpp's dequant_simple with no block)."""
        from kimi_audit.numerics.fp8 import dequantize_fp8

        s = tensors[WEIGHT_SCALE].reshape(1, 1)
        return dequantize_fp8(stored_weight(tensors, ".weight", out, inp), s, (out, inp))
