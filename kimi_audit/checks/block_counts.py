"""A count in the config the stored blocks contradict (the layers, the leading dense layers, the MTP layers): one
CONFIG_DISAGREES naming the key, in place of every tensor of the blocks it adds or removes.

A block count off by one is a whole block's tensors missing or unexpected (18 in a tiny GGUF, about 2,300 in a
Kimi-K2 layer); a leading dense count off is one layer's MLP missing beside its MoE unexpected. Each is one cause:
the layout derived again with the key at a value the stored names suggest (checks.root_causes.layout_with) holds
every tensor the old one held and explains at least two of the findings; of those tried, the one that leaves the
fewest is the root (at most MAX_TRIES layouts, on a failing audit only). What it leaves stays listed. Whole blocks
missing beside a numbered series of shards with a gap (SHARD_SERIES_GAP) are the gap's, not the config's."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from kimi_audit.checks.root_causes import config_key, layout_with
from kimi_audit.errors import KimiAuditError
from kimi_audit.findings import Finding, Severity, error
from kimi_audit.model.checkpoint import Checkpoint
from kimi_audit.model.kinds import BLOCK_NAME
from kimi_audit.model.quant.scheme import fits

COUNT_FIELDS = ("num_hidden_layers", "first_k_dense_replace", "num_nextn_predict_layers", "moe_layer_freq")
"""Config fields that count blocks (or, `moe_layer_freq`, Mistral's `route_every_n`, space the MoE ones): a wrong
value adds or removes blocks' tensors, not a dimension."""
MISSING = ("TENSOR_MISSING", "SCALE_MISSING")
UNEXPECTED = ("TENSOR_UNEXPECTED", "SCALE_UNEXPECTED")
MAX_TRIES = 12
"""Layouts derived at most (each about 70 ms at Kimi-K2's scale), on a failing audit only."""


def fold_block_count(findings: list[Finding], ckpt: Checkpoint) -> list[Finding]:
    """The missing and unexpected tensors one block-count key explains, folded into one CONFIG_DISAGREES: of the
    values tried, the one that leaves the fewest of them (a tie: the first key). What the new count still finds
    wrong in the blocks it accounts for (a tensor no shard stores, another shape or a type its role never takes)
    stays a finding of its own: a second fault is never folded away."""
    missing = {str(f.tensor) for f in findings if f.code in MISSING and f.tensor and not f.covers}
    unexpected = {str(f.tensor) for f in findings if f.code in UNEXPECTED and f.tensor}
    blocks = {int(m.group(1)) for n in missing | unexpected for m in BLOCK_NAME.finditer(n)}
    if len(missing) + len(unexpected) < 2 or not blocks:
        return findings
    shapes = {n: list(s) for h in ckpt.headers.values() for n, s in zip(h.columns.names, h.columns.shapes)}
    dtypes = {n: d for h in ckpt.headers.values() for n, d in zip(h.columns.names, h.columns.dtypes)}
    candidates = sorted({v for b in blocks for v in (b - 1, b, b + 1) if v >= 0})
    before = layout_with(ckpt, COUNT_FIELDS[0], ckpt.config.num_hidden_layers)  # the layout as audited
    if before is None:
        return findings
    held_before = shapes.keys() & set(before.names)
    # (left, -explained, key, current, value, layout, its names) of the best try so far
    best: tuple[int, int, str, int, int, Any, set[str]] | None = None
    tries = 0
    for key in COUNT_FIELDS:
        current = getattr(ckpt.config, key, None)
        tried = candidates if key in COUNT_FIELDS[:2] else [1] if key == "moe_layer_freq" else (
            [0, 1] if not isinstance(current, int) else sorted({0, 1, current - 1, current + 1} - {-1}))
        for value in tried:
            if not isinstance(current, int) or value == current or tries == MAX_TRIES:
                continue
            tries += 1
            layout = _layout(ckpt, key, current, value)
            if layout is None:
                continue
            names = set(layout.names)
            count = len([n for n in missing if n not in names]) + len([n for n in unexpected if n in names])
            added = len(names.difference(shapes, missing))  # tensors the new count expects that no shard stores
            if count < 2 or added >= count or held_before - names:  # (stored, expected before, not now)
                continue
            left = len(missing) + len(unexpected) - count + added
            if best is None or (left, -count) < best[:2]:
                best = (left, -count, key, current, value, layout, names)
    if best is None:
        return findings
    _, _, key, current, value, layout, names = best
    gone = {n for n in missing if n not in names}
    held = {n for n in unexpected if n in names}
    gap = next((f for f in findings if f.code == "SHARD_SERIES_GAP"), None)
    if gap is not None and not held:  # whole blocks missing with a shard of the series: the shard's, not the config's
        return [replace(f, severity=Severity.ERROR, covers=f.covers + len(gone), message=f"{f.message}; the config "
                        f"expects {len(gone):,} tensors no shard holds (first: {sorted(gone)[0]})") if f is gap else f
                for f in findings if not (f.code in MISSING and str(f.tensor) in gone)]
    named, was, would = key_values(ckpt, key, current, value)
    first = sorted(held or gone)[0]
    why = f"(the blocks {named} {was:,} leaves out hold it)"
    second = [error("TENSOR_MISSING", f"{n}: expected {e.dtype} {list(e.shape)} with {named} {would:,}, not in any "
                    "shard", tensor=n, expected=list(e.shape)) for n in sorted(names.difference(shapes, missing))
              for e in (layout.get(n),) if e is not None]
    for n in sorted(held):
        e = layout.get(n)
        if e is not None and list(e.shape) != shapes[n]:
            second.append(error("SHAPE_MISMATCH", f"{n}: stored {shapes[n]}, the layout expects {list(e.shape)} "
                                f"{why}", tensor=n, expected=list(e.shape), actual=shapes[n]))
        elif e is not None and not fits(e.dtype, dtypes[n], tuple(shapes[n])):
            second.append(error("DTYPE_MISMATCH", f"{n}: stored {dtypes[n]}, the layout expects {e.dtype} {why}",
                                tensor=n, expected=e.dtype, actual=dtypes[n]))
    what = " and ".join(w for n, w in ((len(gone), f"{len(gone):,} tensors it expects are in no shard"),
                                       (len(held), f"{len(held):,} stored it does not account for")) if n)
    root = error("CONFIG_DISAGREES", f"{named} is {was:,}, but the stored tensors are those of {would:,}: {what} "
                 f"(first: {first}); one cause, the config and the files disagree", tensor=named, expected=was,
                 actual=would, covers=len(gone) + len(held))
    explained = gone | held
    layers = key in ("num_hidden_layers", "num_nextn_predict_layers")  # an MTP layer counted otherwise: this cause
    return [root, *second] + [f for f in findings if not (f.code in MISSING + UNEXPECTED and str(f.tensor) in
                                                          explained) and not (layers and f.code == "MTP_ABSENT")]


def _layout(ckpt: Checkpoint, key: str, current: int, value: int) -> Any:
    """The layout with `key` at `value`; in a GGUF, NextN layers are counted in block_count, so a change of
    num_nextn_predict_layers keeps the blocks and moves the main layers the other way."""
    if key == "num_nextn_predict_layers" and ckpt.container == "gguf":
        return layout_with(ckpt, key, value, num_hidden_layers=ckpt.config.num_hidden_layers + current - value)
    return layout_with(ckpt, key, value)


def key_values(ckpt: Checkpoint, field_name: str, current: int, value: int) -> tuple[str, Any, Any]:
    """Where a config field is written and what it holds there now and would hold at `value`: config.json's key
    and the two values, or (a GGUF set) the metadata key its dialect writes that changes with it (block_count
    counts the NextN layers beside num_hidden_layers: 3 and 4, not 2 and 3)."""
    if ckpt.container == "gguf":
        from kimi_audit.model.arch.registry import gguf_architecture

        own = f"{ckpt.metadata.get('general.architecture')}.{LLAMA_KEYS.get(field_name, '')}"
        held = ckpt.metadata.get(own)
        if field_name in LLAMA_KEYS and isinstance(held, int) and not isinstance(held, bool):
            return own, held, held + value - current  # the count's own key, whatever else moves with it

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


LLAMA_KEYS = {"num_nextn_predict_layers": "nextn_predict_layers", "first_k_dense_replace": "leading_dense_block_count"}
"""llama.cpp's own names of the counts (LLM_KV_NEXTN_PREDICT_LAYERS, LLM_KV_LEADING_DENSE_BLOCK_COUNT), every
architecture's, where a dialect's metadata does not move with the field."""
