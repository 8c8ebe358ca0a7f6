"""Work per class of tensors, not per tensor (issue "Speed, round three").

A deviation a whole class of tensors shares (compressed-tensors' own compressor writes every `weight_shape` I64
where the releases store I32) is one decision: the audit of a checkpoint where every weight_shape is I64 builds as
many findings and asks the registries as often as the audit of one where none is, within a constant, whatever
the number of tensors. Counted, not timed: on the full-scale Kimi-K2-Thinking replica the per-tensor path built
69,120 findings and looked the float32 routers up 69,120 times (1.4 s of a 2.2 s audit) to report one info.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import kimi_audit.checks.layout as layout_check
import kimi_audit.model.arch.registry as registry
from kimi_audit import audit
from kimi_audit.findings import Finding

CONSTANT = 4
"""How many more counted calls the I64 audit may make: the class's one decision and its one folded info."""


def counting(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Counts every Finding made, every registry union looked up, every writer asked and every stored tensor
    compared with its layout entry."""
    calls: Counter[str] = Counter()

    def counted(key: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            calls[key] += 1
            return fn(*args, **kwargs)
        return wrapper

    post_init = Finding.__post_init__
    monkeypatch.setattr(Finding, "__post_init__", counted("findings", post_init))
    monkeypatch.setattr(registry, "_union", counted("registry unions", registry._union))
    monkeypatch.setattr(layout_check, "writer_of", counted("writer_of", layout_check.writer_of))
    monkeypatch.setattr(layout_check, "role_of", counted("role_of", layout_check.role_of))
    monkeypatch.setattr(layout_check, "mismatch_findings", counted("mismatch_findings",
                                                                   layout_check.mismatch_findings))
    return calls


def test_a_writers_width_is_one_decision_not_one_per_tensor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from test_int4 import build_int4

    released = build_int4(tmp_path / "i32")  # weight_shape I32, as Moonshot's releases store it
    compressor = build_int4(tmp_path / "i64", writers_widths=True)  # I64, as compressed-tensors writes it
    calls = counting(monkeypatch)
    plain = audit(released)
    at_release = Counter(calls)
    calls.clear()
    widths = audit(compressor)
    at_writer = Counter(calls)
    (f,) = [f for f in widths.findings if f.code == "WRITER_DTYPE"]
    assert (f.covers, f.expected, f.actual) == (72, "I32", "I64")  # 72 weight_shapes, one info
    assert widths.verdict() == plain.verdict() == "PASS"
    for key in ("findings", "registry unions", "writer_of", "role_of", "mismatch_findings"):
        assert at_writer[key] <= at_release[key] + CONSTANT, (key, at_writer[key], at_release[key])


def test_diff_builds_one_accounting_per_side(monkeypatch: pytest.MonkeyPatch) -> None:
    """`diff`'s "same model" line weighs both directions (B the release of A, then A of B) with the parameter
    counts its header diff has already built: two accountings in all, one per side, where it built six (the
    header diff's two, and two per direction: 8.5 of a full-scale FP8 / NVFP4 pair's 13.5 s in same_model)."""
    import json

    from typer.testing import CliRunner

    import kimi_audit.checks.diff as diff_check
    import kimi_audit.checks.same_model as same_model_check
    from kimi_audit.cli import app

    built: Counter[str] = Counter()
    for module in (diff_check, same_model_check):
        real = module.accounting_of_checkpoint

        def counted(ck: Any, real: Callable[..., Any] = real) -> Any:
            built[ck.label] += 1
            return real(ck)
        monkeypatch.setattr(module, "accounting_of_checkpoint", counted)
    data = Path(__file__).parent / "data" / "modelopt"
    for a, b, line in (("nvfp4-kv", "fp8", "NVFP4 → FP8"), ("fp8", "nvfp4-kv", "FP8 → NVFP4")):
        built.clear()
        result = CliRunner().invoke(app, ["diff", str(data / a), str(data / b), "--no-progress", "--json"])
        assert result.exit_code == 1, result.output[-2000:]
        assert json.loads(result.stdout)["same_model"].endswith(line)
        assert sorted(built.values()) == [1, 1], built
