"""config.json's quantization_config against the format this layout implements (DeepSeek-V3 FP8)."""

from __future__ import annotations

from typing import Any

from kimi_audit.findings import Finding, error, warning

EXPECTED = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]}


def quantization_findings(config_raw: dict[str, Any]) -> list[Finding]:
    q = config_raw.get("quantization_config")
    if q is None:
        return []
    out: list[Finding] = []
    for key, want in EXPECTED.items():
        got = q.get(key)
        if got != want:
            out.append(error("QUANT_CONFIG", f"quantization_config.{key} is {got!r}, expected {want!r} "
                             "(block-wise FP8 e4m3 with 128x128 scales)", tensor=f"quantization_config.{key}",
                             expected=want, actual=got))
    scheme = q.get("activation_scheme")
    if scheme not in (None, "dynamic"):
        out.append(warning("QUANT_CONFIG", f"quantization_config.activation_scheme is {scheme!r}, expected "
                           "'dynamic'", tensor="quantization_config.activation_scheme", expected="dynamic",
                           actual=scheme))
    return out
