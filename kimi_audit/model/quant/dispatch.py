"""From a quantization_config to its QuantPlan: `quant_plan` looks the config's (quant_method, format) up in
`Scheme.registry` (every scheme module is imported here, so the registry is whole) and asks that class for the
plan; compressed-tensors' configs go to its config-group reader, which looks each group's format up the same way.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kimi_audit.errors import ConfigError
from kimi_audit.model.quant.compressed import base as compressed
from kimi_audit.model.quant.compressed import fp4, naive, pack  # noqa: F401  (imported: their schemes register)
from kimi_audit.model.quant.deepseek import Fp8Block  # noqa: F401  (imported: it registers)
from kimi_audit.model.quant.scheme import QuantPlan, Scheme, Unquantized, UnsupportedQuantization

__all__ = ["implemented", "quant_plan"]


def quant_plan(q: Any, dtype: str, config: Mapping[str, Any] | None = None) -> QuantPlan | None:
    """The plan quantization_config describes (None: nothing quantized), made by the scheme class registered
    for its (quant_method, format). UnsupportedQuantization names an unknown method or format."""
    if q is None:
        return None
    if not isinstance(q, dict):
        raise ConfigError(f"config.json quantization_config is a {type(q).__name__}, not an object")
    method, fmt = q.get("quant_method"), q.get("format")
    if method == compressed.METHOD:  # one registered class per config group's format (mixed-precision too)
        return compressed.compressed_tensors_plan(q, Unquantized(dtype))
    scheme = None
    if isinstance(method, str):
        scheme = Scheme.registry.get((method, fmt if isinstance(fmt, str) else None))
        if scheme is None:
            scheme = Scheme.registry.get((method, None))
    if scheme is None:
        if any(m == method for m, _ in Scheme.registry):
            raise UnsupportedQuantization(f"{method} format {fmt!r}")
        raise UnsupportedQuantization(f"quant_method {method!r}")
    return scheme.plan(q, Unquantized(dtype), config or {})


def implemented() -> str:
    """The (quant_method, format) pairs a scheme is registered for, as text (QUANT_UNSUPPORTED names them)."""
    return ", ".join(m if f is None else f"{m} {f}" for m, f in sorted(Scheme.registry, key=str))
