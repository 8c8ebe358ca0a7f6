"""model.safetensors.index.json: `{"metadata": {"total_size": N}, "weight_map": {tensor: shard}}` (llmcompressor
also writes `metadata.total_parameters`). The one reader of a checkpoint's index, whatever the file is called: Mistral's
own layout names it `consolidated.safetensors.index.json` (the caller says which file, `load_index`'s `name`)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import msgspec

from kimi_audit.constants import INDEX_FILE, MAX_INDEX_BYTES
from kimi_audit.errors import FileTooLargeError, UnsafePathError
from kimi_audit.findings import Finding, error
from kimi_audit.format.jsondup import duplicate_keys
from kimi_audit.sources.base import Source, safe_member_name

MAX_INDEX_SHARDS = 10_000
"""The most distinct shard files an index may list (DeepSeek-V3 has 163, Kimi-K2 61): beyond it, every
shard name would cost a finding, a sort key and a lookup, 60x the index's size in memory."""


@dataclass(frozen=True)
class IndexFile:
    total_size: int | None
    weight_map: dict[str, str] = field(default_factory=dict)
    """Entries whose shard name is safe to open; unsafe ones are reported and dropped."""
    findings: tuple[Finding, ...] = ()
    total_parameters: int | None = None
    """`metadata.total_parameters` where it is a count (llmcompressor writes it; checks.index compares it)."""
    unreadable: bool = False
    """No weight_map could be read at all (not JSON, cut short, no weight_map): its INDEX_INVALID is the one
    finding of that cause, and the audit goes on as if there were no index."""
    name: str = INDEX_FILE
    """The file it was read from (model.safetensors.index.json, or Mistral's consolidated.safetensors.index.json):
    what every finding about it names."""

    @property
    def shards(self) -> list[str]:
        return sorted(set(self.weight_map.values()), key=natural_key)


def natural_key(name: str) -> list[Any]:
    """Sort `model-2-of-61` before `model-10-of-61`."""
    out: list[Any] = []
    num = ""
    for ch in name:
        if ch.isdecimal():  # not isdigit: int() refuses "²"
            num += ch
            continue
        if num:
            out.append(int(num))
            num = ""
        out.append(ch)
    if num:
        out.append(int(num))
    return [(0, x) if isinstance(x, int) else (1, x) for x in out]


class _IndexDoc(msgspec.Struct, forbid_unknown_fields=True):
    """The common form of an index, decoded straight into a dict of str by msgspec."""

    weight_map: dict[str, str]
    metadata: dict[str, Any] | None = None


_DECODER = msgspec.json.Decoder(_IndexDoc)


def parse_index(raw: bytes, name: str = INDEX_FILE) -> IndexFile:
    def invalid(message: str) -> IndexFile:
        return IndexFile(None, {}, (error("INDEX_INVALID", f"{name}: {message}; the checkpoint is audited as if it "
                                          "had no index", shard=name),), unreadable=True, name=name)

    # The common form is decoded by msgspec; anything it refuses or that holds a \u escape (a lone
    # surrogate must be named) goes through json.loads, which says what is wrong.
    doc = None
    wm: dict[str, Any]
    meta: Any
    if b"\\u" not in raw:
        try:
            doc = _DECODER.decode(raw)
        except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):  # json.loads says what is wrong
            doc = None
    if doc is not None:
        wm, meta = doc.weight_map, doc.metadata
        pairs = 1 + len(wm) + (0 if meta is None else 1 + len(meta))
    else:
        try:
            text = raw.decode("utf-8")
            obj = json.loads(text)
        except UnicodeDecodeError as e:
            return invalid(f"not valid UTF-8 at byte {e.start}")
        except json.JSONDecodeError as e:
            return invalid(f"not valid JSON: {e.msg} at character {e.pos}")
        except (ValueError, RecursionError) as e:
            return invalid(f"not valid JSON: {e}")
        if not isinstance(obj, dict):
            return invalid(f"top level is a {type(obj).__name__}, not an object")
        # A lone surrogate escape decodes to a str no report can be written with. (The one-character scan
        # runs at memchr speed; the two-character one costs 10x more, so it runs only after a backslash.)
        if "\\" in text and "\\u" in text:
            try:
                json.dumps(obj, ensure_ascii=False).encode("utf-8")
            except (UnicodeEncodeError, RecursionError, ValueError):
                return invalid("not valid JSON: it holds a lone UTF-16 surrogate escape")
        listed = obj.get("weight_map")
        if not isinstance(listed, dict):
            return invalid("has no weight_map object")
        wm, meta = listed, obj.get("metadata")
        pairs = len(obj) + len(wm) + (len(meta) if isinstance(meta, dict) else 0)
    findings: list[Finding] = []
    total_size = None
    if isinstance(meta, dict) and "total_size" in meta:
        ts = meta["total_size"]
        if type(ts) is int and ts >= 0:
            total_size = ts
        else:
            findings.append(error("INDEX_INVALID", f"{name}: metadata.total_size {ts!r} is not a byte count",
                                  shard=name))
    tp = meta.get("total_parameters") if isinstance(meta, dict) else None
    total_parameters = tp if type(tp) is int and tp >= 0 else None
    if raw.count(b":") != pairs:  # colons in names and values too: then look for duplicates properly
        findings.extend(_duplicates(raw.decode("utf-8"), name))

    try:
        distinct = set(wm.values())
    except TypeError:  # an unhashable value (a list): sorted out entry by entry below
        distinct = set()
    if len(distinct) > MAX_INDEX_SHARDS:
        return invalid(_too_many(len(distinct)))
    if distinct and all(type(shard) is str for shard in distinct):
        canonical = {shard: shard for shard in distinct}  # one str per shard, not one per tensor
        try:
            for shard in canonical:
                safe_member_name(shard)
        except UnsafePathError:
            pass  # sort it out entry by entry below
        else:
            wm.update(zip(wm, map(canonical.__getitem__, wm.values())))  # in place: same keys, no new table
            return IndexFile(total_size, wm, tuple(findings), total_parameters, name=name)

    weight_map = {}
    unsafe: dict[str, str] = {}
    safe: set[str] = set()
    canonical = {}
    for tensor, shard in wm.items():
        if type(shard) is not str:  # not a file name at all (and maybe unhashable)
            unsafe.setdefault(_short_repr(shard), f"file name {_short_repr(shard)} is not a string")
            continue
        if shard in safe:
            weight_map[tensor] = canonical[shard]
            continue
        if shard in unsafe:
            continue
        if len(safe) + len(unsafe) >= MAX_INDEX_SHARDS:
            return invalid(_too_many(len(set(map(_short_repr, wm.values())))))
        try:
            safe_member_name(shard)
        except UnsafePathError as e:
            unsafe[shard] = str(e)
            continue
        safe.add(shard)
        canonical[shard] = shard
        weight_map[tensor] = shard
    for shard, why in unsafe.items():
        findings.append(error("INDEX_UNSAFE_PATH", f"{name}: refused to open {why}", shard=str(shard)[:200]))
    return IndexFile(total_size, weight_map, tuple(findings), total_parameters, name=name)


def _too_many(n: int) -> str:
    return (f"lists {n:,} distinct shard files, more than the {MAX_INDEX_SHARDS:,} any checkpoint has: "
            "not used (the largest public checkpoints have under 200 shards)")


def _short_repr(v: Any) -> str:
    r = repr(v)
    return r if len(r) <= 80 else r[:80] + "..."


def _duplicates(text: str, name: str) -> list[Finding]:
    try:
        dups = duplicate_keys(text)
    except RecursionError:  # the duplicate search's hook nests deeper than the plain decode
        return [error("INDEX_INVALID", f"{name}: nested too deeply to look for duplicate keys", shard=name)]
    return [error("INDEX_DUPLICATE_KEY", f"{name}: key {k[:200]!r} appears more than once", tensor=k, shard=name)
            for k in dups]


def load_index(source: Source, files: tuple[str, ...],
               name: str = INDEX_FILE) -> tuple[IndexFile | None, list[Finding]]:
    """The index `name` of a checkpoint whose files are `files`, or None when it has none (or it is refused)."""
    if name not in files:
        return None, []
    try:
        return parse_index(source.read_file(name, MAX_INDEX_BYTES), name), []
    except FileTooLargeError as e:
        return None, [error("INDEX_TOO_LARGE", str(e), shard=name)]
    except UnsafePathError:  # a symlink out of the directory: reported as SYMLINK_OUTSIDE, never read
        return None, []
