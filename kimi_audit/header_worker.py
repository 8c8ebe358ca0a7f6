"""A second process that fetches and parses a share of a remote checkpoint's shard headers.

Parsing 139,644 header entries is CPU work that holds the GIL, so threads cannot spread it over the
cores. The worker is started (`python -m kimi_audit.header_worker`) as soon as a remote load begins:
its interpreter starts and imports while the parent reads config.json and the index. The parent then
sends it the resolved source and a share of the shards with their first-read sizes, the names the
index lists in each with their layout positions, and the layout's columns: the worker reads, parses
and aligns them (alignment.align_listed, no layout of its own to derive) while the parent does its
own share, reports each shard as it is done (for the progress bar) and hands all its results back at
the end, in one message (a stream of large ones would stall on the parent's reading thread while the
parent parses, holding the GIL).

The worker makes only the requests the parent would have made (no resolve, no extra reads). Its
results are what the parent's own reader would have produced for those shards; a worker that fails
to start or dies leaves its shards to the parent. A Hub error that no retry mends (RangeNotSupported,
timeouts, gated) is raised in the parent as if the parent had met it.

Both directions carry pickles over the pipes between the two processes. The parent unpickles only
the result classes this package defines (`_ResultUnpickler`); the worker's job holds builtins only.
"""

from __future__ import annotations

import io
import logging
import os
import pickle
import queue
import struct
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kimi_audit.errors import KimiAuditError

if TYPE_CHECKING:
    from kimi_audit.layout import LayoutColumns

log = logging.getLogger(__name__)

MIN_SHARDS = 16
"""Fewer shards than this: their headers parse in milliseconds, not worth a process."""
DISABLE_ENV = "KIMI_AUDIT_HEADER_WORKER"
"""Set to 0 to read every header in the parent process."""
_LENGTH = struct.Struct("<Q")
_MAX_MESSAGE = 1 << 31
_ALLOWED_RESULTS = {
    ("kimi_audit.format", "ShardHeader"),
    ("kimi_audit.format", "TensorColumns"),
    ("kimi_audit.findings", "Finding"),
    ("kimi_audit.findings", "Severity"),
    ("kimi_audit.alignment", "ShardAlignment"),
}


class WorkerFailed(Exception):
    """The worker could not do its share (did not start, died, sent garbage): the parent reads it."""


def enabled(shard_count: int) -> bool:
    return (
        shard_count >= MIN_SHARDS
        and os.environ.get(DISABLE_ENV, "1") != "0"
        and bool(sys.executable)
        and not getattr(sys, "frozen", False)
    )


class _ResultUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED_RESULTS:
            return super().find_class(module, name)
        if module.startswith("kimi_audit."):
            cls = super().find_class(module, name)
            if isinstance(cls, type) and issubclass(cls, KimiAuditError):
                return cls
        raise pickle.UnpicklingError(f"header worker sent a {module}.{name}, which is not a result")


class _JobUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"a header job holds builtins only, not {module}.{name}")


def _write(stream: Any, message: Any) -> None:
    blob = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_LENGTH.pack(len(blob)) + blob)
    stream.flush()


def _read(stream: Any, unpickler: type[pickle.Unpickler]) -> Any:
    """One message, or None at end of stream."""
    head = stream.read(_LENGTH.size)
    if not head:
        return None
    if len(head) != _LENGTH.size:
        raise WorkerFailed("header worker's stream broke off in a message length")
    (n,) = _LENGTH.unpack(head)
    if n > _MAX_MESSAGE:
        raise WorkerFailed(f"header worker announced a {n:,}-byte message")
    blob = stream.read(n)
    if len(blob) != n:
        raise WorkerFailed("header worker's stream broke off in a message")
    try:
        return unpickler(io.BytesIO(blob)).load()
    except Exception as e:  # noqa: BLE001 - anything unreadable means the worker failed
        raise WorkerFailed(f"unreadable message from the header worker: {e}") from None


class HeaderWorker:
    """The parent's handle on one worker process: start it early, `submit` a share, follow
    `progressed`, collect `results`; `close` always."""

    command: tuple[str, ...] | None = None
    """The worker's command line (default: this interpreter, `-P -m kimi_audit.header_worker`)."""

    def __init__(self) -> None:
        package_parent = str(Path(__file__).resolve().parent.parent)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_parent, env.get("PYTHONPATH")) if p)
        try:
            self._proc: subprocess.Popen[bytes] | None = subprocess.Popen(
                # -P: the working directory is not put on sys.path, so a `kimi_audit` folder there (in a
                # downloaded repo, say) cannot stand in for this package; PYTHONPATH leads to this one.
                list(self.command or (sys.executable, "-P", "-m", "kimi_audit.header_worker")),
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env,
            )
        except OSError as e:
            log.debug("header worker did not start: %s", e)
            self._proc = None
        self._messages: queue.Queue[Any] = queue.Queue()
        self._reader: threading.Thread | None = None

    def submit(
        self, state: dict[str, Any], items: list[tuple[str, int, list[str], bytes | None]], threads: int,
        budget: int, layout: LayoutColumns | None = None,
    ) -> None:
        """Send the job: the source's state, [(shard, first read, the names the index lists in it and
        their layout positions as alignment.listed_positions)], threads, header-byte budget, and the
        layout's columns if the worker is to align each shard (alignment.align_listed)."""
        if self._proc is None:
            raise WorkerFailed("header worker did not start")
        wire = None if layout is None else layout.to_builtins()
        job = {"source": state, "items": items, "threads": threads, "budget": budget, "layout": wire}
        # Megabytes, more than a pipe holds while the worker is still starting up: a thread writes them,
        # and the parent goes on with its own share. A worker that takes no job ends its stream unanswered.
        threading.Thread(target=self._send, args=(job,), name="kimi-audit-header-job", daemon=True).start()
        self._reader = threading.Thread(target=self._drain, name="kimi-audit-header-worker", daemon=True)
        self._reader.start()

    def _send(self, job: dict[str, Any]) -> None:
        assert self._proc is not None and self._proc.stdin is not None
        stdin = self._proc.stdin
        try:
            _write(stdin, job)
            stdin.close()
        except (OSError, ValueError) as e:
            log.debug("header worker took no job: %s", e)

    def _drain(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        try:
            while True:
                message = _read(self._proc.stdout, _ResultUnpickler)
                self._messages.put(message)
                if message is None or message[0] != "progress":
                    return
        except WorkerFailed as e:
            self._messages.put(("failed", str(e)))

    def progressed(self) -> list[str]:
        """Shards the worker has finished since the last call (their results come with `results`)."""
        out: list[str] = []
        while True:
            try:
                message = self._messages.get_nowait()
            except queue.Empty:
                return out
            if message is None or message[0] != "progress":
                self._messages.put(message)  # the stream's end: `results` says what it means
                return out
            out.append(message[1])

    def results(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """(shard -> ShardHeader | Finding | header_fetch.SKIPPED, shard -> ShardAlignment), once the
        worker is done, waiting for it. The worker's reads time out like the parent's, so its stream
        always ends. Raises the Hub error that stopped the worker, or WorkerFailed."""
        if self._reader is None:
            raise WorkerFailed("header worker has no job")
        while True:
            try:
                message = self._messages.get(timeout=0.5)  # a timeout keeps Ctrl-C working
            except queue.Empty:
                continue
            if message is None:
                raise WorkerFailed("header worker ended without its results")
            kind, payload = message
            if kind == "progress":
                continue
            if (kind == "results" and isinstance(payload, tuple) and len(payload) == 2
                    and all(isinstance(part, dict) for part in payload)):
                return payload
            if kind == "fatal" and isinstance(payload, KimiAuditError):
                raise payload
            raise WorkerFailed(f"header worker failed: {payload}")

    def close(self) -> None:
        if self._proc is None:
            return
        if self._proc.poll() is None:
            self._proc.kill()
        for stream in (self._proc.stdin, self._proc.stdout):
            if stream is not None:
                try:
                    stream.close()
                except OSError:
                    pass
        self._proc.wait()
        self._proc = None


def _warm_up() -> None:
    """What the first requests and parse would otherwise pay for, done while the job is awaited."""
    from huggingface_hub.utils import build_hf_headers, get_session

    from kimi_audit.format import parse_header_json

    get_session()
    build_hf_headers(token=False, library_name="kimi-audit")
    raw = b'{"__metadata__":{"format":"pt"},"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}'
    parse_header_json(raw, shard="warm-up", file_size=8 + len(raw) + 4)


def _serve(stdin: Any, stdout: Any) -> None:
    import gc

    from kimi_audit.alignment import ShardAlignment, align_listed
    from kimi_audit.format import ShardHeader
    from kimi_audit.header_fetch import HeaderBudget, fetch_header, parse_fetched
    from kimi_audit.layout import LayoutColumns
    from kimi_audit.sources.hub import HubError, HubSource

    gc.disable()  # what it builds is acyclic, and the process ends when the job is done
    _warm_up()
    job = _read(stdin, _JobUnpickler)
    if job is None:
        return
    source = HubSource.from_worker_state(job["source"])
    items: list[tuple[str, int, list[str], bytes | None]] = job["items"]
    budget = HeaderBudget(int(job["budget"]))
    layout = None if job["layout"] is None else LayoutColumns.from_builtins(job["layout"])
    results: dict[str, Any] = {}
    alignments: dict[str, ShardAlignment] = {}
    try:
        with ThreadPoolExecutor(max_workers=max(1, min(int(job["threads"]), len(items)))) as pool:
            fetched = pool.map(lambda item: fetch_header(source, item[0], item[1], budget), items)
            for (shard, _, names, listed), got in zip(items, fetched):
                result = results[shard] = parse_fetched(shard, got)
                if layout is not None and listed is not None and isinstance(result, ShardHeader):
                    aligned = align_listed(result, names, listed, layout)
                    if aligned is not None:  # else the parent aligns it, with the whole layout
                        alignments[shard] = aligned
                _write(stdout, ("progress", shard))
    except HubError as e:
        _write(stdout, ("fatal", e))
    except Exception as e:  # noqa: BLE001 - reported to the parent, which reads the share itself
        _write(stdout, ("crashed", f"{type(e).__name__}: {e}"))
    else:
        _write(stdout, ("results", (results, alignments)))


def main() -> None:
    try:
        _serve(sys.stdin.buffer, sys.stdout.buffer)
    except BaseException:  # noqa: BLE001 - the parent sees the stream end and reads the share itself
        pass
    os._exit(0)  # no interpreter teardown: every message is flushed as it is written


if __name__ == "__main__":
    main()
