"""The human-readable audit report, rendered with rich."""

from __future__ import annotations

from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from kimi_audit.checks.audit import AuditReport
from kimi_audit.findings import Severity
from kimi_audit.report.grouping import FindingGroup, first_groups, group_findings, ignored_line
from kimi_audit.text import printable

SEVERITY_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}
MAX_GROUPS = 40


def _plain(text: str) -> Text:
    """Untrusted text (tensor names, messages): no rich markup, no terminal control characters."""
    return Text(printable(text))


def _n(v: int) -> str:
    return f"{v:,}"


def render_table(report: AuditReport, console: Console, fail_on: Severity = Severity.ERROR,
                 plain: bool | None = None) -> None:
    """The report for a reader. `plain` (default: when the console is not a terminal, as in a CI log): each
    finding group on one line, names never wrapped, so that a log can be grepped."""
    if plain is None:
        plain = not console.is_terminal
    m, s, qa = report.model, report.stats, report.q_a_layernorm
    head = Table.grid(padding=(0, 2))
    head.add_row("source", _plain(report.source))
    head.add_row("revision", report.revision or "(local files)")
    blocks = f"{m['layers']} blocks: {m['dense_layers']} dense + {m['moe_layers']} MoE"
    if m["mtp_layers"]:
        blocks += f", + {m['mtp_layers']} MTP"
    head.add_row("model", f"{m['model_type']} · {blocks} · {m['routed_experts'] or 0} routed experts")
    head.add_row("shards", f"{_n(s.shards)} · {_n(s.file_bytes)} bytes · headers {_n(s.header_bytes)} bytes")
    console.print(Panel(head, title="kimi-audit", expand=False))

    classes = Table(title="Tensors by class and dtype", title_justify="left")
    for col in ("class", "dtype", "tensors", "stored elements", "parameters"):  # bytes: in --json and markdown
        classes.add_column(col, justify="left" if col in ("class", "dtype") else "right", overflow="fold")
    for row in s.rows:
        classes.add_row(row.kind, row.dtype, _n(row.tensors), _n(row.elements), _n(row.parameters))
    classes.add_section()
    classes.add_row("all", "", _n(s.tensors), _n(s.elements), _n(s.parameters), style="bold")
    console.print(classes)
    console.print(f"parameters (logical: packed words count for their module's out x in; quantization metadata "
                  f"and stored buffers excluded): [bold]{_n(s.parameters)}[/bold]")

    if qa.width is None:
        console.print("q_a_layernorm: not applicable (config has no q_lora_rank, or not the DeepseekV3 family's, or a "
                      "tree in its own names: Mistral's attention.q_a_norm, which --values checks)")
    else:
        style = "green" if qa.ok else "bold red"
        console.print(f"q_a_layernorm gains (query latent RMSNorm, [{qa.width:,}] each): total {_n(qa.total_params)}")
        for total in qa.totals:
            console.print(f"  [{style}]{total.line(qa.width)}[/{style}]", soft_wrap=True)
        for r in qa.rows:
            if not r.ok:
                got = "missing" if r.shape is None else f"{r.dtype} {list(r.shape)}"
                console.print(f"  [red]layer {r.layer} ({r.block}): {got}[/red]")

    groups = group_findings(report.findings)
    if groups and plain:
        console.print(f"Findings ({counted(report)})", soft_wrap=True)
        for g in first_groups(groups, MAX_GROUPS):
            console.print(Text.assemble((f"{g.severity:<8}", SEVERITY_STYLE[g.severity]),
                                        f"  {g.code}  {_n(g.count)}  ", _plain(g.pattern or "-"), "  ",
                                        _plain(_detail(g))), soft_wrap=True)
    elif groups:
        t = Table(title=f"Findings ({counted(report)})", title_justify="left")
        for col in ("severity", "code", "count", "tensor / shard", "detail (first)"):
            t.add_column(col, overflow="fold", no_wrap=col in ("severity", "code", "count"))  # a code stays whole
        for g in first_groups(groups, MAX_GROUPS):
            # Names and messages come from the checkpoint: plain Text, never parsed as rich markup.
            t.add_row(Text(g.severity, style=SEVERITY_STYLE[g.severity]), g.code, _n(g.count), _plain(g.pattern),
                      _plain(_detail(g)))
        console.print(t)
    if len(groups) > MAX_GROUPS:
        console.print(f"… and {len(groups) - MAX_GROUPS} more groups (use --json --all-findings for every finding)")
    ignored = ignored_line(report)
    if ignored is not None:
        console.print(_plain(ignored))
    headline = report.headline(fail_on)  # agrees with the exit code: PASS exactly when it is 0
    verdict = Text(headline, style="bold green" if headline == "PASS" else "bold red")
    console.print(Group(Text.assemble(verdict, f"  {counted(report)}")))


def _detail(g: FindingGroup) -> str:
    """The group's first message, without the tensor name it starts with (the pattern shows it)."""
    detail = g.example.message
    if g.example.tensor and detail.startswith(g.example.tensor + ": "):
        detail = detail[len(g.example.tensor) + 2:]
    return detail


def plural(n: int, word: str) -> str:
    return f"{n:,} {word}" + ("" if n == 1 else "s")


def counted(report: AuditReport) -> str:
    return f"{plural(report.errors, 'error')}, {plural(report.warnings, 'warning')}"
