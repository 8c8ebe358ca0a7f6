"""A loopback fake of the Hugging Face Hub, for tests and benchmarks.

It serves one or more model repos from local directories, speaking just enough of the Hub's
HTTP protocol for the real `huggingface_hub` client:

- ``HEAD``/``GET /{repo}/resolve/{rev}/{file}`` with ``X-Repo-Commit``, ``ETag``,
  ``Content-Length``, ``Accept-Ranges``; ``Range: bytes=a-b | a- | -n`` -> 206 + ``Content-Range``
  (inclusive end), 416 when unsatisfiable;
- ``GET /api/models/{repo}`` (main) and ``/api/models/{repo}/revision/{rev}`` with ``sha`` and
  ``siblings`` (``rfilename``, ``size``, ``blobId``, ``lfs {sha256, size, pointerSize}``);
- ``GET /api/models/{repo}/tree/{rev}`` (one page; what ``snapshot_download`` lists);
- errors as the Hub sends them: 404 + ``X-Error-Code: RepoNotFound | RevisionNotFound |
  EntryNotFound``, 401/403 + ``GatedRepo`` for a file of a gated repo without the right Bearer
  token (as on the Hub, a gated repo's info and file listing stay public).

Branch names, the full commit and any prefix of it (>= 7 hex digits) resolve to the full commit. A pull request
(:meth:`FakeHub.add_pr`) is a ref ``refs/pr/N`` naming a commit of its own whose files come from another folder,
as the Hub serves a PR's head before it is merged (the client sends the ref URL-quoted: ``refs%2Fpr%2F1``).
sha256 is computed lazily and only for files <= 64 MB (the full-scale replica's shards are 16 GB
sparse files and are never read whole); bigger files are listed without LFS metadata.

It counts requests and body bytes sent, in total and per path, and injects faults
(:meth:`FakeHub.add_fault`): ``500`` (N times, then success), ``429`` with ``Retry-After``,
``ignore_range`` (answer a ranged GET with 200 and the whole body, streamed in chunks, so that a
good client hangs up early), ``truncate`` (promise the full length, send part, close), ``lie_total``
(a ranged answer's Content-Range claims another file size than the listing's), ``stall``
(sleep before answering) and a per-request ``latency_s``.

Every wait is bounded and is cut short by :meth:`FakeHub.stop`, so teardown never hangs.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

SHA256_MAX_BYTES = 64 * 1024 * 1024
CHUNK = 1024 * 1024
STREAM_CHUNK = 64 * 1024
LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".npy", ".gguf", ".msgpack", ".h5")
LFS_MIN_BYTES = 10 * 1024 * 1024
_HEX40 = re.compile(r"^[0-9a-f]{40}$")
_HEX_PREFIX = re.compile(r"^[0-9a-f]{7,40}$")
_RANGE = re.compile(r"^\s*bytes\s*=\s*(\d*)\s*-\s*(\d*)\s*$", re.IGNORECASE)

FAULT_KINDS = ("500", "429", "ignore_range", "truncate", "stall", "trickle", "gzip_bomb", "lie_total")


@dataclass
class Repo:
    repo_id: str
    root: Path
    commit: str
    branches: dict[str, str]
    token: str | None = None  # gated: requests need `Authorization: Bearer <token>`
    hub_total: int | None = None  # model info safetensors.total served instead of the one computed
    commits: dict[str, Path] = field(default_factory=dict)  # other commits (a PR's head) -> the folder of their files


@dataclass
class Fault:
    kind: str
    times: int  # how many matching requests it still applies to
    match: str | None = None  # substring of the request path; None: every path
    method: str | None = None  # "GET", "HEAD"; None: both
    retry_after: int = 1  # 429
    stall_s: float = 30.0  # stall
    keep_fraction: float = 0.5  # truncate: share of the promised body actually sent
    inflated: int = 2 << 30  # gzip_bomb: bytes the body inflates to
    total: int = 0  # lie_total: the file size a ranged answer's Content-Range claims


@dataclass
class RequestRecord:
    method: str
    path: str
    status: int
    range: str | None
    bytes_sent: int
    gen: int = field(default=0, repr=False, compare=False)  # which reset_stats() epoch counted it
    at: float = field(default=0.0, repr=False, compare=False)  # time.monotonic() when the server counted it


@dataclass
class Stats:
    requests: int = 0
    bytes_sent: int = 0
    per_path: dict[str, list[int]] = field(default_factory=dict)  # path -> [requests, bytes]
    records: list[RequestRecord] = field(default_factory=list)
    peak_in_flight: int = 0  # the most requests the server was handling at once

    def for_path(self, needle: str) -> tuple[int, int]:
        """(requests, bytes) summed over the paths that contain `needle`."""
        r = b = 0
        for path, (n, nb) in self.per_path.items():
            if needle in path:
                r += n
                b += nb
        return r, b


def _git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\x00" % len(data) + data).hexdigest()


class FakeHub:
    """Start with ``with FakeHub() as hub:`` or ``hub.start()`` / ``hub.stop()``."""

    def __init__(self) -> None:
        self.repos: dict[str, Repo] = {}
        self.latency_s = 0.0
        self._faults: list[Fault] = []
        self._lock = threading.Lock()
        self._stats = Stats()
        self._gen = 0
        self._in_flight = 0
        self._hash_cache: dict[tuple[str, int, int], tuple[str, str]] = {}
        self._hub_totals: dict[tuple[str, str], int | None] = {}
        self._stopping = threading.Event()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # --- configuration -------------------------------------------------------------------------
    def add_repo(
        self,
        repo_id: str,
        root: str | os.PathLike[str],
        *,
        commit: str | None = None,
        branches: dict[str, str] | None = None,
        token: str | None = None,
    ) -> Repo:
        commit = commit or hashlib.sha1(f"kimi-audit fake hub:{repo_id}".encode()).hexdigest()
        if not _HEX40.match(commit):
            raise ValueError(f"commit must be 40 lowercase hex digits: {commit!r}")
        repo = Repo(repo_id, Path(root), commit, {"main": commit, **(branches or {})}, token)
        self.repos[repo_id] = repo
        return repo

    def add_pr(self, repo_id: str, root: str | os.PathLike[str], number: int = 1, commit: str | None = None) -> str:
        """Pull request `number` on `repo_id`: `refs/pr/{number}` names a commit of its own (returned) whose files
        are `root`'s; `main` still serves the repo's own."""
        repo = self.repos[repo_id]
        commit = commit or hashlib.sha1(f"kimi-audit fake hub:{repo_id} pr {number}".encode()).hexdigest()
        if not _HEX40.match(commit):
            raise ValueError(f"commit must be 40 lowercase hex digits: {commit!r}")
        repo.branches[f"refs/pr/{number}"] = commit
        repo.commits[commit] = Path(root)
        return commit

    def add_fault(self, kind: str, times: int = 1, match: str | None = None, **params: object) -> Fault:
        if kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault {kind!r}; one of {FAULT_KINDS}")
        fault = Fault(kind, times, match, **params)  # type: ignore[arg-type]
        with self._lock:
            self._faults.append(fault)
        return fault

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()
        self.latency_s = 0.0

    def _take_fault(self, method: str, path: str) -> Fault | None:
        with self._lock:
            for fault in self._faults:
                if fault.times <= 0:
                    continue
                if fault.method is not None and fault.method != method:
                    continue
                if fault.match is not None and fault.match not in path:
                    continue
                fault.times -= 1
                return fault
        return None

    # --- counters ------------------------------------------------------------------------------
    def stats(self) -> Stats:
        """A snapshot of the counters."""
        with self._lock:
            s = self._stats
            records = [RequestRecord(r.method, r.path, r.status, r.range, r.bytes_sent, at=r.at) for r in s.records]
            return Stats(s.requests, s.bytes_sent, {k: list(v) for k, v in s.per_path.items()}, records,
                         s.peak_in_flight)

    def reset_stats(self) -> None:
        with self._lock:
            self._stats = Stats()
            self._gen += 1

    def _record(self, method: str, path: str, status: int, rng: str | None, nbytes: int) -> RequestRecord:
        """Count a request (before its body goes out, so a client never sees an answer not yet counted)."""
        with self._lock:
            rec = RequestRecord(method, path, status, rng, 0, self._gen, time.monotonic())
            s = self._stats
            s.requests += 1
            s.per_path.setdefault(path, [0, 0])[0] += 1
            s.records.append(rec)
        self._add_bytes(rec, nbytes)
        return rec

    def _enter(self) -> None:
        with self._lock:
            self._in_flight += 1
            self._stats.peak_in_flight = max(self._stats.peak_in_flight, self._in_flight)

    def _leave(self) -> None:
        with self._lock:
            self._in_flight -= 1

    def _add_bytes(self, rec: RequestRecord, nbytes: int) -> None:
        with self._lock:
            rec.bytes_sent += nbytes
            s = self._stats
            if rec.gen == self._gen:  # not reset since
                s.bytes_sent += nbytes
                s.per_path.setdefault(rec.path, [0, 0])[1] += nbytes

    # --- lifecycle -----------------------------------------------------------------------------
    @property
    def endpoint(self) -> str:
        if self._server is None:
            raise RuntimeError("FakeHub is not started")
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> FakeHub:
        hub = self

        class Handler(_Handler):
            pass

        Handler.hub = hub
        server = _Server(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        server.block_on_close = False
        self._server = server
        self._stopping.clear()
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server = None
        self._thread = None

    def __enter__(self) -> FakeHub:
        return self.start() if self._server is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def wait(self, seconds: float) -> None:
        """Sleep, but wake up at once when the hub stops."""
        if seconds > 0:
            self._stopping.wait(seconds)

    # --- repo content --------------------------------------------------------------------------
    def resolve_revision(self, repo: Repo, rev: str) -> str | None:
        if rev in repo.branches:
            return repo.branches[rev]
        if _HEX_PREFIX.match(rev):
            for commit in (repo.commit, *repo.commits):
                if commit.startswith(rev):
                    return commit
        return None

    def at(self, repo: Repo, commit: str) -> Repo:
        """The repo as of `commit`: its own files, or those of the PR head that commit is."""
        if commit == repo.commit or commit not in repo.commits:
            return repo
        return Repo(repo.repo_id, repo.commits[commit], commit, repo.branches, repo.token, repo.hub_total,
                    repo.commits)

    def file_path(self, repo: Repo, name: str) -> Path | None:
        parts = name.split("/")
        if not name or any(p in ("", ".", "..") for p in parts) or "\\" in name:
            return None
        p = repo.root.joinpath(*parts)
        return p if p.is_file() else None

    def hashes(self, path: Path) -> tuple[str, str] | None:
        """(git blob sha1, sha256) of a file <= 64 MB, cached by (path, size, mtime); None if bigger."""
        st = path.stat()
        if st.st_size > SHA256_MAX_BYTES:
            return None
        key = (str(path), st.st_size, st.st_mtime_ns)
        with self._lock:
            cached = self._hash_cache.get(key)
        if cached is None:
            data = path.read_bytes()
            cached = (_git_blob_sha1(data), hashlib.sha256(data).hexdigest())
            with self._lock:
                self._hash_cache[key] = cached
        return cached

    def is_lfs(self, path: Path, size: int) -> bool:
        return path.name.endswith(LFS_SUFFIXES) or size >= LFS_MIN_BYTES

    def etag(self, path: Path) -> str:
        st = path.stat()
        h = self.hashes(path)
        if h is not None:
            return h[1] if self.is_lfs(path, st.st_size) else h[0]
        # Too big to hash: stable per (name, size, mtime), like a content id would be.
        return hashlib.sha256(f"{path}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()

    def safetensors_total(self, repo: Repo) -> int | None:
        """The model info's `safetensors.total` as the Hub computes it (huggingface.js parseSafetensorsMetadata,
        family.md): every stored element of every shard header, less, with a quantization_config, the names
        ending weight_scale_inv, weight_scale, weight_zero_point, weight_shape and every F8_E8M0 tensor; the
        index's total_parameters where it is not above that. `repo.hub_total` overrides it (a Hub that counted
        other files); None for a repo without safetensors."""
        if repo.hub_total is not None:
            return repo.hub_total
        key = (repo.repo_id, repo.commit)
        if key not in self._hub_totals:
            try:
                self._hub_totals[key] = self._count(repo)
            except (OSError, ValueError, KeyError, TypeError, AttributeError):
                self._hub_totals[key] = None  # a hostile test file: the Hub shows no count for it
        return self._hub_totals[key]

    def _count(self, repo: Repo) -> int | None:
        names = [n for n in self.list_files(repo) if n.endswith(".safetensors")]
        if not names:
            return None
        config_path = self.file_path(repo, "config.json")
        config = json.loads(config_path.read_bytes()) if config_path is not None and \
            config_path.stat().st_size <= 1_000_000 else {}
        quantized = isinstance(config, dict) and config.get("quantization_config") is not None
        left_out = ("weight_scale_inv", "weight_scale", "weight_zero_point", "weight_shape")
        total = 0
        for name in names:
            path = self.file_path(repo, name)
            if path is None:
                continue
            with open(path, "rb") as f:
                n = int.from_bytes(f.read(8), "little")
                if n > 100_000_000:  # the Hub refuses such a header: no count
                    return None
                header = json.loads(f.read(n))
            for key, entry in header.items():
                if key == "__metadata__" or (quantized and (entry["dtype"] == "F8_E8M0" or key.endswith(left_out))):
                    continue
                count = 1
                for d in entry["shape"]:
                    count *= d
                total += count
        index_path = self.file_path(repo, "model.safetensors.index.json")
        if index_path is not None and index_path.stat().st_size <= 64_000_000:
            reported = (json.loads(index_path.read_bytes()).get("metadata") or {}).get("total_parameters")
            if isinstance(reported, int) and reported <= total:
                return reported
        return total

    def list_files(self, repo: Repo) -> list[str]:
        out = []
        for dirpath, _dirs, files in os.walk(repo.root):
            rel = os.path.relpath(dirpath, repo.root)
            for f in files:
                out.append(f if rel == "." else f"{rel}/{f}".replace(os.sep, "/"))
        return sorted(out)

    def entry(self, repo: Repo, name: str, *, blobs: bool) -> dict[str, object]:
        path = repo.root / name
        size = path.stat().st_size
        sib: dict[str, object] = {"rfilename": name}
        if blobs:
            sib["size"] = size
            h = self.hashes(path)
            if h is not None:
                sib["blobId"] = h[0]
                if self.is_lfs(path, size):
                    sib["lfs"] = {"sha256": h[1], "size": size, "pointerSize": 134}
        return sib


class _Server(ThreadingHTTPServer):
    # The default listen backlog (5) drops SYNs when a client opens 16 connections at once, and the
    # kernel retries them only after 1 s: a stall no real Hub has.
    request_queue_size = 256
    daemon_threads = True
    block_on_close = False

    def handle_error(self, request: object, client_address: object) -> None:
        import sys

        if isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError, OSError)):
            return  # a client hanging up (as good clients do on a Range-ignoring answer) is not an error
        super().handle_error(request, client_address)  # type: ignore[arg-type]


class _Handler(BaseHTTPRequestHandler):
    hub: FakeHub
    protocol_version = "HTTP/1.1"
    server_version = "FakeHub/1.0"
    timeout = 30  # idle keep-alive connections end on their own
    disable_nagle_algorithm = True  # headers and body go out as separate writes: no 40 ms delayed-ACK stalls

    def log_message(self, format: str, *args: object) -> None:  # quiet
        pass

    # --- plumbing ------------------------------------------------------------------------------
    def _send(
        self,
        status: int,
        body: bytes = b"",
        headers: dict[str, str] | None = None,
        *,
        content_type: str = "application/json",
    ) -> None:
        send = body if self.command != "HEAD" else b""
        # Counted before anything goes out: end_headers() flushes, and a HEAD's answer is complete then.
        self.hub._record(self.command, self._path, status, self.headers.get("Range"), len(send))
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if send:
            self.wfile.write(send)

    def _trickle(self, every_s: float, size: int = 1 << 20) -> None:
        """A 200 (or 206) answer promising `size` bytes, sent one byte every `every_s` seconds, until the client
        hangs up or the hub stops: each network read gets its byte well within any read timeout."""
        rng = self.headers.get("Range")
        m = _RANGE.match(rng) if rng is not None else None
        first = int(m.group(1)) if m is not None and m.group(1) else 0
        if m is not None and m.group(2):
            size = int(m.group(2)) - first + 1
        self.hub._record(self.command, self._path, 206 if rng else 200, rng, 0)
        self.send_response(206 if rng else 200)
        self.send_header("Content-Type", "application/json" if self._path.startswith("/api/") else
                         "application/octet-stream")
        self.send_header("Content-Length", str(size))
        if rng is not None:
            self.send_header("Content-Range", f"bytes {first}-{first + size - 1}/{first + size + 1}")
        self.end_headers()
        self.close_connection = True
        try:
            for _ in range(size):
                if self.hub._stopping.is_set():
                    return
                self.wfile.write(b"{" if not _ else b" ")
                self.wfile.flush()
                self.hub.wait(every_s)
        except OSError:
            return

    def _gzip_bomb(self, inflated: int) -> None:
        """An API answer of a few MB, `Content-Encoding: gzip`, that inflates to `inflated` bytes of spaces."""
        import zlib

        z = zlib.compressobj(9, zlib.DEFLATED, 31)
        block = b" " * (1 << 20)
        body = b"".join(z.compress(block) for _ in range(inflated >> 20)) + z.flush()
        self._send(200, body, {"Content-Encoding": "gzip"})

    def _error(self, status: int, code: str | None, message: str, commit: str | None = None) -> None:
        headers = {"X-Error-Message": message}
        if code:
            headers["X-Error-Code"] = code
        if commit:
            headers["X-Repo-Commit"] = commit
        self._send(status, json.dumps({"error": message}).encode(), headers)

    def do_HEAD(self) -> None:
        self._handle()

    def do_GET(self) -> None:
        self._handle()

    def _handle(self) -> None:
        hub = self.hub
        split = urlsplit(self.path)
        self._path = split.path
        self._query = parse_qs(split.query)
        hub._enter()
        try:
            hub.wait(hub.latency_s)
            fault = hub._take_fault(self.command, self._path)
            if fault is not None and fault.kind == "stall":
                hub.wait(fault.stall_s)
                self.close_connection = True
                self.hub._record(self.command, self._path, 0, self.headers.get("Range"), 0)
                return
            if fault is not None and fault.kind == "500":
                self._error(500, None, "Internal Error (injected)")
                return
            if fault is not None and fault.kind == "trickle":  # the answer's headers, then a byte every stall_s
                self._trickle(fault.stall_s)
                return
            if fault is not None and fault.kind == "gzip_bomb":  # a small gzip body that inflates without end
                self._gzip_bomb(fault.inflated)
                return
            if fault is not None and fault.kind == "429":
                self._send(
                    429,
                    json.dumps({"error": "Too Many Requests (injected)"}).encode(),
                    {"Retry-After": str(fault.retry_after)},
                )
                return
            self._route(fault)
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            self.close_connection = True
        finally:
            hub._leave()

    def _route(self, fault: Fault | None) -> None:
        path = self._path
        if path.startswith("/api/models/"):
            parts = [unquote(p) for p in path[len("/api/models/") :].split("/")]
            if len(parts) < 2:
                return self._error(404, "RepoNotFound", "Repository not found")
            # Like the Hub, a gated repo's info and listing are public; its files are not.
            repo = self._repo("/".join(parts[:2]), files=False)
            if repo is None:
                return
            rest = parts[2:]
            if not rest:
                return self._api_info(repo, "main")
            if rest[0] == "revision" and len(rest) >= 2:
                return self._api_info(repo, "/".join(rest[1:]))
            if rest[0] == "tree" and len(rest) >= 2:
                return self._api_tree(repo, rest[1], "/".join(rest[2:]))
            return self._error(404, None, "Not found")
        parts = path.lstrip("/").split("/")
        if len(parts) >= 5 and parts[2] == "resolve":
            repo = self._repo(unquote(parts[0]) + "/" + unquote(parts[1]))
            if repo is None:
                return
            return self._resolve(repo, unquote(parts[3]), unquote("/".join(parts[4:])), fault)
        return self._error(404, None, "Not found")

    def _repo(self, repo_id: str, files: bool = True) -> Repo | None:
        repo = self.hub.repos.get(repo_id)
        if repo is None:
            self._error(404, "RepoNotFound", "Repository not found")
            return None
        if repo.token is not None and files:
            auth = self.headers.get("Authorization")
            if auth is None:
                self._error(
                    401,
                    "GatedRepo",
                    f"Access to model {repo_id} is restricted. You must have access to it "
                    "and be authenticated to access it. Please log in.",
                )
                return None
            if auth != f"Bearer {repo.token}":
                self._error(
                    403,
                    "GatedRepo",
                    f"Access to model {repo_id} is restricted and you are not in the authorized list.",
                )
                return None
        return repo

    def _commit(self, repo: Repo, rev: str) -> str | None:
        commit = self.hub.resolve_revision(repo, rev)
        if commit is None:
            self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
        return commit

    def _api_info(self, repo: Repo, rev: str) -> None:
        commit = self._commit(repo, rev)
        if commit is None:
            return
        repo = self.hub.at(repo, commit)
        blobs = self._query.get("blobs", ["false"])[0].lower() in ("1", "true")
        info = {
            "_id": commit[:24],
            "id": repo.repo_id,
            "modelId": repo.repo_id,
            "author": repo.repo_id.split("/")[0],
            "sha": commit,
            "private": False,
            "gated": "manual" if repo.token else False,
            "disabled": False,
            "tags": ["safetensors"],
            "siblings": [self.hub.entry(repo, n, blobs=blobs) for n in self.hub.list_files(repo)],
        }
        total = self.hub.safetensors_total(repo)
        if total is not None:
            info["safetensors"] = {"parameters": {}, "total": total}
        self._send(200, json.dumps(info).encode(), {"X-Repo-Commit": commit})

    def _api_tree(self, repo: Repo, rev: str, sub: str) -> None:
        commit = self._commit(repo, rev)
        if commit is None:
            return
        repo = self.hub.at(repo, commit)
        entries = []
        dirs: set[str] = set()
        recursive = self._query.get("recursive", ["false"])[0].lower() in ("1", "true")
        for name in self.hub.list_files(repo):
            if sub and not name.startswith(sub + "/"):
                continue
            rel = name[len(sub) + 1 :] if sub else name
            if "/" in rel and not recursive:
                dirs.add((sub + "/" if sub else "") + rel.split("/")[0])
                continue
            sib = self.hub.entry(repo, name, blobs=True)
            e: dict[str, object] = {
                "type": "file",
                "path": name,
                "size": sib["size"],
                "oid": sib.get("blobId") or hashlib.sha1(name.encode()).hexdigest(),
            }
            if "lfs" in sib:
                lfs = sib["lfs"]
                e["lfs"] = {"oid": lfs["sha256"], "size": lfs["size"], "pointerSize": lfs["pointerSize"]}  # type: ignore[index]
            entries.append(e)
        if recursive:
            for name in self.hub.list_files(repo):
                d = name.rsplit("/", 1)[0] if "/" in name else None
                while d:
                    dirs.add(d)
                    d = d.rsplit("/", 1)[0] if "/" in d else None
        folders = [{"type": "directory", "path": d, "oid": hashlib.sha1(d.encode()).hexdigest()} for d in sorted(dirs)]
        self._send(200, json.dumps(folders + entries).encode(), {"X-Repo-Commit": commit})

    def _resolve(self, repo: Repo, rev: str, name: str, fault: Fault | None) -> None:
        commit = self._commit(repo, rev)
        if commit is None:
            return
        repo = self.hub.at(repo, commit)
        path = self.hub.file_path(repo, name)
        if path is None:
            return self._error(404, "EntryNotFound", f"{name} does not exist on \"{rev}\"", commit)
        size = path.stat().st_size
        headers = {
            "X-Repo-Commit": commit,
            "ETag": f'"{self.hub.etag(path)}"',
            "Accept-Ranges": "bytes",
            "Content-Disposition": f'inline; filename="{path.name}"',
        }
        rng = self.headers.get("Range")
        start, end, status = 0, size - 1, 200
        if rng is not None and not (fault is not None and fault.kind == "ignore_range"):
            m = _RANGE.match(rng)
            if m is None or (not m.group(1) and not m.group(2)):
                return self._error(416, None, f"Invalid range {rng!r}")
            if m.group(1):
                start = int(m.group(1))
                end = min(int(m.group(2)), size - 1) if m.group(2) else size - 1
            else:
                start = max(0, size - int(m.group(2)))
            if start >= size or end < start:
                headers["Content-Range"] = f"bytes */{size}"
                return self._send(416, b"", headers)
            status = 206
            claimed = fault.total if fault is not None and fault.kind == "lie_total" else size
            headers["Content-Range"] = f"bytes {start}-{end}/{claimed}"
        length = end - start + 1 if size else 0
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(length))
        for k, v in headers.items():
            self.send_header(k, v)
        rec = self.hub._record(self.command, self._path, status, rng, 0)
        self.end_headers()
        if self.command == "HEAD":
            return
        send = length
        if fault is not None and fault.kind == "truncate":
            send = int(length * fault.keep_fraction)
            self.close_connection = True
        sent = 0
        chunk = STREAM_CHUNK if (fault is not None and fault.kind == "ignore_range") else CHUNK
        try:
            fd = os.open(path, os.O_RDONLY)
            try:
                while sent < send and not self.hub._stopping.is_set():
                    data = os.pread(fd, min(chunk, send - sent), start + sent)
                    if not data:
                        break
                    self.hub._add_bytes(rec, len(data))
                    try:
                        self.wfile.write(data)
                    except OSError:
                        self.hub._add_bytes(rec, -len(data))  # the peer hung up: this chunk did not go out
                        raise
                    sent += len(data)
            finally:
                os.close(fd)
            if sent < length:
                self.close_connection = True
                self.wfile.flush()
                with contextlib.suppress(OSError):
                    self.connection.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            self.close_connection = True


def serve_forever(dirs: dict[str, str], port_file: str | None = None) -> None:  # pragma: no cover - manual use
    """Run a hub from the command line: python tests/hub_server.py owner/name=DIR ..."""
    with FakeHub() as hub:
        for repo_id, d in dirs.items():
            hub.add_repo(repo_id, d)
        print(hub.endpoint, flush=True)
        if port_file:
            Path(port_file).write_text(hub.endpoint)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":  # pragma: no cover
    import sys

    serve_forever(dict(a.split("=", 1) for a in sys.argv[1:]))
