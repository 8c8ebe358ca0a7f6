"""Network failures under the Hub source, in words: which host and port, and what failed (refused,
name not found, TLS, no answer); and huggingface_hub's retry logs, hidden unless asked for (`-v`)."""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from urllib.parse import urlsplit

from kimi_audit.errors import KimiAuditError

DEFAULT_TIMEOUT_S = 10.0

RETRY_LOGGER = "huggingface_hub.utils._http"
"""The logger huggingface_hub's http_backoff writes each retry to, as a warning."""
_COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
_RETRY_TEXT = re.compile(r"^(Retrying in |Rate limited\. Waiting )| thrown while requesting ")


class _HideRetries(logging.Filter):
    """Drops http_backoff's "'…' thrown while requesting GET …", "Retrying in 1.0s [Retry 1/3]." and
    "Rate limited. Waiting …" lines; any other warning of that logger (the server's X-HF-Warning) passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not _RETRY_TEXT.search(record.getMessage())


_HIDE_RETRIES = _HideRetries()


def show_retry_logs(show: bool) -> None:
    """Show huggingface_hub's retry warnings on stderr (at its own level: HF_HUB_VERBOSITY, by default
    warnings), or hide them. A failure is reported once anyway, as the error it ends in."""
    logger = logging.getLogger(RETRY_LOGGER)
    if show:
        logger.removeFilter(_HIDE_RETRIES)
    elif _HIDE_RETRIES not in logger.filters:
        logger.addFilter(_HIDE_RETRIES)


def cannot_connect(error: BaseException, endpoint: str, target: str, doing: str, timeout_s: float,
                   attempts: int) -> str:
    """The one line for a connection that failed (`error`: an httpx2 ConnectError or ConnectTimeout) to
    `endpoint` while `doing` ("resolving", "reading config.json of") `target` (repo@revision)."""
    repo, _, rev = target.partition("@")
    short = rev[:7] if _COMMIT_RE.match(rev) else rev
    if type(error).__name__ == "ConnectTimeout":
        why = f"no answer in {timeout_s:g} s, {attempts} attempts"
    else:
        why = connect_failure(error)
    doing = "downloading" if doing == "reading download of" else doing
    return (f"cannot connect to {host_port(endpoint)} ({why}) while {doing} {repo}@{short}"
            " — check HF_ENDPOINT and your network")


USERINFO = re.compile(r"(?<=//)[^/@\s]*@")


def without_userinfo(text: str) -> str:
    """`text` with the user info of every URL in it taken out (`http://user:password@host` -> `http://host`):
    an HF_ENDPOINT's credentials never reach a message."""
    return USERINFO.sub("", text)


def public_netloc(endpoint: str) -> str:
    """The endpoint's host[:port] as written, its user info taken out."""
    return urlsplit(endpoint).netloc.rpartition("@")[2] or without_userinfo(endpoint)


def host_port(endpoint: str) -> str:
    """`host:port` of an endpoint URL (the scheme's port when none is written); no user info."""
    parts = urlsplit(endpoint)
    host = parts.hostname or parts.netloc or endpoint
    try:
        port = parts.port
    except ValueError:
        port = None
    if port is None:
        port = {"https": 443, "http": 80}.get(parts.scheme)
    shown = f"[{host}]" if ":" in host else host
    return f"{shown}:{port}" if port is not None else shown


def connect_failure(error: BaseException) -> str:
    """What failed under an httpx2 ConnectError, from the OS error at the bottom of its chain."""
    import socket  # here, not at the top: a local audit loads no TLS (ssl: ~8 ms of its start)
    import ssl

    seen: set[int] = set()
    cause: BaseException | None = error
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, ssl.SSLError):
            return f"TLS handshake failed: {getattr(cause, 'reason', None) or _words(cause)}"
        if isinstance(cause, socket.gaierror):
            return f"host name not found: {_words(cause)}"
        if isinstance(cause, ConnectionRefusedError):
            return "connection refused"
        if isinstance(cause, TimeoutError):
            return "timed out connecting"
        if isinstance(cause, OSError) and cause.strerror:
            return cause.strerror[:1].lower() + cause.strerror[1:]
        cause = cause.__cause__ or cause.__context__
    text = _words(error)
    return "connection refused" if "refused" in text.lower() else text


def first_line(e: BaseException) -> str:
    text = str(e).strip() or type(e).__name__
    return text.splitlines()[0]


def _words(e: BaseException) -> str:
    """The error's first line without its "[Errno N] " prefix."""
    text = (getattr(e, "strerror", None) or str(e)).strip() or type(e).__name__
    return re.sub(r"^\[Errno [-\d]+\]\s*", "", text.splitlines()[0])


def default_endpoint() -> str:
    """HF_ENDPOINT as set now (falls back to huggingface_hub's, read when it was imported)."""
    from huggingface_hub import constants

    return (os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")


DEFAULT_DEADLINE_S = 300.0
DEADLINE_ENV = "KIMI_AUDIT_HUB_DEADLINE"
"""Seconds one Hub request may take in all, its body included (HF_HUB_DOWNLOAD_TIMEOUT bounds each network read
only: a server that sends a byte every few seconds never trips it)."""


def default_deadline() -> float:
    """KIMI_AUDIT_HUB_DEADLINE as set now (default 300 s); a value that is not a positive number is the default."""
    return _seconds_from_env(DEADLINE_ENV, DEFAULT_DEADLINE_S)


def default_timeout() -> float:
    """HF_HUB_DOWNLOAD_TIMEOUT as set now (huggingface_hub's own default is 10 s)."""
    return _seconds_from_env("HF_HUB_DOWNLOAD_TIMEOUT", DEFAULT_TIMEOUT_S)


def _seconds_from_env(name: str, default: float) -> float:
    """The environment variable `name` as a number of seconds; unset, empty, not a number or not positive: the
    default."""
    raw = os.environ.get(name)
    try:
        value = float(raw) if raw else default
    except ValueError:
        value = default
    return value if value > 0 else default


INT_VARIABLES = ("HF_HUB_DOWNLOAD_TIMEOUT", "HF_HUB_ETAG_TIMEOUT")
"""huggingface_hub reads these with int() when it is imported: a value that is no integer is its traceback."""
PATH_VARIABLES = ("HF_HOME", "HF_HUB_CACHE", "HF_ASSETS_CACHE", "HF_TOKEN_PATH")


def check_environment(environ: Mapping[str, str] | None = None) -> None:
    """The Hub's environment variables, each checked before huggingface_hub reads it: one line naming the variable
    (a KimiAuditError, exit 2), not that library's traceback at import or at the first request."""
    env = os.environ if environ is None else environ
    for name in INT_VARIABLES:
        value = env.get(name)
        if value is not None and value.strip() and not value.strip().lstrip("-").isdecimal():
            raise KimiAuditError(f"{name}={value!r} is not a whole number of seconds")
    endpoint = env.get("HF_ENDPOINT")
    if endpoint:
        try:
            parts = urlsplit(endpoint)
            parts.port  # noqa: B018  (urlsplit checks the port only when asked)
        except ValueError as e:
            raise KimiAuditError(f"HF_ENDPOINT={without_userinfo(endpoint)!r} is not a URL: {e}") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise KimiAuditError(f"HF_ENDPOINT={without_userinfo(endpoint)!r} is not an http(s) URL with a host")
    for name in PATH_VARIABLES:
        value = env.get(name)
        if not value:
            continue
        path = os.path.expanduser(os.path.expandvars(value))
        head = path
        while head and not os.path.exists(head):  # the nearest existing ancestor must be a directory
            parent = os.path.dirname(head)
            if parent == head:
                break
            head = parent
        if head and os.path.exists(head) and not os.path.isdir(head) and head != path:
            raise KimiAuditError(f"{name}={value!r} lies under {head}, which is a file, not a directory")
