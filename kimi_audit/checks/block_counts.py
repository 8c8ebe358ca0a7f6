"""A count in the config the stored blocks contradict (the layers, the leading dense layers, the MTP layers): one
CONFIG_DISAGREES naming the key, in place of every tensor of the blocks it adds or removes.

A block count off by one is a whole block's tensors missing or unexpected (18 in a tiny GGUF, about 2,300 in a
Kimi-K2 layer); a leading dense count off is one layer's MLP missing beside its MoE unexpected. Each is one cause:
the layout derived again with the key at a value the stored names suggest (checks.root_causes.layout_with) holds
every tensor the old one held and explains at least two of the findings; those fold into the root."""

from __future__ import annotations

import re
from typing import Any

from kimi_audit.checks.root_causes import config_key, layout_with
from kimi_audit.errors import KimiAuditError
from kimi_audit.findings import Finding, error
from kimi_audit.model.checkpoint import Checkpoint
from kimi_audit.model.quant.scheme import fits

COUNT_FIELDS = ("num_hidden_layers", "first_k_dense_replace", "num_nextn_predict_layers", "moe_layer_freq")
"""Config fields that count blocks (or, `moe_layer_freq`, Mistral's `route_every_n`, space the MoE ones): a wrong
value adds or removes blocks' tensors, not a dimension."""
BLOCK = re.compile(r"(?:^|\.)(?:layers|blk)\.(\d+)\.")
MISSING = ("TENSOR_MISSING", "SCALE_MISSING")
UNEXPECTED = ("TENSOR_UNEXPECTED", "SCALE_UNEXPECTED")
MAX_TRIES = 12
"""Layouts derived at most (each about 70 ms at Kimi-K2's scale), on a failing audit only."""


def fold_block_count(findings: list[Finding], ckpt: Checkpoint) -> list[Finding]:
    """The missing and unexpected tensors one block-count key explains, folded into one CONFIG_DISAGREES."""
    missing = {str(f.tensor) for f in findings if f.code in MISSING and f.tensor and not f.covers}
    unexpected = {str(f.tensor) for f in findings if f.code in UNEXPECTED and f.tensor}
    blocks = {int(m.group(1)) for n in missing | unexpected for m in BLOCK.finditer(n)}
    if len(missing) + len(unexpected) < 2 or not blocks:
        return findings
    shapes = {n: list(s) for h in ckpt.headers.values() for n, s in zip(h.columns.names, h.columns.shapes)}
    dtypes = {n: d for h in ckpt.headers.values() for n, d in zip(h.columns.names, h.columns.dtypes)}
    candidates = sorted({v for b in blocks for v in (b - 1, b, b + 1) if v >= 0})
    tries = 0
    before = layout_with(ckpt, COUNT_FIELDS[0], ckpt.config.num_hidden_layers)  # the layout as audited
    if before is None:
        return findings
    held_before = shapes.keys() & set(before.names)
    for key in COUNT_FIELDS:
        current = getattr(ckpt.config, key, None)
        tried = candidates if key in COUNT_FIELDS[:2] else [1] if key == "moe_layer_freq" else (
            [0, 1] if not isinstance(current, int) else sorted({0, 1, current - 1, current + 1} - {-1}))
        for value in tried:
            if not isinstance(current, int) or value == current or tries == MAX_TRIES:
                continue
            tries += 1
            layout = layout_with(ckpt, key, value)
            if layout is None:
                continue
            names = set(layout.names)
            gone = {n for n in missing if n not in names}
            held = {n for n in unexpected if n in names}
            added = names.difference(shapes, missing)  # tensors the new count expects that no shard stores
            lost = held_before - names  # stored, expected before, not now
            if len(gone) + len(held) < 2 or added or lost or any(
                    list(layout.get(n).shape) != shapes[n] for n in held):
                continue
            named, was, would = key_values(ckpt, key, current, value)
            first = sorted(held or gone)[0]
            cast = [error("DTYPE_MISMATCH", f"{n}: stored {dtypes[n]}, the layout expects {e.dtype} (the blocks "
                          f"{named} leaves out hold it)", tensor=n, expected=e.dtype, actual=dtypes[n])
                    for n in sorted(held) for e in (layout.get(n),) if e is not None
                    and not fits(e.dtype, dtypes[n], tuple(shapes[n]))]  # a second fault the fold must not hide
            what = " and ".join(w for n, w in ((len(gone), f"{len(gone):,} tensors it expects are in no shard"),
                                               (len(held), f"{len(held):,} stored it does not account for")) if n)
            root = error("CONFIG_DISAGREES", f"{named} is {was:,}, but the stored tensors are those of {would:,}: "
                         f"{what} (first: {first}); one cause, the config and the files disagree",
                         tensor=named, expected=was, actual=would, covers=len(gone) + len(held))
            explained = gone | held
            return [root, *cast] + [f for f in findings if f.code not in MISSING + UNEXPECTED
                                    or str(f.tensor) not in explained]
    return findings


def key_values(ckpt: Checkpoint, field_name: str, current: int, value: int) -> tuple[str, Any, Any]:
    """Where a config field is written and what it holds there now and would hold at `value`: config.json's key
    and the two values, or (a GGUF set) the metadata key its dialect writes that changes with it (block_count
    counts the NextN layers beside num_hidden_layers: 3 and 4, not 2 and 3)."""
    if ckpt.container == "gguf":
        from kimi_audit.model.arch.registry import gguf_architecture

        arch = gguf_architecture(ckpt.metadata.get("general.architecture"))
        if arch is not None and arch.gguf is not None:
            raw = dict(ckpt.config_raw)
            try:
                now, then = arch.gguf.metadata({**raw, field_name: current}), arch.gguf.metadata({**raw, field_name:
                                                                                                  value})
            except (KimiAuditError, TypeError, ValueError, KeyError):
                now = then = {}
            for k, v in now.items():  # the key as the file holds it, moved by as much as the field moves it
                if isinstance(v, int) and isinstance(then.get(k), int) and then[k] != v:
                    held = ckpt.metadata.get(k, v)
                    return (k, held, held + then[k] - v) if isinstance(held, int) else (k, v, then[k])
    return config_key(ckpt, field_name, current), current, value
