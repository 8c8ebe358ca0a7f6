"""What one small tensor's values must be, by its class: the rule every value check applies (the `audit --values`
pass, checks.values, and the `tensor` command, checks.tensor).

`value_kind` says which class a tensor is by its name's role (model.roles) and dtype; `check_values` checks
one decoded tensor of that class: NaN and Inf everywhere (a GGUF tensor's block scales: in each block's `d`, as
llama.cpp checks them); scales finite and > 0 (weight, input and KV-cache scales; MLX's affine scales
non-zero, bitsandbytes' absmax >= 0); FP8 block scales exact powers of two under `scale_fmt: ue8m0`; a gain
not all zeros; a `weight_shape` the [out, in] the config implies; a bitsandbytes quant_state the JSON its
module needs.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from kimi_audit.findings import Finding, error, warning
from kimi_audit.model import kinds
from kimi_audit.model.roles import role_of

if TYPE_CHECKING:
    import numpy as np

GAIN = "gain"
ROUTER_BIAS = "router_bias"
SCALE = "scale"
GROUP_SCALE = "group_scale"
GLOBAL_SCALE = "global_scale"
WEIGHT_SHAPE = "weight_shape"
AFFINE_SCALE = "affine_scale"
"""MLX's affine group scales and GPTQ's: finite and non-zero (either sign is legitimate in MLX)."""
AFFINE_BIAS = "affine_bias"
"""MLX's affine group offsets: finite."""
BNB_ABSMAX = "bnb_absmax"
"""bitsandbytes' absmax and SCB: finite and >= 0 (an all-zero block has absmax 0)."""
BNB_QUANT_MAP = "bnb_quant_map"
"""bitsandbytes' code books: finite."""
QUANT_STATE = "quant_state"
"""bitsandbytes' serialized QuantState: JSON of its quant_type, blocksize, dtype and shape."""
ACTIVATION_SCALE = "activation_scale"
"""Input (activation) and KV-cache scales (ModelOpt's and compressed-tensors' `input_scale`, `input_global_scale`,
`k_scale`, `v_scale`): finite and > 0 (each divides or multiplies an activation)."""
GGML_SCALES = "ggml_scales"
"""A GGUF tensor of a quantized ggml type, read by its blocks' scale fields (numerics.scan.ggml_scales; the values
pass's class, not value_kind's: the `tensor` command reads such a tensor dequantized): NaN and ±Inf refused, as
llama.cpp's `--check-tensors` refuses them (a zero or negative `d` it takes)."""
EXPERT_ID = "expert_id"
"""A hash-routing table's expert ids: each in [0, the routed experts) (llama.cpp indexes the experts with them)."""
VALUES = "values"
"""Any other tensor (check_values: NaN and Inf only)."""


UE8M0_WARN_ONLY = "self_attn.o_proj"
"""Module whose scales are not powers of two in the published DeepSeek-V3.1 release (deepseek-ai/DeepSeek-V3
issue 961): SCALE_NOT_UE8M0 is a warning there, an error elsewhere."""


VALUES_CHUNK = 1 << 22
"""Values converted to float32 at a time by check_values."""


VALUE_KINDS = {kinds.BLOCK_SCALE: SCALE, kinds.V4_SCALE: SCALE, kinds.GROUP_SCALE: GROUP_SCALE,
               kinds.GLOBAL_SCALE: GLOBAL_SCALE, kinds.WEIGHT_SHAPE: WEIGHT_SHAPE, kinds.ROUTER_BIAS: ROUTER_BIAS,
               kinds.GAIN: GAIN, kinds.AFFINE_SCALE: AFFINE_SCALE, kinds.AFFINE_BIAS: AFFINE_BIAS,
               kinds.BNB_ABSMAX: BNB_ABSMAX, kinds.BNB_QUANT_MAP: BNB_QUANT_MAP, kinds.QUANT_STATE: QUANT_STATE,
               kinds.INPUT_SCALE: ACTIVATION_SCALE, kinds.KV_SCALE: ACTIVATION_SCALE, kinds.EXPERT_IDS: EXPERT_ID}
"""The roles (model.kinds) of the small tensors this pass reads, and the class it checks each as."""


def value_kind(name: str, dtype: str) -> str | None:
    """Which small tensor class a name (of that dtype) belongs to, or None for everything else. A `.scale` is
    DeepSeek-V4's scale only as F8_E8M0 (transformers' dialects name other tensors so: `attn_hc.scale`)."""
    role = role_of(name)
    if role == kinds.V4_SCALE and dtype != "F8_E8M0":
        return None
    if role == kinds.AFFINE_SCALE and dtype == "U8":  # MLX's FP modes: E8M0 or F8_E4M3 bits, by the mode alone
        return None
    if role == kinds.BNB_ABSMAX and dtype == "U8":  # double-quantized codes: every byte is one of 256 entries
        return None
    return VALUE_KINDS.get(role)


SCALE_KINDS = (SCALE, GROUP_SCALE, GLOBAL_SCALE, ACTIVATION_SCALE)


def scale_values(values: np.ndarray, dtype: str) -> np.ndarray:
    """A scale tensor's values: U8 scales are E8M0 exponents (compressed-tensors' MX formats store them so; 0xFF
    is NaN), every other dtype decodes as it is."""
    if dtype != "U8":
        return values
    from kimi_audit.numerics.fp4 import e8m0_to_float32

    return e8m0_to_float32(values)


def check_values(name: str, kind: str, values: np.ndarray, *, ue8m0: bool = False,
                 expected_shape: tuple[int, ...] | None = None, shard: str | None = None,
                 experts: int | None = None) -> list[Finding]:
    """What is wrong with one tensor's values, as findings (`actual`: how many values or tensors).

    `kind` is a small-tensor class (GAIN, ROUTER_BIAS, SCALE, GROUP_SCALE, GLOBAL_SCALE, ACTIVATION_SCALE,
    WEIGHT_SHAPE, GGML_SCALES: `values` a GGUF tensor's block scales) or VALUES (any other tensor: NaN and Inf
    only; integer tensors hold neither). Scales must be finite and > 0 (U8
    scales are read as E8M0 exponents, F8_E4M3 and F8_E8M0 ones decoded: their NaN codes are NaN). `ue8m0`: FP8
    block scales must be powers of two (a warning in UE8M0_WARN_ONLY's scales); `expected_shape`: what a
    `weight_shape` must hold. The one value check of the `audit --values` pass and the `tensor` command."""
    import numpy as np

    from kimi_audit.numerics.dtypes import to_float32

    if kind == WEIGHT_SHAPE:
        held = [int(v) for v in values.reshape(-1)] if values.dtype.kind in "iu" else None
        if expected_shape is not None and held != list(expected_shape):
            return [error("WEIGHT_SHAPE_MISMATCH", f"{name} holds {held if held is not None else values.dtype}, the "
                          f"config implies {list(expected_shape)}", tensor=name, shard=shard, actual=1,
                          expected=list(expected_shape))]
        return []
    if kind == QUANT_STATE:
        return _quant_state_findings(name, values, expected_shape, shard)
    if kind == EXPERT_ID:
        return _expert_id_findings(name, values, experts, shard)
    if kind in SCALE_KINDS and values.dtype == np.uint8:
        values = scale_values(values, "U8")
    flat = values.reshape(-1)
    if flat.dtype.kind in "iub":
        return []
    n = flat.size
    nan = inf = bad = zero = off = negative = 0
    first_off: float | None = None
    for i in range(0, n, VALUES_CHUNK):  # float32 a chunk at a time: a whole weight may be gigabytes
        f = to_float32(flat[i : i + VALUES_CHUNK])
        nan += int(np.count_nonzero(np.isnan(f)))
        inf += int(np.count_nonzero(np.isinf(f)))
        if kind in SCALE_KINDS:
            bad += int(np.count_nonzero(f <= 0))  # NaN compares False: counted above
            if ue8m0 and kind == SCALE:
                mant, exp = np.frexp(f)  # f == 0.5 * 2**exp exactly for a power of two; E8M0: 2**-127 .. 2**127
                hits = np.flatnonzero((f > 0) & np.isfinite(f) & ((mant != 0.5) | (exp < -126)))
                if hits.size and first_off is None:
                    first_off = float(f[hits[0]])
                off += int(hits.size)
        elif kind in (GAIN, AFFINE_SCALE):
            zero += int(np.count_nonzero(f == 0))
        elif kind == BNB_ABSMAX:
            negative += int(np.count_nonzero(f < 0))
    out: list[Finding] = []
    where = {"tensor": name, "shard": shard}
    noun = "block scales" if kind == GGML_SCALES else "values"
    if nan:
        out.append(error("VALUE_NAN", f"{name}: {nan:,} of {n:,} {noun} are NaN", actual=nan,
                         expected=_expected("VALUE_NAN"), **where))
    if inf:
        out.append(error("VALUE_INF", f"{name}: {inf:,} of {n:,} {noun} are ±Inf", actual=inf,
                         expected=_expected("VALUE_INF"), **where))
    what = {SCALE: "block", GLOBAL_SCALE: "global", ACTIVATION_SCALE: "input / KV-cache"}.get(kind, "group")
    if bad:
        out.append(error("SCALE_NOT_POSITIVE", f"{name}: {bad:,} of {n:,} {what} scales are ≤ 0 "
                         "(dequantized weights would be zero or sign-flipped)", actual=bad,
                         expected=_expected("SCALE_NOT_POSITIVE"), **where))
    if off:
        severity = warning if UE8M0_WARN_ONLY in name else error
        out.append(severity("SCALE_NOT_UE8M0", f"{name}: {off:,} of {n:,} block scales are not powers of two "
                            f"(scale_fmt ue8m0); the first is {first_off:.9g}", actual=off,
                            expected=_expected("SCALE_NOT_UE8M0"), **where))
    if negative:
        out.append(error("SCALE_NEGATIVE", f"{name}: {negative:,} of {n:,} bitsandbytes absmax scales are negative "
                         "(an absolute maximum never is)", actual=negative, expected=_expected("SCALE_NEGATIVE"),
                         **where))
    if kind == AFFINE_SCALE and zero:
        out.append(error("SCALE_ZERO", f"{name}: {zero:,} of {n:,} group scales are 0 (every weight of the group "
                         "collapses to one value; neither mx.quantize nor GPTQ writes 0)", actual=zero,
                         expected=_expected("SCALE_ZERO"), **where))
    if kind == GAIN and n and zero == n:
        out.append(error("GAIN_ALL_ZERO", f"{name}: all {n:,} RMSNorm gains are zero "
                         "(the normalized output is identically zero)", actual=n,
                         expected=_expected("GAIN_ALL_ZERO"), **where))
    return out


def _expert_id_findings(name: str, values: np.ndarray, experts: int | None, shard: str | None) -> list[Finding]:
    """A hash-routing table's ids outside [0, experts): an expert llama.cpp would read past its stacked experts
    (deepseek4.cpp builds the routing from the table, ggml_get_rows by these ids)."""
    import numpy as np

    flat = values.reshape(-1)
    if flat.dtype.kind not in "iu" or not experts:
        return []
    out = np.count_nonzero((flat < 0) | (flat >= experts))
    if not out:
        return []
    first = int(flat[np.flatnonzero((flat < 0) | (flat >= experts))[0]])
    return [error("EXPERT_ID_RANGE", f"{name}: {out:,} of {flat.size:,} expert ids lie outside 0..{experts - 1} "
                  f"(the first: {first}): a token routed there reads no expert of this model", tensor=name,
                  shard=shard, expected=f"0..{experts - 1}", actual=int(out))]


def _quant_state_findings(name: str, values: np.ndarray, logical: tuple[int, ...] | None,
                          shard: str | None) -> list[Finding]:
    """A serialized bitsandbytes QuantState: JSON naming the quant_type its suffix names, a positive blocksize
    and the module's shape (`logical`: its [out, in] from the layout, or (out x in,) where only that is known)."""
    from kimi_audit.numerics.bnb import read_quant_state
    from kimi_audit.numerics.dtypes import NumericsError

    try:
        doc = read_quant_state(values)
    except NumericsError as e:
        return [error("QUANT_STATE_INVALID", f"{name}: {e}", tensor=name, shard=shard)]
    shape, block = doc.get("shape"), doc.get("blocksize")
    problems = []
    if not name.endswith("__" + str(doc.get("quant_type"))):
        problems.append(f"quant_type {doc.get('quant_type')!r} is not the one its name gives")
    if type(block) is not int or block <= 0:
        problems.append(f"blocksize {block!r} is not a positive integer")
    if not (isinstance(shape, list) and shape and all(type(d) is int and d > 0 for d in shape)):
        problems.append(f"shape {shape!r} is not a list of positive integers")
    elif logical and len(logical) == 2 and shape != list(logical):
        problems.append(f"shape {shape} is not the module's {list(logical)}")
    elif logical and math.prod(shape) != math.prod(logical):
        problems.append(f"shape {shape} holds {math.prod(shape):,} values, the module {math.prod(logical):,}")
    return [error("QUANT_STATE_INVALID", f"{name}: {p}", tensor=name, shard=shard, actual=str(shape))
            for p in problems[:1]]


def _expected(code: str) -> str | None:
    return {
        "VALUE_NAN": "no NaN",
        "VALUE_INF": "no Inf",
        "SCALE_NOT_POSITIVE": "finite scales > 0",
        "SCALE_NOT_UE8M0": "powers of two (scale_fmt ue8m0)",
        "GAIN_ALL_ZERO": "a non-zero gain",
        "SCALE_ZERO": "non-zero affine scales",
        "SCALE_NEGATIVE": "absmax >= 0",
    }.get(code)
