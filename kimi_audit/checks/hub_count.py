"""The Hub's parameter count as a reference (`model_info(...).safetensors.total`): computed by the Hub from the
same shard headers (huggingface.js `parseSafetensorsMetadata`), by its own rule: every stored element counts
(packed sub-byte words as stored), except, where config.json has a quantization_config, the quantization
metadata (block and group scales, zero points, weight shapes) and every F8_E8M0 tensor; an index's
self-reported `total_parameters` is taken when it is not above that count. The audit computes that number
from the files and compares: a difference the rule does not explain is HUB_PARAMETERS."""

from __future__ import annotations

import math

from kimi_audit.findings import Finding, warning
from kimi_audit.format.table import TensorTable
from kimi_audit.model.checkpoint import Checkpoint
from kimi_audit.model.kinds import BLOCK_SCALE, GROUP_SCALE, WEIGHT_SHAPE, ZERO_POINT
from kimi_audit.model.roles import role_of

HUB_LEAVES_OUT = frozenset((BLOCK_SCALE, GROUP_SCALE, ZERO_POINT, WEIGHT_SHAPE))
"""The roles of the quantization tensors the Hub leaves out of its count (with a quantization_config)."""


def hub_rule_count(ckpt: Checkpoint, actual: TensorTable) -> int:
    """What the Hub's rule gives for these shards."""
    quantized = ckpt.config_raw.get("quantization_config") is not None
    total = 0
    for name, dtype, shape in zip(actual.names, actual.dtypes, actual.shapes):
        if quantized and (dtype == "F8_E8M0" or role_of(name) in HUB_LEAVES_OUT):
            continue
        total += math.prod(shape)
    reported = ckpt.index.total_parameters if ckpt.index is not None else None
    return reported if reported is not None and reported <= total else total


def hub_parameters_findings(ckpt: Checkpoint, actual: TensorTable, logical: int) -> list[Finding]:
    """The Hub's total against the files (`logical`: the audit's own count, packed words standing for the
    parameters they pack): a warning where they disagree, nothing where the Hub's rule explains its number."""
    given = ckpt.reported_parameters
    if given is None:
        return []
    expected = hub_rule_count(ckpt, actual)
    why = "" if expected == logical else (f"; the audit's logical count is {logical:,} (packed words counted for "
                                          "the parameters they pack, stored buffers left out: the Hub counts what "
                                          "is stored)")
    if given == expected:
        return []
    return [warning("HUB_PARAMETERS", f"the Hub reports {given:,} parameters; the shard headers give {expected:,} "
                    f"by the Hub's own rule (stored elements less quantization metadata and E8M0 tensors){why}: "
                    "the Hub counted other files, or these are not the files it counted", expected=expected,
                    actual=given)]
