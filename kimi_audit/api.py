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
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kimi_audit.checks import audit as checks_audit
from kimi_audit.checks.q_a_layernorm import QALayerNormReport
from kimi_audit.checks.stats import Stats
from kimi_audit.constants import MAX_CONFIG_BYTES
from kimi_audit.errors import ConfigError, KimiAuditError
from kimi_audit.findings import Finding, Severity
from kimi_audit.model.arch.registry import dialects, model_types
from kimi_audit.model.checkpoint import Checkpoint, ProgressFn
from kimi_audit.model.config_fields import ModelConfig
from kimi_audit.report.json_report import report_dict
from kimi_audit.sources import open_source

if TYPE_CHECKING:
    from kimi_audit.checks.tensor import TensorCheck
    from kimi_audit.model.layout import ExpectedLayout


@dataclass(frozen=True)
class AuditReport:
    """What `audit()` returns: the audit's own report (checks.audit.AuditReport, in `.audit`), each of its
    fields read through, and `to_dict()`, its plain data as the CLI renders it (report.json_report)."""

    audit: checks_audit.AuditReport

    def to_dict(self, fail_on: Severity | str = Severity.ERROR, all_findings: bool = False) -> dict[str, Any]:
        """The report as plain data: exactly what `audit --json` prints (schema kimi-audit/audit/1)."""
        return report_dict(self.audit, Severity(fail_on), all_findings)

    def to_html(self, fail_on: Severity | str = Severity.ERROR) -> str:
        """The report as one self-contained HTML page: what `audit --format html` writes."""
        from kimi_audit.report.html import render_html

        return render_html(self.audit, Severity(fail_on))

    def exit_code(self, fail_on: Severity | str = Severity.ERROR) -> int:
        """The command line's exit code for these findings: 1 when any is at `fail_on` or worse, 3 (inconclusive)
        when no layout could be checked, else 0."""
        return self.audit.exit_code(fail_on)

    def verdict(self, fail_on: Severity | str = Severity.ERROR) -> str:
        """PASS, FAIL, PARTIAL (shards absent, nothing else wrong) or INCONCLUSIVE."""
        return self.audit.verdict(fail_on)

    def headline(self, fail_on: Severity | str = Severity.ERROR) -> str:
        """The verdict with the absent shards it does not cover: the command line's headline."""
        return self.audit.headline(fail_on)

    def count(self, severity: Severity) -> int:
        return self.audit.count(severity)

    @property
    def errors(self) -> int:
        return self.audit.errors

    @property
    def warnings(self) -> int:
        return self.audit.warnings

    @property
    def source(self) -> str:
        return self.audit.source

    @property
    def revision(self) -> str | None:
        return self.audit.revision

    @property
    def model(self) -> dict[str, Any]:
        return self.audit.model

    @property
    def stats(self) -> Stats:
        return self.audit.stats

    @property
    def q_a_layernorm(self) -> QALayerNormReport:
        return self.audit.q_a_layernorm

    @property
    def shards(self) -> tuple[checks_audit.ShardSummary, ...]:
        return self.audit.shards

    @property
    def findings(self) -> tuple[Finding, ...]:
        return self.audit.findings

    @property
    def absent_shards(self) -> int:
        return self.audit.absent_shards

    @property
    def listed_shards(self) -> int:
        return self.audit.listed_shards

    @property
    def values_checked(self) -> bool:
        return self.audit.values_checked

    @property
    def gates_checked(self) -> bool:
        return self.audit.gates_checked

    @property
    def against(self) -> str | None:
        """The checkpoint a GGUF set was compared with (`against=`), or None."""
        return self.audit.against

    @property
    def ignored(self) -> tuple[Finding, ...]:
        return self.audit.ignored

    @property
    def ignored_by(self) -> tuple[str, ...]:
        return self.audit.ignored_by

    @property
    def checkpoint(self) -> Checkpoint | None:
        """What was audited: config, index, every shard's header and the expected layout (the HTML page
        draws the model from it)."""
        return self.audit.checkpoint


def audit(
    source: str | os.PathLike[str], revision: str | None = None, *, values: bool = False,
    progress: ProgressFn | None = None, values_progress: ProgressFn | None = None, include: tuple[str, ...] = (),
    against: str | os.PathLike[str] | None = None,
) -> AuditReport:
    """Audit a checkpoint: a local directory (or .safetensors file), a GGUF set (a folder, or any of its parts),
    an HF cache snapshot, or a Hub repo id `owner/name[@revision]` (`revision` overrides the `@` part).
    `include`: only the files these globs match (one GGUF set of several: `("UD-Q2_K_XL/*",)`). `values=True`
    also reads every small tensor (norm gains, router biases, quantization scales), as `audit --values` does.
    `against`: a GGUF set's source checkpoint (a directory or Hub repo), compared as `audit --against` does (its
    values too with `values=True`).

    `progress` is called with (shard, shards done, shards total) after each header is read, and only then,
    with or without `values`; `values_progress`, with `values=True`, with (shard, tensors done, tensors total)
    as the small tensors are checked. Each counts up to its own total: neither changes meaning mid-run."""
    src = open_source(os.fspath(source), revision, include)
    if values:
        from kimi_audit.checks.values import audit_with_values

        report = audit_with_values(src, progress, values_progress)
    else:
        report = checks_audit.audit_source(src, progress)
    if against is not None:
        from kimi_audit.checks.against import apply_against

        report = apply_against(report, src, open_source(os.fspath(against)), values)
    return AuditReport(report)


def layout(config: str | os.PathLike[str] | Mapping[str, Any], revision: str | None = None, *,
           dialect: str | None = None) -> ExpectedLayout:
    """What a checkpoint of `config` must hold: every tensor's name, dtype, shape, kind and the quantization
    scheme of the module it stores (an ExpectedLayout: a Mapping name -> ExpectedTensor, in checkpoint order),
    in the release's names, or in a writer's `dialect` (`transformers`: its save_pretrained spelling).

    `config`: a config.json path, its parsed dict, or a checkpoint (a local directory or a Hub repo id
    `owner/name[@revision]`) whose config.json is read. KimiAuditError for a config of no registered
    architecture or a dialect the architecture does not have."""
    from kimi_audit.model.layout import expected_layout

    cfg = _config_of(config, revision)
    if not cfg.layout_supported:
        raise ConfigError(f"model_type {cfg.model_type!r} is no architecture kimi-audit describes "
                          f"({', '.join(model_types())})")
    expected = expected_layout(cfg)
    if dialect is None:
        return expected
    from kimi_audit.model.dialect import respelled

    known = dialects(cfg)
    chosen = [d for d in known if d.name.split()[0] == dialect or d.name == dialect]
    if not chosen:
        names = (", ".join(d.name.split()[0] for d in known)
                 or "none: transformers' save_pretrained writes the release's names")
        raise KimiAuditError(f"{cfg.model_type} has no dialect {dialect!r} (its dialects: {names})")
    return respelled(expected, chosen[0].rename)


def _config_of(config: str | os.PathLike[str] | Mapping[str, Any], revision: str | None) -> ModelConfig:
    from kimi_audit.model.checkpoint import load_config
    from kimi_audit.model.config import model_config_from_dict, parse_config_bytes
    from kimi_audit.sources.files import read_small_file

    if isinstance(config, Mapping):
        return model_config_from_dict(dict(config))
    path = os.fspath(config)
    if path.endswith(".json") and os.path.isfile(path):
        return parse_config_bytes(read_small_file(path, MAX_CONFIG_BYTES))[1]
    return load_config(open_source(path, revision))[1]


def tensor(source: str | os.PathLike[str], name: str, revision: str | None = None, *, dequantize: bool = False,
           max_bytes: int | None = None) -> TensorCheck:
    """One tensor fetched by byte range and checked (`kimi-audit tensor`): its statistics, its module's scales
    and, with `dequantize`, the statistics of its dequantized weight (TensorCheck.doc; `.ok`, `.findings`)."""
    from kimi_audit.checks.tensor import check_tensor
    from kimi_audit.numerics.tensor_io import DEFAULT_MAX_TENSOR_BYTES

    return check_tensor(open_source(os.fspath(source), revision), name, dequant=dequantize,
                        max_bytes=DEFAULT_MAX_TENSOR_BYTES if max_bytes is None else max_bytes)
