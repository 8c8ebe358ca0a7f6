"""What compressed-tensors' formats share (scale dtypes and shapes, strategies, the CompressedTensors base) and
the plan of a config's groups (compressed_tensors_plan). The formats are pack.py, naive.py and fp4.py."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from kimi_audit.constants import TORCH_DTYPE_TO_SAFETENSORS
from kimi_audit.errors import ConfigError
from kimi_audit.model.kinds import GROUP_INDEX, GROUP_SCALE, INPUT_SCALE, KV_SCALE, SCALE, ZERO_POINT
from kimi_audit.model.patterns import compile_patterns
from kimi_audit.model.quant.scheme import (
    FP8_DTYPE,
    QuantPlan,
    ReleaseQuant,
    Scheme,
    Stored,
    Unquantized,
    UnsupportedQuantization,
)
from kimi_audit.numerics.grid import ceil_div, scale_grid

if TYPE_CHECKING:
    import numpy as np


__all__ = ["METHOD", "CompressedTensors", "compressed_tensors_plan"]

METHOD = "compressed-tensors"
TORCH_DTYPES = {"torch.bfloat16": "BF16", "torch.float16": "F16", "torch.float32": "F32",
                "torch.float8_e4m3fn": FP8_DTYPE, "torch.uint8": "U8"}
"""`scale_dtype` as compressed-tensors serializes it -> the safetensors dtype."""
LINEAR = "Linear"
MIXED = "mixed-precision"
"""The config's `format` when each config group names its own."""


def scale_dtype_of(weights: Mapping[str, Any], default: str) -> str:
    v = weights.get("scale_dtype")
    if v is None:
        return default
    dtype = TORCH_DTYPES.get(v) if isinstance(v, str) else None
    if dtype is None:
        raise UnsupportedQuantization(f"compressed-tensors scale_dtype {v!r}")
    return dtype


def static(activations: Any) -> bool:
    """Activations quantized with a stored scale (`dynamic` false or 'local')."""
    return isinstance(activations, dict) and activations.get("dynamic") is not True


def scale_shape(strategy: str, out: int, inp: int, group: int, block: tuple[int, int]) -> tuple[int, ...]:
    if strategy in ("group", "tensor_group"):
        return (out, ceil_div(inp, group))
    if strategy == "channel":
        return (out, 1)
    if strategy == "block":
        return scale_grid((out, inp), block)
    return (1,)


def scales_2d(scale: np.ndarray, out: int) -> np.ndarray:
    """A per-tensor scale [1] as [out, 1] (one group spanning the inputs)."""
    import numpy as np

    return np.broadcast_to(scale.reshape(1, 1), (out, 1)) if scale.ndim == 1 else scale


@dataclass(frozen=True)
class CompressedTensors(Scheme):
    """A compressed-tensors format: built per config group (`from_group`), planned together."""

    roles: ClassVar[tuple[tuple[str, str], ...]] = (
        (".weight_scale", GROUP_SCALE), (".weight_zero_point", ZERO_POINT), (".weight_g_idx", GROUP_INDEX),
        (".input_scale", INPUT_SCALE), (".input_global_scale", INPUT_SCALE), (".k_scale", KV_SCALE),
        (".v_scale", KV_SCALE))

    @classmethod
    def plan(cls, q: dict[str, Any], plain: Unquantized, config: Mapping[str, Any],
             release: ReleaseQuant) -> QuantPlan:
        return compressed_tensors_plan(q, plain, release)

    @classmethod
    def from_group(cls, weights: dict[str, Any], group: dict[str, Any], plain: Unquantized) -> Scheme:
        """The scheme of one config group (UnsupportedQuantization for settings the class does not read)."""
        raise NotImplementedError


FALSE_WORDS = frozenset(("0", "off", "f", "false", "n", "no"))
TRUE_WORDS = frozenset(("1", "on", "t", "true", "y", "yes"))
"""The strings pydantic's lax bool reads (case-insensitive, nothing stripped): compressed-tensors'
QuantizationArgs is a pydantic model, so `"symmetric": "false"` is False to its loader."""


def lax_bool(v: Any, key: str) -> bool:
    """A bool field as compressed-tensors' pydantic model validates it; what it refuses is a ConfigError."""
    if isinstance(v, bool):
        return v
    if isinstance(v, (int, float)) and v in (0, 1):
        return bool(v)
    if isinstance(v, str) and v.lower() in FALSE_WORDS | TRUE_WORDS:
        return v.lower() in TRUE_WORDS
    raise ConfigError(f"config.json quantization_config {key} is {v!r}, not a boolean compressed-tensors reads")


def lax_int(v: Any, key: str) -> int:
    """An int field as pydantic's lax mode reads it: an int (a bool as 0/1), an integral float, a string of
    one (surrounding whitespace allowed); anything else is a ConfigError."""
    if isinstance(v, int):
        return int(v)
    if isinstance(v, str):
        text = v.strip()
        try:
            return int(text)
        except ValueError:
            with contextlib.suppress(ValueError):
                v = float(text)
    if isinstance(v, float) and v.is_integer():
        return int(v)
    raise ConfigError(f"config.json quantization_config {key} is {v!r}, not an integer compressed-tensors reads")


def quantization_args(weights: dict[str, Any], where: str) -> dict[str, Any]:
    """A config group's `weights` with its typed fields read as compressed-tensors' QuantizationArgs reads them
    (`symmetric`, `dynamic` booleans, `num_bits` an integer), never by Python truthiness: `"false"` is False,
    `"maybe"` is refused."""
    out = dict(weights)
    for key in ("symmetric", "dynamic"):
        if key in out and not (key == "dynamic" and out[key] == "local"):
            out[key] = lax_bool(out[key], f"{where}.{key}")
    if "num_bits" in out:
        out["num_bits"] = lax_int(out["num_bits"], f"{where}.num_bits")
    if out.get("group_size") is not None and not isinstance(out["group_size"], str):
        out["group_size"] = lax_int(out["group_size"], f"{where}.group_size")
    return out


def strategy_of(weights: Mapping[str, Any], fmt: str, allowed: tuple[str, ...]) -> str:
    strategy = weights.get("strategy")
    if strategy not in allowed:
        raise UnsupportedQuantization(f"compressed-tensors {fmt} strategy {strategy!r} (only {', '.join(allowed)})")
    return str(strategy)


def group_size_of(weights: Mapping[str, Any], strategy: str, fmt: str) -> int:
    if strategy not in ("group", "tensor_group"):
        return 0
    g = weights.get("group_size")
    if type(g) is not int or g <= 0:
        raise UnsupportedQuantization(f"compressed-tensors {fmt} group_size {g!r}")
    return g


def _matchers(entries: Any, what: str) -> tuple[set[str], list[str], bool]:
    """(exact names, `re:` patterns, whether the class target `Linear` is among them) of targets or ignore."""
    names: set[str] = set()
    patterns: list[str] = []
    linear = False
    if entries is not None and not isinstance(entries, list):
        raise ConfigError(f"config.json quantization_config {what} must be a list of names, got {entries!r}")
    for entry in entries or []:
        if not isinstance(entry, str):
            raise ConfigError(f"config.json quantization_config {what} holds {entry!r}, not a string")
        if entry == LINEAR:
            linear = True
        elif entry.startswith("re:"):
            patterns.append(entry[3:])
        else:
            names.add(entry)
    return names, patterns, linear


def compressed_tensors_plan(q: dict[str, Any], plain: Unquantized, release: ReleaseQuant | None = None) -> QuantPlan:
    """The plan of a compressed-tensors quantization_config: each config group's scheme (by the group's
    `format`, else the config's) for its targets, `ignore` left plain; names the architecture's release spells
    otherwise (`release.aliases`: `lm_head` for DeepSeek-V4's `head`) read as the release's."""

    top = q.get("format")
    if top is not None and not isinstance(top, str):
        raise ConfigError(f"config.json quantization_config.format must be a string, got {top!r}")
    if top is not None and top != MIXED and (METHOD, top) not in Scheme.registry:
        raise UnsupportedQuantization(f"{METHOD} format {top!r}")
    groups = q.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        raise UnsupportedQuantization("compressed-tensors without config_groups")
    every: Scheme | None = None
    exact: dict[str, Scheme] = {}
    patterns: dict[str, Scheme] = {}
    summaries: list[tuple[Scheme, dict[str, Any]]] = []
    for name, group in groups.items():
        weights = group.get("weights") if isinstance(group, dict) else None
        if not isinstance(group, dict) or not isinstance(weights, dict):
            raise UnsupportedQuantization(f"compressed-tensors config group {name!r} without weights")
        fmt = group.get("format") or q.get("format")
        cls = Scheme.registry.get((METHOD, fmt)) if isinstance(fmt, str) else None
        if cls is None or not issubclass(cls, CompressedTensors):
            raise UnsupportedQuantization(f"{METHOD} format {fmt!r}")
        scheme = cls.from_group(quantization_args(weights, f"config_groups.{name}.weights"), group, plain)
        names, regexes, linear = _matchers(group.get("targets"), "targets")
        if not (names or regexes or linear):
            raise UnsupportedQuantization(f"compressed-tensors targets {group.get('targets')!r}")
        for n in names:  # a target written twice: the later group's, as compressed-tensors' target_to_scheme
            exact[n] = scheme
        for p in regexes:
            patterns[p] = scheme
        if linear:
            every = scheme
        summaries.append((scheme, {"targets": list(group.get("targets") or [])}))
    ig_names, ig_patterns, ig_linear = _matchers(q.get("ignore"), "ignore")
    if release is not None:
        ig_names, ig_patterns = release.alias(ig_names), [*ig_patterns, *release.unreached]
        exact = {n2: s for n, s in exact.items() for n2 in release.alias({n})}
    if ig_linear:
        every = None
    ignore_re = compile_patterns(ig_patterns, "config.json quantization_config.ignore")
    targets = tuple((compile_patterns([p], "config.json quantization_config targets"), patterns[p])
                    for p in sorted(patterns))
    plan = QuantPlan(every, plain, exact, tuple((m, s) for m, s in targets if m is not None),
                     frozenset(ig_names), ignore_re, by_name=True)
    groups_out = tuple(next(g for t, g in summaries if t is s) for s in plan.schemes)
    return dataclasses.replace(plan, groups=groups_out, layer_tensors=kv_cache_scales(q.get("kv_cache_scheme"), plain))


def kv_cache_scales(kv: Any, plain: Unquantized) -> tuple[Stored, ...]:
    """The KV cache's scales a `kv_cache_scheme` stores per attention layer: `self_attn.k_scale` and `v_scale`, [1]
    in the model's dtype (or `scale_dtype`), as llmcompressor writes them (compressed-tensors 0.19); none without
    one, and none for a dynamic one."""
    if kv is None:
        return ()
    if not isinstance(kv, dict):
        raise ConfigError("config.json quantization_config.kv_cache_scheme is not an object")
    if kv.get("dynamic"):
        return ()
    if kv.get("strategy", "tensor") != "tensor":
        raise UnsupportedQuantization(f"compressed-tensors kv_cache_scheme strategy {kv.get('strategy')!r}")
    scale_dtype = kv.get("scale_dtype")
    if scale_dtype is not None and (not isinstance(scale_dtype, str) or scale_dtype not in TORCH_DTYPE_TO_SAFETENSORS):
        raise ConfigError(f"config.json kv_cache_scheme.scale_dtype {scale_dtype!r} is not one of "
                          f"{sorted(TORCH_DTYPE_TO_SAFETENSORS)}")
    dtype = plain.dtype if scale_dtype is None else TORCH_DTYPE_TO_SAFETENSORS[scale_dtype]
    return (Stored("self_attn.k_scale", dtype, (1,), SCALE), Stored("self_attn.v_scale", dtype, (1,), SCALE))
