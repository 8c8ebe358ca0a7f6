"""Exceptions that end a command with exit code 2 and a one-line message.

Problems *inside* a checkpoint are not exceptions: they are `Finding`s (see findings.py).
An exception here means the input cannot be audited at all.
"""

from __future__ import annotations


class KimiAuditError(Exception):
    """Base class: the message is shown to the user as one line, exit code 2."""

    exit_code = 2


class SourceError(KimiAuditError):
    """A file of the checkpoint could not be read (missing, unreadable, network failure)."""


class FileMissingError(SourceError):
    """The named file does not exist in the source."""


class FileTooLargeError(SourceError):
    """A file that is read whole (config.json, index.json) is over its size limit."""


class ShortReadError(SourceError):
    """A range read returned fewer bytes than the file is said to hold."""


class UnsafePathError(SourceError):
    """A file name would escape the checkpoint directory."""


class ConfigError(KimiAuditError):
    """config.json is missing, not JSON, or lacks a key the layout needs."""
