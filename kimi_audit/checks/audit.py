"""The audit: load a checkpoint from a source, run every check, return one immutable report.

The report is data (findings, statistics, the verdict); report/ renders it, the JSON included.
"""

from __future__ import annotations

import difflib
import math
import unicodedata
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from kimi_audit.checks.block_counts import fold_block_count
from kimi_audit.checks.hub_count import hub_parameters_findings
from kimi_audit.checks.index import index_findings, index_total_parameters_findings, series_findings
from kimi_audit.checks.layout import align, layout_findings
from kimi_audit.checks.q_a_layernorm import QALayerNormReport, q_a_layernorm_report
from kimi_audit.checks.quantization import quantization_findings
from kimi_audit.checks.respelled import fold_respelled
from kimi_audit.checks.root_causes import (
    attribute,
    covered,
    fold_config_dimension,
    fold_format_mismatch,
    fold_missing_experts,
    fold_quantization,
    fold_undescribed,
    fold_unindexed,
)
from kimi_audit.checks.stats import Stats, compute_stats
from kimi_audit.findings import EXIT_INCONCLUSIVE, Finding, Severity, exit_code_of, warning
from kimi_audit.format.table import tensor_table
from kimi_audit.model.arch.registry import buffered, gguf_archs, model_types
from kimi_audit.model.arch.spec import DENSE, MOE, is_mtp
from kimi_audit.model.checkpoint import Checkpoint, ProgressFn, load_checkpoint
from kimi_audit.model.config import in_family
from kimi_audit.model.gguf import GGUF_ARCHITECTURE
from kimi_audit.model.kinds import BUFFER
from kimi_audit.model.layout import layer_block
from kimi_audit.sources.base import Source


@dataclass(frozen=True)
class ShardSummary:
    name: str
    file_size: int
    header_bytes: int
    tensors: int
    errors: int


ABSENCE_CODES = frozenset(("INDEX_SHARD_ABSENT", "GGUF_PART_MISSING"))
"""The findings that say a shard the index names, or a part a GGUF split set counts, is absent (what PARTIAL
is)."""


@dataclass(frozen=True)
class AuditReport:
    source: str
    revision: str | None
    model: dict[str, Any]
    stats: Stats
    q_a_layernorm: QALayerNormReport
    shards: tuple[ShardSummary, ...]
    findings: tuple[Finding, ...] = field(default=())
    absent_shards: int = 0
    """Shards the index names that are not in the checkpoint (a partial download)."""
    listed_shards: int = 0
    """Shards the index names."""
    values_checked: bool = False
    """The values pass ran (`audit --values`, checks.values.audit_with_values)."""
    gates_checked: bool = False
    """A release gate was asked for (`--expect-params` / `--expect-revision`, checks.gates.apply_gates)."""
    against: str | None = None
    """The checkpoint a GGUF set was compared with (`--against`, checks.against.apply_against), or None."""
    ignored: tuple[Finding, ...] = ()
    """Findings an `--ignore` rule accepted (checks.ignore): out of `findings`, the verdict and the exit code."""
    ignored_by: tuple[str, ...] = ()
    """The rule (`CODE` or `CODE:GLOB`) that matched each of `ignored`, position for position."""
    checkpoint: Checkpoint | None = field(default=None, compare=False, repr=False)
    """What was audited (its expected layout, index and headers), for a renderer that draws the model
    (report.html): not part of the report's data."""

    def count(self, severity: Severity) -> int:
        return sum(1 for f in self.findings if f.severity is severity)

    @property
    def errors(self) -> int:
        return self.count(Severity.ERROR)

    @property
    def warnings(self) -> int:
        return self.count(Severity.WARNING)

    def exit_code(self, fail_on: Severity | str = Severity.ERROR) -> int:
        """The command line's exit code for these findings: 1 when any is at `fail_on` or worse, 3 (inconclusive)
        when none is but no layout could be checked, else 0."""
        return exit_code_of(self.findings, fail_on)

    def verdict(self, fail_on: Severity | str = Severity.ERROR) -> str:
        """One of PASS, FAIL, PARTIAL or INCONCLUSIVE. PARTIAL: shards the index names are absent (a download in
        progress) and what is present has no other error at `fail_on`; a fault in what is present is a FAIL, with
        the absent shards beside it (`headline`). INCONCLUSIVE: nothing failed but no tensor could be checked
        against a layout."""
        code = self.exit_code(fail_on)
        if self.absent_shards and not any(
                f.code not in ABSENCE_CODES and f.severity.rank >= Severity(fail_on).rank for f in self.findings):
            return "PARTIAL"
        return "FAIL" if code == 1 else "INCONCLUSIVE" if code == EXIT_INCONCLUSIVE else "PASS"

    def coverage(self) -> str:
        """What the verdict covers, in words a page prints beside it: the headers always, the layout and the index
        where there is one to check against; the values only with --values (a page's PASS without them says so)."""
        ckpt = self.checkpoint
        layout = ckpt is not None and ckpt.config.layout_supported  # no claim where it is not known
        checked = ", ".join(("headers", *(("names, dtypes, shapes, scales against the layout",) if layout else ()),
                             *(("index",) if self.listed_shards else ())))
        values = ("small tensors' values read (--values)" if self.values_checked else
                  "values not read (audit --values reads the small tensors'; verify reads every byte)")
        return f"{checked}; {values}"

    def headline(self, fail_on: Severity | str = Severity.ERROR) -> str:
        """The verdict as a page or a terminal shows it: with the absent shards it does not cover."""
        verdict = self.verdict(fail_on)
        if not self.absent_shards:
            return verdict
        absent = f"{self.absent_shards:,} of {self.listed_shards:,} shards absent"
        return f"PARTIAL: {absent}" if verdict == "PARTIAL" else f"{verdict} ({absent})"


def model_summary(ckpt: Checkpoint) -> dict[str, Any]:
    cfg = ckpt.config
    blocks = [layer_block(cfg, i) for i in range(cfg.total_layers)]
    q = cfg.quant
    return {
        "model_type": cfg.model_type,
        "architectures": ckpt.config_raw.get("architectures"),
        "layers": cfg.num_hidden_layers,
        "dense_layers": sum(b.split("_")[0] == DENSE for b in blocks),
        "moe_layers": sum(b.split("_")[0] == MOE for b in blocks),
        "mtp_layers": sum(map(is_mtp, blocks)),
        "routed_experts": cfg.n_routed_experts,
        "shared_experts": cfg.n_shared_experts,
        "hidden_size": cfg.hidden_size,
        "q_lora_rank": cfg.q_lora_rank,
        "kv_lora_rank": cfg.kv_lora_rank,
        "vocab_size": cfg.vocab_size,
        "quantization": None if q is None else q.summary(),
        "container": ckpt.container,
    }


def unsupported_reason(ckpt: Checkpoint) -> str:
    """Why no layout is derived: the architecture the files name, which kimi-audit does not describe."""
    raw = ckpt.config_raw
    if ckpt.container == "gguf":
        return (f"the GGUF's general.architecture is {raw.get(GGUF_ARCHITECTURE)!r}, no architecture kimi-audit "
                f"describes (it reads {', '.join(gguf_archs())})")
    wrapped = unread_text_model(raw)
    if wrapped is not None:
        return (f"config.json describes model_type {raw.get('model_type')!r} around a text_config of model_type "
                f"{wrapped!r}, which kimi-audit does not describe")
    near = near_model_type(raw.get("model_type"))
    hint = f"; did you mean {near!r}?" if near is not None else ""
    return (f"config.json describes model_type {raw.get('model_type')!r} (architectures "
            f"{raw.get('architectures')!r}), no architecture kimi-audit describes{hint}")


def unread_text_model(raw: dict[str, Any]) -> Any:
    """The text_config model_type of a registered wrapper that does not read it (a `mistral3` around Mistral
    Small 3's `mistral`); None otherwise."""
    text = raw.get("text_config")
    return text.get("model_type") if in_family(raw) and isinstance(text, dict) else None


def layout_unsupported(ckpt: Checkpoint) -> Finding:
    raw = ckpt.config_raw
    if ckpt.container == "gguf":
        return warning("LAYOUT_UNSUPPORTED", f"{unsupported_reason(ckpt)}: only the container and split checks ran, "
                       "no tensor was checked against a layout: inconclusive (exit 3 where no other finding fails it)",
                       tensor="general.architecture", actual=raw.get(GGUF_ARCHITECTURE))
    wrapped, model_type = unread_text_model(raw), raw.get("model_type")
    key, near, actual = (("text_config.model_type", None, wrapped) if wrapped is not None
                         else ("model_type", near_model_type(model_type), model_type))
    return warning("LAYOUT_UNSUPPORTED", f"{unsupported_reason(ckpt)}: only the format, index and file checks ran, "
                   "no tensor was checked against a layout: inconclusive (exit 3 where no other finding fails it)",
                   tensor=key, expected=near, actual=actual)


def near_model_type(model_type: Any) -> str | None:
    """The registered model_type a near miss stands for: the same once invisible characters (zero-width, format
    controls), surrounding whitespace and case are set aside, or else the closest spelling."""
    if not isinstance(model_type, str):
        return None
    known = model_types()
    plain = "".join(c for c in model_type if unicodedata.category(c) not in ("Cf", "Cc", "Zs")).strip().casefold()
    for t in known:
        if t.casefold() == plain:
            return t
    close = difflib.get_close_matches(plain, known, n=1, cutoff=0.8)
    return close[0] if close else None


def audit_checkpoint(ckpt: Checkpoint) -> AuditReport:
    expected = ckpt.expected
    all_findings: list[Finding] = list(ckpt.findings)
    for header in ckpt.headers.values():
        all_findings.extend(header.findings)
    if ckpt.index is not None:
        all_findings.extend(ckpt.index.findings)
    actual, duplicates = tensor_table(ckpt.headers)
    cfg = ckpt.config
    aligned = align(actual, expected)
    all_findings.extend(duplicates)
    cov = covered(ckpt, expected, aligned.positions)
    if cfg.layout_supported:
        stored = Counter(actual.dtypes) if cfg.quant is None else None
        all_findings.extend(quantization_findings(ckpt.config_raw, stored, cfg.quant_unsupported))
        all_findings.extend(cov.extra)
        all_findings.extend(layout_findings(actual, expected, aligned, cov.positions, cov.everything, cfg.dtype,
                                            cov.invalid, cfg.quant is None or cfg.quant.dtype_recorded))
    elif ckpt.container != "gguf" or ckpt.config_raw.get(GGUF_ARCHITECTURE) is not None:
        all_findings.append(layout_unsupported(ckpt))  # (a GGUF whose metadata is unreadable: GGUF_INVALID says)
    all_findings.extend(index_findings(actual, ckpt.index, ckpt.headers, cov.shards, cov.invalid,
                                       cfg.quant is not None and cfg.quant.index_counts_files))
    if ckpt.container != "gguf" and not any(f.code == "MTP_ABSENT" for f in cov.extra):
        # (a GGUF split set's parts: format.gguf_split's GGUF_PART_MISSING; a gap beside an absent MTP layer is
        # the MTP layer's shard, which MTP_ABSENT says)
        all_findings.extend(series_findings(ckpt.files, ckpt.index))
    index = ckpt.index
    every_shard = index is None or all(shard in ckpt.headers for shard in index.shards)
    count_index = index is not None and index.total_parameters is not None and cfg.layout_supported \
        and cfg.quant_unsupported is None and every_shard
    count_hub = ckpt.reported_parameters is not None and not cov.shards and every_shard
    if count_index or count_hub:
        specs, spec_of = expected.specs, expected.spec_of  # the parameters of the tensors found (MTP_ABSENT apart)
        found = [specs[spec_of[p]] for p in aligned.positions if p is not None]
        parameters = sum(s.logical for s in found)
        if count_index:
            kept_as_buffers = buffered()  # router biases transformers registers as buffers: its save lacks them
            buffers = sum(s.logical for s in found if s.component in kept_as_buffers)
            stored_buffers = sum(math.prod(s.shape) for s in found if s.kind == BUFFER)  # rotary caches, hashes
            all_findings.extend(index_total_parameters_findings(index, parameters, sum(map(math.prod, actual.shapes)),
                                                                parameters - buffers,
                                                                (stored_buffers, stored_buffers + buffers)))
        if count_hub:
            all_findings.extend(hub_parameters_findings(ckpt, actual, parameters))
    all_findings = fold_unindexed(fold_format_mismatch(fold_quantization(
        fold_undescribed(attribute(all_findings, ckpt, cov), cfg), expected), expected, aligned.positions))
    all_findings = fold_missing_experts(fold_respelled(fold_block_count(fold_config_dimension(all_findings, ckpt),
                                                                        ckpt)))
    listed = ckpt.index.shards if ckpt.index is not None else []
    if ckpt.container == "gguf":  # the parts split.count names: those here, and those GGUF_PART_MISSING names
        listed = [*ckpt.files, *(str(f.shard) for f in all_findings if f.code == "GGUF_PART_MISSING")]
    stats = compute_stats(actual, expected, ckpt.headers, aligned)
    shards = tuple(
        ShardSummary(name, h.file_size, h.data_start, h.tensor_count,
                     sum(1 for f in h.findings if f.severity is Severity.ERROR))
        for name, h in ckpt.headers.items()
    )
    return AuditReport(
        source=ckpt.label,
        revision=ckpt.revision,
        model=model_summary(ckpt),
        stats=stats,
        q_a_layernorm=q_a_layernorm_report(ckpt.config, actual, expected),
        shards=shards,
        findings=tuple(all_findings),
        absent_shards=len(set(listed) - set(ckpt.files)),
        listed_shards=len(listed),
        checkpoint=ckpt,
    )


def audit_source(source: Source, progress: ProgressFn | None = None) -> AuditReport:
    return audit_checkpoint(load_checkpoint(source, progress))
