"""The Hub's model info answer (`/api/models/{repo}/revision/{rev}?blobs=true`), decoded by msgspec into
the few typed fields the audit reads: the resolved commit and each file's size and LFS sha256.

(huggingface_hub's ModelInfo would do it too, but importing `huggingface_hub.hf_api` costs ~0.25 s of a
~1.3 s remote audit; everything else of huggingface_hub the sources use loads in ~0.1 s.)
"""

from __future__ import annotations

import msgspec


class Lfs(msgspec.Struct):
    sha256: str | None = None
    size: int | None = None


class Sibling(msgspec.Struct):
    rfilename: str
    size: int | None = None
    lfs: Lfs | None = None


class SafetensorsInfo(msgspec.Struct):
    """The Hub's parameter count, computed from the shard headers (huggingface.js parseSafetensorsMetadata)."""

    total: int | None = None
    parameters: dict[str, int] = msgspec.field(default_factory=dict)


class RepoInfo(msgspec.Struct):
    sha: str | None = None
    siblings: list[Sibling] = msgspec.field(default_factory=list)
    safetensors: SafetensorsInfo | None = None
    gated: bool | str = False
    """False, or how access is granted ("auto", "manual"): then files are served only to granted tokens."""


_DECODER = msgspec.json.Decoder(RepoInfo)


def decode_repo_info(body: bytes) -> RepoInfo:
    """The answer's typed fields; ValueError (saying what is wrong) when it is not usable JSON of that shape."""
    try:
        return _DECODER.decode(body)
    except msgspec.MsgspecError as e:
        raise ValueError(str(e)) from None
