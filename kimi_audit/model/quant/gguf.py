"""llama.cpp's GGUF weights: every Linear module one `.weight` tensor in the ggml type llama-quantize chose for it
(a file's types mix: UD-Q2_K_XL keeps attention at Q4_K and up, experts at IQ2/Q2_K), its shape the module's
[out, in] (a stacked module's [E, out, in]), its blocks along the rows. What is not a Linear module llama.cpp
keeps in F32 (norms, the router, its bias: the converter forces 1-D tensors, norms and `ffn_gate_inp` to F32).

The config a GGUF set is audited with is read from its own metadata by the architecture's GGUF dialect
(model.arch's `GgufDialect.config`), with `quantization_config: {"quant_method": "gguf"}` naming this scheme
(`format: "kv_b"` for the files written before llama.cpp #12801, whose attention keeps `kv_b_proj` whole).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from kimi_audit.format.gguf_types import GGML_BY_NAME
from kimi_audit.model.kinds import PARAMETER
from kimi_audit.model.quant.scheme import QuantPlan, ReleaseQuant, Scheme, Stored, Unquantized

if TYPE_CHECKING:
    import numpy as np

GGML_ANY = "GGML"
"""The expected dtype of a GGUF weight before the file is read: any ggml type llama.cpp stores a weight in whose
block divides the row (model.gguf resolves it per tensor against what is stored)."""


GGUF_METHOD = "gguf"
GGUF_TREE = "llama.cpp"
"""The converter's tree (llama.cpp conversion/deepseek.py, DeepseekV2Model.modify_tensors): each layer's routed
experts stacked [E, out, in], kv_b_proj split into k_b [heads, kv_lora, nope] and v_b [heads, v, kv_lora], the
embedding a weight like any other, no MTP layer, no rotary buffer."""
GGUF_KV_B_TREE = "llama.cpp-kv_b"
"""The converter's tree before llama.cpp #12801: the same, with kv_b_proj whole."""


@dataclass(frozen=True)
class Gguf(Scheme):
    key: ClassVar[str] = "gguf"
    formats: ClassVar[tuple[tuple[str, str | None], ...]] = ((GGUF_METHOD, None),)
    tree: ClassVar[str] = GGUF_TREE

    @classmethod
    def plan(cls, q: dict[str, Any], plain: Unquantized, config: Mapping[str, Any],
             release: ReleaseQuant) -> QuantPlan:
        return QuantPlan(cls(), Unquantized("F32"))

    @classmethod
    def accepts(cls, expected: str, stored: str, shape: tuple[int, ...]) -> bool:
        """Where a GGUF weight is expected (GGML_ANY): a ggml type llama.cpp keeps a weight in whose block divides
        the row."""
        t = GGML_BY_NAME.get(stored)
        return expected == GGML_ANY and t is not None and t.weight and bool(shape) and shape[-1] % t.block == 0

    @classmethod
    def format_mismatch(cls, planned: int, want: str, count: int, got: str, first: str) -> str:
        """A GGUF has no quantization_config: each weight's type is the quantizer's choice (`planned` counts only
        the weights left unresolved, those stored in no type that fits, so it is not said)."""
        t = GGML_BY_NAME.get(got)
        why = ("no ggml type llama.cpp loads a weight in" if t is None or not t.weight
               else f"whose {t.block}-value blocks do not divide their rows")
        return (f"{count:,} weights are stored {got}, {why}: one choice of the "
                f"quantizer, not {count:,} faults (first: {first})")

    def summary(self) -> dict[str, Any]:
        return {"method": GGUF_METHOD, "tree": self.tree}

    @property
    def name(self) -> str:
        return "ggml"

    def stored(self, out: int, inp: int) -> tuple[Stored, ...]:
        return (Stored(".weight", GGML_ANY, (out, inp), PARAMETER, out * inp),)

    def describe(self) -> str:
        return "a ggml type per tensor (llama-quantize's choice), blocks along each row"

    def dequantize(self, tensors: Mapping[str, np.ndarray], out: int, inp: int) -> np.ndarray:
        from kimi_audit.numerics.dtypes import NumericsError

        raise NumericsError("a GGUF weight is dequantized by llama.cpp's own kernels (gguf.quants); kimi-audit "
                            "reads its F32 tensors only")


@dataclass(frozen=True)
class GgufKvB(Gguf):
    key: ClassVar[str] = "gguf-kv_b"
    formats: ClassVar[tuple[tuple[str, str | None], ...]] = ((GGUF_METHOD, "kv_b"),)
    tree: ClassVar[str] = GGUF_KV_B_TREE
