"""What every quantization scheme is: which tensors store one Linear module, and what they count for.

Each scheme is one small class registered under the (quant_method, format) pairs it reads
(`Scheme.registry`, filled by `__init_subclass__`, as gguf-py registers one class per quantization type);
model.quant.scheme looks the config's pair up there, so a new format is one new class and nothing else. The
layout asks the checkpoint's QuantPlan, per Linear module, for its scheme, and the scheme for the tensors that
store the module's weight [out, in]; the accounting, `explain`, `tensor --dequant` and the values pass ask the
same scheme.

What a tensor counts for: a PARAMETER's elements are parameters; a PACKED tensor stands for the out x in
logical parameters of its module; SCALE tensors (scales, global scales, shapes, zero points, group indices,
input scales) are quantization metadata, never counted. The first stored tensor is the module's weight; every
SCALE tensor after it describes it.

QuantPlan, at the end, is which scheme stores each Linear module (model.quant.dispatch.quant_plan makes it): one
scheme for every Linear module (compressed-tensors' `Linear` target, DeepSeek's FP8), schemes for modules by exact
name and by `re:` pattern (compressed-tensors' other targets, DeepSeek-V4's FP4 experts), and what stays
unquantized (`ignore`, and the modules a format leaves plain by convention). Precedence is compressed-tensors'
(match_targets): an exact name, then a pattern (in sorted order), then the class target; `ignore` before all.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from itertools import compress, repeat
from operator import neg, or_
from typing import TYPE_CHECKING, Any, ClassVar

from kimi_audit.errors import ConfigError
from kimi_audit.model.kinds import PARAMETER
from kimi_audit.model.patterns import NamePatterns
from kimi_audit.numerics.grid import DEEPSEEK_FP8_BLOCK

if TYPE_CHECKING:
    import numpy as np

__all__ = ["ANY_LENGTH", "FP8_DTYPE", "QuantPlan", "ReleaseQuant", "Scheme", "Stored",
           "Unquantized", "UnsupportedQuantization", "fits", "fp8_block", "stored_weight"]

FP8_DTYPE = "F8_E4M3"
ANY_LENGTH = -1
"""A Stored dimension whose length depends on the values (bitsandbytes' serialized double-quantized QuantState,
whose JSON holds a float): any stored length fits it (model.layout.shape_fits)."""
DEEPSEEK_SCALE_SUFFIX = ".weight_scale_inv"
"""DeepSeek-V3's FP8 block scale."""


@dataclass(frozen=True)
class ReleaseQuant:
    """How an architecture's own release writes DeepSeek's block-wise FP8 (`quant_method: fp8`): a fact of the
    architecture (model.arch declares it), read by the fp8 scheme when it makes the plan."""

    scale_suffix: str = DEEPSEEK_SCALE_SUFFIX
    e8m0_scales: bool = False
    """`scale_fmt: ue8m0` stores the scales as F8_E8M0 (DeepSeek-V4), not as F32 powers of two."""
    blocks: tuple[tuple[int, int], ...] = (DEEPSEEK_FP8_BLOCK,)
    """The scale blocks its releases use (QUANT_CONFIG accepts these; DeepSeek-V4.1: [32, 32] too)."""
    fp4_experts: bool = False
    """`expert_dtype: fp4` stores the routed experts as FP4 (DeepSeek-V4)."""
    plain: tuple[str, ...] = ()
    """Modules the release leaves unquantized by exact name (DeepSeek-V4's `head`)."""
    plain_suffixes: tuple[str, ...] = ()
    """Module-name suffixes its own FP8 leaves unquantized (DeepSeek-V4's compressor and indexer projections, F32
    in transformers): its `fp8` format's only; a compressed-tensors config's targets and ignore decide for its."""
    aliases: tuple[tuple[str, str], ...] = ()
    """(a name other writers' configs give a module, the release's): `ignore: [lm_head]` is DeepSeek-V4's
    `head`."""
    unprefixed: str = ""
    """The text-model prefix its quantizer's `ignore` leaves out (Kimi-K2.5's `lm_head`): both spellings read."""
    unreached: tuple[str, ...] = ()
    """RE2 patterns of modules its quantizer never saw (Kimi-K2.5's saw the text model alone): left unquantized."""

    def alias(self, names: set[str]) -> set[str]:
        """`names` with each alias replaced by the release's name (and under the `unprefixed` prefix beside it)."""
        table = dict(self.aliases)
        out = {table.get(n, n) for n in names}
        if self.unprefixed:
            out |= {self.unprefixed + n for n in out if not n.startswith(self.unprefixed)}
        return out


DEEPSEEK_RELEASE = ReleaseQuant()
"""DeepSeek-V3's conventions: every architecture's unless it declares others."""


@dataclass(frozen=True)
class Stored:
    """One tensor a module's weight is stored in, named relative to the module."""

    suffix: str
    dtype: str
    shape: tuple[int, ...]
    kind: str
    logical: int = 0
    """Parameters this tensor counts for: numel for a PARAMETER, out x in for PACKED words, else 0."""


class UnsupportedQuantization(ConfigError):
    """quantization_config names a method or format no Scheme implements (QUANT_UNSUPPORTED)."""


@dataclass(frozen=True)
class Scheme:
    """How one Linear module's weight [out, in] is stored.

    A subclass that names `formats` (the (quant_method, format) pairs of quantization_config it reads; format
    None where the method has no `format` key) is registered under them. A method-level class (DeepSeek's
    `fp8`) answers `plan()` for the whole config; compressed-tensors' classes are built per config group by
    `from_group()` (model.quant.compressed)."""

    key: ClassVar[str] = ""
    formats: ClassVar[tuple[tuple[str, str | None], ...]] = ()
    dequant_bytes_per_value: ClassVar[int] = 2
    """Memory `dequantize` needs per weight value (its result, and what it computes on)."""
    roles: ClassVar[tuple[tuple[str, str], ...]] = ()
    """The tensor-name suffixes this format stores beside (or instead of) `.weight`, and the role of each
    (model.kinds' roles: a block scale, packed words ...): model.roles derives the suffix classifier from them."""
    tree: ClassVar[str] = ""
    """The writer whose module tree a checkpoint in this format holds, where the format implies one (MLX:
    `mlx-lm`, whose models stack the routed experts and split kv_b_proj); "": the release's tree. An
    architecture describes the trees it knows (`Architecture.writer_trees`); another is QUANT_UNSUPPORTED."""
    loader_reads: ClassVar[str] = ""
    """The files the format's loader reads whatever the index says, as a glob (mlx-lm: `model*.safetensors`): a
    shard the index does not list that matches it changes the model, an error rather than a warning; "": its
    loaders follow the index."""
    writer_dtypes: ClassVar[tuple[tuple[str, str, str], ...]] = ()
    """(suffix, dtype, whose) a writer stores one of its tensors in beside the release's, loaders reading it alike."""
    index_counts_files: ClassVar[bool] = False
    """The writer's index `total_size` counts whole shard files, headers included (AMD Quark), not the tensors'
    payload (safetensors' own convention, and every other writer's)."""
    registry: ClassVar[dict[tuple[str, str | None], type[Scheme]]] = {}
    classes: ClassVar[list[type[Scheme]]] = []
    """Every registered scheme class, in registration order (those with no pair of their own included)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """A subclass with a `key` registers itself (`register`)."""
        super().__init_subclass__(**kwargs)
        if cls.key:
            cls.register()

    @classmethod
    def register(cls) -> None:
        """Adds the class under its pairs; a pair or key already registered is refused (ValueError), as gguf-py's
        quants.py refuses a second class for a quantization type."""
        taken = [pair for pair in cls.formats if pair in Scheme.registry]
        if taken or any(c.key == cls.key for c in Scheme.classes):
            raise ValueError(f"quantization scheme {cls.__name__} ({cls.key!r}): "
                             f"{taken or cls.key} already registered")
        for pair in cls.formats:
            Scheme.registry[pair] = cls
        Scheme.classes.append(cls)

    @classmethod
    def unregister(cls) -> None:
        """Takes the class out of the registry (a plug-in or a test that registered it)."""
        for pair in cls.formats:
            if Scheme.registry.get(pair) is cls:
                del Scheme.registry[pair]
        if cls in Scheme.classes:
            Scheme.classes.remove(cls)

    @classmethod
    def accepts(cls, expected: str, stored: str, shape: tuple[int, ...]) -> bool:
        """Whether a stored dtype other than the expected one is this format's way of storing it (a GGUF weight:
        any ggml weight type whose block divides the row); see `fits`."""
        return False

    @classmethod
    def claims(cls, q: dict[str, Any], config: Mapping[str, Any]) -> bool:
        """Whether a quantization_config with no `quant_method` is this format's (MLX writes none)."""
        return False

    @classmethod
    def plan(cls, q: dict[str, Any], plain: Unquantized, config: Mapping[str, Any],
             release: ReleaseQuant) -> QuantPlan:
        """The plan of a quantization_config this class is registered for (`config`: the whole config.json,
        for settings written outside quantization_config; `release`: how the architecture's release writes it).
        UnsupportedQuantization for settings it does not implement, ConfigError for malformed ones."""
        raise NotImplementedError

    @classmethod
    def format_mismatch(cls, planned: int, want: str, count: int, got: str, first: str) -> str:  # its words
        which = "every one is" if count == planned else f"{count:,} of them are"
        return (f"quantization_config plans {planned:,} weights as {cls.key} ({want}); {which} stored {got}: the "
                f"config describes another format than the files hold (first: {first})")

    def summary(self) -> dict[str, Any]:
        """The scheme's settings as plain data (`model.quantization` in `audit --json`)."""
        raise NotImplementedError

    @property
    def name(self) -> str:
        """A short name of how the weight is stored (`FP8`, `INT4`, `NVFP4`, `BF16`)."""
        raise NotImplementedError

    @property
    def param_dtype(self) -> str:
        """The parameters' dtype where the stored weight packs them into another (`INT4` in I32 words, `FP4` in
        bytes); "" where the weight tensor holds them as they are."""
        return ""

    @property
    def power_of_two_scales(self) -> bool:
        """Every block scale is meant to be an exact power of two (the values pass checks SCALE_NOT_UE8M0)."""
        return False

    def stored(self, out: int, inp: int) -> tuple[Stored, ...]:
        raise NotImplementedError

    def module_shape(self, weight: tuple[int, ...], logical: int) -> tuple[int, int] | None:
        """The module's [rows, in] from its stored weight's expected shape and parameters: the leading dimensions
        are its rows (a stacked module's E x out); None where the stored weight does not say (bitsandbytes'
        4-bit bytes [out·in / 2, 1]: its serialized quant_state does)."""
        rows = math.prod(weight[:-1])
        return (rows, logical // rows) if rows else None

    def describe(self) -> str:
        raise NotImplementedError

    def dequantize(self, tensors: Mapping[str, np.ndarray], out: int, inp: int) -> np.ndarray:
        """The module's weight [out, in] from its stored tensors (decoded, keyed by the suffixes of
        `stored`), computed as the scheme's reference code does (kimi_audit.numerics, imported here)."""
        raise NotImplementedError

    def error_bound(self) -> float | None:
        """The relative RMS error ||dequantized - original|| / ||original|| a weight this scheme quantized stays
        within (model.quant.bounds derives each grid's); None: none derived, its weights are not compared."""
        return None


def fits(expected: str, stored: str, shape: tuple[int, ...]) -> bool:
    """A stored tensor's dtype is what its layout entry expects: the same, or one a registered format accepts for
    that expectation (Scheme.accepts)."""
    return stored == expected or any(c.accepts(expected, stored, shape) for c in Scheme.classes)


def stored_weight(tensors: Mapping[str, np.ndarray], suffix: str, out: int, inp: int) -> np.ndarray:
    """The stored weight [out, in] (NumericsError naming another shape)."""
    from kimi_audit.numerics.dtypes import NumericsError

    w = tensors[suffix]
    if w.shape != (out, inp):
        raise NumericsError(f"{suffix[1:]} has shape {list(w.shape)}, the module is {[out, inp]}")
    return w


def packed_rows(tensors: Mapping[str, np.ndarray], suffix: str, out: int) -> np.ndarray:
    """A packed weight, which must have `out` rows."""
    from kimi_audit.numerics.dtypes import NumericsError

    w = tensors[suffix]
    if w.ndim != 2 or w.shape[0] != out:
        raise NumericsError(f"{suffix[1:]} has shape {list(w.shape)}, the module has {out} outputs")
    return w


@dataclass(frozen=True)
class Unquantized(Scheme):
    key: ClassVar[str] = "none"
    dtype: str = "BF16"

    def summary(self) -> dict[str, Any]:
        return {"method": None, "dtype": self.dtype}

    @property
    def name(self) -> str:
        return self.dtype

    def stored(self, out: int, inp: int) -> tuple[Stored, ...]:
        return (Stored(".weight", self.dtype, (out, inp), PARAMETER, out * inp),)

    def describe(self) -> str:
        return f"{self.dtype}, not quantized"

    def dequantize(self, tensors: Mapping[str, np.ndarray], out: int, inp: int) -> np.ndarray:
        return stored_weight(tensors, ".weight", out, inp)


@dataclass(frozen=True)
class QuantPlan:
    """Which scheme stores each Linear module (by its full name, e.g. `model.layers.3.self_attn.q_a_proj`)."""

    every: Scheme | None
    """The scheme of every Linear module no other entry names (None: those stay plain)."""
    plain: Unquantized
    exact: Mapping[str, Scheme] = field(default_factory=dict)
    patterns: tuple[tuple[NamePatterns, Scheme], ...] = ()
    """`re:` targets, matched (from the start, as compressed-tensors) against module names, in sorted order;
    compiled by RE2 (model.patterns: linear time, whatever config.json holds)."""
    ignore_names: frozenset[str] = frozenset()
    ignore_re: NamePatterns | None = None
    """compressed-tensors `re:` entries of `ignore`, matched the same way."""
    keep_plain: tuple[str, ...] = ()
    """Module-name suffixes a format leaves unquantized by convention (FP8: the MTP layer's projections)."""
    by_name: bool = False
    """Whether the choice depends on the layer's index (an ignore list, a target naming modules): then every
    layer is asked."""
    groups: tuple[dict[str, Any], ...] = ()
    """Each scheme's targets as written (summary of a plan with several schemes)."""
    dtype_recorded: bool = True
    """Whether config.json's dtype is the model's: False where the exporter writes its own (AutoRound's AWQ packing
    records float16, keeps the rest as it was): a float dtype uniform over a component is WRITER_DTYPE, any rank."""
    layer_tensors: tuple[Stored, ...] = ()
    """Quantization metadata every decoder layer stores beside its modules, named relative to the layer (the FP8
    KV cache's k and v scales): expected in each main layer, never parameters."""

    @property
    def schemes(self) -> tuple[Scheme, ...]:
        """Every quantized scheme of the plan, each once (the one for every Linear module first)."""
        out = [] if self.every is None else [self.every]
        for s in (*self.exact.values(), *(s for _, s in self.patterns)):
            if s not in out:
                out.append(s)
        return tuple(out)

    @property
    def tree(self) -> str:
        """The writer's module tree its formats imply (Scheme.tree), "" for the release's."""
        return next((s.tree for s in self.schemes if s.tree), "")

    @property
    def index_counts_files(self) -> bool:
        """Whether its writer's index total_size counts whole files (Scheme.index_counts_files)."""
        return any(s.index_counts_files for s in self.schemes)

    @property
    def loader_reads(self) -> str:
        """The glob of files its formats' loader reads whatever the index says (Scheme.loader_reads), "" for none."""
        return next((s.loader_reads for s in self.schemes if s.loader_reads), "")

    @property
    def quantized(self) -> Scheme:
        """The plan's main scheme (the first of `schemes`)."""
        return self.schemes[0]

    def summary(self) -> dict[str, Any]:
        """The quantized modules' scheme as plain data (`model.quantization` in `audit --json`); a plan of
        several schemes lists each with its targets under `groups`."""
        schemes = self.schemes
        if len(schemes) == 1:
            return schemes[0].summary()
        first = schemes[0].summary()
        return {"method": first.get("method"), "groups": [
            dict(s.summary(), **g) for s, g in zip(schemes, self.groups)] if self.groups else
            [s.summary() for s in schemes]}

    def scheme_for(self, module: str) -> Scheme:
        if module in self.ignore_names or (self.ignore_re is not None and self.ignore_re.match(module)):
            return self.plain
        if module.endswith(self.keep_plain):
            return self.plain
        if self.exact:
            s = self.exact.get(module)
            if s is not None:
                return s
        for pattern, s in self.patterns:
            if pattern.match(module):
                return s
        return self.every if self.every is not None else self.plain

    def choices(self, modules: list[str]) -> tuple[int, ...]:
        """Which scheme each module gets (its index in `schemes`, -1: plain), for every module of a layer at
        once: `scheme_for` of each, with each pattern matched over all the names in one RE2 scan (a layer of
        896 experts has 2,688 modules; a call per name per pattern was most of a Kimi K3 audit)."""
        plain = map(str.endswith, modules, repeat(self.keep_plain))
        if self.ignore_names:
            plain = map(or_, plain, map(self.ignore_names.__contains__, modules))
        if self.ignore_re is not None:
            plain = map(or_, plain, self.ignore_re.match_many(modules))
        if not (self.exact or self.patterns or self.every is None):
            return tuple(map(neg, plain))
        schemes = self.schemes

        def index(s: Scheme | None) -> int:
            return -1 if s is None or s is self.plain else schemes.index(s)

        out = [index(self.every)] * len(modules)
        for pattern, scheme in reversed(self.patterns):  # the first pattern that matches wins
            i = index(scheme)
            for k in compress(range(len(modules)), pattern.match_many(modules)):
                out[k] = i
        for k, module in enumerate(modules) if self.exact else ():
            exact = self.exact.get(module)
            if exact is not None:
                out[k] = index(exact)
        for k in compress(range(len(modules)), plain):
            out[k] = -1
        return tuple(out)


def fp8_block(plan: QuantPlan | None) -> tuple[int, int]:
    """The block of FP8 weights' scales: the plan's, else Fp8Block's default (FP8 weights a config does not
    describe are read as DeepSeek's)."""
    for scheme in () if plan is None else plan.schemes:
        block = getattr(scheme, "block", None)
        if isinstance(block, tuple) and len(block) == 2:
            return block
    return DEEPSEEK_FP8_BLOCK
