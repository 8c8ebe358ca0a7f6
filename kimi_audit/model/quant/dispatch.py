"""From a quantization_config to its QuantPlan: `quant_plan` looks the config's (quant_method, format) up in
`Scheme.registry` and asks that class for the plan; compressed-tensors' configs go to its config-group reader,
which looks each group's format up the same way.

Every module of the model.quant package is imported when this one is (`load_formats`): a format is one new
module holding its class, registered by `Scheme.__init_subclass__`, and nothing else names it.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kimi_audit.errors import ConfigError
from kimi_audit.model.quant.compressed import base as compressed
from kimi_audit.model.quant.scheme import (
    DEEPSEEK_RELEASE,
    QuantPlan,
    ReleaseQuant,
    Scheme,
    Unquantized,
    UnsupportedQuantization,
)

__all__ = ["formats", "implemented", "load_formats", "quant_plan", "writer_of"]


def load_formats() -> None:
    """Imports every module of the model.quant package, so that each scheme class in it registers."""
    package = __name__.rpartition(".")[0]
    for m in pkgutil.walk_packages([str(Path(__file__).parent)], package + "."):
        importlib.import_module(m.name)


load_formats()


def formats() -> tuple[type[Scheme], ...]:
    """Every registered scheme class, in registration order."""
    return tuple(Scheme.classes)


def writer_of(scheme: str, name: str, dtype: str) -> str:
    """Who stores the quantization tensor `name` of the scheme keyed `scheme` in `dtype` where the release stores
    another (Scheme.writer_dtypes: compressed-tensors' own I64 `weight_shape`); "" for no format's writer."""
    for c in Scheme.classes:
        if c.key == scheme:
            return next((w for suffix, d, w in c.writer_dtypes if d == dtype and name.endswith(suffix)), "")
    return ""


def quant_plan(q: Any, dtype: str, config: Mapping[str, Any] | None = None,
               release: ReleaseQuant = DEEPSEEK_RELEASE) -> QuantPlan | None:
    """The plan quantization_config describes (None: nothing quantized), made by the scheme class registered
    for its (quant_method, format). UnsupportedQuantization names an unknown method or format."""
    legacy = None if config is None else config.get("quantization")
    if q is None and isinstance(legacy, dict) and {"bits", "group_size"} <= legacy.keys():
        q = legacy  # mlx-lm before #957 wrote only `quantization`
    if q is None:
        return None
    if not isinstance(q, dict):
        raise ConfigError(f"config.json quantization_config is a {type(q).__name__}, not an object")
    method, fmt = q.get("quant_method"), q.get("format")
    for key, value in (("quant_method", method), ("format", fmt)):
        if value is not None and not isinstance(value, str):
            raise ConfigError(f"config.json quantization_config.{key} must be a string, got {value!r}")
    if method is None:
        claimed = next((c for c in Scheme.classes if c.claims(q, config or {})), None)
        if claimed is not None:
            return claimed.plan(q, Unquantized(dtype), config or {}, release)
    if method == compressed.METHOD:  # one registered class per config group's format (mixed-precision too)
        return compressed.compressed_tensors_plan(q, Unquantized(dtype), release)
    scheme = None
    if isinstance(method, str):
        scheme = Scheme.registry.get((method, fmt if isinstance(fmt, str) else None))
        if scheme is None:
            scheme = Scheme.registry.get((method, None))
    if scheme is None:
        if any(m == method for m, _ in Scheme.registry):
            raise UnsupportedQuantization(f"{method} format {fmt!r}")
        raise UnsupportedQuantization(f"quant_method {method!r}")
    return scheme.plan(q, Unquantized(dtype), config or {}, release)


def implemented() -> str:
    """The (quant_method, format) pairs a scheme is registered for, as text (QUANT_UNSUPPORTED names them)."""
    return ", ".join(m if f is None else f"{m} {f}" for m, f in sorted(Scheme.registry, key=str))
