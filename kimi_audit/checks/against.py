"""A GGUF set against the safetensors checkpoint it was converted from (`audit GGUF --against SOURCE`).

What llama.cpp's converter does with a release is its architecture's GGUF dialect's (model.arch: the metadata it
writes from config.json, the tensors it writes each release tensor into, the values it writes there). Checked:
- the metadata: every key the converter writes from the source's config.json, equal (AGAINST_METADATA);
- every release tensor accounted for, FP8 scales, rotary buffers and MTP layers excepted (AGAINST_UNACCOUNTED),
  and the element totals equal (AGAINST_TOTAL);
- with `--values`, the bytes of every tensor stored F32, F16, BF16 or Q8_0 equal to what ggml writes for the
  release's values (dequantized as the release's format says; numerics.ggml): one AGAINST_VALUES per part that
  differs, which is how a part swapped in from another upload shows. Other ggml types are counted, not compared
  (AGAINST_NOT_COMPARED).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from kimi_audit.checks.audit import AuditReport
from kimi_audit.errors import KimiAuditError
from kimi_audit.findings import Finding, error, info
from kimi_audit.format.gguf import GgufArray
from kimi_audit.format.gguf_types import GGML_BY_NAME
from kimi_audit.format.table import tensor_table
from kimi_audit.model.arch.registry import architecture_of, gguf_architecture, gguf_converts
from kimi_audit.model.arch.spec import GgufDialect
from kimi_audit.model.checkpoint import Checkpoint
from kimi_audit.model.kinds import PACKED, SCALE
from kimi_audit.model.layout import scheme_of
from kimi_audit.model.quant.deepseek import Fp8Block
from kimi_audit.model.quant.scheme import FP8_DTYPE, Scheme, Unquantized, fp8_block
from kimi_audit.sources.base import Source

if TYPE_CHECKING:
    import numpy as np

FIRST = 3
"""Names listed in a finding that covers several."""


def _same(expected: Any, actual: Any) -> bool:
    """A metadata value as the converter writes it: floats as float32, booleans as booleans."""
    if isinstance(expected, bool) or isinstance(actual, bool):
        return expected is actual
    if isinstance(expected, float) or isinstance(actual, float):
        numbers = isinstance(expected, int | float) and isinstance(actual, int | float)
        return numbers and struct.pack("<f", expected) == struct.pack("<f", actual)
    return bool(expected == actual)


def _plain(value: Any) -> Any:
    """A metadata value as a report holds it: an array as its values (or, where format.gguf keeps only its length,
    a description of it), never the reader's GgufArray."""
    if isinstance(value, GgufArray):
        return list(value.values) if value.values is not None else f"an array of {value.count:,} values"
    return value


def _listed(names: list[str]) -> str:
    return ", ".join(names[:FIRST]) + (f" and {len(names) - FIRST:,} more" if len(names) > FIRST else "")


def against_findings(gguf: Checkpoint, gguf_source: Source, hf: Checkpoint, hf_source: Source,
                     values: bool = False, progress: Callable[[str, int, int], None] | None = None,
                     missing: frozenset[str] = frozenset()) -> list[Finding]:
    """`missing`: GGUF tensors the audit already reports missing (TENSOR_MISSING): not said again here, and the
    element totals, which cannot agree then, not compared."""
    name = gguf.metadata.get("general.architecture")
    converts = gguf_converts(hf.config_raw, name)  # the source's architecture's dialect, a wrapper's text model too
    if gguf_architecture(name) is None or converts is None:
        model_type = hf.config_raw.get("model_type")
        why = (f"which llama.cpp does not convert to GGUF architecture {name!r}" if architecture_of(hf.config_raw)
               else "an architecture kimi-audit does not describe: what llama.cpp converts it to is not known here")
        return [error("AGAINST_ARCHITECTURE", f"{hf.label} is model_type {model_type!r}, {why}: not held to "
                      "this GGUF", actual=model_type)]
    dialect = converts
    out: list[Finding] = []
    for key, want in dialect.metadata(hf.config_raw).items():
        have = gguf.metadata.get(key)
        if not _same(want, have):
            want, have = _plain(want), _plain(have)
            out.append(error("AGAINST_METADATA", f"{key} is {have!r}; the converter writes {want!r} from "
                             f"{hf.label}'s config.json", tensor=key, expected=want, actual=have))
    stored, _ = tensor_table(gguf.headers)
    names = set(stored.names)
    source, _ = tensor_table(hf.headers)
    layers = hf.config.num_hidden_layers
    unaccounted: list[str] = []
    total = 0
    for name, shape in zip(source.names, source.shapes):
        e = hf.expected.get(name)
        if e is not None and e.kind == SCALE:
            continue
        spelled = name.rsplit(".", 1)[0] + ".weight" if e is not None and e.kind == PACKED else name
        targets = dialect.converted(spelled, layers, names)
        if not targets:
            continue
        total += e.logical if e is not None else math.prod(shape)
        if not all(t in names or t in missing for t in targets):
            unaccounted.append(name)
    if unaccounted:
        out.append(error("AGAINST_UNACCOUNTED", f"{len(unaccounted):,} tensors of {hf.label} are in no GGUF tensor "
                         f"the converter writes them to ({_listed(unaccounted)})", tensor=unaccounted[0],
                         covers=len(unaccounted)))
    stored_total = sum(map(math.prod, stored.shapes))
    if total != stored_total and not missing and not unaccounted:
        out.append(error("AGAINST_TOTAL", f"the GGUF holds {stored_total:,} elements, {hf.label}'s tensors (scales, "
                         f"buffers and MTP layers excepted) {total:,}", expected=total, actual=stored_total))
    keys = len(dialect.metadata(hf.config_raw))
    out.append(info("AGAINST_HELD", f"held against {hf.label}: {keys:,} metadata keys, {len(source.names):,} source "
                    f"tensors accounted for in {len(stored.names):,} GGUF tensors, element totals"
                    + ("" if values else "; values not compared: add --values"), actual=hf.label))
    if values:
        out.extend(_value_findings(gguf, gguf_source, hf, hf_source, stored, dialect, progress))
    return out


BAND_BYTES = 1 << 24
"""The float32 values one piece of a comparison holds at most (16 MiB: the source's band, its encoding and the
GGUF's bytes for it stay under ~150 MB whatever the tensor's size; bench/against_memory.py measures it)."""
ROW_GRAIN = 128
"""Bands are whole multiples of this many rows (a quantized source's scale blocks: DeepSeek's FP8 is 128 x 128),
except a tensor's last."""


def _value_findings(gguf: Checkpoint, gguf_source: Source, hf: Checkpoint, hf_source: Source, stored: Any,
                    dialect: GgufDialect, progress: Callable[[str, int, int], None] | None) -> list[Finding]:
    from kimi_audit.numerics.ggml import ENCODED
    from kimi_audit.numerics.ggml_quants import is_quantized

    cfg = hf.config
    reader = SourceRows(hf, hf_source)
    differ: dict[str, list[str]] = {}
    compared, not_compared, unread = 0, [], []
    worst: dict[str, tuple[float, str]] = {}  # ggml type -> (its largest relative error, the tensor)
    rows = list(zip(stored.names, stored.dtypes, stored.shapes, stored.shards, stored.begins, stored.ends))
    for done, (name, dtype, shape, part, begin, end) in enumerate(rows, 1):
        if progress:
            progress(name, done, len(rows))
        if dtype not in ENCODED and not is_quantized(dtype):
            not_compared.append(name)
            continue
        start = gguf.headers[part].data_start
        try:
            want = dialect.release_values(name, reader, cfg.n_routed_experts or 0, cfg.num_attention_heads,
                                          cfg.qk_nope_head_dim)
            if want is None:
                continue
            if dtype in ENCODED:
                same = _same_bytes(want, shape, dtype, gguf_source, part, start + begin, start + end)
            else:
                rel = _relative_error(want, shape, dtype, gguf_source, part, start + begin, start + end)
                same = rel is not None and rel <= error_bound(dtype)
                if rel is not None and rel > worst.get(dtype, (-1.0, ""))[0]:
                    worst[dtype] = (rel, name)
        except (KimiAuditError, MemoryError) as e:  # the source unreadable, or too large for this machine
            unread.append((name, str(e) or type(e).__name__))
            reader.drop()
            continue
        compared += 1
        if not same:
            differ.setdefault(part, []).append(name)
    out = [error("AGAINST_VALUES", f"{part}: {len(names):,} tensors differ from what the converter writes from "
                 f"{hf.label} ({_listed(names)}): a part from another conversion or upload?", tensor=names[0],
                 shard=part, covers=len(names)) for part, names in differ.items()]
    if unread:
        out.append(error("AGAINST_UNREAD", f"{len(unread):,} tensors could not be compared with {hf.label}'s values "
                         f"({_listed([n for n, _ in unread])}): {unread[0][0]}: {unread[0][1]}",
                         tensor=unread[0][0], covers=len(unread)))
    bounds = ", ".join(f"{t} {rel:.3g}/{error_bound(t):.3g}" for t, (rel, _) in sorted(worst.items()))
    out.append(info("AGAINST_CHECKED", f"{compared:,} tensors compared with {hf.label}'s values: F32/F16/BF16/Q8_0 "
                    "byte for byte, other types dequantized within their type's relative error bound"
                    f"{' (worst/bound: ' + bounds + ')' if bounds else ''}", actual=compared,
                    tensor=max(worst.values())[1] if worst else None))
    if not_compared:
        out.append(info("AGAINST_NOT_COMPARED", f"{len(not_compared):,} tensors in types kimi-audit cannot decode "
                        f"were not compared ({_listed(not_compared)})", tensor=not_compared[0],
                        covers=len(not_compared)))
    return out


def error_bound(dtype: str) -> float:
    """The relative RMS error ||dequantized - source|| / ||source|| a ggml type's quantization of a release tensor
    stays within. A block of b-bit codes scaled to its absolute maximum rounds each value by at most half a step,
    amax / (2^b - 1), and the RMS of a rounding error spread evenly over that is step / (2 sqrt 3): relative to the
    block's RMS, 0.58 (amax / rms) / (2^b - 1). The bound takes b as the type's bits per weight (its block's bytes x
    8 / its values, scales included) and allows amax / rms up to 5.2 (heavy-tailed blocks; a Gaussian block of 32
    to 256 values has about 2.5 to 3): 3 / (2^b - 1), at most 0.95. A tensor from another model, layer or expert
    (uncorrelated values of the same scale) is off by about sqrt 2 = 1.41. tests/test_gguf.py measures the worst
    tensor of each type llama-quantize wrote against it."""
    t = GGML_BY_NAME[dtype]
    bits = t.size * 8 / t.block
    return float(min(0.95, 3.0 / (2.0 ** bits - 1)))


def _relative_error(want: tuple[tuple[int, ...], Iterator[np.ndarray]], shape: tuple[int, ...], dtype: str,
                    gguf_source: Source, part: str, begin: int, end: int) -> float | None:
    """The relative RMS error of the GGUF tensor's bytes [begin, end) of `part`, dequantized (gguf-py), against
    the expected values, piece by piece (each piece's whole rows read by range); None where the shapes or sizes
    disagree (a tensor from another model)."""
    import numpy as np

    from kimi_audit.numerics.ggml_quants import dequantize
    from kimi_audit.numerics.tensor_io import read_exact

    expected, pieces = want
    if tuple(expected) != tuple(shape) or not shape:
        return None
    row_bytes = GGML_BY_NAME[dtype].nbytes(shape[-1])
    at, err, ref = begin, 0.0, 0.0
    for piece in pieces:
        values = np.asarray(piece, dtype=np.float32)
        if values.ndim == 0 or values.shape[-1] != shape[-1]:
            return None
        rows = values.size // shape[-1]
        if at + rows * row_bytes > end:
            return None
        got = dequantize(read_exact(gguf_source, part, at, rows * row_bytes), dtype, (rows, shape[-1]))
        at += rows * row_bytes
        diff = got.astype(np.float64) - values.reshape(rows, shape[-1])
        err += float(np.sum(diff * diff))
        ref += float(np.sum(values.astype(np.float64) ** 2))
    if at != end:
        return None
    return math.sqrt(err / ref) if ref else (0.0 if err == 0 else math.inf)


def _same_bytes(want: tuple[tuple[int, ...], Iterator[np.ndarray]], shape: tuple[int, ...], dtype: str,
                gguf_source: Source, part: str, begin: int, end: int) -> bool:
    """Whether the GGUF tensor's bytes [begin, end) of `part` are ggml's encoding of the expected values, compared
    piece by piece (each piece's bytes read by range): as they are, or (Q8_0) rounded through BF16 first, one
    reading for the whole tensor."""
    import numpy as np

    from kimi_audit.numerics.ggml import encode
    from kimi_audit.numerics.tensor_io import read_exact

    expected, pieces = want
    if tuple(expected) != tuple(shape):
        return False
    readings = {"as is", "bf16"} if dtype == "Q8_0" else {"as is"}
    at, elements = begin, 0
    for piece in pieces:
        values = np.asarray(piece, dtype=np.float32)
        if values.ndim == 0 or (len(shape) > 1 and values.shape[-1] != shape[-1]):
            return False
        elements += values.size
        if elements > math.prod(shape):
            return False
        encoded = encode(values, dtype)
        raw = read_exact(gguf_source, part, at, len(encoded))
        at += len(encoded)
        if raw != encoded:
            readings.discard("as is")
        if "bf16" in readings:
            rounded = encode_bf16(values)
            if raw != (encoded if np.array_equal(rounded, values) else encode(rounded, dtype)):
                readings.discard("bf16")
        if not readings:
            return False
    return at == end and elements == math.prod(shape)


class SourceRows:
    """The release's tensors as the converter reads them (float32, a quantized Linear module's weight dequantized
    as its format says), by row ranges: each band read by byte range and dequantized alone (an FP8 weight with
    its scales' rows for those rows), so memory stays bounded whatever the tensor's size. One code path: a
    format whose stored tensors do not split by rows (GPTQ's [in/8, out]) is one band, the whole module."""

    def __init__(self, hf: Checkpoint, source: Source) -> None:
        from kimi_audit.numerics.tensor_io import TensorFetcher

        self.hf, self.cfg = hf, hf.config
        self.fetch = TensorFetcher(source)
        self._last: tuple[str, int, int, np.ndarray] | None = None

    def drop(self) -> None:
        self._last = None

    def _module(self, name: str) -> tuple[str, Scheme, int, int] | None:
        """A quantized Linear module's (name, scheme, out, in); None for any other tensor (read as stored)."""
        if not name.endswith(".weight"):
            return None
        module = name[: -len(".weight")]
        scheme = scheme_of(self.cfg, module)
        if isinstance(scheme, Unquantized):
            return None
        e = self.hf.expected.get(module + scheme.stored(1, 4096)[0].suffix)
        shape = None if e is None or not e.scheme else scheme.module_shape(e.shape, e.logical)
        if shape is None:
            return None
        main = scheme.stored(*shape)[0]
        if self.fetch.locate(module + main.suffix)[1].dtype == FP8_DTYPE and main.dtype != FP8_DTYPE:
            scheme = Fp8Block(fp8_block(self.cfg.quant))  # FP8 weights the config does not describe as such
        return module, scheme, *shape

    def shape(self, name: str) -> tuple[int, ...]:
        m = self._module(name)
        return (m[2], m[3]) if m is not None else tuple(self.fetch.locate(name)[1].shape)

    def _band(self, name: str) -> int:
        shape = self.shape(name) or (1,)
        row = 4 * math.prod(shape[1:])
        band = max(ROW_GRAIN, BAND_BYTES // max(row, 1) // ROW_GRAIN * ROW_GRAIN)
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

        band, n = self._band(name), (self.shape(name) or (1,))[0]
        out = [self._rows(name, a, min(a + band, n))[max(start, a) - a: min(stop, a + band) - a]
               for a in range(start // band * band, stop, band)]
        return out[0] if len(out) == 1 else np.concatenate(out)

    def bands(self, name: str) -> Iterator[np.ndarray]:
        band, n = self._band(name), (self.shape(name) or (1,))[0]
        for a in range(0, n, band):
            yield self._rows(name, a, min(a + band, n))


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


def encode_bf16(values: np.ndarray) -> np.ndarray:
    """The values rounded through BF16 (a converter run with `--outtype bf16`, quantized after)."""
    import ml_dtypes
    import numpy as np

    return np.asarray(values, dtype=np.float32).astype(ml_dtypes.bfloat16).astype(np.float32)


def apply_against(report: AuditReport, gguf_source: Source, hf_source: Source, values: bool = False,
                  progress: Callable[[str, int, int], None] | None = None) -> AuditReport:
    """The audit of a GGUF set with its findings against the checkpoint it was converted from added."""
    from kimi_audit.model.checkpoint import load_checkpoint

    gguf = report.checkpoint
    if gguf is None or gguf.container != "gguf":
        raise KimiAuditError("--against compares a GGUF set with its source: audit a GGUF file or folder")
    hf = load_checkpoint(hf_source)
    if hf.container == "gguf":
        raise KimiAuditError(f"--against {hf_source.label}: a GGUF set; give the safetensors checkpoint it was "
                             "converted from")
    missing = frozenset(str(f.tensor) for f in report.findings if f.code == "TENSOR_MISSING")
    found = against_findings(gguf, gguf_source, hf, hf_source, values, progress, missing)
    return replace(report, findings=report.findings + tuple(found), against=hf.label)
