"""The Hub's failures as KimiAuditErrors (huggingface_hub's typed errors are mapped onto these in hub.py)."""

from __future__ import annotations

from kimi_audit.errors import KimiAuditError

__all__ = [
    "GatedRepoError", "HubError", "HubOfflineError", "HubTimeoutError", "RangeNotSupportedError",
    "RepoNotFoundError", "RevisionNotFoundError",
]


class HubError(KimiAuditError):
    """The Hub (or whatever HF_ENDPOINT points at) refused or failed a request.

    Not a SourceError: it is about the server, not one file, so an audit stops at once (exit 2)
    instead of reporting every shard unreadable. A missing file is a FileMissingError and a body
    that kept breaking off a ShortReadError (both SourceErrors: findings for that one shard).
    """

    code = "HUB_ERROR"


class RepoNotFoundError(HubError):
    code = "HUB_REPO_NOT_FOUND"


class RevisionNotFoundError(HubError):
    code = "HUB_REVISION_NOT_FOUND"


class GatedRepoError(HubError):
    code = "HUB_GATED_REPO"


class HubTimeoutError(HubError):
    code = "HUB_TIMEOUT"


class RangeNotSupportedError(HubError):
    """The server answered a Range request with the whole file (200) instead of 206."""

    code = "HUB_RANGE_NOT_SUPPORTED"


class HubOfflineError(HubError):
    code = "HUB_OFFLINE"
