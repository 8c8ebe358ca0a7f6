"""The parameter accounting tree: every parameter of a DeepseekV3-family checkpoint, by component.

The tree mirrors the model as modeling_deepseek.py builds it (and as the design cards show it:
"61 transformer blocks › 60 MoE blocks › Latent attention › Query compression › Query latent RMSNorm"):

    model
    ├── embedding (model.embed_tokens)
    ├── transformer blocks
    │   ├── dense block(s): norms, latent attention, MLP
    │   └── MoE blocks: norms, latent attention, router, routed experts, shared experts
    ├── multi-token-prediction layers (only when num_nextn_predict_layers > 0)
    ├── final norm (model.norm)
    └── lm_head (absent when tie_word_embeddings)

Latent attention is split into query compression (q_a_proj, q_a_layernorm, q_b_proj), key-value
compression (kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj) and the output projection (o_proj).

Every node carries two counts:
  * `derived`: computed from config.json values alone, by the formulas of the model code (the node's
    `formula` spells them out, e.g. "1,536 × 60 MoE blocks = 92,160");
  * `found`: the elements of the checkpoint tensors that map to the node (from the shard headers).
A node is flagged (`mismatch`) when they differ, when the number of tensors differs, when a found
tensor has another dtype than the config implies, or when any descendant is flagged. Tensors the
config does not account for land in an extra "unaccounted" node, which is always a mismatch.

A Linear module counts out × in parameters, however it is stored: FP8 e4m3 weights element for element,
INT4 weights (compressed-tensors pack-quantized, Kimi-K2-Thinking) through their `weight_packed` I32 words,
eight parameters a word. Quantization metadata (FP8 block scales `weight_scale_inv`, INT4 group scales
`weight_scale` and `weight_shape`, zero points, group indices) and stored buffers (`rotary_emb.inv_freq`)
are not parameters: they are listed apart (`Accounting.excluded`) and counted in no node. Every node also
carries its stored elements by tensor dtype, metadata included (`Node.stored`; `Accounting.stored` over
the whole checkpoint, buffers too), beside its parameters by dtype (`Node.by_dtype`: INT4 for packed words).

Multi-token-prediction layers (DeepSeek-V3's `model.layers.61`) are their own node: their embedding and
output head copy the main model's, so `Accounting.mtp` gives the total with MTP, main-only and with those
copies counted once ("671B main + 14B MTP = 685B").

Activated parameters per token (`Activation`) are counted as follows:
  * every parameter outside the routed experts of the main stack counts in full: embedding, all
    attention and norm parameters, routers (gate weight and correction bias), dense MLPs, shared
    experts, the final norm and lm_head. The embedding is counted in full although a token reads
    one row of it, as the published figures do (`without_embedding` gives the other convention);
  * of the routed experts of each MoE block, `num_experts_per_tok` of `n_routed_experts` count;
  * multi-token-prediction layers are not counted (they do not take part in next-token inference).
The published figures (`PUBLISHED`) are reference constants for comparison only; nothing here is
derived from them.
"""

from __future__ import annotations

from collections.abc import Mapping

from kimi_audit.format.table import Located
from kimi_audit.model.accounting_model import ModelBuilder
from kimi_audit.model.accounting_summary import (
    PUBLISHED,
    Activation,
    Comparison,
    DtypeRow,
    ExcludedRow,
    MtpSummary,
    PublishedFigure,
)
from kimi_audit.model.accounting_tree import (
    UNACCOUNTED,
    Accounting,
    Factor,
    FoundTensor,
    Node,
    Part,
    StoredPart,
    collapse,
    tensor_slot,
)
from kimi_audit.model.config import ModelConfig, parse_config_bytes, pinned_config_bytes
from kimi_audit.model.layout import ExpectedTensor, expected_layout

__all__ = [
    "PUBLISHED", "UNACCOUNTED", "Accounting", "Activation", "Comparison", "DtypeRow", "ExcludedRow", "Factor",
    "FoundTensor", "MtpSummary", "Node", "Part", "PublishedFigure", "StoredPart", "accounting_dict",
    "accounting_of_checkpoint", "build_accounting", "collapse", "compare_published", "published_applies",
    "tensor_slot",
]


def _mtp(root: Node) -> MtpSummary | None:
    mtp = next((c for c in root.children if c.key == "mtp"), None)
    if mtp is None:
        return None
    copies = sum(n.derived for _, n in mtp.walk() if n.role in ("embed_tokens", "shared_head_head"))
    return MtpSummary(mtp.layers, root.derived, mtp.derived, copies)


def _activation(cfg: ModelConfig, root: Node) -> Activation:
    mtp = next((c.derived for c in root.children if c.key == "mtp"), 0)
    embedding = next((c.derived for c in root.children if c.key == "embedding"), 0)
    experts = [n for _, n in root.walk() if n.key == "blocks.moe.experts"]
    routed = experts[0].derived if experts else 0
    k = cfg.num_experts_per_tok or 0
    if experts:
        per_expert = experts[0].per_instance
        moe_blocks = experts[0].mult[1][0]
        active = per_expert * min(k, cfg.n_routed_experts or 0) * moe_blocks
    else:
        per_expert = moe_blocks = active = 0
    always = root.derived - mtp - routed
    return Activation(always + active, always, routed, active, k, cfg.n_routed_experts or 0, moe_blocks,
                      per_expert, mtp, embedding)


def _round_sig(x: float, sig: int) -> float:
    if x == 0:
        return 0.0
    from math import floor, log10

    return round(x, -floor(log10(abs(x))) + sig - 1)


def published_applies(cfg: ModelConfig) -> bool:
    """The published figures describe Kimi-K2's architecture: compare only when the config has it."""
    _, pinned = parse_config_bytes(pinned_config_bytes())
    return cfg == pinned


def compare_published(total: int, activated: int) -> tuple[Comparison, ...]:
    return tuple(
        Comparison(p.source, p.total, p.activated, total / p.total, activated / p.activated,
                   _round_sig(total, p.significant) == p.total, _round_sig(activated, p.significant) == p.activated)
        for p in PUBLISHED
    )


def build_accounting(cfg: ModelConfig, actual: Located, expected: Mapping[str, ExpectedTensor] | None = None,
                     *, source: str = "", revision: str | None = None) -> Accounting:
    """The tree for `cfg`, with found counts from `actual` (tensor name -> (header entry, shard))."""
    b = ModelBuilder(cfg, actual, expected if expected is not None else expected_layout(cfg))
    root = b.model()
    act = _activation(cfg, root)
    comps = compare_published(root.derived, act.per_token) if published_applies(cfg) else ()
    return Accounting(root, b.excluded(), root.by_dtype, act, comps, source, revision,
                      stored=b.stored_totals(root), mtp=_mtp(root))


def accounting_of_checkpoint(ckpt) -> Accounting:  # type: ignore[no-untyped-def]
    """From a kimi_audit.checkpoint.Checkpoint (already loaded: no I/O here)."""
    from kimi_audit.format.table import locate_tensors

    actual, _ = locate_tensors(ckpt.headers)
    return build_accounting(ckpt.config, actual, ckpt.expected, source=ckpt.label, revision=ckpt.revision)


def _rows(rows: tuple[DtypeRow, ...]) -> list[dict[str, object]]:
    return [{"dtype": r.dtype, "derived": r.derived, "found": r.found} for r in rows]


def accounting_dict(acc: Accounting, depth: int | None = None) -> dict[str, object]:
    """JSON-ready form (schema kimi-audit/params/1). Leaves list their tensors collapsed, not one by one."""

    def node(n: Node, d: int) -> dict[str, object]:
        out: dict[str, object] = {
            "key": n.key, "name": n.name, "title": n.title, "formula": n.formula,
            "derived": n.derived, "found": n.found, "derived_tensors": n.derived_tensors,
            "found_tensors": n.found_tensors, "per_instance": n.per_instance,
            "instances": [{"count": v, "of": label} for v, label in n.mult],
            "mismatch": n.mismatch, "config_keys": list(n.config_keys),
            "by_dtype": _rows(n.by_dtype), "stored_by_dtype": _rows(n.stored),
        }
        if n.note:
            out["note"] = n.note
        if n.is_leaf:
            out["parts"] = [{"label": p.label, "tensor": p.component, "calculation": p.calculation(),
                             "parameters": p.numel, "dtype": p.logical_dtype, "stored_dtype": p.dtype,
                             "stored_shape": list(p.stored_shape)} for p in n.parts]
            out["tensors"] = collapse(t.name for t in n.tensors)
            out["dtype_ok"] = n.dtype_ok
            if n.schemes:
                out["quantization"] = list(n.schemes)
                out["stored_tensors"] = [{"tensor": s.component, "dtype": s.dtype, "shape": list(s.shape),
                                          "kind": s.kind, "counts_for": s.logical} for s in n.stored_parts]
                out["metadata"] = collapse(sorted(t.name for t in n.scales))
        elif depth is None or d < depth:
            out["children"] = [node(c, d + 1) for c in n.children]
        return out

    a = acc.activation
    return {
        "schema": "kimi-audit/params/1",
        "source": acc.source,
        "revision": acc.revision,
        "total": {"derived": acc.derived, "found": acc.found, "mismatch": acc.mismatch},
        "tree": node(acc.root, 0),
        "by_dtype": _rows(acc.dtypes),
        "stored_by_dtype": _rows(acc.stored),
        "mtp": None if acc.mtp is None else {
            "layers": list(acc.mtp.layers), "parameters": acc.mtp.parameters, "total_with_mtp": acc.mtp.total,
            "main_only": acc.mtp.main, "duplicates": acc.mtp.duplicates, "counted_once": acc.mtp.counted_once,
            "definition": "the MTP layers' embed_tokens and shared_head.head copy model.embed_tokens and "
                          "lm_head; counted_once is the total without those copies",
        },
        "excluded": [{"kind": r.kind, "tensors": r.pattern, "dtype": r.dtype, "derived_tensors": r.derived_tensors,
                      "found_tensors": r.found_tensors, "derived_elements": r.derived_elements,
                      "found_elements": r.found_elements} for r in acc.excluded],
        "activated": {
            "per_token": a.per_token, "always_active": a.always_active, "routed_total": a.routed_total,
            "routed_active": a.routed_active, "experts_per_token": a.top_k, "routed_experts": a.experts,
            "moe_blocks": a.moe_blocks, "per_expert": a.per_expert, "mtp_excluded": a.mtp_excluded,
            "without_embedding": a.without_embedding,
            "definition": "all parameters outside the routed experts (embedding and lm_head in full), plus "
                          "num_experts_per_tok of n_routed_experts experts per MoE block; MTP layers excluded",
        },
        "published": [{"source": c.source, "total": c.published_total, "activated": c.published_activated,
                       "total_ratio": c.total_ratio, "activated_ratio": c.activated_ratio,
                       "total_consistent": c.total_consistent, "activated_consistent": c.activated_consistent}
                      for c in acc.comparisons],
    }
