"""AWQ (`quant_method: awq`), GEMM version, as AutoAWQ and GPTQModel's AWQ write it.

quantization_config: `bits` 4, `group_size`, `zero_point` true, `version` (or `format`) `gemm`. Every Linear
module but the output head is stored as `qweight` I32 [in, out/8] and `qzeros` I32 [groups, out/8] (eight
4-bit codes a word in llm-awq's interleaved order) and `scales` [groups, out]: float16 as AutoAWQ writes them,
whatever the model's dtype; the model's dtype as GPTQModel writes them (`scale_dtype`). numerics.gptq dequantizes.
The GEMV versions and AWQ without zero points are QUANT_UNSUPPORTED. Reference: GPTQModel 7.7
quantization/awq/utils/packing_utils.py and AutoAWQ 0.2.9 awq/utils/packing_utils.py (dequantize_gemm).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from kimi_audit.errors import ConfigError
from kimi_audit.model.kinds import AFFINE_SCALE, PACKED, PACKED_WEIGHT, SCALE, ZERO_POINT
from kimi_audit.model.quant import bounds
from kimi_audit.model.quant.scheme import QuantPlan, ReleaseQuant, Scheme, Stored, Unquantized, UnsupportedQuantization
from kimi_audit.model.quant.skips import output_head, skip_list, skipped

if TYPE_CHECKING:
    import numpy as np

__all__ = ["AwqGemm"]


def scale_dtype(q: Mapping[str, Any], model_dtype: str) -> str:
    """The scales' dtype: the model's where GPTQModel wrote the checkpoint (its `meta.quantizer` names it), float16
    where AutoAWQ did (0.2.9 awq/modules/linear/gemm.py WQLinear_GEMM holds its scales float16 whatever the model's
    dtype; vLLM's AWQ kernels read float16)."""
    meta = q.get("meta")
    quantizer = meta.get("quantizer") if isinstance(meta, dict) else None
    writers = quantizer if isinstance(quantizer, list) else [quantizer]
    return model_dtype if any(isinstance(w, str) and w.startswith("gptqmodel") for w in writers) else "F16"


@dataclass(frozen=True)
class AwqGemm(Scheme):
    key: ClassVar[str] = "awq"
    formats: ClassVar[tuple[tuple[str, str | None], ...]] = (("awq", None),)
    roles: ClassVar[tuple[tuple[str, str], ...]] = (
        (".qweight", PACKED_WEIGHT), (".qzeros", ZERO_POINT), (".scales", AFFINE_SCALE))
    dequant_bytes_per_value: ClassVar[int] = 16
    group_size: int = 128
    dtype: str = "F16"

    @classmethod
    def plan(cls, q: dict[str, Any], plain: Unquantized, config: Mapping[str, Any],
             release: ReleaseQuant) -> QuantPlan:
        version = str(q.get("version", q.get("format", "gemm"))).lower()
        if version != "gemm":
            raise UnsupportedQuantization(f"awq version {version!r}")
        if q.get("bits", q.get("w_bit", 4)) != 4:
            raise UnsupportedQuantization(f"awq bits {q.get('bits', q.get('w_bit'))!r}")
        if not q.get("zero_point", True):
            raise UnsupportedQuantization("awq without zero points")
        group = q.get("group_size", q.get("q_group_size", 128))
        if type(group) is not int or group <= 0:
            raise ConfigError(f"config.json quantization_config group_size {group!r} is not a positive integer")
        skip = skip_list(q, "modules_to_not_convert")
        return QuantPlan(cls(group, scale_dtype(q, plain.dtype)), plain, ignore_names=output_head(release, q),
                         ignore_re=skipped(skip, "config.json quantization_config modules_to_not_convert"),
                         by_name=bool(skip))

    def summary(self) -> dict[str, Any]:
        return {"method": "awq", "version": "gemm", "bits": 4, "group_size": self.group_size,
                "scale_dtype": self.dtype}

    @property
    def name(self) -> str:
        return "AWQ INT4"

    @property
    def param_dtype(self) -> str:
        return "INT4"

    def stored(self, out: int, inp: int) -> tuple[Stored, ...]:
        groups, words = -(-inp // self.group_size), -(-out // 8)
        return (Stored(".qweight", "I32", (inp, words), PACKED, out * inp),
                Stored(".qzeros", "I32", (groups, words), SCALE), Stored(".scales", self.dtype, (groups, out), SCALE))

    def module_shape(self, weight: tuple[int, ...], logical: int) -> tuple[int, int] | None:
        """qweight is [in, out/8]: in is its first dimension."""
        return (logical // weight[0], weight[0]) if len(weight) == 2 and weight[0] else None

    def describe(self) -> str:
        return (f"AWQ GEMM INT4, eight interleaved codes per I32 word, a {self.dtype} scale and packed zero point "
                f"per {self.group_size} inputs")

    def error_bound(self) -> float:
        """4-bit integer codes per group with a zero point, scaled to its range: bounds.uniform_grid."""
        return bounds.uniform_grid(4)

    def dequantize(self, tensors: Mapping[str, np.ndarray], out: int, inp: int) -> np.ndarray:
        """``(q - z) * scales`` (numerics.gptq.dequantize_awq)."""
        from kimi_audit.numerics.gptq import dequantize_awq

        return dequantize_awq(tensors[".qweight"], tensors[".qzeros"], tensors[".scales"], out, inp,
                              self.group_size)
