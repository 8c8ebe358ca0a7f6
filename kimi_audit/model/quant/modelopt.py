"""NVIDIA Model Optimizer's exports (`quant_method: "modelopt"`, nvidia-modelopt's `export_hf_checkpoint`): the
NVFP4 releases of Kimi-K2-Thinking, K2.6, K2.7-Code, K3 and DeepSeek-R1/V4, and its FP8 ones.

config.json's `quantization_config` (and hf_quant_config.json's `quantization`, which older exports and vLLM's
ModelOpt loaders read) names `quant_algo`: NVFP4, FP8, or MIXED_PRECISION with a `quantized_layers` table (per
module, or per container such as a layer's `mlp.experts`: `modelopt_mixed`); `exclude_modules` / `ignore` the
modules left in the checkpoint's dtype (exact names or fnmatch globs); `kv_cache_quant_algo` / `kv_cache_scheme`
the FP8 KV cache, whose scales ModelOpt stores per attention layer as `self_attn.k_proj.k_scale` and
`self_attn.v_proj.v_scale`, F32 0-d (vLLM's `maybe_remap_kv_scale_name` reads them there, MLA included).

- NVFP4: `weight` U8 [out, in/2] (two E2M1 codes a byte, low nibble first), `weight_scale` F8_E4M3 [out, in/16],
  `weight_scale_2` F32 [] (the per-tensor second level), `input_scale` F32 [] with static activations;
  dequantized as NVFP4QTensor.dequantize: bf16(fp4 x (f32(weight_scale) x weight_scale_2)).
- FP8: `weight` F8_E4M3 [out, in], `weight_scale` F32 [], `input_scale` F32 []; dequantized as
  FP8QTensor.dequantize: bf16(bf16(weight) x bf16(weight_scale)).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from kimi_audit.errors import ConfigError
from kimi_audit.model.kinds import GLOBAL_SCALE, GROUP_SCALE, INPUT_SCALE, KV_SCALE, PACKED, PARAMETER, SCALE
from kimi_audit.model.patterns import NamePatterns, compile_patterns
from kimi_audit.model.quant import bounds
from kimi_audit.model.quant.scheme import (
    FP8_DTYPE,
    QuantPlan,
    ReleaseQuant,
    Scheme,
    Stored,
    Unquantized,
    UnsupportedQuantization,
    packed_rows,
    stored_weight,
)
from kimi_audit.numerics.grid import ceil_div

if TYPE_CHECKING:
    import numpy as np

METHOD = "modelopt"
NVFP4, FP8, MIXED = "NVFP4", "FP8", "MIXED_PRECISION"
KV_SCALES = (Stored("self_attn.k_proj.k_scale", "F32", (), SCALE), Stored("self_attn.v_proj.v_scale", "F32", (), SCALE))
"""The FP8 KV cache's scales ModelOpt stores in every attention layer (quant_utils: `k_bmm_quantizer._amax` ->
`k_proj.k_scale`), named relative to the layer."""


@dataclass(frozen=True)
class ModeloptFp8(Scheme):
    """FP8 E4M3 weights with one F32 scale each (ModelOpt's FP8 export)."""

    key: ClassVar[str] = "modelopt/fp8"
    formats: ClassVar[tuple[tuple[str, str | None], ...]] = ((METHOD, None),)
    roles: ClassVar[tuple[tuple[str, str], ...]] = (
        (".weight_scale", GROUP_SCALE), (".weight_scale_2", GLOBAL_SCALE), (".input_scale", INPUT_SCALE),
        (".k_scale", KV_SCALE), (".v_scale", KV_SCALE))
    input_scale: bool = True

    @classmethod
    def plan(cls, q: dict[str, Any], plain: Unquantized, config: Mapping[str, Any],
             release: ReleaseQuant) -> QuantPlan:
        return modelopt_plan(q, plain)

    def summary(self) -> dict[str, Any]:
        return {"method": METHOD, "quant_algo": FP8, "input_scale": self.input_scale}

    @property
    def name(self) -> str:
        return "FP8"

    def stored(self, out: int, inp: int) -> tuple[Stored, ...]:
        tensors = [Stored(".weight", FP8_DTYPE, (out, inp), PARAMETER, out * inp),
                   Stored(".weight_scale", "F32", (), SCALE)]
        if self.input_scale:
            tensors.append(Stored(".input_scale", "F32", (), SCALE))
        return tuple(tensors)

    def describe(self) -> str:
        return "FP8 e4m3, one F32 scale per tensor (NVIDIA ModelOpt FP8)"

    def error_bound(self) -> float:
        """FP8 E4M3 codes, one scale amax / 448 (rounded to BF16 when dequantized, as the result): bounds.float_grid."""
        return bounds.float_grid(3)

    def dequantize(self, tensors: Mapping[str, np.ndarray], out: int, inp: int) -> np.ndarray:
        """FP8QTensor.dequantize: ``weight.to(bf16) * weight_scale.to(bf16)``."""
        import ml_dtypes
        import numpy as np

        from kimi_audit.numerics.dtypes import round_to

        w = stored_weight(tensors, ".weight", out, inp)
        s = np.asarray(tensors[".weight_scale"], dtype=np.float32).reshape(-1)
        if s.shape != (1,):
            from kimi_audit.numerics.dtypes import NumericsError

            raise NumericsError(f"weight_scale must be one value, got {list(np.shape(tensors['.weight_scale']))}")
        scale = round_to(s, ml_dtypes.bfloat16).astype(np.float32)[0]
        return round_to(w.astype(np.float32) * scale, ml_dtypes.bfloat16)


@dataclass(frozen=True)
class ModeloptNvfp4(ModeloptFp8):
    """NVFP4: E2M1 codes two a byte, an F8_E4M3 scale per `group` inputs and an F32 second-level scale."""

    key: ClassVar[str] = "modelopt/nvfp4"
    formats: ClassVar[tuple[tuple[str, str | None], ...]] = ()
    dequant_bytes_per_value: ClassVar[int] = 12
    group_size: int = 16

    def summary(self) -> dict[str, Any]:
        return {"method": METHOD, "quant_algo": NVFP4, "group_size": self.group_size, "input_scale": self.input_scale}

    @property
    def name(self) -> str:
        return "NVFP4"

    @property
    def param_dtype(self) -> str:
        return "FP4"

    def stored(self, out: int, inp: int) -> tuple[Stored, ...]:
        tensors = [Stored(".weight", "U8", (out, ceil_div(inp, 2)), PACKED, out * inp),
                   Stored(".weight_scale", FP8_DTYPE, (out, ceil_div(inp, self.group_size)), SCALE),
                   Stored(".weight_scale_2", "F32", (), SCALE)]
        if self.input_scale:
            tensors.append(Stored(".input_scale", "F32", (), SCALE))
        return tuple(tensors)

    def describe(self) -> str:
        return (f"NVFP4: FP4 e2m1 two per U8 byte, one F8_E4M3 scale per {self.group_size} inputs and an F32 "
                "weight_scale_2 (NVIDIA ModelOpt)")

    def error_bound(self) -> float:
        """FP4 E2M1 codes, an E4M3 scale per `group_size` inputs: bounds.nvfp4."""
        return bounds.nvfp4(self.group_size)

    def dequantize(self, tensors: Mapping[str, np.ndarray], out: int, inp: int) -> np.ndarray:
        from kimi_audit.numerics.fp4 import dequantize_modelopt_nvfp4

        return dequantize_modelopt_nvfp4(packed_rows(tensors, ".weight", out), tensors[".weight_scale"],
                                         tensors[".weight_scale_2"], inp, self.group_size)


def _settings(q: dict[str, Any]) -> dict[str, Any]:
    """hf_quant_config.json's `quantization` object, or config.json's quantization_config (the same keys)."""
    inner = q.get("quantization")
    return inner if isinstance(inner, dict) else q


def _static_inputs(q: dict[str, Any], algo: Any) -> bool:
    """Whether the export stores `input_scale`: static activations in a config group (W4A4, W8A8), else the
    algorithm's default (NVFP4 and FP8 quantize activations)."""
    groups = q.get("config_groups")
    if isinstance(groups, dict):
        for g in groups.values():
            acts = g.get("input_activations") if isinstance(g, dict) else None
            if isinstance(acts, dict) and acts.get("num_bits") == (4 if algo == NVFP4 else 8):
                return not acts.get("dynamic", False)
            if isinstance(g, dict) and "input_activations" in g and acts is None:
                return False
    return algo in (NVFP4, FP8)


def scheme_of_algo(algo: Any, group_size: Any, input_scale: bool) -> Scheme:
    if algo == NVFP4:
        size = 16 if group_size is None else group_size
        if type(size) is not int or size <= 0:
            raise ConfigError(f"config.json quantization_config group_size {size!r} is not a positive integer")
        return ModeloptNvfp4(input_scale=input_scale, group_size=size)
    if algo == FP8:
        return ModeloptFp8(input_scale=input_scale)
    raise UnsupportedQuantization(f"ModelOpt quant_algo {algo!r} (kimi-audit reads NVFP4, FP8 and "
                                  "MIXED_PRECISION of those)")


def _glob(pattern: str) -> str:
    """An fnmatch glob as an RE2 pattern matching the whole name."""
    return "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern) + "$"


def _under(names: list[str]) -> str:
    """A module, or any module under it (a `quantized_layers` entry naming `model.layers.1.mlp.experts`)."""
    return "(?:" + "|".join(re.escape(n) for n in names) + r")(?:\..*)?$"


def modelopt_plan(q: dict[str, Any], plain: Unquantized) -> QuantPlan:
    s = _settings(q)
    algo = s.get("quant_algo")
    exclude = s.get("exclude_modules", q.get("ignore", [])) or []
    if not isinstance(exclude, list) or not all(isinstance(e, str) for e in exclude):
        raise ConfigError("config.json quantization_config ignore / exclude_modules must be a list of names")
    exact = frozenset(e for e in exclude if not any(c in e for c in "*?["))
    globs = compile_patterns([_glob(e) for e in exclude if e not in exact], "quantization_config ignore")
    kv = s.get("kv_cache_quant_algo") or q.get("kv_cache_scheme")
    if kv not in (None, FP8) and not (isinstance(kv, dict) and kv.get("num_bits") == 8 and kv.get("type") == "float"):
        raise UnsupportedQuantization(f"ModelOpt KV cache {kv!r} (kimi-audit reads the FP8 KV cache)")
    layer_tensors = KV_SCALES if kv is not None else ()
    inputs = _static_inputs(q, algo if algo != MIXED else NVFP4)
    if algo != MIXED:
        return QuantPlan(scheme_of_algo(algo, s.get("group_size"), inputs), plain, ignore_names=exact,
                         ignore_re=globs, by_name=bool(exclude), layer_tensors=layer_tensors)
    layers = s.get("quantized_layers")
    if not isinstance(layers, dict) or not layers:
        raise ConfigError("config.json quantization_config: MIXED_PRECISION without a quantized_layers table")
    by_scheme: dict[Scheme, list[str]] = {}
    for name, entry in layers.items():
        if not isinstance(entry, dict):
            raise ConfigError(f"config.json quantized_layers[{name!r}] is not an object")
        algo_of = entry.get("quant_algo")
        scheme = scheme_of_algo(algo_of, entry.get("group_size"), _static_inputs(q, algo_of))
        by_scheme.setdefault(scheme, []).append(name)
    patterns: list[tuple[NamePatterns, Scheme]] = []
    for scheme, names in by_scheme.items():
        compiled = compile_patterns([_under(names)], "quantization_config quantized_layers")
        assert compiled is not None
        patterns.append((compiled, scheme))
    return QuantPlan(None, plain, patterns=tuple(patterns), ignore_names=exact, ignore_re=globs, by_name=True,
                     groups=tuple({"targets": names} for names in by_scheme.values()), layer_tensors=layer_tensors)
