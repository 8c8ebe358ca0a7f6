"""A checkpoint on the Hugging Face Hub, read by HTTP Range through huggingface_hub.

Everything goes through huggingface_hub: its shared httpx2 session (`get_session`, via
`http_backoff` / `http_stream_backoff` for retries on 429/5xx/timeouts), `hf_hub_url`,
`build_hf_headers` (token from the argument, `HF_TOKEN` or the saved login), the endpoint
(`HF_ENDPOINT`), offline mode (`HF_HUB_OFFLINE`) and `hf_raise_for_status`, whose typed errors are
mapped to one-line `KimiAuditError`s here (a network failure names the host, port and what failed:
hub_network.py). No token ever appears in a message.

The revision is resolved once, by one API call that also lists every file with its size; every
later read names the resolved commit, so a branch moving mid-audit cannot mix two commits. A full
commit hash needs no resolving to be read at: config.json is then fetched beside that call.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any
from urllib.parse import quote

from kimi_audit.constants import CONFIG_FILE, PINNED_REPO_ID, PINNED_REVISION
from kimi_audit.errors import FileMissingError, FileTooLargeError, KimiAuditError, ShortReadError, SizeDisagreesError
from kimi_audit.sources.base import RangeRead, safe_member_name
from kimi_audit.sources.hub_api import decode_repo_info
from kimi_audit.sources.hub_body import MAX_API_BYTES, BodyError, bounded_body, ranged_body
from kimi_audit.sources.hub_errors import (
    GatedRepoError,
    HubError,
    HubOfflineError,
    HubTimeoutError,
    RangeNotSupportedError,
    RepoNotFoundError,
    RevisionNotFoundError,
)
from kimi_audit.sources.hub_network import (
    cannot_connect,
    default_deadline,
    default_endpoint,
    default_timeout,
    first_line,
    public_netloc,
    without_userinfo,
)

DEFAULT_PARALLEL_READS = 16
DEFAULT_MAX_RETRIES = 3
DEFAULT_RETRY_WAIT_S = 1.0

_REPO_ID_RE = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
EARLY_CONFIG_BYTES = 1 << 16
"""What is asked of config.json while a commit's files are listed (Kimi-K2's is 1.7 KB)."""


class _Secret(str):
    """A token that never shows itself in a repr (tracebacks with locals, debuggers)."""

    def __repr__(self) -> str:
        return "'***'"


class HubSource:
    """`repo_id` at `revision` (default: the pinned commit for the pinned repo, else `main`)."""

    remote = True
    root = None
    """No local directory: no sparse holes, no symlinks (the Source protocol's answers for those)."""

    def __init__(
        self,
        repo_id: str,
        revision: str | None = None,
        *,
        endpoint: str | None = None,
        token: str | bool | None = None,
        timeout: float | None = None,
        parallel_reads: int = DEFAULT_PARALLEL_READS,
        max_retries: int = DEFAULT_MAX_RETRIES,
        retry_wait: float = DEFAULT_RETRY_WAIT_S,
    ) -> None:
        if not isinstance(repo_id, str) or not _REPO_ID_RE.match(repo_id) or ".." in repo_id:
            raise RepoNotFoundError(f"not a Hub repo id (owner/name): {repo_id!r}")
        self.repo_id = repo_id
        if revision is None:
            revision = PINNED_REVISION if repo_id == PINNED_REPO_ID else "main"
        self.requested_revision = revision
        self.endpoint = (endpoint or default_endpoint()).rstrip("/")
        self._token: str | bool | None = _Secret(token) if isinstance(token, str) else token
        self.timeout = float(timeout) if timeout is not None else default_timeout()
        self.deadline = default_deadline()
        """Seconds one request may take in all (KIMI_AUDIT_HUB_DEADLINE): a body that trickles in is cut off."""
        self.parallel_reads = max(1, int(parallel_reads))
        self.max_retries = max(0, int(max_retries))
        self.retry_wait = max(0.0, float(retry_wait))
        self.revision: str | None = None
        self._sizes: dict[str, int | None] = {}
        self._lfs_sha256: dict[str, str] = {}
        self._fatal: HubError | None = None
        self._reported_parameters: int | None = None
        self._early: dict[str, bytes] = {}
        early = self._fetch_config_early() if _COMMIT_RE.match(revision) else None
        try:
            self._resolve()
        finally:  # nothing of this source's is left running once it is built, or has failed to be
            if early is not None:
                early.join()
        self.label = f"{self.repo_id}@{self.revision}"

    def __repr__(self) -> str:
        return f"HubSource({self.repo_id!r}, revision={self.revision!r}, endpoint={self.endpoint!r})"

    # --- huggingface_hub plumbing --------------------------------------------------------------
    def _headers(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        from huggingface_hub.utils import build_hf_headers

        headers = build_hf_headers(token=self._token, library_name="kimi-audit")
        if extra:
            headers.update(extra)
        return headers

    def _backoff_kwargs(self) -> dict[str, Any]:
        return {
            "max_retries": self.max_retries,
            "base_wait_time": self.retry_wait,
            "max_wait_time": max(self.retry_wait, 8.0 if self.retry_wait >= 1 else self.retry_wait * 4),
            "timeout": self.timeout,
        }

    def _where(self) -> str:
        return public_netloc(self.endpoint)

    @contextmanager
    def _translate_errors(self, what: str, doing: str | None = None) -> Iterator[None]:
        """Map huggingface_hub / httpx2 errors to one-line KimiAuditErrors (no token, no traceback); `doing`
        says what a connection failure interrupted ("resolving"; by default "reading <what> of")."""
        import httpx2
        from huggingface_hub import errors as hf_errors

        rev = self.revision or self.requested_revision
        try:
            yield
        except hf_errors.OfflineModeIsEnabled:
            raise self._offline_error() from None
        except hf_errors.GatedRepoError as e:
            status = e.response.status_code if e.response is not None else "?"
            raise GatedRepoError(
                f"{self.repo_id} is a gated repo and access was refused (HTTP {status}): accept its terms on the Hub "
                "and use a token that has access (set HF_TOKEN or run `hf auth login`)"
            ) from None
        except hf_errors.RepositoryNotFoundError:
            raise RepoNotFoundError(
                f"repository {self.repo_id!r} not found on {self._where()} "
                "(or it is private and no valid token was given)"
            ) from None
        except hf_errors.RevisionNotFoundError:
            raise RevisionNotFoundError(f"revision {rev!r} not found in {self.repo_id} on {self._where()}") from None
        except hf_errors.RemoteEntryNotFoundError:
            raise FileMissingError(f"{what}: no such file in {self.repo_id}@{rev}") from None
        except hf_errors.HfHubHTTPError as e:
            status = e.response.status_code if e.response is not None else "?"
            raise HubError(
                f"{what}: HTTP {status} from {self._where()} for {self.repo_id}@{rev} "
                f"(after {self.max_retries} retries)"
            ) from None
        except (httpx2.ConnectError, httpx2.ConnectTimeout) as e:  # before TimeoutException: ConnectTimeout is one
            error = HubTimeoutError if isinstance(e, httpx2.ConnectTimeout) else HubError
            raise error(cannot_connect(e, self.endpoint, f"{self.repo_id}@{rev}", doing or f"reading {what} of",
                                       self.timeout, self.max_retries + 1)) from None
        except httpx2.TimeoutException:
            raise HubTimeoutError(
                f"{what}: timed out after {self.timeout:g} s waiting for {self._where()} "
                f"({self.max_retries + 1} attempts); the Hub is not answering, retry later or raise the timeout"
            ) from None
        except httpx2.HTTPError as e:
            raise HubError(f"{what}: network error talking to {self._where()}: "
                           f"{without_userinfo(first_line(e))}") from None

    def _offline_error(self) -> HubOfflineError:
        return HubOfflineError(
            f"offline mode is on (HF_HUB_OFFLINE): cannot reach the Hub for {self.repo_id}; "
            "audit a local copy instead (kimi-audit download, then kimi-audit audit PATH)"
        )

    # --- revision ------------------------------------------------------------------------------
    def _fetch_config_early(self) -> threading.Thread | None:
        """A commit needs no resolving before its files are read: config.json, which every audit reads
        first, is fetched while the API call resolves the revision, one round trip sooner. One attempt
        at its first EARLY_CONFIG_BYTES; read_file takes them only if they are the whole file the listing
        names, and otherwise (or if this failed) reads it as any other file."""
        import httpx2
        from huggingface_hub import constants

        if constants.is_offline_mode():
            return None
        commit = self.requested_revision

        def fetch() -> None:
            # A failure (any Hub or HTTP error as _translate_errors maps it; a token huggingface_hub cannot
            # find; an endpoint httpx refuses; huggingface_hub's client torn down under this daemon thread when
            # the command exits first, an AttributeError on None): read_file asks again, and says what is
            # wrong. A prefetch says nothing of its own.
            with suppress(KimiAuditError, OSError, httpx2.InvalidURL, AttributeError, RuntimeError):
                self._early[CONFIG_FILE] = self._ranged_get(
                    CONFIG_FILE, 0, EARLY_CONFIG_BYTES - 1, commit=commit, retry=False)[0]

        thread = threading.Thread(target=fetch, name="kimi-audit-early-config", daemon=True)
        thread.start()
        return thread

    def _resolve(self) -> None:
        """One API call: the full commit of the revision, and every file with its size."""
        from huggingface_hub import constants
        from huggingface_hub.utils import hf_raise_for_status, http_stream_backoff

        if constants.is_offline_mode():
            raise self._offline_error()
        url = f"{self.endpoint}/api/models/{self.repo_id}/revision/{quote(self.requested_revision, safe='')}"
        started = time.monotonic()
        with self._translate_errors(f"revision {self.requested_revision!r}", "resolving"), http_stream_backoff(
            "GET", url, headers=self._headers(), params={"blobs": True}, **self._backoff_kwargs()
        ) as response:
            hf_raise_for_status(response)
            body = bounded_body(response, "the model info", self._where(), MAX_API_BYTES, self.deadline, started)
            try:
                info = decode_repo_info(body)
            except ValueError as e:
                raise HubError(
                    f"{self._where()} answered the model info call with unusable JSON: {first_line(e)}"
                ) from None
        sha = info.sha
        if not isinstance(sha, str) or not _COMMIT_RE.match(sha):
            raise HubError(
                f"{self._where()} did not resolve {self.requested_revision!r} to a full commit hash (got {sha!r})"
            )
        if _COMMIT_RE.match(self.requested_revision) and sha != self.requested_revision:
            raise HubError(
                f"{self._where()} answered commit {sha} for the requested commit {self.requested_revision}"
            )
        self.revision = sha
        total = info.safetensors.total if info.safetensors is not None else None
        self._reported_parameters = total if isinstance(total, int) and total >= 0 else None
        for sib in info.siblings or []:
            name = sib.rfilename
            self._sizes[name] = sib.size if isinstance(sib.size, int) and sib.size >= 0 else None
            if sib.lfs is not None and isinstance(sib.lfs.sha256, str):
                self._lfs_sha256[name] = sib.lfs.sha256
        if info.gated and self._sizes:
            self._check_file_access()

    def _check_file_access(self) -> None:
        """A gated repo lists its files to anyone but serves them only to granted tokens: ask now
        (one HEAD, no body) so that a refusal is a clear error before any work starts."""
        from huggingface_hub.utils import hf_raise_for_status, http_backoff

        probe = CONFIG_FILE if CONFIG_FILE in self._sizes else min(self._sizes)
        with self._translate_errors(probe):
            response = http_backoff("HEAD", self.url(probe), headers=self._headers(), **self._backoff_kwargs())
            hf_raise_for_status(response)

    # --- Source protocol ------------------------------------------------------------------------
    def list_files(self) -> tuple[str, ...]:
        return tuple(sorted(self._sizes))

    def exists(self, name: str) -> bool:
        return name in self._sizes

    def file_size(self, name: str) -> int | None:
        """Size listed by the Hub for this commit (None: not listed or no size given)."""
        return self._sizes.get(name)

    def reported_parameters(self) -> int | None:
        return self._reported_parameters

    def lfs_sha256(self, name: str) -> str | None:
        return self._lfs_sha256.get(name)

    def holes(self, name: str, start: int = 0, length: int | None = None) -> tuple[tuple[int, int], ...]:
        return ()

    def outside_links(self) -> tuple[str, ...]:
        return ()

    def url(self, name: str, commit: str | None = None) -> str:
        from huggingface_hub import hf_hub_url

        return hf_hub_url(self.repo_id, name, revision=commit or self.revision, endpoint=self.endpoint)

    def _known(self, name: str) -> str:
        safe_member_name(name)
        if name not in self._sizes:
            raise FileMissingError(f"{name}: no such file in {self.label}")
        return name

    def read_file(self, name: str, max_bytes: int) -> bytes:
        self._known(name)
        size = self._sizes[name]
        early = self._early.pop(name, None)
        if early is not None and len(early) == size and size <= max_bytes:
            return early
        if size is not None:
            if size > max_bytes:
                raise FileTooLargeError(f"{name} is {size:,} bytes, over the {max_bytes:,}-byte limit")
            if size == 0:
                return b""
            got = self.read_range(name, 0, size)
            if len(got.data) != size:
                raise ShortReadError(f"{name}: got {len(got.data):,} of {size:,} bytes from {self._where()}")
            return got.data
        got = self.read_range(name, 0, max_bytes + 1)
        if len(got.data) > max_bytes:
            raise FileTooLargeError(f"{name} is over the {max_bytes:,}-byte limit")
        return got.data

    def read_range(self, name: str, start: int, length: int) -> RangeRead:
        if start < 0 or length < 0:
            raise ValueError("negative range")
        self._known(name)
        size = self._sizes[name]
        if size is not None:
            if length == 0 or start >= size:
                return RangeRead(b"", size)
            length = min(length, size - start)
        elif length == 0:
            return RangeRead(b"", 0)
        if self._fatal is not None:  # the server already failed in a way no retry mends: fail fast
            raise type(self._fatal)(str(self._fatal))
        try:
            data, total = self._ranged_get(name, start, start + length - 1)
        except (RangeNotSupportedError, HubTimeoutError, GatedRepoError, HubOfflineError) as e:
            self._fatal = e
            raise
        if total is not None and size is not None and total != size:
            # The listing and the answer disagree on the file's size: either may be the lie (a truncated upload
            # served with a total that hides it), and a size taken from one would pass what the other says.
            raise SizeDisagreesError(f"{name}: the repository lists {size:,} bytes, but {self._where()} answers "
                                     f"bytes {start:,}-{start + len(data) - 1:,} of a {total:,}-byte file")
        file_size = total if total is not None else (size if size is not None else start + len(data))
        expected = max(0, min(length, file_size - start))
        if len(data) < expected:
            raise ShortReadError(
                f"{name}: asked for {expected:,} bytes at offset {start:,}, {self._where()} sent {len(data):,}"
            )
        return RangeRead(data, file_size)

    # --- one ranged GET ---------------------------------------------------------------------------
    def _ranged_get(
        self, name: str, start: int, last: int, *, commit: str | None = None, retry: bool = True
    ) -> tuple[bytes, int | None]:
        """Bytes [start, last] (inclusive), and the total size from Content-Range.

        Streams the body and never reads past what was asked: a 200 answer (Range ignored) is
        closed unread and reported. A body that breaks off is retried a few times (`retry`).
        """
        from huggingface_hub.utils import hf_raise_for_status, http_stream_backoff

        url = self.url(name, commit)
        headers = self._headers({"Range": f"bytes={start}-{last}", "Accept-Encoding": "identity"})
        backoff = {**self._backoff_kwargs(), **({} if retry else {"max_retries": 0})}
        attempt = 0
        while True:
            attempt += 1
            try:
                with self._translate_errors(name), http_stream_backoff(
                    "GET", url, headers=headers, **backoff
                ) as response:
                    hf_raise_for_status(response)
                    return ranged_body(response, name, start, last, self._where(), self.deadline)
            except BodyError as e:
                if not retry or attempt > self.max_retries:
                    raise ShortReadError(f"{name}: {e} ({attempt} attempts)") from None
                time.sleep(min(self.retry_wait * 2 ** (attempt - 1), 8.0))
