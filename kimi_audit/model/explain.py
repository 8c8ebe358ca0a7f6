"""Explain cards: one node of the accounting tree, as the design cards (shared/seeds) present it.

A card says what the component computes (formula), its input and output shapes with named axes,
the exact per-instance parameter accounting, the count across blocks, how it is stored (its quantization
scheme, the tensors storing one instance with their dtypes and shapes, stored elements by dtype), the
checkpoint tensors that hold it (names with indices collapsed, dtypes, shapes, shards), its quantization
metadata (listed, never counted) and the config keys it came from. The catalogue of what each role
computes is explain_docs.py.
Pure: everything comes from an Accounting (kimi_audit.model.accounting) and the config.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, replace
from typing import Any

from kimi_audit.errors import KimiAuditError
from kimi_audit.model.accounting.tree import (
    UNACCOUNTED,
    Accounting,
    FoundTensor,
    Node,
    StoredPart,
    collapse,
    tensor_slot,
)
from kimi_audit.model.arch.spec import is_mtp
from kimi_audit.model.config_fields import ModelConfig
from kimi_audit.model.explain_docs import DOCS, RMSNORM_MATH
from kimi_audit.model.kinds import block_prefix
from kimi_audit.model.roles import metadata_suffixes, weight_suffixes


@dataclass(frozen=True)
class TensorGroup:
    names: str
    dtype: str
    shape: tuple[int, ...]
    count: int
    shards: str


@dataclass(frozen=True)
class Card:
    key: str
    name: str
    title: str
    breadcrumb: tuple[str, ...]
    computes: str | None
    description: str
    math: tuple[str, ...]
    eps: float | None
    inputs: tuple[tuple[str, str], ...]
    outputs: tuple[tuple[str, str], ...]
    formula: str
    rows: tuple[tuple[str, str, int], ...]
    """Exact per-instance accounting: (component, calculation, parameters)."""
    per_instance: int
    instances: str
    instance_count: int
    derived: int
    found: int
    derived_tensors: int
    found_tensors: int
    mismatch: bool
    tensors: tuple[TensorGroup, ...]
    scales: tuple[TensorGroup, ...]
    config: tuple[tuple[str, Any], ...]
    code: str | None
    note: str
    model: str
    quantization: tuple[str, ...] = ()
    """How its Linear modules are stored (model.quant's scheme descriptions)."""
    stored: tuple[StoredPart, ...] = ()
    """Leaves: every tensor storing one instance, metadata included."""
    stored_by_dtype: tuple[tuple[str, int, int], ...] = ()
    """Stored elements across all instances by dtype: (dtype, derived, found), metadata included."""

    @property
    def verdict(self) -> str:
        if not self.mismatch:
            return ("Derived from the config; the model total matches the checkpoint's tensors "
                    f"({_n(self.found_tensors, 'tensor')}, {_n(self.found, 'parameter')}).")
        return (f"MISMATCH: the config implies {_n(self.derived_tensors, 'tensor')} and "
                f"{_n(self.derived, 'parameter')}; the checkpoint holds {_n(self.found_tensors, 'tensor')} and "
                f"{_n(self.found, 'parameter')}.")


def tensor_groups(tensors: tuple[FoundTensor, ...] | list[FoundTensor]) -> tuple[TensorGroup, ...]:
    by: dict[tuple[str, tuple[int, ...]], list[FoundTensor]] = {}
    for t in tensors:
        by.setdefault((t.dtype, t.shape), []).append(t)
    out = []
    for (dtype, shape), ts in by.items():
        names = ", ".join(collapse(sorted(t.name for t in ts)))
        shards = ", ".join(collapse(sorted({t.shard for t in ts}, key=_natural)))
        out.append(TensorGroup(names, dtype, shape, len(ts), shards))
    return tuple(out)


def _natural(s: str) -> list[Any]:
    return [int(p) if p.isascii() and p.isdigit() else p for p in re.split(r"(\d+)", s)]


def find_nodes(acc: Accounting, cfg: ModelConfig, query: str) -> list[Node]:
    """Nodes named by `query`: a key (`blocks.moe.router.gate`), a key suffix on a dot boundary
    (`q_a_layernorm`, `experts.gate_proj`), a title (`Query latent RMSNorm`), or a tensor name
    (`model.layers.5.self_attn.q_a_layernorm.weight`). Raises KimiAuditError (with suggestions) if none."""
    q = query.strip()
    nodes = acc.nodes()
    exact = [n for n in nodes if n.key == q]
    if exact:
        return exact
    low = q.lower()
    hits = [n for n in nodes if n.key.endswith("." + q) or n.name == q]
    if not hits:
        hits = [n for n in nodes if n.title.lower() == low]
    if not hits and "." in q:
        # A tensor name: the leaf that holds it, or (when it is absent) the leaf whose part it would be.
        hits = [n for n in nodes if n.is_leaf and any(t.name == q for t in n.tensors + n.scales)]
        if not hits:
            block, comp, _ = tensor_slot(cfg, q)
            # a weight's own tensor or its quantization metadata: the Linear module it stores
            module = comp.rpartition(".")[0] if comp.endswith(metadata_suffixes() + weight_suffixes()) else None
            prefix = "" if block is None else f"{block}." if is_mtp(block) else f"blocks.{block}."
            hits = [n for n in nodes if n.is_leaf and n.key.startswith(prefix)
                    and any(p.component == comp or (p.scheme and p.component.rpartition(".")[0] == module)
                            for p in n.parts) and (block is not None or "." not in n.key)]
    if not hits:
        names = sorted({n.name for n in nodes} | {n.key for n in nodes})
        close = difflib.get_close_matches(q, names, n=4, cutoff=0.6)
        hint = f"; did you mean {', '.join(close)}?" if close else "; `kimi-audit params SOURCE` lists every node"
        raise KimiAuditError(f"no component {query!r} in the accounting tree{hint}")
    # MoE blocks first (the seed cards' order), then dense, MTP, the rest.
    rank = {"blocks.moe": 0, "blocks.dense": 1, "mtp": 2}
    return sorted(hits, key=lambda n: min([v for k, v in rank.items() if n.key.startswith(k)] or [3]))


def _per_instance_calc(child: Node, div: int) -> str:
    if not child.mult:
        return child.formula
    per = " + ".join(p.calculation() for p in child.parts) if child.is_leaf else f"{child.per_instance:,}"
    times = child.instances // div
    return per + (f" × {times:,} {child.mult[0][1]}" if times > 1 else "")


def _n(count: int, noun: str) -> str:
    return f"{count:,} {noun}" + ("" if count == 1 else "s")


def config_value(raw: dict[str, Any], key: str) -> Any:
    """A config key's value as config.json holds it: at the top, else in the nested `text_config` (Kimi-K2.5's,
    K3's, Mistral Large 4's, GLM-5.3-Flash's text model); a dotted key (`vision_config.hidden_size`) walked."""
    for where in (raw, raw.get("text_config")):
        node: Any = where
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if node is not None:
            return node
    return None


def as_stored(parts: tuple[StoredPart, ...], found: tuple[FoundTensor, ...]) -> tuple[StoredPart, ...]:
    """One instance's tensors in the checkpoint's own spelling and dtypes where it spells them otherwise than the
    release (a GGUF's `attn_q_b.weight` in Q2_K, not `self_attn.q_b_proj.weight` in "any ggml type"): the found
    tensors of the first instance, matched to the parts in order where they are as many; else the parts as they
    are."""
    if not found or any(t.name.endswith(p.component) for t in found for p in parts):
        return parts
    prefix = block_prefix(found[0].name)
    instance = [t for t in found if t.name.startswith(prefix)] if prefix else list(found[:len(parts)])
    if len(instance) != len(parts):
        return parts
    return tuple(replace(p, component=t.name[len(prefix):], dtype=t.dtype) for p, t in zip(parts, instance))


def build_card(acc: Accounting, cfg: ModelConfig, config_raw: dict[str, Any], node: Node) -> Card:
    path = acc.path_to(node.key)
    crumbs = tuple(n.title for n in path[1:-1])
    doc = DOCS.get(node.role)
    stored: tuple[StoredPart, ...] = ()
    if node.is_leaf:
        rows = tuple((p.label, p.calculation(), p.numel) for p in node.parts)
        tensors = tensor_groups(node.tensors)
        scales = tensor_groups(node.scales)
        stored = as_stored(node.stored_parts, node.tensors)
    else:
        div = node.instances or 1
        rows = tuple((c.title, _per_instance_calc(c, div), c.derived // div) for c in node.children)
        tensors = scales = ()
    if doc is not None:
        ins, outs = doc.shapes(cfg)
    else:
        ins = outs = []
    config = tuple((k, config_value(config_raw, k)) for k in node.config_keys)
    is_norm = doc is not None and doc.math == RMSNORM_MATH
    description = doc.description if doc else (
        "Tensors in the checkpoint that the config does not account for." if node.key == UNACCOUNTED
        else f"{node.title}: its tensors and counts below (no card text is written for this component)."
        if node.is_leaf else f"{len(node.children)} components: " + ", ".join(c.title for c in node.children) + ".")
    return Card(
        key=node.key, name=node.name, title=node.title, breadcrumb=crumbs,
        computes=doc.computes if doc else None, description=description,
        math=doc.math if doc else (), eps=cfg.rms_norm_eps if is_norm else None,
        inputs=tuple(ins), outputs=tuple(outs), formula=node.formula, rows=rows,
        per_instance=node.per_instance if node.mult else node.derived,
        instances=node.instance_text(), instance_count=node.instances if node.mult else 1,
        derived=node.derived, found=node.found, derived_tensors=node.derived_tensors,
        found_tensors=node.found_tensors, mismatch=node.mismatch, tensors=tensors, scales=scales,
        config=config, code=doc.code if doc else None,
        note=" ".join(x for x in (doc.note if doc else "", node.note) if x),
        model=str(config_raw.get("model_type", cfg.model_type)),
        quantization=tuple(dict.fromkeys(s for _, n in node.walk() for s in n.schemes)), stored=stored,
        stored_by_dtype=tuple((r.dtype, r.derived, r.found) for r in node.stored),
    )
