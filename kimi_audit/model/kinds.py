"""The words for what a tensor is: its kind (what it counts for: PARAMETER, PACKED, SCALE or BUFFER) and its
role (a block scale, a group scale, packed words, a norm gain, a router bias, a buffer ...).

Which suffix has which role is not written here: each format class (model.quant) and each architecture
(model.arch) declares its own, and model.roles derives the one suffix classifier from them.
"""

from __future__ import annotations

import re

PARAMETER = "parameter"
SCALE = "scale"
"""Quantization metadata: block and group scales, weight_shape, zero points, group indices."""
BUFFER = "buffer"
PACKED = "packed"
"""Quantized weight words (weight_packed): stands for its module's out x in logical parameters."""

# roles: what a tensor is, by its name's suffix
BLOCK_SCALE = "block_scale"
"""`.weight_scale_inv`: an FP8 block scale (DeepSeek)."""
GROUP_SCALE = "group_scale"
"""`.weight_scale`: a compressed-tensors scale (INT4 / FP4 groups, FP8 blocks or channels)."""
GLOBAL_SCALE = "global_scale"
"""`.weight_global_scale`: NVFP4's one F32 scale of the whole weight."""
V4_SCALE = "v4_scale"
"""`.scale`: DeepSeek-V4's FP8 block scale or FP4 expert scale (a scale only where F8_E8M0: see SCALE_ROLES)."""
WEIGHT_SHAPE = "weight_shape"
ZERO_POINT = "zero_point"
GROUP_INDEX = "group_index"
INPUT_SCALE = "input_scale"
KV_SCALE = "kv_scale"
"""An attention layer's KV-cache scale (`self_attn.k_scale`, ModelOpt's `self_attn.k_proj.k_scale`): metadata of
no Linear module."""
AFFINE_SCALE = "affine_scale"
"""`.scales`: MLX's affine group scale (either sign, never zero: mx.quantize writes -1e-7 for a constant group)."""
BNB_ABSMAX = "bnb_absmax"
"""bitsandbytes' per-block absmax (4-bit), nested absmax (double quantization) and per-row SCB (int8)."""
BNB_QUANT_MAP = "bnb_quant_map"
"""bitsandbytes' code book: 16 values (NF4, FP4), 256 (the nested absmax's)."""
QUANT_STATE = "quant_state"
"""bitsandbytes' serialized QuantState: the JSON of its quant_type, blocksize, dtype and shape, as U8."""
WEIGHT_FORMAT = "weight_format"
"""bitsandbytes int8's layout code, U8 []."""
AFFINE_BIAS = "affine_bias"
"""`.biases`: MLX's affine group offset (any finite value)."""
PACKED_WEIGHT = "packed_weight"
ROTARY_BUFFER = "rotary_buffer"
ROUTER_BIAS = "router_bias"
EXPERT_IDS = "expert_ids"
"""A hash-routing table: each token's experts by id (DeepSeek-V4's `ffn.gate.tid2eid`, GGUF `ffn_gate_tid2eid`)."""
GAIN = "gain"
"""A norm's learned gain (`...norm.weight`)."""
WEIGHT = "weight"
OTHER = "other"

KIND_OF_ROLE = {BLOCK_SCALE: SCALE, GROUP_SCALE: SCALE, GLOBAL_SCALE: SCALE, V4_SCALE: SCALE, WEIGHT_SHAPE: SCALE,
                ZERO_POINT: SCALE, GROUP_INDEX: SCALE, INPUT_SCALE: SCALE, KV_SCALE: SCALE,
                AFFINE_SCALE: SCALE, AFFINE_BIAS: SCALE, BNB_ABSMAX: SCALE, BNB_QUANT_MAP: SCALE, QUANT_STATE: SCALE,
                WEIGHT_FORMAT: SCALE, PACKED_WEIGHT: PACKED, ROTARY_BUFFER: BUFFER}
SCALE_ROLES = frozenset((BLOCK_SCALE, GROUP_SCALE, GLOBAL_SCALE))
"""Roles whose tensors are scales whatever their dtype. A `.scale` (V4_SCALE) is one only as F8_E8M0: transformers'
dialects name other tensors so too (DeepSeek-V4's `attn_hc.scale`, norm gains elsewhere)."""
GAIN_SUFFIX = "norm.weight"
"""An RMSNorm's or LayerNorm's gain, in every architecture."""
WEIGHT_SUFFIX = ".weight"


BLOCK_NAME = re.compile(r"(?:^|\.)(?:layers|blk)\.(\d+)\.")
"""A decoder block's part of a tensor name, its index the group: `model.layers.3.`, `layers.3.` (Mistral's,
DeepSeek-V4's), `blk.3.` (GGUF)."""


def block_prefix(name: str) -> str:
    """A tensor name up to and including its block (`blk.3.` of `blk.3.attn_q_b.weight`); "" outside the blocks."""
    m = BLOCK_NAME.search(name)
    return name[: m.end()] if m else ""


def module_name(name: str) -> str:
    """The module a tensor stores (its name without the last dotted part)."""
    return name.rpartition(".")[0]
