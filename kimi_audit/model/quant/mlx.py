"""MLX's affine quantization, as mlx-lm writes it (`mlx_lm.convert -q`, mlx-community's 2- to 8-bit builds).

config.json holds `quantization` (and, since mlx-lm #957, the same object as `quantization_config`) with
`group_size`, `bits` and `mode` and no `quant_method`; a module quantized otherwise has its own entry under its
path (`"model.layers.3.mlp.gate_proj": {"group_size": 32, "bits": 8}`), one left plain `false`. Each quantized
Linear (and the embedding) stores `weight` U32 [out, in * bits / 32] (codes in a little-endian bit stream),
`scales` and `biases` [out, in / group_size] in the model's dtype; mlx-lm leaves a module plain where its
input width is not a multiple of group_size (quantize_model's predicate). The checkpoint holds mlx-lm's module
tree (Scheme.tree): its models stack the routed experts (`mlp.switch_mlp.gate_proj` [E, ...]), split
DeepseekV3's kv_b_proj per head and drop the MTP layer; each architecture describes its mlx-lm tree
(model.arch). mlx-lm's loader reads every `model*.safetensors` and ignores the index.
Reference: mlx-lm 0.32 `utils.py` (quantize_model, save_model, load_model), mlx 0.32 `mx.quantize`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from kimi_audit.errors import ConfigError
from kimi_audit.model.kinds import AFFINE_BIAS, AFFINE_SCALE, PACKED, SCALE
from kimi_audit.model.quant.scheme import (
    QuantPlan,
    ReleaseQuant,
    Scheme,
    Stored,
    Unquantized,
    UnsupportedQuantization,
    packed_rows,
)

if TYPE_CHECKING:
    import numpy as np

__all__ = ["MlxAffine"]

MODE_DEFAULTS = {"affine": (64, 4)}
"""mode -> (group_size, bits) mlx-lm uses where the config omits them (quantize_model's defaults_for_mode)."""
SETTINGS = ("group_size", "bits", "mode", "quant_method")
TREE = "mlx-lm"


@dataclass(frozen=True)
class MlxAffine(Scheme):
    key: ClassVar[str] = "mlx"
    formats: ClassVar[tuple[tuple[str, str | None], ...]] = (("mlx", None),)
    roles: ClassVar[tuple[tuple[str, str], ...]] = ((".scales", AFFINE_SCALE), (".biases", AFFINE_BIAS))
    tree: ClassVar[str] = TREE
    reads_every_shard: ClassVar[bool] = True
    dequant_bytes_per_value: ClassVar[int] = 48
    """The unpacked bit stream (one byte per bit), the codes and two float32 passes."""
    group_size: int = 64
    bits: int = 4
    dtype: str = "BF16"

    @classmethod
    def claims(cls, q: dict[str, Any], config: Mapping[str, Any]) -> bool:
        return ("bits" in q and "group_size" in q and "quantization" in config) or q.get("mode") in MODE_DEFAULTS

    @classmethod
    def plan(cls, q: dict[str, Any], plain: Unquantized, config: Mapping[str, Any],
             release: ReleaseQuant) -> QuantPlan:
        every = cls.read(q, plain.dtype, "config.json quantization")
        exact: dict[str, Scheme] = {}
        ignore: set[str] = set()
        for path, v in q.items():
            if path in SETTINGS:
                continue
            if v is False:
                ignore.add(path)
            elif v is True:
                exact[path] = every
            elif isinstance(v, dict):
                exact[path] = cls.read({**{"mode": every_mode(q)}, **v}, plain.dtype, f"config.json quantization "
                                       f"{path!r}")
            else:
                raise ConfigError(f"config.json quantization {path!r} is {v!r}: mlx-lm writes an object or false")
        return QuantPlan(every, plain, exact=exact, ignore_names=frozenset(ignore), by_name=bool(exact or ignore))

    @classmethod
    def read(cls, q: Mapping[str, Any], dtype: str, where: str) -> MlxAffine:
        mode = every_mode(q)
        if mode not in MODE_DEFAULTS:
            raise UnsupportedQuantization(f"mlx mode {mode!r}")
        group, bits = MODE_DEFAULTS[mode]
        group, bits = q.get("group_size", group), q.get("bits", bits)
        if type(bits) is not int or bits not in (2, 3, 4, 5, 6, 8):
            raise ConfigError(f"{where} bits {bits!r} is not one of 2, 3, 4, 5, 6, 8 (mx.quantize's affine widths)")
        if type(group) is not int or group not in (32, 64, 128):
            raise ConfigError(f"{where} group_size {group!r} is not 32, 64 or 128 (mx.quantize's groups)")
        return cls(group, bits, dtype)

    def summary(self) -> dict[str, Any]:
        return {"method": "mlx", "mode": "affine", "bits": self.bits, "group_size": self.group_size,
                "scale_dtype": self.dtype}

    @property
    def name(self) -> str:
        return f"MLX{self.bits}"

    @property
    def param_dtype(self) -> str:
        return f"UINT{self.bits}"

    def quantizes(self, inp: int) -> bool:
        """mlx-lm quantizes a module only where its input width is a multiple of group_size."""
        return inp % self.group_size == 0

    def stored(self, out: int, inp: int) -> tuple[Stored, ...]:
        if not self.quantizes(inp):
            return Unquantized(self.dtype).stored(out, inp)
        groups = (out, inp // self.group_size)
        return (Stored(".weight", "U32", (out, inp * self.bits // 32), PACKED, out * inp),
                Stored(".scales", self.dtype, groups, SCALE), Stored(".biases", self.dtype, groups, SCALE))

    def describe(self) -> str:
        return (f"MLX affine {self.bits}-bit, packed in U32 words, one {self.dtype} scale and bias per "
                f"{self.group_size} inputs")

    def dequantize(self, tensors: Mapping[str, np.ndarray], out: int, inp: int) -> np.ndarray:
        """``scales * q + biases``, rounded as mx.dequantize (numerics.affine)."""
        from kimi_audit.numerics.affine import dequantize_affine

        flat = {k: v.reshape(-1, v.shape[-1]) if v.ndim > 2 else v for k, v in tensors.items()}  # stacked: rows
        if not self.quantizes(inp):
            return Unquantized(self.dtype).dequantize(flat, out, inp)
        return dequantize_affine(packed_rows(flat, ".weight", out), flat[".scales"], flat[".biases"],
                                 self.group_size, self.bits)


def every_mode(q: Mapping[str, Any]) -> Any:
    return q.get("mode", "affine")
