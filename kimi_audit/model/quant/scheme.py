"""What every quantization scheme is: which tensors store one Linear module, and what they count for.

Each scheme is one small class registered under the (quant_method, format) pairs it reads
(`Scheme.registry`, filled by `__init_subclass__`, as gguf-py registers one class per quantization type);
model.quant.plan looks the config's pair up there, so a new format is one new class and nothing else. The
layout asks the checkpoint's QuantPlan, per Linear module, for its scheme, and the scheme for the tensors that
store the module's weight [out, in]; the accounting, `explain`, `tensor --dequant` and the values pass ask the
same scheme.

What a tensor counts for: a PARAMETER's elements are parameters; a PACKED tensor stands for the out x in
logical parameters of its module; SCALE tensors (scales, global scales, shapes, zero points, group indices,
input scales) are quantization metadata, never counted. The first stored tensor is the module's weight; every
SCALE tensor after it describes it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from kimi_audit.errors import ConfigError
from kimi_audit.model.kinds import PARAMETER

if TYPE_CHECKING:
    import numpy as np

    from kimi_audit.model.quant.plan import QuantPlan

__all__ = ["FP8_DTYPE", "Scheme", "Stored", "Unquantized", "UnsupportedQuantization", "stored_weight"]

FP8_DTYPE = "F8_E4M3"


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
    registry: ClassVar[dict[tuple[str, str | None], type[Scheme]]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for pair in cls.formats:
            Scheme.registry[pair] = cls

    @classmethod
    def plan(cls, q: dict[str, Any], plain: Unquantized, config: Mapping[str, Any]) -> QuantPlan:
        """The plan of a quantization_config this class is registered for (`config`: the whole config.json,
        for settings written outside quantization_config). UnsupportedQuantization for settings it does not
        implement, ConfigError for malformed ones."""
        raise NotImplementedError

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

    def describe(self) -> str:
        raise NotImplementedError

    def dequantize(self, tensors: Mapping[str, np.ndarray], out: int, inp: int) -> np.ndarray:
        """The module's weight [out, in] from its stored tensors (decoded, keyed by the suffixes of
        `stored`), computed as the scheme's reference code does (kimi_audit.numerics, imported here)."""
        raise NotImplementedError


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
