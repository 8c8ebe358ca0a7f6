"""The `rmsnorm` and `tensor` commands' output: rich tables for a console, and their JSON text (non-finite
floats as null). Pure: the commands compute, these only render what they computed."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from kimi_audit.text import printable

if TYPE_CHECKING:
    from kimi_audit.checks.rmsnorm import LayerResult


def _fmt(v: float | None, spec: str = ".4g") -> str:
    return "-" if v is None else format(v, spec)


def _json_default(v: Any) -> Any:
    raise TypeError(type(v))


def clean(v: Any) -> Any:
    """JSON has no NaN/Inf: non-finite floats become null."""
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, dict):
        return {k: clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [clean(x) for x in v]
    return v


def json_text(doc: Mapping[str, Any]) -> str:
    """The document as indented JSON, non-finite floats as null, with a final newline."""
    return json.dumps(clean(doc), indent=2, allow_nan=False, default=_json_default) + "\n"


def render_rmsnorm(console: Console, label: str, revision: str | None, eps: float, input_desc: dict[str, Any],
                   results: Sequence[LayerResult], show: int, bytes_read: int) -> None:
    from kimi_audit.checks.rmsnorm import max_abs

    rev = f" @ {revision}" if revision else ""
    shape = "×".join(str(d) for d in input_desc["shape"])
    what = {"random": f"seeded bf16 N(0,1), seed {input_desc.get('seed')}", "file": input_desc.get("path"),
            "embeddings": f"embedding rows of tokens {input_desc.get('token_ids')} → input_layernorm → q_a_proj"}
    console.print(f"[bold]RMSNorm[/bold] (DeepseekV3RMSNorm, eps={eps:g}) on {label}{rev}")
    console.print(f"input [{shape}]: {what[input_desc['kind']]}; {bytes_read:,} bytes fetched")
    console.print("γ: the layer's q_a_layernorm gain; out RMS: min–max over positions of RMS(y); "
                  "|RMS(y/γ)−1|: the largest over positions", highlight=False)
    table = Table(show_lines=False)
    for col, just in (("layer", "right"), ("block", "left"), ("γ min", "right"), ("γ max", "right"),
                      ("γ mean", "right"), ("out RMS", "right"), ("|RMS(y/γ)−1|", "right"), ("check", "left")):
        table.add_column(col, justify=just, no_wrap=col == "out RMS")  # type: ignore[arg-type]
    for r in results:
        fin = [v for v in r.output_rms if math.isfinite(v)]
        span = f"{min(fin):.4f}–{max(fin):.4f}" if fin else "-"
        check = "[green]ok[/green]" if r.ok else "[red]" + "; ".join(r.problems) + "[/red]"
        table.add_row(str(r.layer), r.block, _fmt(r.gain.min), _fmt(r.gain.max), _fmt(r.gain.mean),
                      span, _fmt(max_abs(r.unit_deviation), ".3g"), check)
    console.print(table)
    if show:
        for r in results:
            vals = " ".join(_fmt(v, ".4f") for v in r.output_rms[:show])
            more = f" … ({len(r.output_rms):,} positions)" if len(r.output_rms) > show else ""
            console.print(f"layer {r.layer} output RMS per position: {vals}{more}", highlight=False)
    bad = [r for r in results if not r.ok]
    if bad:
        console.print(f"[red]{len(bad)} of {len(results)} layers failed the check[/red]")
    else:
        console.print(f"[green]{len(results)} layer(s): gains finite and non-zero, outputs finite[/green]")


def _stats_rows(table: Table, label: str, st: Mapping[str, Any]) -> None:
    table.add_row(label, "count", f"{st['count']:,}")
    for k in ("min", "max", "mean", "std"):
        table.add_row("", k, _fmt(st[k], ".6g"))
    table.add_row("", "NaN / +Inf / −Inf", f"{st['nan']:,} / {st['posinf']:,} / {st['neginf']:,}")
    table.add_row("", "zeros", f"{st['zeros']:,}")
    if st.get("saturated") is not None:
        table.add_row("", "FP8 saturated |x| = 448", f"{st['saturated']:,}")


def render_tensor(console: Console, doc: Mapping[str, Any], values_label: str, scheme: str | None) -> None:
    """The `tensor` command's document (what `--json` prints) as text: `values_label` names the stored values'
    row, `scheme` describes the module's quantization (None: not a quantized weight)."""
    rev = f" @ {doc['revision']}" if doc["revision"] else ""
    console.print(Text(printable(doc["tensor"]), style="bold")
                  + Text(printable(f" in {doc['shard']} ({doc['source']}{rev})")))
    console.print(Text(printable(f"{doc['dtype']} {doc['shape']}, {doc['bytes']:,} bytes")))
    if scheme is not None:
        shape_note = f"; weight_shape {doc['weight_shape']}" if doc["weight_shape"] is not None else ""
        console.print(Text(printable(f"module {doc['module']}: {scheme}{shape_note}")))
    table = Table(show_header=True)
    table.add_column("values")
    table.add_column("statistic")
    table.add_column("", justify="right")
    _stats_rows(table, printable(values_label), doc["stats"])
    if doc["scale"] is not None:
        sc = doc["scale"]["stats"]
        _stats_rows(table, f"scales {sc['dtype']} {sc['shape']}", sc)
    if doc["dequantized"] is not None:
        _stats_rows(table, f"dequantized {doc['dequantized']['dtype']}", doc["dequantized"])
    console.print(table)
    for p in doc["problems"]:
        console.print(Text(printable(p), style="red"))
