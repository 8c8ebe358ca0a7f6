"""MTP stages the files hold beyond what config.json declares, where the architecture lets the files decide
(DeepSeek-V4-Flash-0731: `num_nextn_predict_layers: 1`, three DSpark stages `mtp.0..2` stored, and read so by
its loaders). The config is re-read with the stored count and the difference said once (MTP_STAGES_FROM_FILES)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from kimi_audit.findings import Finding, info
from kimi_audit.model.arch.registry import stages_from_files
from kimi_audit.model.config import model_config_from_dict
from kimi_audit.model.config_fields import ModelConfig

MAX_STAGES = 16
"""Stage indices above this are not taken from the files (a name such as `mtp.99999.x` stays unexpected)."""


def stored_stages(cfg: ModelConfig, stored: Iterable[Sequence[str]]) -> int:
    """1 + the highest stage index `mtp.K.` among the stored names (0: none), up to MAX_STAGES."""
    at = cfg.prefix + cfg.mtp_at
    top = -1
    for names in stored:
        for name in names:
            if name.startswith(at):
                k = name[len(at):].partition(".")[0]
                if k.isascii() and k.isdigit() and len(k) <= 2 and top < int(k) < MAX_STAGES:
                    top = int(k)
    return top + 1


def with_stored_stages(raw: dict[str, Any], cfg: ModelConfig,
                       stored: Iterable[Sequence[str]]) -> tuple[ModelConfig, list[Finding]]:
    """The config with as many MTP stages as the files hold, where its architecture lets them decide and they
    hold more than it declares; else the config unchanged."""
    if not cfg.mtp_at or not stages_from_files(cfg):
        return cfg, []
    declared = cfg.num_nextn_predict_layers
    n = stored_stages(cfg, stored)
    if n <= declared:
        return cfg, []
    at = cfg.prefix + cfg.mtp_at
    return model_config_from_dict({**raw, "num_nextn_predict_layers": n}), [info(
        "MTP_STAGES_FROM_FILES", f"config.json declares num_nextn_predict_layers = {declared}, but the shards hold "
        f"{n} multi-token-prediction stages ({at}0 to {at}{n - 1}), as this release's loaders read them: audited "
        f"as {n}", tensor=f"{at}{n - 1}", expected=declared, actual=n)]
