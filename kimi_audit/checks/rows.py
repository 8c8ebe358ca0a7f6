"""A checkpoint's tensors as float32 values by row ranges, each quantized Linear module's weight dequantized as its
format says (`SourceRows`): what `audit --against --values` compares, a GGUF set (checks.against) or a quantized
release (checks.same_model) with the checkpoint it was made from, in bands of rows, so memory stays bounded
whatever a tensor's size."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from kimi_audit.errors import KimiAuditError
from kimi_audit.model.checkpoint import Checkpoint
from kimi_audit.model.layout import scheme_of
from kimi_audit.model.quant.deepseek import Fp8Block
from kimi_audit.model.quant.scheme import FP8_DTYPE, Scheme, Unquantized, fp8_block
from kimi_audit.sources.base import Source

if TYPE_CHECKING:
    import numpy as np

__all__ = ["BAND_BYTES", "ROW_GRAIN", "SourceRows", "quantized_module"]

BAND_BYTES = 1 << 24
"""The float32 values one piece of a comparison holds at most (16 MiB: the source's band, its encoding and the
GGUF's bytes for it stay under ~150 MB whatever the tensor's size; bench/against_memory.py measures it)."""
ROW_GRAIN = 128
"""Bands are whole multiples of this many rows (a quantized source's scale blocks: DeepSeek's FP8 is 128 x 128),
except a tensor's last."""


class SourceRows:
    """The release's tensors as the converter reads them (float32, a quantized Linear module's weight dequantized
    as its format says), by row ranges: each band read by byte range and dequantized alone (an FP8 weight with
    its scales' rows for those rows), so memory stays bounded whatever the tensor's size. One code path: a
    format whose stored tensors do not split by rows (GPTQ's [in/8, out]) is one band, the whole module."""

    def __init__(self, hf: Checkpoint, source: Source, band_bytes: int = BAND_BYTES) -> None:
        from kimi_audit.numerics.tensor_io import TensorFetcher

        self.hf, self.cfg, self.band_bytes = hf, hf.config, band_bytes
        self.fetch = TensorFetcher(source)
        self._last: tuple[str, int, int, np.ndarray] | None = None

    def drop(self) -> None:
        self._last = None

    def _module(self, name: str) -> tuple[str, Scheme, int, int] | None:
        """A quantized Linear module's (name, scheme, out, in); None for any other tensor (read as stored)."""
        return quantized_module(self.hf, name, lambda n: self.fetch.locate(n)[1].dtype)

    def shape(self, name: str) -> tuple[int, ...]:
        m = self._module(name)
        return (m[2], m[3]) if m is not None else tuple(self.fetch.locate(name)[1].shape)

    def scheme(self, name: str) -> Scheme | None:
        """The scheme of the quantized Linear module whose weight `name` is; None for any other tensor."""
        m = self._module(name)
        return None if m is None else m[1]

    def band(self, name: str) -> int:
        """The rows one band of the tensor holds (the whole tensor where its format's tensors do not split by
        rows)."""
        shape = self.shape(name) or (1,)
        row = 4 * math.prod(shape[1:])
        band = max(ROW_GRAIN, self.band_bytes // max(row, 1) // ROW_GRAIN * ROW_GRAIN)
        m = self._module(name)
        return band if m is None or _splits(m[1], m[2], m[3], band) else max(shape[0], 1)

    def _rows(self, name: str, start: int, stop: int) -> np.ndarray:
        """Rows [start, stop) (start a multiple of the band), float32; the last band kept for the next call."""
        import numpy as np

        if self._last is not None and self._last[:3] == (name, start, stop):
            return self._last[3]
        self._last = None
        m = self._module(name)
        if m is None:
            values = np.asarray(self.fetch.read_slice(name, start, stop), dtype=np.float32)
        else:
            module, scheme, out, inp = m
            full, part, before = scheme.stored(out, inp), scheme.stored(stop - start, inp), scheme.stored(start, inp)
            tensors = {}
            for f, p, b in zip(full, part, before):
                have = tuple(self.fetch.locate(module + f.suffix)[1].shape)
                if have != f.shape:
                    raise KimiAuditError(f"{module}{f.suffix} has shape {list(have)}, {scheme.describe()} stores "
                                         f"{list(f.shape)} for a [{out}, {inp}] weight")
                if f.shape == p.shape or not f.shape:  # not by rows (weight_shape, a global scale): whole
                    t = self.fetch.read_slice(module + f.suffix, 0, f.shape[0] if f.shape else 1)
                    if t.size == 2 and t.dtype.kind in "iu" and [int(v) for v in t.reshape(-1)] == [out, inp]:
                        t = np.asarray([stop - start, inp], dtype=t.dtype).reshape(t.shape)  # the band's [out, in]
                    tensors[f.suffix] = t
                else:
                    first = b.shape[0] if start else 0
                    tensors[f.suffix] = self.fetch.read_slice(module + f.suffix, first, first + p.shape[0])
            values = np.asarray(scheme.dequantize(tensors, stop - start, inp), dtype=np.float32)
        self._last = (name, start, stop, values)
        return values

    def rows(self, name: str, start: int, stop: int) -> np.ndarray:
        import numpy as np

        band, n = self.band(name), (self.shape(name) or (1,))[0]
        out = [self._rows(name, a, min(a + band, n))[max(start, a) - a: min(stop, a + band) - a]
               for a in range(start // band * band, stop, band)]
        return out[0] if len(out) == 1 else np.concatenate(out)

    def bands(self, name: str) -> Iterator[np.ndarray]:
        band, n = self.band(name), (self.shape(name) or (1,))[0]
        for a in range(0, n, band):
            yield self._rows(name, a, min(a + band, n))


def quantized_module(hf: Checkpoint, name: str, dtype_of: Callable[[str], str]) -> tuple[str, Scheme, int, int] | None:
    """The quantized Linear module whose weight `name` is, as (module, scheme, out, in) by the checkpoint's config
    and layout; None for any other tensor. `dtype_of`: a stored tensor's dtype (FP8 weights the config does not
    describe as such are read as DeepSeek's block FP8)."""
    if not name.endswith(".weight"):
        return None
    module = name[: -len(".weight")]
    scheme = scheme_of(hf.config, module)
    if isinstance(scheme, Unquantized):
        return None
    e = hf.expected.get(module + scheme.stored(1, 4096)[0].suffix)
    shape = None if e is None or not e.scheme else scheme.module_shape(e.shape, e.logical)
    if shape is None:
        return None
    main = scheme.stored(*shape)[0]
    if dtype_of(module + main.suffix) == FP8_DTYPE and main.dtype != FP8_DTYPE:
        scheme = Fp8Block(fp8_block(hf.config.quant))
    return module, scheme, *shape


def _splits(scheme: Scheme, out: int, inp: int, band: int) -> bool:
    """Whether every tensor the scheme stores for [out, in] is either the same whatever the rows (read whole) or
    the rows of its own first dimension, bands of `band` rows taking whole rows of it at regular steps."""
    n = -(-out // band)
    last = out - (n - 1) * band
    full, one, lead, tail = (scheme.stored(r, inp) for r in (out, band, (n - 1) * band, last))
    for f, o, ld, t in zip(full, one, lead, tail):
        if f.shape == o.shape or not f.shape:
            continue
        if f.shape[1:] != o.shape[1:] or (n > 1 and ld.shape[0] != (n - 1) * o.shape[0]):
            return False
        if (ld.shape[0] if n > 1 else 0) + t.shape[0] != f.shape[0]:
            return False
    return True


