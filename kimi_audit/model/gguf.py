"""A GGUF set as a Checkpoint: the same audit as a safetensors checkpoint's, with a second container.

The set's parts are read (format.gguf) and checked as a set (format.gguf_split); part 1's metadata is read back
into the config.json it implies by the architecture's GGUF dialect (model.arch's `GgufDialect`, found by
`general.architecture`); the expected layout is that config's, in the tree llama.cpp's converter writes
(the `gguf` quantization scheme), spelled in GGUF's names, each weight's ggml type the one stored where it is a
type llama.cpp keeps a weight in and its blocks divide the row.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from kimi_audit.constants import GGUF_SUFFIX, SAFETENSORS_SUFFIX
from kimi_audit.errors import ConfigError, GgufKeyError, GgufSetError
from kimi_audit.findings import Finding, error, warning
from kimi_audit.format.columns import label
from kimi_audit.format.gguf import GgufPart, read_gguf_part
from kimi_audit.format.gguf_keys import (
    LOADER_KEYS,
    UNDESCRIBED,
    loader_required,
    loader_value_findings,
    mistyped,
    wrong_lengths,
)
from kimi_audit.format.gguf_split import NOT_MODELS, SPLIT_NO, gguf_sets, not_a_model, part_number
from kimi_audit.format.gguf_types import GGML_BY_NAME, ggml_dims
from kimi_audit.format.header import ShardHeader
from kimi_audit.model.arch.registry import gguf_architecture
from kimi_audit.model.config import model_config_from_dict
from kimi_audit.model.config_fields import ModelConfig, unsupported_config
from kimi_audit.model.dialect import respelled
from kimi_audit.model.kinds import BLOCK_NAME
from kimi_audit.model.layout import ExpectedLayout, expected_layout
from kimi_audit.model.quant.gguf import GGML_ANY
from kimi_audit.model.quant.scheme import fits
from kimi_audit.sources.base import Source
from kimi_audit.sources.selected import set_globs

GENERAL_ARCHITECTURE = "general.architecture"
GGUF_ARCHITECTURE = "gguf_architecture"
"""The key of config_raw (what the metadata implies) holding general.architecture where no dialect reads it."""


def is_gguf(files: Iterable[str]) -> bool:
    """GGUF files and no safetensors file: a GGUF checkpoint."""
    files = tuple(files)
    return any(f.endswith(GGUF_SUFFIX) for f in files) and not any(f.endswith(SAFETENSORS_SUFFIX) for f in files)


def _kind(part: GgufPart) -> str | None:
    """What a file that is not a model is (format.gguf_split.not_a_model), UNREADABLE for a header that did not
    parse (its GGUF_INVALID says why), None for a model."""
    if not part.version:
        return UNREADABLE
    return not_a_model(part.kv, part.header.columns.names)


UNREADABLE = "unreadable"


def posing_parts(parts: Mapping[str, GgufPart]) -> set[str]:
    """The files named as parts of the set that are no model (an imatrix or a projector renamed
    `X-00002-of-00004.gguf`): not parts llama.cpp's loader reads, whatever their names; model.gguf_beside names
    each, and the set lacks the part they stand in for."""
    return {n for n, p in parts.items() if _kind(p) not in (None, UNREADABLE)}


def choose_set(source: Source, files: Iterable[str]) -> tuple[list[str], dict[str, GgufPart]]:
    """The one GGUF model set among `files`, and every file whose header was read to tell (the others among them:
    an imatrix or an mmproj file, which are not models, by what llama.cpp reads them by: format.gguf_split; a file
    whose header does not parse, which is no second model to choose; model.gguf_beside names each).

    An unsplit file is read to tell; so is a file named as a split part of a set that also holds an unsplit file
    (`X.gguf` beside `X-00002-of-00002.gguf`: no split set llama.cpp writes), which may be a projector or an imatrix
    renamed into the set's names."""
    sets = gguf_sets(files)
    read: dict[str, GgufPart] = {}
    others: list[str] = []
    unreadable: list[str] = []
    for key, names in list(sets.items()):
        unsplit = [n for n in names if part_number(n) is None]
        probe = names if unsplit else []
        for name in probe:
            read[name] = read_gguf_part(source, name)
            kind = _kind(read[name])
            if kind == UNREADABLE:
                unreadable.append(name)
            elif kind is not None:
                others.append(name)
                names.remove(name)
        if not names:
            del sets[key]
    readable = {k: [n for n in v if n not in unreadable] for k, v in sets.items()}
    if any(readable.values()):  # a file that cannot be read is no second model: the readable set is audited
        sets = {k: v for k, v in readable.items() if v}
    if not sets:
        said = "; ".join(f"{n} is {NOT_MODELS[str(_kind(read[n]))]}" for n in others[:3])
        raise GgufSetError(f"no GGUF model file here{': ' + said if said else ''}. Audit the folder that holds the "
                           "model and these files beside it")
    if len(sets) > 1:
        listed = ", ".join(sorted(sets)[:6]) + (f" and {len(sets) - 6} more" if len(sets) > 6 else "")
        glob = set_globs(sets[sorted(sets)[0]][0])[0]  # the first set's exact glob: it selects that set alone
        raise GgufSetError(f"{len(sets)} GGUF sets here ({listed}): choose one, e.g. --include '{glob}', or name "
                           "one of its files")
    return next(iter(sets.values())), read


def with_stored_types(layout: ExpectedLayout, headers: dict[str, ShardHeader]) -> ExpectedLayout:
    """The layout as llama.cpp's loader holds the stored tensors to it: each GGUF weight's dtype the ggml type
    stored for it, where that is a weight type whose block divides the row (a weight stored otherwise keeps
    GGML_ANY, which no stored type equals); and each shape as stored where it is the expected one without the
    leading 1s ggml's writers leave out (format.gguf_types.ggml_dims: llama-quantize and llama-gguf-split store a
    convolution (1, d, 1, k) as (d, 1, k), which the loader reads alike)."""
    stored = {n: (d, s) for h in headers.values() for n, d, s in zip(h.columns.names, h.columns.dtypes,
                                                                    h.columns.shapes)}
    specs, spec_of = list(layout.specs), list(layout.spec_of)
    made: dict[tuple[int, str, tuple[int, ...]], int] = {}
    for p, name in enumerate(layout.names):
        s = specs[spec_of[p]]
        dtype, shape = stored.get(name, ("", s.shape))
        t = GGML_BY_NAME.get(dtype) if s.dtype == GGML_ANY else None
        if t is not None and not fits(s.dtype, t.name, s.shape):
            t = None
        trimmed = shape != s.shape and ggml_dims(shape) == ggml_dims(s.shape)
        if t is None and not trimmed:
            continue
        key = (spec_of[p], t.name if t is not None else s.dtype, shape if trimmed else s.shape)
        if key not in made:
            made[key] = len(specs)
            spec = s._replace(shape=key[2])
            specs.append(spec if t is None else spec._replace(dtype=t.name, nbytes=t.nbytes(math.prod(s.shape))))
        spec_of[p] = made[key]
    return ExpectedLayout(layout.names, spec_of, specs, layout.layer_of, layout.meta_at, layout.meta_owner)


ProgressFn = Callable[[str, int, int], None]


def read_set(source: Source, names: list[str], progress: ProgressFn | None = None,
             read: Mapping[str, GgufPart] | None = None) -> dict[str, GgufPart]:
    """The set's parts (those in `read` already read)."""
    parts: dict[str, GgufPart] = {}
    for done, name in enumerate(names, 1):
        parts[name] = (read or {}).get(name) or read_gguf_part(source, name)
        if progress:
            progress(name, done, len(names))
    return parts


def first_part(parts: dict[str, GgufPart]) -> GgufPart | None:
    """Part 1 (split.no 0), which alone carries the model's metadata; else the first readable part; None when no
    part could be read (each part's GGUF_INVALID says why)."""
    readable = [p for p in parts.values() if p.kv]
    for p in readable:
        if p.kv.get(SPLIT_NO, 0) == 0 and GENERAL_ARCHITECTURE in p.kv:
            return p
    return readable[0] if readable else None


def gguf_names(parts: dict[str, GgufPart]) -> Callable[[str], str]:
    """How the set spells the tree's names: its architecture's GGUF dialect (unchanged where none reads it)."""
    first = first_part(parts)
    arch = gguf_architecture(None if first is None else first.kv.get(GENERAL_ARCHITECTURE))
    return str if arch is None or arch.gguf is None else arch.gguf.rename


MAX_LAYERS = 512
"""llama.cpp's LLAMA_MAX_LAYERS (src/llama-hparams.h): `GGML_ASSERT(n_layer_all > 0 && n_layer_all <=
LLAMA_MAX_LAYERS)` right after block_count is read (src/llama-model.cpp)."""


def gguf_model(parts: dict[str, GgufPart]) -> tuple[dict[str, Any], ModelConfig, ExpectedLayout, list[Finding]]:
    """The config.json the set's metadata implies, its model, its layout in GGUF's names, and what the
    metadata holds that llama.cpp would misread."""
    first = first_part(parts)
    kv = {} if first is None else first.kv
    headers = {n: p.header for n, p in parts.items()}
    read = [n for n, p in parts.items() if p.version]  # parts whose header parsed (GGUF_INVALID says for the rest)
    arch = gguf_architecture(kv.get(GENERAL_ARCHITECTURE))
    table = dict(LOADER_KEYS)
    if arch is not None and arch.gguf is not None:
        prefix = f"{kv[GENERAL_ARCHITECTURE]}."
        table.update({prefix + key: t for key, t in arch.gguf.key_types.items()})
    wrong = mistyped(kv, {} if first is None else first.types, table)
    part = next((n for n, p in parts.items() if p is first), read[0] if read else None)
    findings = [error("GGUF_KEY_TYPE", f"{part}: {label(key)} is stored as {have}, but llama.cpp reads it as {want}: "
                      "its loader stops at this key", tensor=key, shard=part, expected=want, actual=have)
                for key, have, want in wrong]
    name = kv.get(GENERAL_ARCHITECTURE)
    hyper = [key for key, _, _ in wrong if key == GENERAL_ARCHITECTURE or key.startswith(f"{name}.")]
    if arch is None or arch.gguf is None or hyper:
        # No layout without the hyperparameters read as llama.cpp reads them: the key's GGUF_KEY_TYPE says why,
        # and no tensor is checked against a layout derived from a value llama.cpp would never load.
        if read and GENERAL_ARCHITECTURE not in kv and not findings:
            findings.append(error("GGUF_KEY_MISSING", f"{part}: no {GENERAL_ARCHITECTURE} key: the file names no "
                                  "model, llama.cpp cannot load it, and no tensor could be checked against a layout",
                                  tensor=GENERAL_ARCHITECTURE, shard=part))
        return _no_layout(None if hyper else name, findings)
    absent = [k for k in (*loader_required(kv), *(f"{name}.{k}" for k in arch.gguf.required)) if k not in kv]
    kv = {k: v for k, v in kv.items() if k not in {w[0] for w in wrong}}  # (a mistyped key: its GGUF_KEY_TYPE)
    if absent:
        findings.append(error("GGUF_KEY_MISSING", f"{part}: no {', '.join(label(k) for k in absent)}: llama.cpp's "
                              "loader requires it (\"key not found in model\") and cannot load the model",
                              tensor=absent[0], shard=part, covers=len(absent)))
    findings += loader_value_findings(kv, part)
    layers = kv.get(f"{name}.block_count")
    if isinstance(layers, int) and not 0 < layers <= MAX_LAYERS:  # llama-model.cpp: GGML_ASSERT, an abort
        findings.append(error("GGUF_KEY_VALUE", f"{part}: {name}.block_count is {layers:,}; llama.cpp loads 1 to "
                              f"{MAX_LAYERS} layers (LLAMA_MAX_LAYERS) and aborts on any other count",
                              tensor=f"{name}.block_count", shard=part, expected=f"1..{MAX_LAYERS}", actual=layers))
        return _no_layout(None, findings)
    unfinite = [k for k, v in kv.items() if k.startswith(f"{name}.") and (
        (isinstance(v, float) and not math.isfinite(v))
        or any(isinstance(x, float) and not math.isfinite(x) for x in getattr(v, "values", None) or ()))]
    findings += [error("GGUF_KEY_VALUE", f"{part}: {label(k)} is not a finite number: llama.cpp loads it, and every "
                       "output it computes with it is NaN or infinite", tensor=k, shard=part) for k in unfinite]
    lengths = wrong_lengths(kv, table, layers) if isinstance(layers, int) else []
    blocks = 1 + max((int(m.group(1)) for h in headers.values() for n in h.columns.names
                      if (m := BLOCK_NAME.match(n))), default=-1) if lengths else 0  # (asked only when one is off)
    if lengths and len({got for _, got in lengths}) == 1 and lengths[0][1] == blocks:  # block_count is the one off
        key = f"{name}.block_count"
        findings.append(error("GGUF_KEY_VALUE", f"{part}: {label(key)} is {layers:,}, but the file stores {blocks:,} "
                              f"blocks and its per-layer keys ({', '.join(label(k) for k, _ in lengths)}) hold "
                              f"{blocks:,} values each: llama.cpp refuses it (\"wrong array length\")", tensor=key,
                              shard=part, expected=blocks, actual=layers, covers=len(lengths)))
    else:
        findings += [error("GGUF_KEY_VALUE", f"{part}: {label(key)} holds {got:,} values, not one per layer "
                           f"({label(f'{name}.block_count')} is {layers:,}): llama.cpp refuses it (\"key {key} has "
                           f"wrong array length; expected {layers}, got {got}\")", tensor=key, shard=part,
                           expected=layers, actual=got) for key, got in lengths]
    if lengths or unfinite:  # llama.cpp stops at the key, or computes nothing: no layout derived from it
        return _no_layout(None, findings)
    stored = {n: s for h in headers.values() for n, s in zip(h.columns.names, h.columns.shapes)}
    try:
        raw, meta = arch.gguf.config(kv, stored)
        cfg = model_config_from_dict(raw)
    except ConfigError as e:
        # The metadata names no model llama.cpp loads (a key absent or refused, said above or here): a finding
        # naming the key, and no layout derived from it (not an exit 2: the file was read, and is wrong).
        if isinstance(e, GgufKeyError) and e.finding_code == UNDESCRIBED:
            findings.append(warning(UNDESCRIBED, f"{part}: {e}", tensor=e.key, shard=part))
        elif isinstance(e, GgufKeyError):
            if not (absent and e.finding_code == "GGUF_KEY_MISSING"):
                findings.append(error(e.finding_code, f"{part}: {e}", tensor=e.key, shard=part))
        elif not absent:
            said = str(e).replace("config.json ", "the config its metadata implies: ")
            findings.append(error("GGUF_KEY_VALUE", f"{part}: the hyperparameters in its {name}.* keys are no model "
                                  f"llama.cpp loads ({said})", tensor=f"{name}.*", shard=part))
        return _no_layout(None, findings)
    findings += meta
    layout = with_stored_types(respelled(expected_layout(cfg), arch.gguf.rename), headers)
    return raw, cfg, layout, findings


def _no_layout(architecture: Any, findings: list[Finding]) -> tuple[dict[str, Any], ModelConfig, ExpectedLayout,
                                                                    list[Finding]]:
    """No model read: the config that derives no layout, naming the `general.architecture` no dialect reads (None
    where a finding already says why no layout follows, so the audit adds no LAYOUT_UNSUPPORTED)."""
    raw = {"model_type": None, GGUF_ARCHITECTURE: architecture}
    cfg = unsupported_config(raw)
    return raw, cfg, expected_layout(cfg), findings
