"""What a tensor is, from its name: the one suffix classifier every stage uses, derived from the registries.

`role_of(name)` says what a tensor is by the suffix its name ends with (a block scale, packed words, a norm
gain, a router bias, a buffer ...); `kind_of(name)` says what it counts for (PARAMETER, PACKED, SCALE or
BUFFER) when the layout does not know the name. The suffixes are the registered format classes' `roles`
(model.quant) and the registered architectures' `value_roles` (model.arch); the longest suffix that matches
wins, so no order is written anywhere. A format or architecture registered later (a plug-in, a test) is
read at the next call.
"""

from __future__ import annotations

from typing import NamedTuple

from kimi_audit.constants import WIDE_FLOATS
from kimi_audit.model.arch.registry import float32_routers, value_roles
from kimi_audit.model.arch.spec import REGISTERED
from kimi_audit.model.kinds import (
    GAIN,
    GAIN_SUFFIX,
    KIND_OF_ROLE,
    OTHER,
    PACKED,
    PARAMETER,
    SCALE,
    WEIGHT,
    WEIGHT_SUFFIX,
)
from kimi_audit.model.quant.dispatch import formats
from kimi_audit.model.quant.scheme import Scheme

__all__ = ["float32_router", "kind_of", "metadata_suffixes", "role_of", "suffix_roles", "varies_by_writer",
           "weight_suffixes"]

class _Roles(NamedTuple):
    """The suffix table of one state of the registries, and what is derived from it."""

    table: tuple[tuple[str, str], ...]
    """(suffix, role), longest suffix first."""
    by_tail: dict[str, tuple[tuple[str, str], ...]]
    """The table's pairs whose suffix ends in these TAIL characters, and every suffix shorter than TAIL, in the
    table's order: a name is compared with the few suffixes that can end it, not with all 40."""
    short: tuple[tuple[str, str], ...]
    """The pairs whose suffix is shorter than TAIL (candidates for every name)."""
    metadata: tuple[str, ...]
    weights: tuple[str, ...]


TAIL = 3
_cache: dict[tuple[int, int], _Roles] = {}


def _roles() -> _Roles:
    key = (len(Scheme.classes), len(REGISTERED))  # the registries' sizes (asked per tensor name: no copies)
    roles = _cache.get(key)
    if roles is None:
        classes = formats()
        pairs: dict[str, str] = {GAIN_SUFFIX: GAIN, WEIGHT_SUFFIX: WEIGHT}
        for suffix, role in [*(p for cls in classes for p in cls.roles), *value_roles()]:
            if pairs.setdefault(suffix, role) != role:
                raise ValueError(f"tensor suffix {suffix!r} is given two roles: {pairs[suffix]} and {role}")
        table = tuple(sorted(pairs.items(), key=lambda p: -len(p[0])))
        tails = {suffix[-TAIL:] for suffix, _ in table if len(suffix) >= TAIL}
        by_tail = {tail: tuple(p for p in table if len(p[0]) < TAIL or p[0].endswith(tail)) for tail in tails}
        roles = _Roles(table, by_tail, tuple(p for p in table if len(p[0]) < TAIL),
                       tuple(s for s, r in table if KIND_OF_ROLE.get(r) == SCALE),
                       (WEIGHT_SUFFIX, *(s for s, r in table if KIND_OF_ROLE.get(r) == PACKED)))
        _cache.clear()
        _cache[key] = roles
    return roles


def suffix_roles() -> tuple[tuple[str, str], ...]:
    """(suffix, role) of every registered format and architecture, and the gain and weight every model has,
    longest suffix first; a suffix two owners give different roles is refused (ValueError)."""
    return _roles().table


def role_of(name: str) -> str:
    """What the tensor is, from its name's suffix (OTHER when no suffix says): the longest suffix that ends it."""
    roles = _roles()
    for suffix, role in roles.by_tail.get(name[-TAIL:], roles.short):
        if name.endswith(suffix):
            return role
    return OTHER


def kind_of(name: str) -> str:
    """What a tensor the layout does not know counts for, from its name alone."""
    return KIND_OF_ROLE.get(role_of(name), PARAMETER)


def metadata_suffixes() -> tuple[str, ...]:
    """Every quantization-metadata suffix (a scale, a shape, a zero point ...)."""
    return _roles().metadata


def weight_suffixes() -> tuple[str, ...]:
    """The suffixes a Linear module's stored weight may have: `.weight`, and every format's packed words."""
    return _roles().weights


def float32_router(component: str) -> bool:
    """A router part transformers keeps in float32 whatever the model's dtype (a layer's component)."""
    return component in float32_routers()


def varies_by_writer(component: str, dtype: str, ndim: int, quantized: bool) -> bool:
    """A part whose float dtype writers vary (WRITER_DTYPE and ROUTER_DTYPE are info for it): a norm's gain or
    a bias (1-D), or a router kept in float32; not a Linear weight or an embedding table. The one policy the
    layout check and the accounting read."""
    return not quantized and dtype in WIDE_FLOATS and (ndim == 1 or float32_router(component))
