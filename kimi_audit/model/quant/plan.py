"""Which scheme stores each Linear module: the QuantPlan a quantization_config describes.

`quant_plan` looks the config's (quant_method, format) up in `Scheme.registry` (every scheme module is imported
here, so the registry is whole) and asks that class for the plan. A plan holds one scheme for every Linear
module (compressed-tensors' `Linear` target, DeepSeek's FP8), schemes for modules by exact name and by `re:`
pattern (compressed-tensors' other targets, DeepSeek-V4's FP4 experts), and what stays unquantized (`ignore`,
and the modules a format leaves plain by convention). Precedence is compressed-tensors' (match_targets):
an exact name, then a pattern (in sorted order), then the class target; `ignore` before all.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from itertools import repeat
from operator import neg, or_
from typing import Any

from kimi_audit.errors import ConfigError
from kimi_audit.model.quant import deepseek
from kimi_audit.model.quant.compressed import base as compressed
from kimi_audit.model.quant.compressed import fp4, naive, pack  # noqa: F401  (imported: their schemes register)
from kimi_audit.model.quant.scheme import Scheme, Unquantized, UnsupportedQuantization

__all__ = ["QuantPlan", "fp8_block", "implemented", "quant_plan"]


@dataclass(frozen=True)
class QuantPlan:
    """Which scheme stores each Linear module (by its full name, e.g. `model.layers.3.self_attn.q_a_proj`)."""

    every: Scheme | None
    """The scheme of every Linear module no other entry names (None: those stay plain)."""
    plain: Unquantized
    exact: Mapping[str, Scheme] = field(default_factory=dict)
    patterns: tuple[tuple[re.Pattern[str], Scheme], ...] = ()
    """`re:` targets, matched (re.match, as compressed-tensors) against module names, in sorted order."""
    ignore_names: frozenset[str] = frozenset()
    ignore_re: re.Pattern[str] | None = None
    """compressed-tensors `re:` entries of `ignore`, matched (re.match) against module names."""
    keep_plain: tuple[str, ...] = ()
    """Module-name suffixes a format leaves unquantized by convention (FP8: the MTP layer's projections)."""
    by_name: bool = False
    """Whether the choice depends on the layer's index (an ignore list, a target naming modules): then every
    layer is asked."""
    groups: tuple[dict[str, Any], ...] = ()
    """Each scheme's targets as written (summary of a plan with several schemes)."""

    @property
    def schemes(self) -> tuple[Scheme, ...]:
        """Every quantized scheme of the plan, each once (the one for every Linear module first)."""
        out = [] if self.every is None else [self.every]
        for s in (*self.exact.values(), *(s for _, s in self.patterns)):
            if s not in out:
                out.append(s)
        return tuple(out)

    @property
    def quantized(self) -> Scheme:
        """The plan's main scheme (the first of `schemes`)."""
        return self.schemes[0]

    def summary(self) -> dict[str, Any]:
        """The quantized modules' scheme as plain data (`model.quantization` in `audit --json`); a plan of
        several schemes lists each with its targets under `groups`."""
        schemes = self.schemes
        if len(schemes) == 1:
            return schemes[0].summary()
        first = schemes[0].summary()
        return {"method": first.get("method"), "groups": [
            dict(s.summary(), **g) for s, g in zip(schemes, self.groups)] if self.groups else
            [s.summary() for s in schemes]}

    def scheme_for(self, module: str) -> Scheme:
        if module in self.ignore_names or (self.ignore_re is not None and self.ignore_re.match(module)):
            return self.plain
        if module.endswith(self.keep_plain):
            return self.plain
        if self.exact:
            s = self.exact.get(module)
            if s is not None:
                return s
        for pattern, s in self.patterns:
            if pattern.match(module):
                return s
        return self.every if self.every is not None else self.plain

    def choices(self, modules: list[str]) -> tuple[int, ...]:
        """Which scheme each module gets (its index in `schemes`, -1: plain), for every module of a layer at
        once; builtin speed where one scheme stores every Linear module."""
        if self.exact or self.patterns or self.every is None:
            schemes = self.schemes
            return tuple(-1 if s is self.plain else schemes.index(s) for s in map(self.scheme_for, modules))
        plain = map(str.endswith, modules, repeat(self.keep_plain))
        if self.ignore_names:
            plain = map(or_, plain, map(self.ignore_names.__contains__, modules))
        if self.ignore_re is not None:
            plain = map(or_, plain, map(bool, map(self.ignore_re.match, modules)))
        return tuple(map(neg, plain))


def fp8_block(plan: QuantPlan | None) -> tuple[int, int]:
    """The block of FP8 weights' scales: the plan's, else Fp8Block's default (FP8 weights a config does not
    describe are read as DeepSeek's)."""
    for scheme in () if plan is None else plan.schemes:
        block = getattr(scheme, "block", None)
        if isinstance(block, tuple) and len(block) == 2:
            return block
    return deepseek.Fp8Block.block


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
