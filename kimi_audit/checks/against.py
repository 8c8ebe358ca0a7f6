"""A GGUF set against the safetensors checkpoint it was converted from (`audit GGUF --against SOURCE`).

What llama.cpp's converter does with a release is its architecture's GGUF dialect's (model.arch: the metadata it
writes from config.json, the tensors it writes each release tensor into, the values it writes there). Checked:
- the metadata: every key the converter writes from the source's config.json, equal (AGAINST_METADATA);
- every release tensor accounted for, FP8 scales, rotary buffers and MTP layers excepted (AGAINST_UNACCOUNTED),
  and the element totals equal (AGAINST_TOTAL);
- with `--values`, the bytes of every tensor stored F32, F16, BF16 or Q8_0 equal to what ggml writes for the
  release's values (dequantized as the release's format says; numerics.ggml): one AGAINST_VALUES per part that
  differs, which is how a part swapped in from another upload shows; the mmproj beside the model held to the
  source's vision tower as its converter writes it (the dialect's `GgufProjector.release_values`). Other ggml types,
  and tensors whose converter transform is not modelled, are counted with the reason, not compared
  (AGAINST_NOT_COMPARED): none is skipped without a word.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from kimi_audit.checks.audit import AuditReport
from kimi_audit.checks.rows import BAND_BYTES, SourceRows
from kimi_audit.errors import KimiAuditError
from kimi_audit.findings import Finding, error, info
from kimi_audit.format.gguf import GgufArray
from kimi_audit.format.gguf_types import GGML_BY_NAME, ggml_dims
from kimi_audit.format.table import tensor_table
from kimi_audit.model.arch.registry import architecture_of, gguf_architecture, gguf_converts
from kimi_audit.model.arch.spec import GgufDialect
from kimi_audit.model.checkpoint import Checkpoint
from kimi_audit.model.kinds import PACKED, SCALE
from kimi_audit.model.quant import bounds
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


def same_dims(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    """Two shapes llama.cpp takes for one (format.gguf_types.ggml_dims)."""
    return ggml_dims(a) == ggml_dims(b)


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
    for key, want in converted_metadata(dialect, hf.config_raw, gguf.metadata).items():
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
        elements = e.logical if e is not None else math.prod(shape)
        total += elements if dialect.written is None else dialect.written(spelled, elements, hf.config)
        if not all(t in names or t in missing for t in targets):
            unaccounted.append(name)
    if unaccounted:
        out.append(error("AGAINST_UNACCOUNTED", f"{len(unaccounted):,} tensors of {hf.label} are in no GGUF tensor "
                         f"the converter writes them to ({_listed(unaccounted)})", tensor=unaccounted[0],
                         covers=len(unaccounted)))
    projector = dialect.projector
    if projector is not None and projector.output in names:  # the mmproj beside the model: what it copies again
        total += projector.repeated(hf.config_raw)
    stored_total = sum(map(math.prod, stored.shapes))
    if total != stored_total and not missing and not unaccounted:
        out.append(error("AGAINST_TOTAL", f"the GGUF holds {stored_total:,} elements, {hf.label}'s tensors (scales, "
                         f"buffers and MTP layers excepted) {total:,}", expected=total, actual=stored_total))
    keys = len(converted_metadata(dialect, hf.config_raw, gguf.metadata))
    out.append(info("AGAINST_HELD", f"held against {hf.label}: {keys:,} metadata keys, {len(source.names):,} source "
                    f"tensors accounted for in {len(stored.names):,} GGUF tensors, element totals"
                    + ("" if values else "; values not compared: add --values"), actual=hf.label))
    if values:
        out.extend(_value_findings(gguf, gguf_source, hf, hf_source, stored, dialect, progress))
    return out


def _value_findings(gguf: Checkpoint, gguf_source: Source, hf: Checkpoint, hf_source: Source, stored: Any,
                    dialect: GgufDialect, progress: Callable[[str, int, int], None] | None) -> list[Finding]:
    from kimi_audit.numerics.ggml import ENCODED
    from kimi_audit.numerics.ggml_quants import is_quantized

    cfg = hf.config
    reader = SourceRows(hf, hf_source, BAND_BYTES)
    differ: dict[str, list[str]] = {}
    compared: dict[str, int] = {}  # part -> tensors compared
    not_compared: list[tuple[str, str]] = []  # (tensor, why)
    unread: list[tuple[str, str]] = []
    worst: dict[str, tuple[float, str]] = {}  # ggml type -> (its largest relative error, the tensor)
    rows = list(zip(stored.names, stored.dtypes, stored.shapes, stored.shards, stored.begins, stored.ends))
    for done, (name, dtype, shape, part, begin, end) in enumerate(rows, 1):
        if progress:
            progress(name, done, len(rows))
        if dtype not in ENCODED and not is_quantized(dtype):
            not_compared.append((name, f"{dtype}, a type kimi-audit cannot decode"))
            continue
        start = gguf.headers[part].data_start
        try:
            want: tuple[tuple[int, ...], Iterator[Any]] | str | None = dialect.release_values(
                name, reader, cfg.n_routed_experts or 0, cfg.num_attention_heads, cfg.qk_nope_head_dim)
            if want is None and dialect.projector is not None:  # the mmproj beside the model: its own converter
                want = dialect.projector.release_values(name, reader, hf.config_raw)
            if want is None or isinstance(want, str):
                not_compared.append((name, want or "no release tensor the converter writes there is modelled"))
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
        compared[part] = compared.get(part, 0) + 1
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
    total = sum(compared.values())
    where = ", ".join(f"{n:,} of {part}" for part, n in compared.items())
    out.append(info("AGAINST_CHECKED", f"{total:,} of the {len(rows):,} GGUF tensors compared with {hf.label}'s "
                    f"values{' (' + where + ')' if where else ''}: F32/F16/BF16/Q8_0 and integers byte for byte, "
                    "other types dequantized within their type's relative error bound"
                    f"{' (worst/bound: ' + bounds + ')' if bounds else ''}", actual=total,
                    tensor=max(worst.values())[1] if worst else None))
    if not_compared:
        why = "; ".join(dict.fromkeys(w for _, w in not_compared))
        out.append(info("AGAINST_NOT_COMPARED", f"{len(not_compared):,} tensors were not compared "
                        f"({_listed([n for n, _ in not_compared])}): {why}", tensor=not_compared[0][0],
                        covers=len(not_compared)))
    return out


def converted_metadata(dialect: GgufDialect, raw: Mapping[str, Any], held: Mapping[str, Any]) -> dict[str, Any]:
    """The keys the converter writes from `raw`, run as the file says it was: with `--no-mtp` (llama.cpp's
    DeepseekV2Model, Glm4MoeModel: the NextN layers dropped, `nextn_predict_layers` not written, `block_count` the
    main layers) where the source declares NextN layers and the file holds no nextn_predict_layers key."""
    wanted: dict[str, Any] = dialect.metadata(raw)
    nextn = raw.get("num_nextn_predict_layers")
    if isinstance(nextn, int) and nextn > 0 and not any(k.endswith(".nextn_predict_layers") for k in held):
        return {k: v for k, v in dialect.metadata({**raw, "num_nextn_predict_layers": 0}).items()
                if not k.endswith(".nextn_predict_layers")}
    return wanted


def error_bound(dtype: str) -> float:
    """The relative RMS error ||dequantized - source|| / ||source|| a ggml type's quantization of a release tensor
    stays within: a uniform grid (model.quant.bounds.uniform_grid, derived there) with b the type's bits per weight
    (its block's bytes x 8 / its values, scales included): 3 / (2^b - 1), at most 0.95. A tensor from another
    model, layer or expert is off by about sqrt 2 = 1.41. tests/test_gguf.py measures the worst tensor of each type
    llama-quantize wrote against it."""
    t = GGML_BY_NAME[dtype]
    return bounds.uniform_grid(t.size * 8 / t.block)


def _relative_error(want: tuple[tuple[int, ...], Iterator[np.ndarray]], shape: tuple[int, ...], dtype: str,
                    gguf_source: Source, part: str, begin: int, end: int) -> float | None:
    """The relative RMS error of the GGUF tensor's bytes [begin, end) of `part`, dequantized (gguf-py), against
    the expected values, piece by piece (each piece's whole rows read by range); None where the shapes or sizes
    disagree (a tensor from another model)."""
    import numpy as np

    from kimi_audit.numerics.ggml_quants import dequantize
    from kimi_audit.numerics.tensor_io import read_exact

    expected, pieces = want
    if not same_dims(expected, shape) or not shape:
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

    from kimi_audit.numerics.ggml import INTEGERS, encode
    from kimi_audit.numerics.tensor_io import read_exact

    expected, pieces = want
    if not same_dims(expected, shape):
        return False
    readings = {"as is", "bf16"} if dtype == "Q8_0" else {"as is"}
    at, elements = begin, 0
    for piece in pieces:
        values = np.asarray(piece) if dtype in INTEGERS else np.asarray(piece, dtype=np.float32)
        if values.ndim == 0 or (len(shape) > 1 and values.shape[-1] != shape[-1]):
            return False
        elements += values.size
        if elements > math.prod(shape):
            return False
        try:
            encoded = encode(values, dtype)
        except ValueError:  # not integers an integer type holds
            return False
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


def encode_bf16(values: np.ndarray) -> np.ndarray:
    """The values rounded through BF16 (a converter run with `--outtype bf16`, quantized after)."""
    import ml_dtypes
    import numpy as np

    return np.asarray(values, dtype=np.float32).astype(ml_dtypes.bfloat16).astype(np.float32)


def apply_against(report: AuditReport, gguf_source: Source, hf_source: Source, values: bool = False,
                  progress: Callable[[str, int, int], None] | None = None) -> AuditReport:
    """The audit of a GGUF set with its findings against the checkpoint it was converted from added; of a
    safetensors release, against the checkpoint it was quantized from (checks.same_model)."""
    from kimi_audit.model.checkpoint import load_checkpoint

    gguf = report.checkpoint
    if gguf is None:
        raise KimiAuditError("--against: the checkpoint audited could not be read")
    hf = load_checkpoint(hf_source)
    if gguf.container != "gguf":
        from kimi_audit.checks.same_model import same_model_findings

        if hf.container == "gguf":
            raise KimiAuditError(f"--against {hf_source.label}: a GGUF set; a safetensors release is held to the "
                                 "safetensors checkpoint it was quantized from")
        found = same_model_findings(gguf, gguf_source, hf, hf_source, values, progress)
        return replace(report, findings=report.findings + tuple(found), against=hf.label)
    if hf.container == "gguf":
        raise KimiAuditError(f"--against {hf_source.label}: a GGUF set; give the safetensors checkpoint it was "
                             "converted from")
    missing = frozenset(str(f.tensor) for f in report.findings if f.code == "TENSOR_MISSING")
    found = against_findings(gguf, gguf_source, hf, hf_source, values, progress, missing)
    if values:  # held to one source, a part in another quant's types is no longer a dynamic quant's choice
        found += [error("AGAINST_QUANT_MIXED", f"{f.shard}: stored in another quant's types than the set's other parts "
                        f"({f.actual} where they use {f.expected}), its values {hf.label}'s within their bounds: a "
                        "part from another upload of the same model, not this set's", shard=f.shard,
                        expected=f.expected, actual=f.actual)
                  for f in report.findings if f.code == "GGUF_QUANT_MIXED"]
    return replace(report, findings=report.findings + tuple(found), against=hf.label)
