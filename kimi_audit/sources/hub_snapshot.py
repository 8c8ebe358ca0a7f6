"""A HubSource's files fetched whole at its resolved commit, by huggingface_hub's `snapshot_download`
(its cache layout or a local directory, resume, progress bars), with the source's own token and its
errors mapped as every other Hub read's are."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from kimi_audit.errors import SourceError
from kimi_audit.sources.hub import HubSource
from kimi_audit.sources.hub_network import first_line


def download_snapshot(source: HubSource, names: Sequence[str], *, local_dir: Path | None, cache_dir: Path | None,
                      max_workers: int = 8) -> Path:
    """Where the files now are: `local_dir`, or the snapshot folder in the HF cache."""
    from huggingface_hub import snapshot_download

    try:
        with source._translate_errors("download"):
            path = snapshot_download(
                source.repo_id,
                revision=source.revision,
                local_dir=local_dir,
                cache_dir=cache_dir,
                allow_patterns=list(names),
                endpoint=source.endpoint,
                token=source._token,
                max_workers=max_workers,
                library_name="kimi-audit",
            )
    except OSError as e:  # a disk full, a permission refused, a file huggingface_hub could not move
        raise SourceError(f"download of {source.label} failed: {first_line(e)}") from None
    return Path(path)
