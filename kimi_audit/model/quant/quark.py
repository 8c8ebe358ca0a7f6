"""AMD Quark's exports (`quant_method: "quark"`): amd/Kimi-K2.5-MXFP4-AttnFP8, amd/Kimi-K2.7-Code-MXFP4, written
by its file-to-file quantization (`ModelQuantizer.direct_quantize_checkpoint`, amd-quark 0.13).

quantization_config holds Quark's own layout: `global_quant_config` (the spec of every Linear module's `weight`,
`input_tensors`, `output_tensors`), `layer_quant_config` (fnmatch globs over module names -> a spec, before the
global one), `layer_type_quant_config` (by layer type), `exclude` (names or globs left in the checkpoint's dtype),
`kv_cache_quant_config`, and `export` (`pack_method`, `weight_format`). A weight spec is read as:
- `dtype: fp4`, `qscheme: per_group`, `group_size: 32`, `scale_format: e8m0` (OCP MXFP4): `weight` U8
  [out, in/2], two E2M1 codes a byte, `weight_scale` U8 [out, in/32] holding E8M0 exponents;
- `dtype: fp8_e4m3`, `per_channel` on axis 0: `weight` F8_E4M3, `weight_scale` F32 [out]; `per_tensor`:
  `weight_scale` [] in the checkpoint's dtype (as the file-to-file export writes it).
Dequantized as Quark's importer does (QParamsLinear's weight quantizer), in float32: codes x 2^(e - 127) for
MXFP4, weight x scale for FP8. Quark's index `total_size` counts whole files, headers included
(Scheme.index_counts_files). Activations quantized statically (input scales) are not read:
QUANT_UNSUPPORTED.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from kimi_audit.errors import ConfigError
from kimi_audit.model.kinds import GROUP_SCALE, PACKED, PARAMETER, SCALE
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

METHOD = "quark"


@dataclass(frozen=True)
class QuarkFp8(Scheme):
    """FP8 e4m3 weights with a per-channel F32 scale [out], or one per-tensor scale [] (Quark)."""

    key: ClassVar[str] = "quark/fp8"
    formats: ClassVar[tuple[tuple[str, str | None], ...]] = ((METHOD, None),)
    roles: ClassVar[tuple[tuple[str, str], ...]] = ((".weight_scale", GROUP_SCALE),)
    index_counts_files: ClassVar[bool] = True
    per_channel: bool = True
    scale_dtype: str = "F32"

    @classmethod
    def plan(cls, q: dict[str, Any], plain: Unquantized, config: Mapping[str, Any],
             release: ReleaseQuant) -> QuantPlan:
        return quark_plan(q, plain)

    def summary(self) -> dict[str, Any]:
        return {"method": METHOD, "dtype": "fp8_e4m3", "qscheme": "per_channel" if self.per_channel else "per_tensor"}

    @property
    def name(self) -> str:
        return "FP8"

    def stored(self, out: int, inp: int) -> tuple[Stored, ...]:
        scale = (out,) if self.per_channel else ()
        return (Stored(".weight", FP8_DTYPE, (out, inp), PARAMETER, out * inp),
                Stored(".weight_scale", self.scale_dtype, scale, SCALE))

    def describe(self) -> str:
        per = "per output channel, F32" if self.per_channel else f"per tensor, {self.scale_dtype}"
        return f"FP8 e4m3, one scale {per} (AMD Quark)"

    def error_bound(self) -> float:
        """FP8 E4M3 codes, a scale per channel or tensor (its absmax / 448): bounds.float_grid."""
        return bounds.float_grid(3)

    def dequantize(self, tensors: Mapping[str, np.ndarray], out: int, inp: int) -> np.ndarray:
        """Quark's importer: ``weight.float() * scale`` in float32 (per channel: one scale per row)."""
        import numpy as np

        w = stored_weight(tensors, ".weight", out, inp).astype(np.float32)
        s = np.asarray(tensors[".weight_scale"]).astype(np.float32)
        return w * (s.reshape(out, 1) if self.per_channel else s.reshape(()))


@dataclass(frozen=True)
class QuarkMxfp4(QuarkFp8):
    """OCP MXFP4: E2M1 codes two a byte, one E8M0 exponent (U8) per 32 inputs (Quark)."""

    key: ClassVar[str] = "quark/mxfp4"
    formats: ClassVar[tuple[tuple[str, str | None], ...]] = ()
    dequant_bytes_per_value: ClassVar[int] = 8
    group_size: int = 32

    def summary(self) -> dict[str, Any]:
        return {"method": METHOD, "dtype": "fp4", "qscheme": "per_group", "group_size": self.group_size,
                "scale_format": "e8m0"}

    @property
    def name(self) -> str:
        return "MXFP4"

    @property
    def param_dtype(self) -> str:
        return "FP4"

    @property
    def power_of_two_scales(self) -> bool:
        return True

    def stored(self, out: int, inp: int) -> tuple[Stored, ...]:
        return (Stored(".weight", "U8", (out, ceil_div(inp, 2)), PACKED, out * inp),
                Stored(".weight_scale", "U8", (out, ceil_div(inp, self.group_size)), SCALE))

    def describe(self) -> str:
        return f"OCP MXFP4: FP4 e2m1 two per U8 byte, one E8M0 exponent (U8) per {self.group_size} inputs (AMD Quark)"

    def error_bound(self) -> float:
        """OCP MXFP4: FP4 E2M1 codes, an E8M0 scale per `group_size` inputs: bounds.power_of_two_fp4."""
        return bounds.power_of_two_fp4(self.group_size)

    def dequantize(self, tensors: Mapping[str, np.ndarray], out: int, inp: int) -> np.ndarray:
        """Quark's importer: ``e2m1 * 2 ** (e - 127)`` in float32."""
        from kimi_audit.numerics.fp4 import dequantize_mx_f32

        return dequantize_mx_f32(packed_rows(tensors, ".weight", out), tensors[".weight_scale"], inp,
                                 self.group_size)


def _weight_scheme(spec: Any, dtype: str, where: str) -> Scheme | None:
    """The scheme of one Quark layer config (None: its weights are not quantized)."""
    if spec is None:
        return None
    if not isinstance(spec, dict):
        raise ConfigError(f"config.json quantization_config {where} is not an object")
    acts = spec.get("input_tensors")
    if acts is not None and not isinstance(acts, dict):
        raise ConfigError(f"config.json quantization_config {where}.input_tensors is not an object")
    if acts is not None and not acts.get("is_dynamic", True):
        raise UnsupportedQuantization(f"Quark static activation scales ({where}.input_tensors)")
    weight = spec.get("weight")
    if weight is None:
        return None
    if not isinstance(weight, dict):
        raise ConfigError(f"config.json quantization_config {where}.weight is not an object")
    kind, qscheme = weight.get("dtype"), weight.get("qscheme")
    if kind == "fp4" and qscheme == "per_group" and weight.get("scale_format") == "e8m0":
        size = weight.get("group_size")
        if type(size) is not int or size <= 0:
            raise ConfigError(f"config.json quantization_config {where}.weight.group_size {size!r}")
        return QuarkMxfp4(group_size=size)
    if kind == "fp8_e4m3" and qscheme in ("per_channel", "per_tensor"):
        if qscheme == "per_channel" and weight.get("ch_axis", 0) != 0:
            raise UnsupportedQuantization(f"Quark FP8 per-channel scales on axis {weight.get('ch_axis')!r}")
        per_channel = qscheme == "per_channel"
        return QuarkFp8(per_channel=per_channel, scale_dtype="F32" if per_channel else dtype)
    raise UnsupportedQuantization(f"Quark weight dtype {kind!r} {qscheme!r} (kimi-audit reads OCP MXFP4 and "
                                  "FP8 e4m3 per channel or per tensor)")


def _glob(pattern: str) -> str:
    return "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern) + "$"


def quark_plan(q: dict[str, Any], plain: Unquantized) -> QuantPlan:
    export = q.get("export")
    if isinstance(export, dict) and export.get("weight_format", "real_quantized") != "real_quantized":
        raise UnsupportedQuantization(f"Quark weight_format {export.get('weight_format')!r}")
    if q.get("kv_cache_quant_config"):
        raise UnsupportedQuantization("Quark's KV-cache quantization (kv_cache_quant_config)")
    if q.get("layer_type_quant_config"):
        raise UnsupportedQuantization("Quark's layer_type_quant_config")
    every = _weight_scheme(q.get("global_quant_config"), plain.dtype, "global_quant_config")
    layers = q.get("layer_quant_config") or {}
    if not isinstance(layers, dict):
        raise ConfigError("config.json quantization_config layer_quant_config is not an object")
    exclude = q.get("exclude") or []
    if not isinstance(exclude, list) or not all(isinstance(e, str) for e in exclude):
        raise ConfigError("config.json quantization_config exclude must be a list of names")
    exact = frozenset(e for e in exclude if not any(c in e for c in "*?["))
    plain_globs = [e for e in exclude if e not in exact]
    patterns: list[tuple[NamePatterns, Scheme]] = []
    for glob, spec in sorted(layers.items()):
        scheme = _weight_scheme(spec, plain.dtype, f"layer_quant_config[{glob!r}]")
        if scheme is None:  # a layer config that quantizes no weight leaves them as they are
            plain_globs.append(glob)
            continue
        compiled = compile_patterns([_glob(glob)], "quantization_config layer_quant_config")
        assert compiled is not None
        patterns.append((compiled, scheme))
    globs = compile_patterns([_glob(e) for e in plain_globs], "quantization_config exclude")
    return QuantPlan(every, plain, patterns=tuple(patterns), ignore_names=exact, ignore_re=globs,
                     by_name=bool(patterns or exclude or plain_globs))
