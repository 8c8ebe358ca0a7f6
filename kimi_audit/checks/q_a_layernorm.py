"""Every layer's query-latent RMSNorm gain (`self_attn.q_a_layernorm.weight`, BF16 [q_lora_rank])."""

from __future__ import annotations

from dataclasses import dataclass

from kimi_audit.format.table import TensorLookup
from kimi_audit.model.arch.spec import DENSE, MOE, MTP
from kimi_audit.model.config_fields import ModelConfig
from kimi_audit.model.layout import ExpectedLayout, layer_block

COMPONENT = "self_attn.q_a_layernorm.weight"


@dataclass(frozen=True)
class GainRow:
    layer: int
    block: str
    tensor: str
    shard: str | None
    dtype: str | None
    shape: tuple[int, ...] | None
    ok: bool

    @property
    def params(self) -> int:
        n = 1
        for d in self.shape or (0,):
            n *= d
        return n


@dataclass(frozen=True)
class BlockTotal:
    block: str
    blocks: int
    """Blocks of this kind whose gain was found with the expected dtype and shape."""
    of: int
    """Blocks of this kind the config defines."""
    params: int
    """Elements of the gains found in these blocks."""

    def line(self, width: int) -> str:
        label = {MOE: "MoE", DENSE: "dense", MTP: "MTP"}[self.block]
        noun = "block" if self.of == 1 else "blocks"
        missing = "" if self.blocks == self.of else f" (of {self.of} defined)"
        sign = "=" if self.blocks * width == self.params else "≠"
        return f"{self.blocks} {label} {noun}{missing} × {width:,} {sign} {self.params:,}"


@dataclass(frozen=True)
class QALayerNormReport:
    width: int | None
    """q_lora_rank from config.json; None when the model has no query compression."""
    rows: tuple[GainRow, ...]
    totals: tuple[BlockTotal, ...]

    @property
    def total_params(self) -> int:
        return sum(t.params for t in self.totals)

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.rows)


def q_a_layernorm_report(cfg: ModelConfig, actual: TensorLookup,
                         expected: ExpectedLayout | None = None) -> QALayerNormReport:
    """Every layer's gain; named as `expected` (the layout in the checkpoint's dialect) names it."""
    if cfg.q_lora_rank is None or cfg.layer_kinds:  # the DeepseekV3 family's gain (not deepseek_v4, kimi_linear)
        return QALayerNormReport(None, (), ())
    want = (cfg.q_lora_rank,)
    rows = []
    named: dict[int | None, str] | None = None
    for layer in range(cfg.total_layers):
        name = cfg.layer_name(layer) + COMPONENT
        if expected is not None and name not in expected:  # the layout in a dialect: its names, found once
            if named is None:
                specs = expected.specs  # the component is the tree's name in every dialect (GGUF's attn_q_a_norm)
                at = (p for p, i in enumerate(expected.spec_of) if specs[i].component == COMPONENT)
                named = {expected.layer_of[p]: expected.names[p] for p in at}
                if not named:  # a tree in its own names (Mistral's `attention.q_a_norm`): no claim either way
                    return QALayerNormReport(None, (), ())
            name = named.get(layer, name)
        found = actual.get(name)
        block = layer_block(cfg, layer)
        if found is None:
            rows.append(GainRow(layer, block, name, None, None, None, False))
        else:
            t, shard = found
            rows.append(GainRow(layer, block, name, shard, t.dtype, t.shape, t.dtype == cfg.dtype and t.shape == want))
    totals = []
    for block in (MOE, DENSE, MTP):
        mine = [r for r in rows if r.block == block]
        if mine:
            good = [r for r in mine if r.ok]
            totals.append(BlockTotal(block, len(good), len(mine), sum(r.params for r in mine if r.shape)))
    return QALayerNormReport(cfg.q_lora_rank, tuple(rows), tuple(totals))
