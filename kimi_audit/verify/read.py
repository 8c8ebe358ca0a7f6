"""`verify`'s unit of work: one file read once, every byte hashed, every tensor's values scanned on the way.

`verify_file(task)` is a pure function of its (picklable) task: it opens the file itself (a local path, or
a Hub file read by 16 MiB ranged reads), streams it through one reused buffer in pieces of about
`chunk` bytes, feeds each piece to the file's sha256 and each tensor's part of it to the value kernels
(numerics/scan.py) and, when asked, to the tensor's own sha256. Pieces end on a tensor's row bands (the
128 rows of its FP8 blocks), ggml blocks or elements (verify/plan.py), so no state crosses a piece but counters.
The same function runs
in a local process pool or as a Ray task (verify/pool.py) and returns a `FileResult`.

A local file's sparse holes are not read: the tensors that lie in them are reported as data not present
(never scanned as zeros) and the file's sha256 is not computed.
"""

from __future__ import annotations

import bisect
import hashlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

from kimi_audit.format.gguf_types import GGML_BY_NAME
from kimi_audit.verify.plan import CHUNK as CHUNK
from kimi_audit.verify.plan import E8M0_SCALE, FLOAT, FP8_SCALE, GGML, block_checked, unit_of
from kimi_audit.verify.plan import FP8 as FP8
from kimi_audit.verify.plan import SCALE as SCALE
from kimi_audit.verify.plan import TensorPlan as TensorPlan
from kimi_audit.verify.plan import plan_pieces as plan_pieces
from kimi_audit.verify.plan import tensor_kind as tensor_kind

if TYPE_CHECKING:
    from kimi_audit.numerics.scan import Scanner

SPAN = 512 << 10
"""Bytes hashed, then scanned while they are still in the core's cache."""

ProgressHook = Callable[[int], None]
"""Called with the bytes of each piece done (the pool's workers send them to the progress bar)."""


class CellHealth(NamedTuple):
    """The weight-health figures of one (layer, expert) cell, summed over its tensors (FP8 weights: values and
    ±448 values; float scales: the least and greatest finite one). Kept per cell, not per tensor: a full-scale
    checkpoint has ~140k tensors but ~24k cells, and the report keeps only the sums per layer and per expert."""

    row: str
    expert: int
    """-1: the layer's tensors outside the routed experts."""
    fp8_values: int = 0
    saturated: int = 0
    scale_min: float | None = None
    scale_max: float | None = None

    def merge(self, other: CellHealth) -> CellHealth:
        lo = [v for v in (self.scale_min, other.scale_min) if v is not None]
        hi = [v for v in (self.scale_max, other.scale_max) if v is not None]
        return self._replace(fp8_values=self.fp8_values + other.fp8_values, saturated=self.saturated + other.saturated,
                             scale_min=min(lo) if lo else None, scale_max=max(hi) if hi else None)


@dataclass(frozen=True)
class FileTask:
    name: str
    size: int
    path: str | None = None
    """A local file (its realpath was checked to lie inside the checkpoint)."""
    hub: tuple[str, str, str] | None = None
    """(repo_id, commit, endpoint): the file is streamed from the Hub by ranged reads."""
    tensors: tuple[TensorPlan, ...] = ()
    """Empty when the file is not a shard with a usable header: hashed only."""
    holes: tuple[tuple[int, int], ...] = ()
    tensor_hashes: bool = False
    scan: bool = True
    chunk: int = CHUNK
    failed: str | None = None
    """Why the file is not to be read at all (its holes could not be asked about): its result is this error."""
    identity: tuple[int, ...] | None = None
    """The audited file's identity (sources.files.file_identity): the file hashed must be it, else FILE_CHANGED."""


@dataclass(frozen=True)
class Health:
    """One check that fired on one tensor: how many values, and the first one's element offset (for
    BLOCK_ALL_ZERO: blocks, and the first block's index in row-major block order)."""

    tensor: str
    code: str
    count: int
    first: int
    """Element offset of the first value (BLOCK_ALL_ZERO: of the first block's first value)."""
    shape: tuple[int, ...]
    block: tuple[int, int] | None = None
    ggml: str | None = None
    """A GGUF tensor's quantized ggml type: `count` is of its blocks' scale fields, `first` the element offset of
    the first such block."""


@dataclass(frozen=True)
class FileResult:
    name: str
    size: int
    sha256: str | None
    """None when the file could not be read whole (an error, or sparse holes)."""
    bytes_read: int
    seconds: float
    tensor_sha256: dict[str, str] = field(default_factory=dict)
    health: tuple[Health, ...] = ()
    saturated: int = 0
    """FP8 values at ±448 (info: each block's maximum is there)."""
    saturated_tensors: int = 0
    tensors_scanned: int = 0
    not_present: tuple[str, ...] = ()
    """Tensors lying (partly) in sparse holes: not scanned."""
    holes: tuple[tuple[int, int], ...] = ()
    error: str | None = None
    changed: str | None = None
    """Why the bytes read are not the file as it is (appended, written, cut or replaced): no sha256 then."""
    cells: tuple[CellHealth, ...] = ()
    """Per (layer, expert) cell of the tensors planned with one: FP8 values, ±448 values, the scales' range."""


def _in_holes(holes: tuple[tuple[int, int], ...], a: int, b: int) -> bool:
    """Whether any byte of [a, b) lies in a hole."""
    return any(h0 < b and a < h1 for h0, h1 in holes)


def _present(holes: tuple[tuple[int, int], ...], a: int, b: int) -> Iterator[tuple[int, int]]:
    """The parts of [a, b) outside the holes (sorted, not overlapping)."""
    for h0, h1 in holes:
        if h1 <= a or h0 >= b:
            continue
        if h0 > a:
            yield a, h0
        a = max(a, h1)
    if a < b:
        yield a, b


def verify_file(task: FileTask, progress: ProgressHook | None = None) -> FileResult:
    """Read the file once: its sha256, each tensor's health, and (task.tensor_hashes) each tensor's sha256."""
    from kimi_audit.errors import KimiAuditError
    from kimi_audit.verify.windows import FileChangedError

    started = time.monotonic()
    state = _State(task)
    if task.failed is not None:
        return state.result(started, task.failed)
    try:
        changed = state.run(progress)
    except FileChangedError as e:
        return state.result(started, None, str(e))
    except (OSError, KimiAuditError) as e:
        return state.result(started, f"{type(e).__name__}: {e}" if isinstance(e, OSError) else str(e))
    return state.result(started, None, changed)


class _State:
    def __init__(self, task: FileTask) -> None:
        self.task = task
        self.file_hash = None if task.holes else hashlib.sha256()
        self.tensor_hash: dict[str, hashlib._Hash] = {}
        self.tensor_sha: dict[str, str] = {}
        self.counts: dict[tuple[str, str], list[int]] = {}
        self.saturated: dict[str, int] = {}
        self.cells: dict[tuple[str, int], list[int]] = {}
        """(row, expert) -> [FP8 values, ±448 values]."""
        self.ranges: dict[tuple[str, int], tuple[float, float]] = {}
        """(row, expert) -> (least finite float scale, greatest)."""
        self.zero_from: dict[str, int] = {}
        """FP8 weight -> where its all-zero block screen goes on from (bands before it are checked)."""
        self.zero_check = {t.name for t in task.tensors if t.block is not None and block_checked(t)}
        self.scanned = 0
        self.bytes_read = 0
        self.absent = tuple(t.name for t in task.tensors if _in_holes(task.holes, t.begin, t.end))
        self.skip = set(self.absent)

    def run(self, progress: ProgressHook | None) -> str | None:
        """Read the file; why what was read is not the file as it is now (local files), else None."""
        from kimi_audit.numerics.scan import Scanner
        from kimi_audit.verify.windows import HubReader, LocalReader

        task = self.task
        pieces = list(plan_pieces(task.size, task.tensors, task.chunk))
        begins = [t.begin for t in task.tensors]
        scan = task.scan and bool(task.tensors)
        reader: LocalReader | HubReader
        if task.path is not None:
            reader = LocalReader(task.path, task.size, task.identity)
        elif task.hub is not None:
            reader = HubReader(task.name, task.hub)
        else:
            raise OSError("no path and no Hub file to read")
        try:
            for k, (start, end) in enumerate(pieces):
                following = pieces[k + 1] if k + 1 < len(pieces) else None
                present = list(_present(task.holes, start, end))
                if present:
                    with reader.window(present[0][0], present[-1][1], following) as (buf, base):
                        self.bytes_read += sum(b - a for a, b in present)
                        scanner = Scanner(buf) if scan else None
                        view = memoryview(buf)
                        try:
                            for a, b in present:
                                for s in range(a, b, SPAN):
                                    e = min(b, s + SPAN)
                                    if self.file_hash is not None:
                                        self.file_hash.update(view[s - base:e - base])
                                    self._tensors(view, scanner, begins, s, e, base)
                        finally:
                            view.release()
                            if scanner is not None:
                                scanner.release()
                if progress:
                    progress(end - start)
            return reader.changed() if isinstance(reader, LocalReader) else None
        finally:
            reader.close()

    def _tensors(self, view: memoryview, scanner: Scanner | None, begins: list[int], s: int, e: int,
                 base: int) -> None:
        """The tensors' parts in the file's bytes [s, e), which are view[s - base:e - base]."""
        tensors = self.task.tensors
        k = max(0, bisect.bisect_right(begins, s) - 1)
        while k < len(tensors) and tensors[k].begin < e:
            t = tensors[k]
            k += 1
            a, b = max(t.begin, s), min(t.end, e)
            if a >= b or t.name in self.skip:
                continue
            if self.task.tensor_hashes:
                h = self.tensor_hash.get(t.name)
                if h is None:
                    h = self.tensor_hash[t.name] = hashlib.sha256()
                h.update(view[a - base:b - base])
                if b == t.end:
                    self.tensor_sha[t.name] = self.tensor_hash.pop(t.name).hexdigest()
            if scanner is not None and t.kind is not None:
                self._scan(scanner, t, a, b, base)
                if b == t.end:
                    self.scanned += 1

    def _scan(self, scanner: Scanner, t: TensorPlan, a: int, b: int, base: int) -> None:
        """Check the values of t's bytes [a, b) (file offsets; buffer offsets are less `base`)."""
        if t.kind == FP8:
            nan, first, sat = scanner.fp8(a - base, b - base)
            if nan:
                self._add(t, "FP8_NAN", nan, a - t.begin + first)
            if sat:
                self.saturated[t.name] = self.saturated.get(t.name, 0) + sat
            if t.cell is not None:
                c = self.cells.get(t.cell)
                if c is None:
                    self.cells[t.cell] = [b - a, sat]
                else:
                    c[0] += b - a
                    c[1] += sat
            if t.block is not None and t.name in self.zero_check:
                self._zero_blocks(scanner, t, t.block, a, b, base)
            return
        if t.kind == E8M0_SCALE:
            nan, first = scanner.e8m0(a - base, b - base)
            if nan:
                self._add(t, "VALUE_NAN", nan, a - t.begin + first)
            return
        if t.kind == FP8_SCALE:
            nan, first, bad, bad_first = scanner.fp8_scales(a - base, b - base)
            for code, n, at in (("VALUE_NAN", nan, first), ("SCALE_NOT_POSITIVE", bad, bad_first)):
                if n:
                    self._add(t, code, n, a - t.begin + at)
            return
        size = unit_of(t)
        a -= (a - t.begin) % size  # a span may end mid-element (mid-block): it is checked with the next span
        b -= (b - t.begin) % size if b < t.end else 0
        if t.kind == GGML:
            ggml = GGML_BY_NAME[t.dtype]
            if ggml.scales is None:  # llama.cpp's check refuses the type whole
                if a == t.begin:
                    self._add(t, "GGUF_TYPE_UNKNOWN", 1, 0)
                return
            nan, nan_first, inf, inf_first = scanner.ggml(a - base, b - base, t.dtype)
            for code, n, first in (("VALUE_NAN", nan, nan_first), ("VALUE_INF", inf, inf_first)):
                if n:
                    self._add(t, code, n, ((a - t.begin) // size + first) * ggml.block)
            return
        if t.kind == FLOAT:
            nan, nan_first, inf, inf_first = scanner.floats(a - base, b - base, t.dtype)
            bad, bad_first = 0, -1
        else:
            nan, nan_first, inf, inf_first, bad, bad_first, lo, hi = scanner.scales(a - base, b - base, t.dtype)
            if t.cell is not None and lo is not None and hi is not None:
                r = self.ranges.get(t.cell)
                self.ranges[t.cell] = (lo, hi) if r is None else (min(r[0], lo), max(r[1], hi))
        for code, n, first in (("VALUE_NAN", nan, nan_first), ("VALUE_INF", inf, inf_first),
                               ("SCALE_NOT_POSITIVE", bad, bad_first)):
            if n:
                self._add(t, code, n, (a - t.begin) // size + first)

    def _zero_blocks(self, scanner: Scanner, t: TensorPlan, block: tuple[int, int], a: int, b: int,
                     base: int) -> None:
        """Screen [a, b) for a run of zeros as wide as t's narrowest block (from a little before a: a run may
        cross spans); check exactly each band of blocks a run lies in (it is whole in the window: windows end
        on bands)."""
        cols = t.shape[1]
        width = cols % block[1] or block[1]
        band = block[0] * cols
        band_start = a - (a - t.begin) % band  # windows start on bands: the window holds it
        pos = max(a - width + 1, band_start, self.zero_from.get(t.name, t.begin))
        while True:
            i = scanner.zero_run(width, pos - base, b - base)
            if i < 0:
                break
            k = (i + base - t.begin) // band
            lo, hi = t.begin + k * band, min(t.end, t.begin + (k + 1) * band)
            zero, col = scanner.zero_blocks(lo - base, (hi - lo) // cols, cols, block)
            if zero:  # the first element of the first zero block
                self._add(t, "BLOCK_ALL_ZERO", zero, lo - t.begin + col * block[1])
            self.zero_from[t.name] = pos = hi
            if pos >= b:
                break

    def _add(self, t: TensorPlan, code: str, n: int, first: int) -> None:
        c = self.counts.get((t.name, code))
        if c is None:
            self.counts[(t.name, code)] = [n, first]
        else:
            c[0] += n

    def result(self, started: float, error: str | None, changed: str | None = None) -> FileResult:
        plans = {t.name: t for t in self.task.tensors}
        health = tuple(Health(name, code, c[0], c[1], p.shape, p.block, p.dtype if p.kind == GGML else None)
                       for (name, code), c in self.counts.items() for p in (plans[name],))
        whole = error is None and changed is None
        return FileResult(
            self.task.name, self.task.size,
            self.file_hash.hexdigest() if self.file_hash is not None and whole else None,
            self.bytes_read, time.monotonic() - started, self.tensor_sha if whole else {}, health,
            sum(self.saturated.values()), len(self.saturated), self.scanned, self.absent, self.task.holes, error,
            changed, self._cells())

    def _cells(self) -> tuple[CellHealth, ...]:
        keys = list(self.cells) + [k for k in self.ranges if k not in self.cells]
        return tuple(CellHealth(row, expert, *self.cells.get((row, expert), (0, 0)),
                                *self.ranges.get((row, expert), (None, None))) for row, expert in keys)
