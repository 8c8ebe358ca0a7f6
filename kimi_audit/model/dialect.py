"""Which spelling of the architecture's names a checkpoint uses: the release's (canonical), or one dialect
(model.arch.spec.Dialect) throughout. A checkpoint wholly in a dialect is audited against the same tree
with its names respelled, and the dialect named once (LAYOUT_DIALECT, info); one that mixes both spellings
is audited against the spelling most of its probed names use, so the others are findings (missing and
unexpected)."""

from __future__ import annotations

from collections.abc import Callable, Container, Iterable
from dataclasses import replace
from itertools import chain, islice
from operator import methodcaller

from kimi_audit.findings import Finding, info
from kimi_audit.model.arch.registry import dialects
from kimi_audit.model.arch.spec import Dialect
from kimi_audit.model.config_fields import ModelConfig
from kimi_audit.model.layout import ExpectedLayout, expected_layout


def respelled(layout: ExpectedLayout, rename: Callable[[str], str]) -> ExpectedLayout:
    """The same layout with every name in a dialect's spelling (`rename`: Dialect.rename, GgufDialect.rename;
    dtypes, shapes and order unchanged)."""
    return ExpectedLayout(list(map(rename, layout.names)), layout.spec_of, layout.specs, layout.layer_of,
                          layout.meta_at, layout.meta_owner)


def canonical_ignores(cfg: ModelConfig, dialect: Dialect) -> ModelConfig:
    """The config with its quantization `ignore` names (exact module names) spelled as the release spells
    them: a quantization of a dialect's checkpoint lists them in the dialect (`re:` patterns are kept)."""
    q = cfg.quant
    if q is None or not q.ignore_names:
        return cfg
    names = frozenset(map(dialect.canonical, q.ignore_names))
    return cfg if names == q.ignore_names else replace(cfg, quant=replace(q, ignore_names=names))


def resolve_dialect(cfg: ModelConfig, layout: ExpectedLayout,
                    stored: Iterable[Container[str]]) -> tuple[ModelConfig, ExpectedLayout, list[Finding]]:
    """The layout in the spelling the stored names use, and the finding that names a dialect.

    Decided by probes: for each of the dialect's renames, the first layout name it applies to, looked up in
    both spellings among `stored` (each shard's names): a few lookups, not one per name. The spelling more
    probes find wins; the names a checkpoint holds in the other are findings."""
    known = dialects(cfg)
    if not known:
        return cfg, layout, []
    shards = list(stored)

    def has(name: str) -> bool:
        return any(name in names for names in shards)

    def first(prefix: str) -> str | None:
        """The layout's first name under `prefix`: the layers come first, the rest (vision tower, projector)
        last, so both ends are scanned first."""
        ends = chain(islice(layout.names, 1000), reversed(layout.names))
        return next(filter(methodcaller("startswith", prefix), ends), None)

    for dialect in known:
        probes = [first(canonical) for canonical, _ in dialect.renames]
        pairs = [(n, dialect.rename(n)) for n in probes if n is not None]
        # the spelling most probes find: a checkpoint wholly in the dialect, or mostly (its few names in the
        # release's spelling are then findings, as a few respelled names are in a checkpoint mostly canonical)
        if sum(has(r) for _, r in pairs) > sum(has(n) for n, _ in pairs):
            renames = "; ".join(f"{c}* as {d}*" for c, d in dialect.renames)
            spelled = canonical_ignores(cfg, dialect)
            if spelled is not cfg:
                cfg, layout = spelled, expected_layout(spelled)
            return cfg, respelled(layout, dialect.rename), [info(
                "LAYOUT_DIALECT", f"the checkpoint names its tensors in the {dialect.name} dialect ({renames}): "
                f"audited against the same layout so spelled. The release's names are canonical; vLLM and "
                f"SGLang load those ({dialect.note})", tensor=pairs[0][1], expected=pairs[0][0],
                actual=pairs[0][1])]
    return cfg, layout, []
