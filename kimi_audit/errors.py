"""Exceptions that end a command with exit code 2 and a one-line message.

Problems *inside* a checkpoint are not exceptions: they are `Finding`s (see findings.py).
An exception here means the input cannot be audited at all.

Each class has a stable `code` (`{"error": {"code": ...}}` in --json output): the one it sets, or,
for a subclass that sets none, its name in upper snake case without "Error"
(TensorNotFoundError -> TENSOR_NOT_FOUND).
"""

from __future__ import annotations

import re
from typing import Any, ClassVar


class KimiAuditError(Exception):
    """Base class: the message is shown to the user as one line, exit code 2."""

    exit_code = 2
    code: ClassVar[str] = "UNUSABLE_INPUT"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "code" not in cls.__dict__:
            name = cls.__name__.removesuffix("Error") or cls.__name__
            cls.code = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).upper()


class SourceError(KimiAuditError):
    """A file of the checkpoint could not be read (missing, unreadable, network failure)."""

    code = "SOURCE_UNREADABLE"


class FileMissingError(SourceError):
    """The named file does not exist in the source."""

    code = "FILE_MISSING"


class FileTooLargeError(SourceError):
    """A file that is read whole (config.json, index.json) is over its size limit."""

    code = "FILE_TOO_LARGE"


class NotRegularFileError(SourceError):
    """A file of the checkpoint is a FIFO, socket, device or directory: never opened for reading."""

    code = "NOT_REGULAR_FILE"


class ShortReadError(SourceError):
    """A range read returned fewer bytes than the file is said to hold."""

    code = "SHORT_READ"


class SizeDisagreesError(SourceError):
    """A Hub answer's Content-Range gives the file another total size than the repository's listing: one of them
    is wrong, and neither is taken over the other."""

    code = "SIZE_DISAGREES"


class UnsafePathError(SourceError):
    """A file name would escape the checkpoint directory."""

    code = "UNSAFE_PATH"


class DataNotPresentError(SourceError):
    """A tensor's bytes lie in a sparse hole of a local file (a header-only or partial copy):
    they would read as zeros, which are not the checkpoint's values."""

    code = "DATA_NOT_PRESENT"


class GgufSetError(KimiAuditError):
    """The files name no one GGUF set to audit (none, or several and no --include)."""

    code = "GGUF_SET"


class ConfigError(KimiAuditError):
    """config.json is missing, not JSON, or lacks a key the layout needs."""

    code = "CONFIG_INVALID"


class GgufKeyError(ConfigError):
    """A GGUF's metadata key llama.cpp's loader refuses (absent where it is required, or a value it asserts
    against), found while its hyperparameters are read: the audit makes it a finding of `finding_code` naming
    `key`, not an exit 2 (model.gguf)."""

    code = "GGUF_KEY_REFUSED"

    def __init__(self, message: str, key: str, finding_code: str = "GGUF_KEY_VALUE") -> None:
        super().__init__(message)
        self.key, self.finding_code = key, finding_code


class DirectoryNotEmptyError(KimiAuditError):
    """A command would write into a directory that already holds files (and --force was not given)."""

    code = "DIRECTORY_NOT_EMPTY"


class ManifestError(KimiAuditError):
    """A model manifest (`verify --manifest`) that cannot be read or is not model-signing's form."""

    code = "MANIFEST_INVALID"
