"""config.json's quantization_config: a scheme model.quant implements, with the family's settings."""

from __future__ import annotations

from collections import Counter
from typing import Any

from kimi_audit.findings import Finding, error, warning
from kimi_audit.model.arch.registry import architecture_of
from kimi_audit.model.quant.dispatch import implemented
from kimi_audit.numerics.grid import DEEPSEEK_FP8_BLOCK

EXPECTED = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": list(DEEPSEEK_FP8_BLOCK)}
"""The family's FP8 settings (DeepSeek-V3's): what QUANT_CONFIG compares an fp8 quantization_config with; the
block may be any of those the architecture's release uses (model.arch: DeepSeek-V4.1's [32, 32])."""


def quantization_findings(
    config_raw: dict[str, Any], stored: Counter[str] | None = None, unsupported: str | None = None
) -> list[Finding]:
    """`stored`: how many tensors the shards hold of each dtype (to notice FP8 weights with no config);
    `unsupported`: the method or format no scheme implements (ModelConfig.quant_unsupported)."""
    q = config_raw.get("quantization_config")
    if unsupported is not None:
        return [error("QUANT_UNSUPPORTED", f"quantization_config: {unsupported} is not a scheme kimi-audit "
                      f"implements ({implemented()}): the tensors of Linear modules are not checked and the parameter "
                      "total is incomplete; the format, index and other checks still ran",
                      tensor="quantization_config", actual=unsupported)]
    if q is None:
        fp8 = sum(n for dtype, n in (stored or {}).items() if dtype.startswith("F8_"))
        if not fp8:
            return []
        return [error("QUANT_CONFIG", f"config.json has no quantization_config, yet {fp8:,} tensors are stored "
                      "in FP8: loaders will not dequantize them (expected block-wise FP8 e4m3 with 128x128 "
                      "weight_scale_inv)", tensor="quantization_config", expected=EXPECTED, actual=None)]
    out: list[Finding] = []
    if not isinstance(q, dict) or q.get("quant_method") != "fp8":
        return out  # compressed-tensors: what its plan implements was decided when the config was read
    arch = architecture_of(config_raw)
    blocks = [list(b) for b in (arch.quant.blocks if arch is not None else (DEEPSEEK_FP8_BLOCK,))]
    for key, want in EXPECTED.items():
        got = q.get(key)
        if key == "fmt" and got is None:
            continue  # DeepSeek-V4.1 publishes none: no loader reads it (transformers, vLLM), e4m3 is the format
        if got != want and not (key == "weight_block_size" and got in blocks):
            out.append(error("QUANT_CONFIG", f"quantization_config.{key} is {got!r}, expected {want!r} "
                             "(block-wise FP8 e4m3 with 128x128 scales)", tensor=f"quantization_config.{key}",
                             expected=want, actual=got))
    scheme = q.get("activation_scheme")
    if scheme not in (None, "dynamic"):
        out.append(warning("QUANT_CONFIG", f"quantization_config.activation_scheme is {scheme!r}, expected "
                           "'dynamic'", tensor="quantization_config.activation_scheme", expected="dynamic",
                           actual=scheme))
    return out
