"""Compare two checkpoints: tensors added, removed, changed (dtype or shape), moved between shards, the
parameter delta per accounting-tree component and config changes, from the headers alone; optionally
which tensors' bytes differ (`content_diff`).

Content comparison reads each tensor that both sides hold with the same dtype and shape, by ranged
reads in bounded chunks (small neighbouring tensors coalesced into one read; as many in flight as the
source reads in parallel), and compares SHA-256 digests. A tensor is not read at all when its shards
are known to be the same file on both sides: the same Hub LFS sha256 (or an HF-cache blob of that
sha256), or the same local file (hard link).

The verdict (`verdict`): DIFFERENT when anything compared differs, INCOMPLETE when nothing compared
differs but `max_read` left tensors unchecked, else IDENTICAL.
"""

from __future__ import annotations

import fnmatch
import hashlib
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from kimi_audit.errors import SourceError
from kimi_audit.findings import Finding
from kimi_audit.format.table import Located, locate_tensors
from kimi_audit.model.accounting.account import accounting_of_checkpoint
from kimi_audit.model.accounting.tree import Accounting
from kimi_audit.model.checkpoint import Checkpoint
from kimi_audit.numerics.tensor_io import Holes, data_holes, in_hole, read_exact, windowed_map
from kimi_audit.sources.base import Source

IDENTICAL, DIFFERENT, INCOMPLETE = "IDENTICAL", "DIFFERENT", "INCOMPLETE"
CHUNK_BYTES = 16 << 20
"""Largest single range read. A comparison holds one per read in flight (16 over the Hub: 256 MiB)."""
COALESCE_GAP = 1 << 20
"""Neighbouring tensors closer than this are read in one range read."""


class Entry(NamedTuple):
    dtype: str
    shape: tuple[int, ...]
    shard: str

    def text(self) -> str:
        return f"{self.dtype} {list(self.shape)} in {self.shard}"


@dataclass(frozen=True)
class Change:
    name: str
    a: Entry | None
    b: Entry | None


@dataclass(frozen=True)
class ComponentDelta:
    key: str
    title: str
    a: int
    b: int

    @property
    def delta(self) -> int:
        return self.b - self.a


@dataclass(frozen=True)
class HeaderDiff:
    a: str
    b: str
    a_revision: str | None
    b_revision: str | None
    added: tuple[Change, ...]
    removed: tuple[Change, ...]
    changed: tuple[Change, ...]
    """Held by both, with another dtype or shape."""
    moved: tuple[Change, ...]
    """Held by both with the same dtype and shape, in another shard."""
    components: tuple[ComponentDelta, ...]
    """Accounting-tree nodes whose found parameter count differs (leaves and groups)."""
    config: tuple[tuple[str, Any, Any], ...]
    """config.json keys whose values differ: (key, A's, B's); absent is None."""
    parameters: tuple[int, int]
    tensors: tuple[int, int]
    common: int
    shards_only: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())
    """Shard files on one side only (A's, B's): a stray file a loader that reads every `*.safetensors` (mlx-lm)
    takes in, even where its tensors duplicate others."""
    duplicates: tuple[int, int] = (0, 0)
    """Tensor names stored in two shards or more, on each side (which copy a loader takes is its own choice)."""
    listed_only: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())
    """Names each side's index lists that none of its shards stores (what its loaders look for and miss)."""

    @property
    def differs(self) -> bool:
        return bool(self.added or self.removed or self.changed or self.moved or self.config or any(self.shards_only)
                    or self.duplicates[0] != self.duplicates[1] or self.listed_only[0] != self.listed_only[1])


@dataclass(frozen=True)
class ContentDiff:
    compared: int
    """Tensors whose bytes were read and hashed on both sides."""
    identical_files: int
    """Tensors not read because their shards are the same file on both sides."""
    differing: tuple[tuple[str, str, str], ...]
    """(name, A's sha256, B's sha256) for tensors whose bytes differ."""
    unchecked: tuple[str, ...]
    """Tensors left unread because of the --max-read budget (those --tensors excludes are `excluded`)."""
    bytes_read: tuple[int, int]
    reads: tuple[int, int]
    excluded: int = 0
    notes: tuple[str, ...] = field(default=())
    not_present: tuple[str, ...] = ()
    """Tensors whose bytes lie (partly) in a sparse hole on either side (a header-only or partial copy): not
    data, never read, never compared; the verdict is INCOMPLETE at best."""

    @property
    def differs(self) -> bool:
        """Some compared tensor's bytes differ (tensors left unchecked are not a difference found)."""
        return bool(self.differing)


def _entries(actual: Located) -> dict[str, Entry]:
    return {name: Entry(t.dtype, tuple(t.shape), shard) for name, (t, shard) in actual.items()}


def header_diff(a: Checkpoint, b: Checkpoint, acc_a: Accounting | None = None,
                acc_b: Accounting | None = None) -> HeaderDiff:
    """Pure: two loaded checkpoints -> their differences."""
    la, dup_a = locate_tensors(a.headers)
    lb, dup_b = locate_tensors(b.headers)
    ea, eb = _entries(la), _entries(lb)
    added = tuple(Change(n, None, eb[n]) for n in eb if n not in ea)
    removed = tuple(Change(n, ea[n], None) for n in ea if n not in eb)
    changed, moved = [], []
    common = 0
    for n, x in ea.items():
        y = eb.get(n)
        if y is None:
            continue
        common += 1
        if (x.dtype, x.shape) != (y.dtype, y.shape):
            changed.append(Change(n, x, y))
        elif x.shard != y.shard:
            moved.append(Change(n, x, y))
    acc_a = acc_a or accounting_of_checkpoint(a)
    acc_b = acc_b or accounting_of_checkpoint(b)
    fa = {n.key: n for n in acc_a.nodes()}
    fb = {n.key: n for n in acc_b.nodes()}
    components = []
    for key in list(fa) + [k for k in fb if k not in fa]:
        na, nb = fa.get(key), fb.get(key)
        va, vb = (na.found if na else 0), (nb.found if nb else 0)
        if va != vb:
            components.append(ComponentDelta(key, (na or nb).title, va, vb))  # type: ignore[union-attr]
    keys = list(a.config_raw) + [k for k in b.config_raw if k not in a.config_raw]
    config = tuple((k, a.config_raw.get(k), b.config_raw.get(k)) for k in keys
                   if a.config_raw.get(k) != b.config_raw.get(k))
    shards_a, shards_b = set(a.headers), set(b.headers)
    ghosts_a, ghosts_b = (tuple(sorted(n for n in c.index.weight_map if n not in e)) if c.index else ()
                          for c, e in ((a, ea), (b, eb)))
    return HeaderDiff(a.label, b.label, a.revision, b.revision, added, removed, tuple(changed), tuple(moved),
                      tuple(components), config, (acc_a.found, acc_b.found), (len(ea), len(eb)), common,
                      (tuple(sorted(shards_a - shards_b)), tuple(sorted(shards_b - shards_a))),
                      (_stored_twice(dup_a), _stored_twice(dup_b)), (ghosts_a, ghosts_b))


def _stored_twice(findings: list[Finding]) -> int:
    """Names stored in more than one shard, from the tensor table's findings (one per duplicated name, or one
    that counts those it stands for)."""
    return sum(max(f.covers, 1) for f in findings if f.code == "TENSOR_DUPLICATE")


@dataclass(frozen=True)
class _Item:
    name: str
    shard: str
    start: int
    length: int


class _Read(NamedTuple):
    """One range read of the plan: whole small tensors (`run`, coalesced neighbours) or one chunk
    of a big tensor (`part`: its name, and whether the chunk is its last)."""

    shard: str
    start: int
    length: int
    run: tuple[_Item, ...] = ()
    part: tuple[str, bool] | None = None


def plan_hash_reads(items: list[_Item], chunk: int = CHUNK_BYTES, gap: int = COALESCE_GAP) -> list[_Read]:
    """The range reads that cover every item once, in file order: neighbours closer than `gap` share a read
    of at most `chunk` bytes; a tensor over `chunk` is read in chunks. With `gap` 0 only touching neighbours
    share one, so the bytes read are the items' own (what a --max-read budget bounds)."""
    plan: list[_Read] = []
    run: list[_Item] = []

    def flush() -> None:
        if run:
            first, last = run[0], run[-1]
            plan.append(_Read(first.shard, first.start, last.start + last.length - first.start, tuple(run)))
            run.clear()

    for it in sorted(items, key=lambda i: (i.shard, i.start)):
        if it.length > chunk:
            flush()
            for pos in range(0, it.length, chunk):
                n = min(chunk, it.length - pos)
                plan.append(_Read(it.shard, it.start + pos, n, part=(it.name, pos + n == it.length)))
            continue
        if run and (it.shard != run[0].shard or it.start - (run[-1].start + run[-1].length) > gap
                    or it.start + it.length - run[0].start > chunk):
            flush()
        run.append(it)
    flush()
    return plan


def hash_tensors(source: Source, items: list[_Item], chunk: int = CHUNK_BYTES,
                 progress: Callable[[int], None] | None = None,
                 plan: list[_Read] | None = None) -> tuple[dict[str, str], int, int]:
    """SHA-256 of each item's bytes by the reads of `plan_hash_reads` (or `plan`, made by it from these
    items), `source.parallel_reads` of them in flight at once (so at most that many chunks in memory);
    `progress` gets each read's byte count as it is hashed. Returns (name -> hex digest, bytes read, reads)."""
    out = {it.name: hashlib.sha256(b"").hexdigest() for it in items if not it.length}  # nothing to read
    if plan is None:
        plan = plan_hash_reads([it for it in items if it.length], chunk)
    read_bytes = 0
    hashers: dict[str, Any] = {}
    for r, data in zip(plan, _in_order(source, plan), strict=True):
        read_bytes += r.length
        if progress:
            progress(r.length)
        if r.part is not None:
            name, last = r.part
            h = hashers.setdefault(name, hashlib.sha256())
            h.update(data)
            if last:
                out[name] = hashers.pop(name).hexdigest()
            continue
        for it in r.run:
            off = it.start - r.start
            out[it.name] = hashlib.sha256(data[off: off + it.length]).hexdigest()
    return out, read_bytes, len(plan)


def _in_order(source: Source, plan: list[_Read]) -> Iterator[bytes]:
    """Each planned read's bytes, in plan order; up to `source.parallel_reads` reads in flight."""
    window = max(1, source.parallel_reads)
    if window == 1:
        for r in plan:
            yield read_exact(source, r.shard, r.start, r.length)
        return
    with ThreadPoolExecutor(max_workers=window) as pool:
        yield from windowed_map(pool, lambda r: read_exact(source, r.shard, r.start, r.length), plan, window)


def content_diff(src_a: Source, a: Checkpoint, src_b: Source, b: Checkpoint, *,
                 fingerprints_a: dict[str, str] | None = None, fingerprints_b: dict[str, str] | None = None,
                 max_read: int | None = None, include: Iterable[str] = (), chunk: int = CHUNK_BYTES,
                 progress: Callable[[int, int], None] | None = None) -> ContentDiff:
    """Which tensors held by both sides (same dtype and shape) have different bytes.

    `fingerprints_*` map shard names to a file identity ("sha256:<hex>" or a local file identity): two
    shards with equal fingerprints are the same file, and their tensors are not read. `max_read` bounds
    the bytes read per side (smallest tensors first); what it leaves out is reported as unchecked.
    `include` (glob patterns) restricts the comparison to matching tensor names. `progress(done, total)`
    is called before the first read and after each: bytes hashed so far and to hash, both sides together."""
    la, _ = locate_tensors(a.headers)
    lb, _ = locate_tensors(b.headers)
    fa, fb = fingerprints_a or {}, fingerprints_b or {}
    holes_a, holes_b = _holes(src_a, a), _holes(src_b, b)
    patterns = list(include)
    same_file = excluded = 0
    not_present: list[str] = []
    todo: list[tuple[int, str]] = []
    for name, (ta, sa) in la.items():
        got = lb.get(name)
        if got is None:
            continue
        tb, sb = got
        if (ta.dtype, tuple(ta.shape)) != (tb.dtype, tuple(tb.shape)):
            continue
        if patterns and not any(fnmatch.fnmatchcase(name, p) for p in patterns):
            excluded += 1
            continue
        if fa.get(sa) is not None and fa.get(sa) == fb.get(sb):
            same_file += 1
            continue
        if _absent(holes_a, a, sa, ta.begin, ta.end) or _absent(holes_b, b, sb, tb.begin, tb.end):
            not_present.append(name)  # holes read as zeros: "not present", never equal data
            continue
        todo.append((ta.end - ta.begin, name))
    todo.sort()
    chosen: list[str] = []
    unchecked: list[str] = []
    budget = 0
    for size, name in todo:
        if max_read is not None and budget + size > max_read:
            unchecked.append(name)
            continue
        budget += size
        chosen.append(name)

    def items(located: Located, ckpt: Checkpoint) -> list[_Item]:
        out = []
        for name in chosen:
            t, shard = located[name]
            out.append(_Item(name, shard, ckpt.headers[shard].data_start + t.begin, t.end - t.begin))
        return out

    items_a, items_b = items(la, a), items(lb, b)
    gap = COALESCE_GAP if max_read is None else 0  # a budget bounds the bytes read, the gaps between included
    plan_a = plan_hash_reads([it for it in items_a if it.length], chunk, gap)
    plan_b = plan_hash_reads([it for it in items_b if it.length], chunk, gap)
    total = sum(r.length for r in plan_a) + sum(r.length for r in plan_b)
    done = 0

    def tick(n: int) -> None:
        nonlocal done
        done += n
        if progress is not None:
            progress(done, total)

    if progress is not None:
        progress(0, total)
    ha, ba, ra = hash_tensors(src_a, items_a, chunk, tick if progress else None, plan_a)
    hb, bb, rb = hash_tensors(src_b, items_b, chunk, tick if progress else None, plan_b)
    differing = tuple((n, ha[n], hb[n]) for n in sorted(chosen) if ha[n] != hb[n])
    notes = []
    if unchecked:
        left_out = set(unchecked)
        left = sum(size for size, n in todo if n in left_out)
        notes.append(f"{len(unchecked):,} tensors ({left:,} bytes) not compared: over --max-read")
    if not_present:
        notes.append(f"{len(not_present):,} tensors not compared: their data is not present (sparse holes: a "
                     "header-only or partial copy)")
    return ContentDiff(len(chosen), same_file, differing, tuple(sorted(unchecked)), (ba, bb), (ra, rb),
                       excluded, tuple(notes), tuple(sorted(not_present)))


def _holes(source: Source, ckpt: Checkpoint) -> dict[str, Holes]:
    """Each shard's sparse holes (none for a remote source or where the file cannot be asked)."""
    out: dict[str, Holes] = {}
    for shard, h in ckpt.headers.items():
        try:
            out[shard] = data_holes(source, shard, h.data_start, h.file_size)
        except SourceError:
            out[shard] = ()  # the reads fail too, and say so
    return out


def _absent(holes: dict[str, Holes], ckpt: Checkpoint, shard: str, begin: int, end: int) -> bool:
    start = ckpt.headers[shard].data_start
    return in_hole(holes.get(shard, ()), start + begin, start + end)


def diff_dict(d: HeaderDiff, c: ContentDiff | None = None) -> dict[str, Any]:
    def ch(x: Change) -> dict[str, Any]:
        def e(v: Entry | None) -> dict[str, Any] | None:
            return None if v is None else {"dtype": v.dtype, "shape": list(v.shape), "shard": v.shard}
        return {"tensor": x.name, "a": e(x.a), "b": e(x.b)}

    out: dict[str, Any] = {
        "schema": "kimi-audit/diff/1",
        "a": {"source": d.a, "revision": d.a_revision, "tensors": d.tensors[0], "parameters": d.parameters[0]},
        "b": {"source": d.b, "revision": d.b_revision, "tensors": d.tensors[1], "parameters": d.parameters[1]},
        "added": [ch(x) for x in d.added],
        "removed": [ch(x) for x in d.removed],
        "changed": [ch(x) for x in d.changed],
        "moved": [ch(x) for x in d.moved],
        "components": [{"key": x.key, "title": x.title, "a": x.a, "b": x.b, "delta": x.delta} for x in d.components],
        "config": [{"key": k, "a": va, "b": vb} for k, va, vb in d.config],
        "shards_only": {"a": list(d.shards_only[0]), "b": list(d.shards_only[1])},
        "duplicates": {"a": d.duplicates[0], "b": d.duplicates[1]},
        "listed_only": {"a": list(d.listed_only[0]), "b": list(d.listed_only[1])},
        "differs": d.differs or bool(c and c.differs),
        "verdict": verdict(d, c),
    }
    if c is not None:
        out["content"] = {
            "compared": c.compared, "identical_files": c.identical_files, "excluded": c.excluded,
            "differing": [{"tensor": n, "a_sha256": x, "b_sha256": y} for n, x, y in c.differing],
            "unchecked": list(c.unchecked), "not_present": list(c.not_present), "bytes_read": list(c.bytes_read),
            "reads": list(c.reads),
            "notes": list(c.notes),
        }
    return out


def verdict(d: HeaderDiff, c: ContentDiff | None = None) -> str:
    """DIFFERENT if anything compared differs (headers, config or bytes), even with tensors left unchecked;
    INCOMPLETE if nothing compared differs but `--max-read` left tensors unchecked; else IDENTICAL."""
    if d.differs or (c is not None and c.differs):
        return DIFFERENT
    return INCOMPLETE if c is not None and (c.unchecked or c.not_present) else IDENTICAL
