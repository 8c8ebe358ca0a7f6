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
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from kimi_audit.checks.audit import AuditReport
from kimi_audit.errors import KimiAuditError
from kimi_audit.findings import Finding, error, info
from kimi_audit.format.table import tensor_table
from kimi_audit.model.arch.registry import architecture_of, gguf_architecture
from kimi_audit.model.checkpoint import Checkpoint
from kimi_audit.model.kinds import PACKED, SCALE
from kimi_audit.model.layout import scheme_of
from kimi_audit.model.quant.scheme import Unquantized
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


def _listed(names: list[str]) -> str:
    return ", ".join(names[:FIRST]) + (f" and {len(names) - FIRST:,} more" if len(names) > FIRST else "")


def against_findings(gguf: Checkpoint, gguf_source: Source, hf: Checkpoint, hf_source: Source,
                     values: bool = False, progress: Callable[[str, int, int], None] | None = None,
                     missing: frozenset[str] = frozenset()) -> list[Finding]:
    """`missing`: GGUF tensors the audit already reports missing (TENSOR_MISSING): not said again here, and the
    element totals, which cannot agree then, not compared."""
    arch = gguf_architecture(gguf.metadata.get("general.architecture"))
    if arch is None or arch.gguf is None or architecture_of(hf.config_raw) is not arch:
        return [error("AGAINST_ARCHITECTURE", f"{hf.label} is model_type {hf.config_raw.get('model_type')!r}, which "
                      f"llama.cpp does not convert to GGUF architecture "
                      f"{gguf.metadata.get('general.architecture')!r}: not the source of this GGUF",
                      actual=hf.config_raw.get("model_type"))]
    dialect = arch.gguf
    out: list[Finding] = []
    for key, want in dialect.metadata(hf.config_raw).items():
        have = gguf.metadata.get(key)
        if not _same(want, have):
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
    if values:
        out.extend(_value_findings(gguf, gguf_source, hf, hf_source, stored, progress))
    return out


def _value_findings(gguf: Checkpoint, gguf_source: Source, hf: Checkpoint, hf_source: Source, stored: Any,
                    progress: Callable[[str, int, int], None] | None) -> list[Finding]:
    import numpy as np

    from kimi_audit.checks.rmsnorm import linear_weight
    from kimi_audit.numerics.ggml import ENCODED, encode
    from kimi_audit.numerics.tensor_io import TensorFetcher, read_exact

    arch = gguf_architecture(gguf.metadata.get("general.architecture"))
    assert arch is not None and arch.gguf is not None
    cfg = hf.config
    fetch = TensorFetcher(hf_source)

    def read(name: str) -> np.ndarray:
        module = name[: -len(".weight")]
        scheme = scheme_of(cfg, module) if name.endswith(".weight") else None
        if scheme is not None and not isinstance(scheme, Unquantized):  # a quantized Linear module: dequantized
            e = hf.expected.get(module + scheme.stored(1, 4096)[0].suffix)
            shape = None if e is None or not e.scheme else scheme.module_shape(e.shape, e.logical)
            if shape is not None:
                return np.asarray(linear_weight(fetch, cfg, module, *shape), dtype=np.float32)
        return np.asarray(fetch.read(name)[0], dtype=np.float32)

    differ: dict[str, list[str]] = {}
    compared, not_compared = 0, []
    rows = list(zip(stored.names, stored.dtypes, stored.shapes, stored.shards, stored.begins, stored.ends))
    for done, (name, dtype, shape, part, begin, end) in enumerate(rows, 1):
        if progress:
            progress(name, done, len(rows))
        if dtype not in ENCODED:
            not_compared.append(name)
            continue
        want = arch.gguf.release_values(name, read, cfg.n_routed_experts or 0, cfg.num_attention_heads,
                                        cfg.qk_nope_head_dim)
        if want is None:
            continue
        compared += 1
        raw = read_exact(gguf_source, part, gguf.headers[part].data_start + begin, end - begin)
        if want.shape != shape or (raw != encode(want, dtype) and not (
                dtype == "Q8_0" and raw == encode(encode_bf16(want), dtype))):
            differ.setdefault(part, []).append(name)
    out = [error("AGAINST_VALUES", f"{part}: {len(names):,} tensors differ from what the converter writes from "
                 f"{hf.label} ({_listed(names)}): a part from another conversion or upload?", tensor=names[0],
                 shard=part, covers=len(names)) for part, names in differ.items()]
    out.append(info("AGAINST_CHECKED", f"{compared:,} tensors compared byte for byte with what ggml writes for "
                    f"{hf.label}'s values", actual=compared))
    if not_compared:
        out.append(info("AGAINST_NOT_COMPARED", f"{len(not_compared):,} tensors in types whose encoding kimi-audit "
                        f"does not compute (K-quants, IQ types) were not compared ({_listed(not_compared)})",
                        tensor=not_compared[0], covers=len(not_compared)))
    return out


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
