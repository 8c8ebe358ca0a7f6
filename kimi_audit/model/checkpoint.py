"""Load what an audit needs from a source: config.json, the index and every shard's header.

This is the only place the audit does I/O; everything downstream works on the returned Checkpoint.
A remote source's headers are fetched by threads (one ranged read per shard, sized from the listed file
size and the expected layout) and parsed here, one after another, as they arrive.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Any

from kimi_audit.constants import (
    CONFIG_FILE,
    INDEX_FILE,
    MAX_CONFIG_BYTES,
    MAX_HEADER_BYTES,
    SAFETENSORS_SUFFIX,
)
from kimi_audit.errors import ConfigError, FileMissingError, FileTooLargeError, SourceError
from kimi_audit.findings import Finding, error, warning
from kimi_audit.format.estimate import first_read_bytes
from kimi_audit.format.fetch import SKIPPED, Fetched, HeaderBudget, fetch_header, parse_fetched
from kimi_audit.format.gguf_split import mixed_quant_findings, split_findings
from kimi_audit.format.header import ShardHeader, read_shard_header
from kimi_audit.format.index import IndexFile, load_index, natural_key
from kimi_audit.model import mistral_layout
from kimi_audit.model.arch.mistral_params import PARAMS_FILE
from kimi_audit.model.config import parse_config_bytes, parse_params_bytes
from kimi_audit.model.config_fields import ModelConfig
from kimi_audit.model.dialect import resolve_dialect
from kimi_audit.model.gguf import (
    choose_set,
    first_part,
    gguf_model,
    gguf_names,
    is_gguf,
    posing_parts,
    read_set,
)
from kimi_audit.model.gguf_beside import beside
from kimi_audit.model.layout import ExpectedLayout, expected_layout
from kimi_audit.model.mtp_stages import with_stored_stages
from kimi_audit.sources.base import Source

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")
MAX_TOTAL_HEADER_BYTES = 128_000_000
"""All shards' headers together (Kimi-K2: 17.7 MB, 139,644 tensors: 7x headroom). Past it, no further
shard is read. Parsing costs ~7x the JSON at peak, so a hostile checkpoint (10 million tensor names over
many shards) stays near 1 GB instead of growing with the number of shards."""


@dataclass(frozen=True)
class Checkpoint:
    label: str
    revision: str | None
    files: tuple[str, ...]
    config_raw: dict[str, Any]
    config: ModelConfig
    index: IndexFile | None
    expected: ExpectedLayout
    """The layout config.json implies (layout.expected_layout), in the dialect the shards spell it in
    (model.dialect)."""
    headers: dict[str, ShardHeader]
    """Shard name -> parsed header, for every shard that could be read, in natural order."""
    findings: tuple[Finding, ...]
    """What loading itself found: absent or unlisted shards, pickle files, unreadable files."""
    reported_parameters: int | None = None
    """The parameter total the source reports (the Hub's model info), checks.hub_count compares it."""
    container: str = "safetensors"
    """The files' container: `safetensors`, or `gguf` (llama.cpp's; config_raw is then what its metadata implies,
    model.gguf)."""
    metadata: Mapping[str, Any] = field(default_factory=dict)
    """A GGUF set's metadata (part 1's key-values); empty for safetensors."""


ProgressFn = Callable[[str, int, int], None]
"""Called with (shard, done, total) after each header is read."""


def load_config(source: Source) -> tuple[dict[str, Any], ModelConfig]:
    """config.json; where there is none, Mistral's params.json through its adapter (one path after it)."""
    try:
        raw = source.read_file(CONFIG_FILE, MAX_CONFIG_BYTES)
    except FileMissingError:
        try:
            return parse_params_bytes(source.read_file(PARAMS_FILE, MAX_CONFIG_BYTES))
        except FileMissingError:
            raise ConfigError(f"no {CONFIG_FILE} (nor Mistral's {PARAMS_FILE}) in {source.label}: the expected "
                              "layout is derived from it") from None
        except FileTooLargeError as e:
            raise ConfigError(str(e)) from None
    except FileTooLargeError as e:
        raise ConfigError(str(e)) from None
    return parse_config_bytes(raw)


def load_model(source: Source) -> tuple[dict[str, Any], ModelConfig, Callable[[str], str]]:
    """The config a checkpoint's layout is derived from, and how its files spell the tree's names: config.json and
    the release's names, or a GGUF set's metadata and its dialect's names (one tensor's commands: rmsnorm)."""
    files = source.list_files()
    if not is_gguf(files):
        return (*load_config(source), str)
    names, read = choose_set(source, files)
    parts = read_set(source, names, read=read)
    raw, cfg, _, _ = gguf_model(parts)
    return raw, cfg, gguf_names(parts)


def shards_to_read(files: tuple[str, ...], index: IndexFile | None,
                   index_present: bool = False, loader_reads: str = "", loader: str = "",
                   index_name: str = INDEX_FILE) -> tuple[list[str], list[Finding]]:
    """The shards to read, and what the index says of them (`index_present`: an index file is there but none
    of it could be read, so INDEX_MISSING does not apply; `loader_reads`: the glob of files the format's loader
    (`loader`) reads whatever the index says (Scheme.loader_reads), so a shard matching it that the index does not
    list is SHARD_LOADED_UNINDEXED, an error; `index_name`: the index file the layout has, model.mistral_layout's)."""
    if index is not None:
        index_name = index.name
    on_disk = [f for f in files if f.endswith(SAFETENSORS_SUFFIX)]
    findings: list[Finding] = []
    present = set(on_disk)
    if index is not None:
        listed = Counter(index.weight_map.values())
        for shard, count in listed.items():
            if shard not in present:
                findings.append(error("INDEX_SHARD_ABSENT", f"{index_name} maps {count:,} tensors to {shard}, "
                                      "which is not in the checkpoint", shard=shard, actual=count))
        for shard in on_disk:
            if shard not in listed and loader_reads and fnmatchcase(shard, loader_reads):
                findings.append(error("SHARD_LOADED_UNINDEXED", f"{shard} is not listed in {index_name}, but this "
                                      f"format's loader ({loader or 'its own'}) reads every {loader_reads}: its "
                                      "tensors load and may replace the indexed ones", shard=shard))
            elif shard not in listed:
                findings.append(warning("SHARD_NOT_IN_INDEX", f"{shard} is not listed in {index_name}; loaders "
                                        "that follow the index will not read it", shard=shard))
    elif len(on_disk) > 1 and not index_present:
        findings.append(warning("INDEX_MISSING", f"{len(on_disk)} shards but no {index_name}"))
    for f in files:
        if f.endswith(PICKLE_SUFFIXES):
            findings.append(warning("PICKLE_NOT_INSPECTED", f"{f} is a pickle-based file: not inspected "
                                    "(kimi-audit never unpickles)", shard=f))
    if not on_disk:
        findings.append(error("NO_SAFETENSORS", "the checkpoint has no .safetensors files"))
    return sorted(on_disk, key=natural_key), findings


def read_headers(
    source: Source, shards: list[str], index: IndexFile | None, progress: ProgressFn | None = None,
    expected: ExpectedLayout | None = None,
) -> tuple[dict[str, ShardHeader], list[Finding]]:
    """Every shard's header. A remote source's headers are fetched in threads, each read sized from
    `expected` and the names the index lists in the shard; a local one's are read one after another."""
    results: dict[str, ShardHeader | Finding | str] = {}
    if source.parallel_reads > 1 and len(shards) > 1:
        _read_remote(source, shards, index, expected, results, progress)
    else:
        budget = HeaderBudget(MAX_TOTAL_HEADER_BYTES)
        for done, shard in enumerate(shards, 1):
            results[shard] = _read_one(source, shard, budget)
            if progress:
                progress(shard, done, len(shards))
    results = {s: results[s] for s in shards}
    headers = {s: r for s, r in results.items() if isinstance(r, ShardHeader)}
    failures = [r for r in results.values() if isinstance(r, Finding)]
    skipped = [s for s, r in results.items() if r == SKIPPED]
    if skipped:
        failures.append(error(
            "CHECKPOINT_TOO_LARGE", f"the headers of {len(headers):,} shards already exceed "
            f"{MAX_TOTAL_HEADER_BYTES:,} bytes together: {len(skipped):,} more shards not read "
            f"(from {skipped[0]})", shard=skipped[0], expected=MAX_TOTAL_HEADER_BYTES, actual=len(skipped)))
    return headers, failures


def _read_one(source: Source, shard: str, budget: HeaderBudget) -> ShardHeader | Finding | str:
    if budget.spent:
        return SKIPPED
    try:
        h = read_shard_header(source, shard)  # local: a short read costs a second pread, nothing more
    except SourceError as e:
        return error("SHARD_UNREADABLE", f"{shard}: {e}", shard=shard)
    budget.spend(h.header_len if h.header_len is not None and h.header_len <= MAX_HEADER_BYTES else 0)
    return h


def _read_remote(
    source: Source, shards: list[str], index: IndexFile | None, expected: ExpectedLayout | None,
    results: dict[str, ShardHeader | Finding | str], progress: ProgressFn | None,
) -> None:
    names_by_shard = _names_by_shard(shards, index)
    budget = HeaderBudget(MAX_TOTAL_HEADER_BYTES)

    def fetch(shard: str) -> Fetched:  # threads only fetch; this thread parses, so parsing never starves them
        specs = None if expected is None else expected.specs_by_name
        size = first_read_bytes(names_by_shard[shard], specs, source.file_size(shard))
        return fetch_header(source, shard, size, budget)

    with ThreadPoolExecutor(max_workers=min(source.parallel_reads, len(shards))) as pool:
        for done, (shard, got) in enumerate(zip(shards, pool.map(fetch, shards)), 1):
            results[shard] = parse_fetched(shard, got)
            if progress:
                progress(shard, done, len(shards))


def _names_by_shard(shards: list[str], index: IndexFile | None) -> dict[str, list[str]]:
    """The tensor names the index lists in each shard (what sizes a remote shard's first read)."""
    out: dict[str, list[str]] = {s: [] for s in shards}
    if index is not None:
        for tensor, shard in index.weight_map.items():
            if shard in out:
                out[shard].append(tensor)
    return out


def load_checkpoint(source: Source, progress: ProgressFn | None = None) -> Checkpoint:
    """What an audit reads: a safetensors checkpoint, or the one GGUF set of files with no safetensors file
    (`--include` narrows a repo of several to one: sources.selected)."""
    files = source.list_files()
    if is_gguf(files):
        return _load_gguf(source, files, progress)
    return _load(source, files, source.remote, progress)


def _load_gguf(source: Source, files: tuple[str, ...], progress: ProgressFn | None) -> Checkpoint:
    names, read = choose_set(source, files)
    parts = read_set(source, names, progress, read)
    posing = posing_parts(parts)
    if posing and len(posing) < len(parts):  # an imatrix or projector in a part's name: beside the set, not in it
        read = {**read, **{n: parts.pop(n) for n in posing}}
        names = [n for n in names if n not in posing]
    findings = split_findings(parts) + mixed_quant_findings(parts)
    raw, config, expected, meta = gguf_model(parts)
    first = first_part(parts)
    kv = {} if first is None else first.kv
    others = {n: p for n, p in read.items() if n not in parts}
    expected, projector, beside_findings = beside(others, raw, config, expected, kv)
    headers = {n: p.header for n, p in parts.items() if p.header.tensor_count or p.header.ok}
    failed = [f for n, p in parts.items() if n not in headers for f in p.header.findings]
    headers.update(projector)
    return Checkpoint(source.label, source.revision, (*names, *projector), raw, config, None, expected, headers,
                      tuple(failed + findings + meta + beside_findings), container="gguf", metadata=kv)


def _load(source: Source, files: tuple[str, ...], remote: bool, progress: ProgressFn | None) -> Checkpoint:
    # Remote sources list file sizes: with the expected layout, each header's length is known exactly.
    # Locally it is not needed yet, and building it after the headers keeps the peak memory lower.
    expected = None
    if remote and source.parallel_reads > 1:
        # The index (megabytes) downloads while config.json is fetched and the layout derived from it.
        with ThreadPoolExecutor(max_workers=1) as pool:
            pending = pool.submit(load_index, source, files, mistral_layout.index_name(files))
            config_raw, config = load_config(source)
            expected = expected_layout(config)
            index, findings = pending.result()
    else:
        config_raw, config = load_config(source)
        index, findings = load_index(source, files, mistral_layout.index_name(files))
        expected = expected_layout(config) if remote else None
    for link in source.outside_links():
        findings.append(error("SYMLINK_OUTSIDE", f"{link} is a symlink that leaves the checkpoint directory: "
                              "not opened", shard=link))
    unreadable = index is not None and index.unreadable
    if index is not None and unreadable:  # its INDEX_INVALID is the one finding: no entry missing, no shard unlisted
        findings += index.findings
        index = None
    plan = config.quant
    reads, loader = mistral_layout.loader_reads(files, plan.loader_reads if plan is not None else "",
                                                plan.tree if plan is not None else "")
    read_from, aside = mistral_layout.set_aside(files, index)
    shards, shard_findings = shards_to_read(read_from, index, index_present=unreadable, loader_reads=reads,
                                            loader=loader, index_name=mistral_layout.index_name(files))
    findings += aside + shard_findings + mistral_layout.findings(source, files, config_raw, config)
    headers, failures = read_headers(source, shards, index, progress, expected)
    stored = [h.columns.names for h in headers.values()]
    config, stage_findings = with_stored_stages(config_raw, config, stored)
    if expected is None or stage_findings:
        expected = expected_layout(config)
    config, expected, dialect_findings = resolve_dialect(config, expected, stored)
    findings += failures + stage_findings + dialect_findings
    return Checkpoint(source.label, source.revision, files, config_raw, config, index, expected, headers,
                      tuple(findings), source.reported_parameters())
