"""Intel AutoRound's exports (`quant_method: "auto-round"`, auto-round's `quantize_and_save`):
OPEA/DeepSeek-R1-int2-mixed-sym-inc, OPEA/DeepSeek-R1-0528-int2-mixed-AutoRound, Intel/DeepSeek-V4-Flash-W4A16-
AutoRound.

quantization_config: `bits`, `group_size`, `sym`, `data_type` (`int`), `packing_format` (how the weights are stored:
`auto_round:auto_gptq`, GPTQ's layout without `g_idx`, zero points stored minus one; `auto_round:auto_awq`, AWQ GEMM's
layout), `block_name_to_quantize` (the blocks quantized: modules outside them, the embedding and the output head,
stay as they are), and `extra_config`, per module (an exact name, or a regex: `.*model\\.layers\\.1\\.mlp\\.gate.*`)
its own `bits` (16, or `data_type` float/fp: left unquantized; else quantized at those bits, same packing). The
stored tensors and their dequantization are the GPTQ and AWQ schemes' (model.quant.gptq, model.quant.awq).

The AWQ packing's exporter records `torch_dtype: float16` whatever the model's dtype (AWQ kernels run in float16)
while it keeps every unquantized tensor in the model's own: the config's dtype is then the exporter's, and a float
dtype uniform across a component's tensors is writer variance (QuantPlan.dtype_recorded false).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from kimi_audit.errors import ConfigError
from kimi_audit.model.patterns import NamePatterns, compile_patterns
from kimi_audit.model.quant.awq import AwqGemm
from kimi_audit.model.quant.gptq import Gptq
from kimi_audit.model.quant.scheme import QuantPlan, ReleaseQuant, Scheme, Unquantized, UnsupportedQuantization

METHOD = "auto-round"
GPTQ_PACKING, AWQ_PACKING = "auto_round:auto_gptq", "auto_round:auto_awq"
REGEX_CHARS = frozenset("*+?[](){}|^$\\")


@dataclass(frozen=True)
class AutoRoundGptq(Gptq):
    """AutoRound's GPTQ packing (no g_idx): the scheme class registered under `auto-round`, planning the config."""

    key: ClassVar[str] = "auto-round"
    formats: ClassVar[tuple[tuple[str, str | None], ...]] = ((METHOD, None),)
    roles: ClassVar[tuple[tuple[str, str], ...]] = ()
    g_idx: bool = False

    dtype: str = "F16"
    """AutoRound's inference (auto_round_extension's QuantLinear) dequantizes in its scales' dtype, float16."""

    @classmethod
    def plan(cls, q: dict[str, Any], plain: Unquantized, config: Mapping[str, Any],
             release: ReleaseQuant) -> QuantPlan:
        return autoround_plan(q, plain)

    def summary(self) -> dict[str, Any]:
        return {"method": METHOD, "packing_format": GPTQ_PACKING, "bits": self.bits, "group_size": self.group_size,
                "sym": self.sym}

    def describe(self) -> str:
        return f"AutoRound INT{self.bits}, GPTQ packing ({GPTQ_PACKING}, no g_idx), per {self.group_size} inputs"


def _scheme(packing: str, bits: Any, group: Any, sym: Any, where: str) -> Scheme:
    if type(bits) is not int or bits not in (2, 3, 4, 8):
        raise ConfigError(f"config.json quantization_config {where}bits {bits!r} is not 2, 3, 4, 8 or 16")
    if type(group) is not int or not (group == -1 or group > 0):
        raise ConfigError(f"config.json quantization_config {where}group_size {group!r}")
    if packing == GPTQ_PACKING:
        if bits == 3:
            raise UnsupportedQuantization("AutoRound 3-bit GPTQ packing")
        return AutoRoundGptq(bits=bits, group_size=group, v1=True, sym=bool(sym))
    if packing == AWQ_PACKING:
        if bits != 4:
            raise UnsupportedQuantization(f"AutoRound AWQ packing of {bits} bits")
        return AwqGemm(group_size=group, dtype="F16")
    raise UnsupportedQuantization(f"AutoRound packing_format {packing!r} (kimi-audit reads {GPTQ_PACKING} and "
                                  f"{AWQ_PACKING})")


def _pattern(key: str) -> str:
    """An extra_config key as an RE2 pattern over the whole name: a regex as written, a name exactly."""
    return (key if REGEX_CHARS & set(key) else re.escape(key)) + "$"


def autoround_plan(q: dict[str, Any], plain: Unquantized) -> QuantPlan:
    packing = q.get("packing_format", GPTQ_PACKING)
    if q.get("data_type", "int") != "int":
        raise UnsupportedQuantization(f"AutoRound data_type {q.get('data_type')!r}")
    bits, group, sym = q.get("bits", 4), q.get("group_size", 128), q.get("sym", True)
    main = _scheme(packing, bits, group, sym, "")
    extra = q.get("extra_config") or {}
    if not isinstance(extra, dict):
        raise ConfigError("config.json quantization_config extra_config is not an object")
    plain_keys: list[str] = []
    by_scheme: dict[Scheme, list[str]] = {}
    for key, layer in sorted(extra.items()):
        if not isinstance(layer, dict):
            raise ConfigError(f"config.json quantization_config extra_config[{key!r}] is not an object")
        b = layer.get("bits", bits)
        if (type(b) is int and b >= 16) or layer.get("data_type") in ("float", "fp"):
            plain_keys.append(key)
            continue
        scheme = _scheme(packing, b, layer.get("group_size", group), layer.get("sym", sym), f"extra_config[{key!r}].")
        by_scheme.setdefault(scheme, []).append(key)
    blocks = q.get("block_name_to_quantize", "model.layers")
    names = blocks.split(",") if isinstance(blocks, str) else blocks
    if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
        raise ConfigError(f"config.json quantization_config block_name_to_quantize {blocks!r}")
    patterns: list[tuple[NamePatterns, Scheme]] = []
    for scheme, keys in by_scheme.items():
        compiled = compile_patterns([_pattern(k) for k in keys], "quantization_config extra_config")
        assert compiled is not None
        patterns.append((compiled, scheme))
    inside = compile_patterns([re.escape(n.strip()) + r"\..*" for n in names], "block_name_to_quantize")
    assert inside is not None
    patterns.append((inside, main))
    ignore = compile_patterns([_pattern(k) for k in plain_keys], "quantization_config extra_config")
    return QuantPlan(None, plain, patterns=tuple(patterns), ignore_re=ignore, by_name=True,
                     dtype_recorded=packing != AWQ_PACKING)
