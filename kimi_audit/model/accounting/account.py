"""The accounting of a checkpoint: its tree built from the config and the found tensors, with the activated
parameters, the MTP summary and the comparison with the published figures."""

from __future__ import annotations

import re
from collections.abc import Mapping

from kimi_audit.format.table import Located
from kimi_audit.model.accounting.model import MTP_ROLE, ModelBuilder
from kimi_audit.model.accounting.summary import PUBLISHED, Activation, Comparison, MtpSummary
from kimi_audit.model.accounting.tree import Accounting, Node
from kimi_audit.model.config import parse_config_bytes, pinned_config_bytes
from kimi_audit.model.config_fields import ModelConfig
from kimi_audit.model.layout import ExpectedTensor, expected_layout


def _mtp_nodes(root: Node) -> list[Node]:
    """The stored multi-token-prediction block kinds (one node each: `mtp`, DSpark's `mtp_dspark_first`, ...)."""
    return [c for c in root.children if c.role == MTP_ROLE and not c.absent]


def _mtp(root: Node) -> MtpSummary | None:
    nodes = _mtp_nodes(root)
    if not nodes:
        return None
    copies = sum(n.derived for m in nodes for _, n in m.walk() if n.role in ("embed_tokens", "shared_head_head"))
    layers = tuple(sorted(layer for m in nodes for layer in m.layers))
    return MtpSummary(layers, root.derived, sum(m.derived for m in nodes), copies)


def _activation(cfg: ModelConfig, root: Node) -> Activation:
    mtp = sum(c.derived for c in _mtp_nodes(root))
    embedding = next((c.derived for c in root.children if c.key == "embedding"), 0)
    # the routed experts of every MoE block kind (DeepseekV3's one `moe`, deepseek_v4's and kimi_linear's
    # several: `moe_csa`, `moe_hash_swa`, `moe_kda`, ...), whose experts have the same size
    experts = [n for _, n in root.walk() if re.fullmatch(r"blocks\.moe(_\w+)?\.experts", n.key)]
    routed = sum(n.derived for n in experts)
    k = cfg.num_experts_per_tok or 0
    n_experts = cfg.n_routed_experts or 0

    def blocks_and_expert(n: Node) -> tuple[int, int]:
        """(MoE blocks, parameters of one expert) of an experts group: repeated per expert, or stacked into
        one tensor per projection (mlx-lm's switch_mlp), whose one instance holds every expert."""
        if len(n.mult) > 1:
            return n.mult[1][0], n.per_instance
        return n.mult[0][0] if n.mult else 1, n.per_instance // max(n_experts, 1)

    shapes = [blocks_and_expert(n) for n in experts]
    per_expert = shapes[0][1] if shapes else 0
    moe_blocks = sum(b for b, _ in shapes)
    active = sum(e * min(k, n_experts) * b for b, e in shapes)
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
    incomplete = None if cfg.quant_unsupported is None else (
        f"quantization_config: {cfg.quant_unsupported} is not a scheme kimi-audit implements: the Linear modules "
        "stored that way are not counted, so the found total is incomplete")
    return Accounting(root, b.excluded(), root.by_dtype, act, comps, source, revision,
                      stored=b.stored_totals(root), mtp=_mtp(root), incomplete=incomplete)


def accounting_of_checkpoint(ckpt) -> Accounting:  # type: ignore[no-untyped-def]
    """From a kimi_audit.checkpoint.Checkpoint (already loaded: no I/O here)."""
    from kimi_audit.format.table import locate_tensors

    actual, _ = locate_tensors(ckpt.headers)
    return build_accounting(ckpt.config, actual, ckpt.expected, source=ckpt.label, revision=ckpt.revision)
