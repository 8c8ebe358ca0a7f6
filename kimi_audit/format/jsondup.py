"""Find duplicate object keys, which json.loads drops silently (the last one wins)."""

from __future__ import annotations

import json
from typing import Any


def duplicate_keys(text: str, **loads_kwargs: Any) -> list[str]:
    """Every key that repeats within one JSON object, in document order. Raises what json.loads raises."""
    dups: list[str] = []

    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        seen: set[str] = set()
        for k, _ in pairs:
            if k in seen:
                dups.append(k)
            seen.add(k)
        return dict(pairs)

    json.loads(text, object_pairs_hook=hook, **loads_kwargs)
    return dups
