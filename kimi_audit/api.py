"""The Python API: `kimi_audit.audit(source)` returns the same report the `audit` command prints.

    >>> import kimi_audit
    >>> report = kimi_audit.audit("path/to/checkpoint")          # or "owner/name@revision" over the Hub
    >>> report.verdict(), report.stats.parameters
    ('PASS', 1026408232448)
    >>> report.to_dict() == json.loads(`kimi-audit audit path/to/checkpoint --json`)
    >>> report.exit_code(fail_on="warning")                       # the CLI's exit code with --fail-on warning

Unusable input (no config.json, an unreachable Hub, ...) raises KimiAuditError (the CLI's exit 2), whose
`code` names the cause.
"""

from __future__ import annotations

import os

from kimi_audit.checks.audit import AuditReport, audit_source
from kimi_audit.model.checkpoint import ProgressFn
from kimi_audit.sources import open_source


def audit(
    source: str | os.PathLike[str], revision: str | None = None, *, values: bool = False,
    progress: ProgressFn | None = None,
) -> AuditReport:
    """Audit a checkpoint: a local directory (or .safetensors file), an HF cache snapshot, or a Hub repo id
    `owner/name[@revision]` (`revision` overrides the `@` part). `values=True` also reads every small
    tensor (norm gains, router biases, quantization scales), as `audit --values` does. `progress` is
    called with (shard, done, total) after each header is read."""
    src = open_source(os.fspath(source), revision)
    if values:
        from kimi_audit.checks.values import audit_with_values

        return audit_with_values(src, progress, progress)
    return audit_source(src, progress)
