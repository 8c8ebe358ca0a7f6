"""Strict safetensors header reader.

A shard is `u64 little-endian N` + `N bytes of UTF-8 JSON` + the data buffer. This module parses the
first two parts and validates them against the format's rules, reporting each violation as a Finding.
It never reads tensor data: `read_shard_header` issues at most two range reads, both within the header.

The parser is pure (`parse_shard_prefix`), so the same code serves local files, Hub range reads and
the fuzz tests. A well-formed header is decoded by msgspec into typed Structs (`typed_header`,
decode.py); every other header goes through json.loads and the per-entry rules (`strict_header`,
strict.py), which name each violation. Both give the same result on any input the typed path accepts
(tests/test_format_canonical.py). The tensor rows and columns and the shared rules are in columns.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property
from itertools import repeat
from typing import Any

from kimi_audit.constants import HEADER_LENGTH_BYTES, MAX_HEADER_BYTES
from kimi_audit.findings import Finding, Severity, error, warning
from kimi_audit.format.columns import EMPTY_COLUMNS, TensorColumns, TensorInfo, extent_findings
from kimi_audit.format.decode import typed_header
from kimi_audit.format.strict import strict_header
from kimi_audit.sources.base import Source

__all__ = [
    "EMPTY_COLUMNS",
    "ShardHeader",
    "TensorColumns",
    "TensorInfo",
    "header_length",
    "parse_header_json",
    "parse_shard_prefix",
    "read_shard_header",
]

JSON_WHITESPACE = tuple(bytes([c]) for c in b" \t\n\r")


@dataclass(frozen=True)
class ShardHeader:
    shard: str
    file_size: int
    header_len: int | None
    """N from the length prefix, or None when the file is too short to hold one."""
    metadata: dict[str, str] | None = None
    columns: TensorColumns = EMPTY_COLUMNS
    findings: tuple[Finding, ...] = ()
    identity: tuple[int, ...] | None = field(default=None, compare=False)
    """The local file's identity when this header was read (sources.files.file_identity); None elsewhere."""
    data_offset: int | None = None
    """Where the data section starts, for a container that says so itself (a GGUF part: after its metadata, at
    its alignment); None: after the safetensors length prefix and header."""

    @cached_property
    def tensors(self) -> dict[str, TensorInfo]:
        c = self.columns
        rows = zip(c.names, c.dtypes, c.shapes, c.begins, c.ends)
        return dict(zip(c.names, map(tuple.__new__, repeat(TensorInfo), rows)))

    @property
    def tensor_count(self) -> int:
        return len(self.columns.names)

    @property
    def data_start(self) -> int:
        if self.data_offset is not None:
            return self.data_offset
        return HEADER_LENGTH_BYTES + (self.header_len or 0)

    @property
    def ok(self) -> bool:
        return not any(f.severity is Severity.ERROR for f in self.findings)

    @property
    def payload_bytes(self) -> int:
        return sum(self.columns.ends) - sum(self.columns.begins)


def header_length(prefix: bytes) -> int | None:
    if len(prefix) < HEADER_LENGTH_BYTES:
        return None
    return int.from_bytes(prefix[:HEADER_LENGTH_BYTES], "little")


def read_shard_header(source: Source, shard: str, first_read: int = 1 << 16) -> ShardHeader:
    """Fetch and parse one shard's header: one read of `first_read` bytes, a second only if short."""
    first = source.read_range(shard, 0, max(first_read, HEADER_LENGTH_BYTES))
    data = first.data
    n = header_length(data)
    if n is not None and n <= MAX_HEADER_BYTES:
        need = HEADER_LENGTH_BYTES + n
        if len(data) < need <= first.file_size:
            rest = source.read_range(shard, len(data), need - len(data))
            data += rest.data
    header = parse_shard_prefix(data, shard=shard, file_size=first.file_size)
    return header if first.identity is None else replace(header, identity=first.identity)


def parse_shard_prefix(prefix: bytes, *, shard: str, file_size: int) -> ShardHeader:
    """Parse the leading bytes of a shard (at least 8 + N of them when the file has them)."""
    n = header_length(prefix)

    def fail(code: str, message: str, header_len: int | None = n, **kw: Any) -> ShardHeader:
        return ShardHeader(shard, file_size, header_len, findings=(error(code, message, shard=shard, **kw),))

    if n is None or file_size < HEADER_LENGTH_BYTES:
        return fail("HEADER_TOO_SHORT", f"file is {file_size} bytes, too short for the 8-byte header length", None)
    if n > MAX_HEADER_BYTES:
        return fail("HEADER_TOO_LARGE", f"header length {n:,} exceeds the {MAX_HEADER_BYTES:,}-byte limit",
                    expected=MAX_HEADER_BYTES, actual=n)
    if HEADER_LENGTH_BYTES + n > file_size:
        return fail("HEADER_PAST_EOF", f"header length {n:,} runs past the end of the {file_size:,}-byte file",
                    expected=file_size - HEADER_LENGTH_BYTES, actual=n)
    if len(prefix) < HEADER_LENGTH_BYTES + n:
        return fail("HEADER_SHORT_READ", f"only {len(prefix) - 8:,} of {n:,} header bytes could be read")
    return parse_header_json(prefix[HEADER_LENGTH_BYTES:HEADER_LENGTH_BYTES + n], shard=shard, file_size=file_size)


def parse_header_json(raw: bytes, *, shard: str, file_size: int) -> ShardHeader:
    """Validate the N header bytes. `file_size` is the whole shard's size, for the data extent rules."""
    n = len(raw)
    findings: list[Finding] = []
    text = None
    if not raw.isascii():  # ASCII is UTF-8 as it stands; anything else is decoded once, here
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            findings.append(error("HEADER_NOT_UTF8", f"header is not valid UTF-8 at byte {e.start}", shard=shard))
            return ShardHeader(shard, file_size, n, findings=tuple(findings))
    # Whitespace is ASCII, and no other character's UTF-8 starts or ends with an ASCII byte: bytes will do.
    body = raw.rstrip(b" ")
    if body[:1] in JSON_WHITESPACE:
        findings.append(warning("HEADER_LEADING_WHITESPACE", "header JSON starts with whitespace", shard=shard))
    if body[-1:] in JSON_WHITESPACE:
        findings.append(warning("HEADER_TRAILING_WHITESPACE",
                                "header padding holds whitespace other than spaces", shard=shard))
    parsed = typed_header(body)
    if parsed is None:
        parsed = strict_header(body.decode("utf-8") if text is None else text.rstrip(" "), shard, findings)
        if parsed is None:
            return ShardHeader(shard, file_size, n, findings=tuple(findings))
    metadata, columns = parsed
    findings.extend(extent_findings(columns, shard, n, file_size))
    return ShardHeader(shard, file_size, n, metadata, columns, tuple(findings))
