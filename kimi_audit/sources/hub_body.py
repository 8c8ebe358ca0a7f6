"""Reading the body of a Hub answer, bounded: in size as it is decompressed (a small gzip answer can inflate to
gigabytes), and in time (KIMI_AUDIT_HUB_DEADLINE: a body that trickles in, a byte every few seconds, never
trips HF_HUB_DOWNLOAD_TIMEOUT, which bounds each network read only)."""

from __future__ import annotations

import time
from typing import Any

from kimi_audit.sources.base import parse_content_range
from kimi_audit.sources.hub_errors import HubError, HubTimeoutError, RangeNotSupportedError
from kimi_audit.sources.hub_network import DEADLINE_ENV, first_line

MAX_API_BYTES = 64_000_000
"""The most an API answer (the repo's file listing) may hold, decompressed: Kimi K3's, with ~100 files, is under
50 KB; a listing past this is refused, never inflated into memory."""


class BodyError(Exception):
    """A ranged body that broke off or ended short (retried by the caller)."""


def check_deadline(what: str, where: str, deadline: float, started: float, got: int, want: int | None = None) -> None:
    elapsed = time.monotonic() - started
    if elapsed > deadline:
        of = f" of {want:,}" if want is not None else ""
        raise HubTimeoutError(f"{what}: {where} sent {got:,}{of} bytes in {elapsed:.0f} s, past the {deadline:g} s "
                              f"a request may take ({DEADLINE_ENV}): the server stalls")


def bounded_body(response: Any, what: str, where: str, cap: int, deadline: float, started: float) -> bytes:
    """A whole answer's body as it is decompressed, refused past `cap` bytes and past the deadline."""
    import httpx2

    parts: list[bytes] = []
    got = 0
    try:
        for chunk in response.iter_bytes():
            got += len(chunk)
            if got > cap:
                raise HubError(f"{what}: {where} sent over {cap:,} bytes (decompressed): not read further")
            parts.append(chunk)
            check_deadline(what, where, deadline, started, got)
    except (httpx2.RemoteProtocolError, httpx2.ReadError, httpx2.DecodingError) as e:
        raise HubError(f"{what}: the answer of {where} broke after {got:,} bytes ({first_line(e)})") from None
    return b"".join(parts)


def ranged_body(response: Any, name: str, start: int, last: int, where: str,
                deadline: float) -> tuple[bytes, int | None]:
    """Bytes [start, last] of a 206 answer (never read past them) and the total size from Content-Range; a 200
    (Range ignored) is closed unread and reported."""
    import httpx2

    if response.status_code != 206:
        raise RangeNotSupportedError(
            f"{name}: {where} ignored the Range request (HTTP {response.status_code} instead of 206); "
            "stopped without reading the body"
        )
    try:
        first, end, total = parse_content_range(response.headers.get("Content-Range"))
    except ValueError as e:
        raise HubError(f"{name}: {e} in the answer to bytes={start}-{last}") from None
    if first != start or end > last:
        sent = response.headers.get("Content-Range")
        raise HubError(f"{name}: asked for bytes={start}-{last}, {where} sent {sent!r}")
    want = end - first + 1
    parts: list[bytes] = []
    got = 0
    started = time.monotonic()
    try:
        for chunk in response.iter_bytes():  # as each network read delivers it: no re-chunking copies
            if len(chunk) > want - got:
                chunk = chunk[: want - got]
            parts.append(chunk)
            got += len(chunk)
            if got >= want:
                break
            check_deadline(name, where, deadline, started, got, want)
    except (httpx2.RemoteProtocolError, httpx2.ReadError) as e:
        raise BodyError(f"connection broke after {got:,} of {want:,} bytes ({first_line(e)})") from None
    if got < want:
        raise BodyError(f"body ended after {got:,} of {want:,} bytes")
    return b"".join(parts), total
