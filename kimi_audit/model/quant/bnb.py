"""bitsandbytes (`quant_method: bitsandbytes`), as transformers 5.25 saves a model loaded with
`BitsAndBytesConfig(load_in_4bit=True)` (NF4 or FP4, with or without double quantization) or `load_in_8bit=True`.

Every `nn.Linear` transformers' bitsandbytes integration replaces is stored as:
- 4-bit: `weight` U8 [ceil(out·in / 2), 1] (two codes a byte), `weight.absmax` F32 [ceil(out·in / 64)],
  `weight.quant_map` F32 [16] and `weight.quant_state.bitsandbytes__{nf4,fp4}` U8, the JSON of the rest of its
  QuantState (quant_type, blocksize, dtype, shape). With `bnb_4bit_use_double_quant` the absmax are U8 codes,
  with `weight.nested_absmax` F32 [ceil(blocks / 256)] and `weight.nested_quant_map` F32 [256]; the JSON then
  holds the nested offset, a float whose printed length depends on the values (ANY_LENGTH).
- int8: `weight` I8 [out, in], `SCB` F32 [out] (one scale per row) and `weight_format` U8 [] (0: row major).
Not converted: the modules `llm_int8_skip_modules` names (matched as transformers' should_convert_module:
from the start up to a module boundary, or as a suffix), else the output head; and every routed expert, which
transformers 5 holds as fused 3-D parameters (DeepseekV3NaiveMoe's `gate_up_proj`), no `nn.Linear` for
bitsandbytes to replace, saved back per expert in the model's dtype.
Reference: transformers 5.25 quantizers/quantizer_bnb_4bit.py, quantizer_bnb_8bit.py, quantizers_utils.py;
bitsandbytes 0.50 functional.py (QuantState.as_dict, dequantize_4bit, int8_vectorwise_dequant).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from kimi_audit.errors import ConfigError
from kimi_audit.model.kinds import BNB_ABSMAX, BNB_QUANT_MAP, PACKED, QUANT_STATE, SCALE, WEIGHT_FORMAT
from kimi_audit.model.quant.deepseek import ROUTED_EXPERTS_PATTERN
from kimi_audit.model.quant.scheme import (
    ANY_LENGTH,
    QuantPlan,
    ReleaseQuant,
    Scheme,
    Stored,
    Unquantized,
    UnsupportedQuantization,
)
from kimi_audit.model.quant.skips import output_head, skip_list, skipped

if TYPE_CHECKING:
    import numpy as np

__all__ = ["Bitsandbytes"]

BLOCKSIZE = 64
"""bitsandbytes' 4-bit block (transformers passes no other)."""
NESTED_BLOCKSIZE = 256
QUANT_TYPES = ("nf4", "fp4")
STATE = ".weight.quant_state.bitsandbytes__"


@dataclass(frozen=True)
class Bitsandbytes(Scheme):
    key: ClassVar[str] = "bitsandbytes"
    formats: ClassVar[tuple[tuple[str, str | None], ...]] = (("bitsandbytes", None),)
    roles: ClassVar[tuple[tuple[str, str], ...]] = (
        (".weight.absmax", BNB_ABSMAX), (".weight.nested_absmax", BNB_ABSMAX), (".SCB", BNB_ABSMAX),
        (".weight.quant_map", BNB_QUANT_MAP), (".weight.nested_quant_map", BNB_QUANT_MAP),
        *((STATE + t, QUANT_STATE) for t in QUANT_TYPES), (".weight_format", WEIGHT_FORMAT))
    dequant_bytes_per_value: ClassVar[int] = 12
    bits: int = 4
    quant_type: str = "nf4"
    double: bool = False
    dtype: str = "BF16"

    @classmethod
    def plan(cls, q: dict[str, Any], plain: Unquantized, config: Mapping[str, Any],
             release: ReleaseQuant) -> QuantPlan:
        four, eight = bool(q.get("load_in_4bit")), bool(q.get("load_in_8bit"))
        if four == eight:
            raise ConfigError("config.json quantization_config (bitsandbytes) must set exactly one of load_in_4bit "
                              "and load_in_8bit")
        quant_type = q.get("bnb_4bit_quant_type", "fp4")
        if four and quant_type not in QUANT_TYPES:
            raise ConfigError(f"config.json bnb_4bit_quant_type {quant_type!r} is not nf4 or fp4")
        storage = q.get("bnb_4bit_quant_storage", "uint8")
        if four and storage != "uint8":
            raise UnsupportedQuantization(f"bitsandbytes bnb_4bit_quant_storage {storage!r}")
        if eight and q.get("llm_int8_has_fp16_weight"):
            raise UnsupportedQuantization("bitsandbytes llm_int8_has_fp16_weight")
        scheme = cls(4 if four else 8, str(quant_type), bool(q.get("bnb_4bit_use_double_quant")) and four,
                     plain.dtype)
        skip = skip_list(q, "llm_int8_skip_modules")
        return QuantPlan(scheme, plain, ignore_names=output_head(release) if skip is None else frozenset(),
                         ignore_re=skipped(skip, "config.json llm_int8_skip_modules", ROUTED_EXPERTS_PATTERN),
                         by_name=True)

    def summary(self) -> dict[str, Any]:
        if self.bits == 8:
            return {"method": "bitsandbytes", "bits": 8}
        return {"method": "bitsandbytes", "bits": 4, "quant_type": self.quant_type, "blocksize": BLOCKSIZE,
                "double_quant": self.double}

    @property
    def name(self) -> str:
        return "INT8" if self.bits == 8 else self.quant_type.upper()

    @property
    def param_dtype(self) -> str:
        return "" if self.bits == 8 else self.quant_type.upper()

    def stored(self, out: int, inp: int) -> tuple[Stored, ...]:
        n = out * inp
        if self.bits == 8:
            return (Stored(".weight", "I8", (out, inp), PACKED, n), Stored(".SCB", "F32", (out,), SCALE),
                    Stored(".weight_format", "U8", (), SCALE))
        from kimi_audit.numerics.bnb import quant_state_json

        blocks = -(-n // BLOCKSIZE)
        state = ANY_LENGTH if self.double else len(quant_state_json(self.quant_type, BLOCKSIZE, self.dtype,
                                                                     (out, inp)))
        tensors = [Stored(".weight", "U8", (-(-n // 2), 1), PACKED, n),
                   Stored(".weight.absmax", "U8" if self.double else "F32", (blocks,), SCALE),
                   Stored(".weight.quant_map", "F32", (16,), SCALE)]
        if self.double:
            tensors += [Stored(".weight.nested_absmax", "F32", (-(-blocks // NESTED_BLOCKSIZE),), SCALE),
                        Stored(".weight.nested_quant_map", "F32", (NESTED_BLOCKSIZE,), SCALE)]
        tensors.append(Stored(STATE + self.quant_type, "U8", (state,), SCALE))
        return tuple(tensors)

    def module_shape(self, weight: tuple[int, ...], logical: int) -> tuple[int, int] | None:
        return super().module_shape(weight, logical) if self.bits == 8 else None

    def describe(self) -> str:
        if self.bits == 8:
            return "bitsandbytes LLM.int8: I8 codes, one F32 SCB scale per output row"
        nested = ", the absmax double-quantized in blocks of 256" if self.double else ""
        return (f"bitsandbytes {self.quant_type.upper()}: two codes a U8 byte, one absmax per {BLOCKSIZE} values"
                f"{nested}, the QuantState serialized as JSON")

    def dequantize(self, tensors: Mapping[str, np.ndarray], out: int, inp: int) -> np.ndarray:
        """bitsandbytes' dequantize_4bit / int8_vectorwise_dequant (numerics.bnb)."""
        from kimi_audit.numerics.bnb import dequantize_4bit, dequantize_int8, read_quant_state
        from kimi_audit.numerics.dtypes import NumericsError

        if self.bits == 8:
            return dequantize_int8(tensors[".weight"], tensors[".SCB"])
        state = read_quant_state(tensors[STATE + self.quant_type])
        if state.get("shape") != [out, inp] or state.get("blocksize") != BLOCKSIZE:
            raise NumericsError(f"the quant_state says shape {state.get('shape')} in blocks of "
                                f"{state.get('blocksize')}, the module is {[out, inp]} in blocks of {BLOCKSIZE}")
        nested = None
        if self.double:
            offset = state.get("nested_offset")
            if not isinstance(offset, (int, float)):
                raise NumericsError("the double-quantized quant_state holds no nested_offset")
            nested = (tensors[".weight.nested_absmax"], tensors[".weight.nested_quant_map"], float(offset))
        return dequantize_4bit(tensors[".weight"], tensors[".weight.absmax"], tensors[".weight.quant_map"], out, inp,
                               BLOCKSIZE, self.dtype, nested)
