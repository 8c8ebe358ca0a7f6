"""What a tensor is, from its name: the one suffix classifier every stage uses.

`role_of(name)` says what a tensor is by the suffix its name ends with (a block scale, a group scale, packed
words, a norm gain, a router bias, a buffer ...); `kind_of(name)` says what it counts for (PARAMETER, PACKED,
SCALE or BUFFER) when the layout does not know the name. The layout, the statistics, the accounting, the
values pass, verify's value scan, the `tensor` command and the replica all read these two functions.
"""

from __future__ import annotations

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
PACKED_WEIGHT = "packed_weight"
ROTARY_BUFFER = "rotary_buffer"
ROUTER_BIAS = "router_bias"
GAIN = "gain"
"""A norm's learned gain (`...norm.weight`)."""
WEIGHT = "weight"
OTHER = "other"

SUFFIX_ROLES: tuple[tuple[str, str], ...] = (
    (".weight_scale_inv", BLOCK_SCALE),
    (".weight_scale", GROUP_SCALE),
    (".weight_global_scale", GLOBAL_SCALE),
    (".input_global_scale", INPUT_SCALE),
    (".scale", V4_SCALE),
    (".weight_shape", WEIGHT_SHAPE),
    (".weight_zero_point", ZERO_POINT),
    (".weight_g_idx", GROUP_INDEX),
    (".input_scale", INPUT_SCALE),
    (".weight_packed", PACKED_WEIGHT),
    (".inv_freq", ROTARY_BUFFER),
    (".e_score_correction_bias", ROUTER_BIAS),
    ("norm.weight", GAIN),
    (".weight", WEIGHT),
)
"""Suffix -> role, the first that matches wins."""

KIND_OF_ROLE = {BLOCK_SCALE: SCALE, GROUP_SCALE: SCALE, GLOBAL_SCALE: SCALE, V4_SCALE: SCALE, WEIGHT_SHAPE: SCALE,
                ZERO_POINT: SCALE, GROUP_INDEX: SCALE, INPUT_SCALE: SCALE, PACKED_WEIGHT: PACKED, ROTARY_BUFFER: BUFFER}
METADATA_SUFFIXES = tuple(s for s, r in SUFFIX_ROLES if KIND_OF_ROLE.get(r) == SCALE)
"""Every quantization-metadata suffix."""
SCALE_ROLES = frozenset((BLOCK_SCALE, GROUP_SCALE, GLOBAL_SCALE))
"""Roles whose tensors are scales whatever their dtype. A `.scale` (V4_SCALE) is one only as F8_E8M0: transformers'
dialects name other tensors so too (DeepSeek-V4's `attn_hc.scale`, norm gains elsewhere)."""


def role_of(name: str) -> str:
    """What the tensor is, from its name's suffix (OTHER when no suffix says)."""
    for suffix, role in SUFFIX_ROLES:
        if name.endswith(suffix):
            return role
    return OTHER


def kind_of(name: str) -> str:
    """What a tensor the layout does not know counts for, from its name alone."""
    return KIND_OF_ROLE.get(role_of(name), PARAMETER)


def module_name(name: str) -> str:
    """The module a tensor stores (its name without the last dotted part)."""
    return name.rpartition(".")[0]
