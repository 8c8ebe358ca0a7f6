"""kimi-audit: audit Kimi-K2 / DeepseekV3-family safetensors checkpoints from their headers.

The public API (loaded on first use, so `kimi-audit --version` stays light):

- `audit(source, revision=None, *, values=False)` -> `AuditReport` (see kimi_audit.api);
- `AuditReport`: `.findings`, `.stats`, `.verdict()`, `.exit_code(fail_on="error")`, `.to_dict()` (the
  audit's own report, checks.audit.AuditReport, in `.audit`);
- `layout(config, *, dialect=None)` -> what a checkpoint of that config must hold (name, dtype, shape, kind,
  scheme of every tensor), in the release's names or a writer's dialect;
- `tensor(source, name, *, dequantize=False)` -> one tensor fetched by byte range and checked (TensorCheck);
- `Finding`, `Severity`, and `KimiAuditError` (unusable input, with a stable `.code`).
"""

from __future__ import annotations

from kimi_audit.constants import VERSION as __version__

# typing is not imported at run time: `python -m kimi_audit` imports this module before any of its code can
# answer Ctrl-C (kimi_audit/__main__.py), and typing was most of that window (~2.4 ms of ~2.7 ms).
TYPE_CHECKING = False

__all__ = ["AuditReport", "Finding", "KimiAuditError", "Severity", "__version__", "audit", "layout", "tensor"]

if TYPE_CHECKING:
    from typing import Any

    from kimi_audit.api import AuditReport, audit, layout, tensor
    from kimi_audit.errors import KimiAuditError
    from kimi_audit.findings import Finding, Severity

_LAZY = {"audit": "kimi_audit.api", "layout": "kimi_audit.api", "tensor": "kimi_audit.api",
         "AuditReport": "kimi_audit.api", "Finding": "kimi_audit.findings",
         "Severity": "kimi_audit.findings", "KimiAuditError": "kimi_audit.errors"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'kimi_audit' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
