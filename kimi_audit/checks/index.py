"""Headers against the index (model.safetensors.index.json, or Mistral's consolidated.safetensors.index.json: each
finding names the file, IndexFile.name): what loaders will look up, and where."""

from __future__ import annotations

import re
from collections.abc import Iterable

from kimi_audit.findings import Finding, error, info, warning
from kimi_audit.format.header import ShardHeader
from kimi_audit.format.index import IndexFile
from kimi_audit.format.table import TensorTable


def index_findings(
    actual: TensorTable, index: IndexFile | None, headers: dict[str, ShardHeader], unusable: set[str] | None = None,
    invalid: set[str] | frozenset[str] = frozenset(), counts_files: bool = False,
) -> list[Finding]:
    """`unusable`: shards whose root finding already covers the tensors the index puts there; `invalid`: names
    whose header entry is invalid (their format finding is their one finding), not reported missing here;
    `counts_files`: the writer's total_size counts whole files (QuantPlan.index_counts_files)."""
    if index is None:
        return []
    out: list[Finding] = []
    wm = index.weight_map
    listed = list(map(wm.get, actual.names))
    if listed != actual.shards:  # one comparison at builtin speed; row by row only when it fails
        for name, shard, where in zip(actual.names, actual.shards, listed):
            if where is None:
                if name in invalid:
                    continue
                out.append(error("INDEX_ENTRY_MISSING", f"{name} is in {shard} but not in {index.name}: loaders "
                                 "will not find it", tensor=name, shard=shard))
            elif where != shard:
                out.append(error("INDEX_SHARD_MISMATCH", f"{name}: {index.name} says {where}, found in {shard}",
                                 tensor=name, shard=shard, expected=where, actual=shard))
    # Every actual name listed where it is, and as many names listed: then none is listed in vain.
    in_vain = [n for n in wm if n not in actual.row_of] if out or len(wm) != len(actual) else []
    for name in in_vain:
        shard = wm[name]
        if shard in headers and not (unusable and shard in unusable):
            out.append(error("INDEX_TENSOR_ABSENT", f"{name}: {index.name} maps it to {shard}, whose header "
                             "lacks it", tensor=name, shard=shard))
    return out + ([] if unusable else index_total_size_findings(index, headers, counts_files))


def index_total_size_findings(index: IndexFile, headers: dict[str, ShardHeader],
                              counts_files: bool = False) -> list[Finding]:
    """metadata.total_size against the payloads (or, `counts_files`, the shards' whole files, as AMD Quark counts
    them), once every shard the index names has been read."""
    out: list[Finding] = []
    if index.total_size is not None and all(shard in headers for shard in index.shards):
        payload = sum(h.file_size if counts_files else h.payload_bytes for h in headers.values())
        what = "files' sizes (this writer counts whole files)" if counts_files else "tensor payloads"
        if payload != index.total_size:
            out.append(warning("INDEX_TOTAL_SIZE", f"{index.name} metadata.total_size is {index.total_size:,}; "
                               f"the shards' {what} sum to {payload:,}",
                               expected=payload, actual=index.total_size))
    return out


def index_total_parameters_findings(index: IndexFile | None, parameters: int, stored_elements: int,
                                    without_buffers: int | None = None,
                                    stored_buffers: tuple[int, ...] = ()) -> list[Finding]:
    """metadata.total_parameters against the parameters of the tensors found (packed words standing for the out x
    in parameters of their module, quantization metadata not counted), or `without_buffers`, that count less the
    router biases transformers keeps as buffers (its save writes num_parameters()): an info where it counts the
    stored elements instead (llmcompressor's: compressed words and scales, or those less the buffers: each of
    `stored_buffers` is a buffer total it may leave out), a warning where it is neither."""
    if index is None or index.total_parameters is None or index.total_parameters in (parameters, without_buffers):
        return []
    given = index.total_parameters
    if given == stored_elements:
        return [info("INDEX_TOTAL_PARAMETERS", f"{index.name} metadata.total_parameters is {given:,}: the stored "
                     f"elements (packed words, scales and metadata counted as they are stored); the model has "
                     f"{parameters:,} parameters", expected=parameters, actual=given)]
    less = next((b for b in stored_buffers if b and given == stored_elements - b), None)
    if less is not None:
        return [info("INDEX_TOTAL_PARAMETERS", f"{index.name} metadata.total_parameters is {given:,}: the stored "
                     f"elements less {less:,} buffer elements, as llmcompressor writes it; the model has "
                     f"{parameters:,} parameters", expected=parameters, actual=given)]
    return [warning("INDEX_TOTAL_PARAMETERS", f"{index.name} metadata.total_parameters is {given:,}; the model "
                    f"has {parameters:,} parameters ({stored_elements:,} stored elements)",
                    expected=parameters, actual=given)]


SERIES = re.compile(r"^(?P<stem>.*)-(?P<no>\d+)-of-(?P<of>\d+)\.safetensors$")
"""A shard named as one of a numbered series (`model-00002-of-00003.safetensors`, save_pretrained's names)."""


def series_findings(shards: Iterable[str], index: IndexFile | None) -> list[Finding]:
    """A numbered series of shards the index reads whose names count more members than the folder and the index hold
    together: one SHARD_SERIES_GAP warning per series (a shard left out of an upload and an index written without
    it: loaders load the rest; checks.block_counts makes it the error of the tensors the config misses with it).
    Where the index names the shard, INDEX_SHARD_ABSENT says so instead; a numbered file the index never reads is
    a stray (SHARD_NOT_IN_INDEX, SHARD_LOADED_UNINDEXED), no series."""
    indexed = set(index.shards) if index is not None else set()
    series: dict[tuple[str, str], set[int]] = {}
    for name in set(shards) | indexed:
        m = SERIES.match(name.rsplit("/", 1)[-1])
        if m is not None:
            series.setdefault((m["stem"], m["of"]), set()).add(int(m["no"]))
    out = []
    for (stem, of), held in series.items():
        total = int(of)
        read = any(s in indexed for s in listed_as(stem, of, held))
        if total > 100_000 or len(held) >= total or not read:  # (a count no writer writes: no series)
            continue
        gone = [n for n in range(1, total + 1) if n not in held]
        width = len(of)
        first = f"{stem}-{gone[0]:0{width}d}-of-{of}.safetensors"
        are = "is" if len(gone) == 1 else "are"
        out.append(warning("SHARD_SERIES_GAP", f"the shards are named as {total:,} ({stem}-*-of-{of}.safetensors), "
                           f"but {len(gone):,} of them {are} neither here nor in the index (first: {first}): a shard "
                           "left out of the upload and of its index? Loaders load the rest", shard=first,
                           expected=total, actual=len(held)))
    return out


def listed_as(stem: str, of: str, numbers: Iterable[int]) -> list[str]:
    """The names a series' members may have (any zero padding the writer used)."""
    return [f"{stem}-{n:0{w}d}-of-{of}.safetensors" for n in numbers for w in {1, len(of)}]
