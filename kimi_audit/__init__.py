"""kimi-audit: audit Kimi-K2 / DeepseekV3-family safetensors checkpoints from their headers.

The public API (loaded on first use, so `kimi-audit --version` stays light):

- `audit(source, revision=None, *, values=False)` -> `AuditReport` (see kimi_audit.api);
- `AuditReport`: `.findings`, `.stats`, `.verdict()`, `.exit_code(fail_on="error")`, `.to_dict()`;
- `Finding`, `Severity`, and `KimiAuditError` (unusable input, with a stable `.code`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["AuditReport", "Finding", "KimiAuditError", "Severity", "__version__", "audit"]

if TYPE_CHECKING:
    from kimi_audit.api import audit
    from kimi_audit.checks.audit import AuditReport
    from kimi_audit.errors import KimiAuditError
    from kimi_audit.findings import Finding, Severity

_LAZY = {"audit": "kimi_audit.api", "AuditReport": "kimi_audit.checks.audit", "Finding": "kimi_audit.findings",
         "Severity": "kimi_audit.findings", "KimiAuditError": "kimi_audit.errors"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'kimi_audit' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
