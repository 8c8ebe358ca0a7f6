"""Reading the loader name tables in tests/data/loader_names/: a table's dimension is arithmetic over config keys."""

from __future__ import annotations

import re
from typing import Any


def dim(expr: str, keys: dict[str, Any]) -> int:
    """A table dimension (`num_heads*head_dim`, `(2+hc_mult)*hc_mult`, `linear_attn_config.head_dim`): each key,
    dotted into nested objects, replaced by its value, then the arithmetic (digits, + - * / and parentheses; the
    tables are this project's own test data) evaluated."""
    def value(m: re.Match[str]) -> str:
        node: Any = keys
        for part in m.group(0).split("."):
            node = node[part]
        return str(int(node))
    return int(eval(re.sub(r"[a-z_][a-z_.]*", value, expr), {"__builtins__": {}}))
