"""The tests' tiny real checkpoint: the package's own (kimi_audit.replica.tiny, what `demo --tiny` writes), and
`write_safetensors` for the tests that write one file of their own."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from kimi_audit.replica.tiny import TINY_CONFIG, build_tiny, safetensors_bytes, tiny_shard_of, tiny_shards, write_tiny

__all__ = ["TINY_CONFIG", "build_tiny", "tiny_shard_of", "tiny_shards", "write_safetensors", "write_tiny"]


def write_safetensors(path: Path, arrays: dict[str, np.ndarray]) -> None:
    path.write_bytes(safetensors_bytes(arrays))
