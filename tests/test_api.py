"""The Python API: kimi_audit.audit returns the report the CLI prints, exit codes included."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import kimi_audit
from kimi_audit.cli import app
from tiny_checkpoint import TINY_CONFIG, tiny_shards, write_tiny


def cli_json(*args: str) -> tuple[dict, int]:
    r = CliRunner().invoke(app, ["audit", *args, "--json", "--no-progress"])
    return json.loads(r.stdout), r.exit_code


def test_to_dict_is_the_json_output_and_exit_codes_agree(tmp_path: Path) -> None:
    path = write_tiny(tmp_path / "ckpt", tiny_shards(), dict(TINY_CONFIG, num_nextn_predict_layers=1))
    report = kimi_audit.audit(path)
    assert isinstance(report, kimi_audit.AuditReport)
    for fail_on in ("error", "warning"):
        doc, code = cli_json(str(path), "--fail-on", fail_on)
        assert report.to_dict(fail_on) == doc
        assert report.exit_code(fail_on=fail_on) == code == (fail_on == "warning")
    assert [f.code for f in report.findings] == ["MTP_ABSENT"]
    assert report.verdict() == "PASS" and report.verdict("warning") == "FAIL"


def test_the_report_reads_every_field_of_the_audits_own(tiny_dir: Path) -> None:
    """kimi_audit.AuditReport composes checks.audit.AuditReport: each of its fields reads through."""
    import dataclasses

    from kimi_audit.checks.audit import AuditReport

    report = kimi_audit.audit(tiny_dir)
    assert isinstance(report.audit, AuditReport)
    for field in dataclasses.fields(AuditReport):
        assert getattr(report, field.name) == getattr(report.audit, field.name), field.name
    assert (report.errors, report.warnings) == (report.audit.errors, report.audit.warnings)


def test_values_reads_the_small_tensors_as_audit_values_does(tiny_dir: Path) -> None:
    report = kimi_audit.audit(tiny_dir, values=True)
    doc, code = cli_json(str(tiny_dir), "--values")
    assert report.to_dict() == doc and code == 0
    assert report.values_checked and any(f.code == "VALUES_CHECKED" for f in report.findings)


def test_unusable_input_raises_with_a_stable_code(tmp_path: Path) -> None:
    with pytest.raises(kimi_audit.KimiAuditError) as e:
        kimi_audit.audit(tmp_path)
    assert e.value.code == "CONFIG_INVALID"


def test_progress_is_called_per_shard(tiny_dir: Path) -> None:
    seen: list[tuple[str, int, int]] = []
    kimi_audit.audit(str(tiny_dir), progress=lambda shard, done, total: seen.append((shard, done, total)))
    assert [(d, t) for _, d, t in seen] == [(1, 3), (2, 3), (3, 3)]


def test_the_library_leaves_the_collector_alone(tiny_dir: Path) -> None:
    """No hidden global state: inside the audit (where the progress callback runs) the host's collector
    is as the host set it, and it is so afterwards."""
    import gc

    before = (gc.isenabled(), gc.get_threshold(), gc.get_freeze_count())
    seen: list[tuple[bool, tuple[int, int, int], int]] = []
    kimi_audit.audit(tiny_dir, progress=lambda *_: seen.append(
        (gc.isenabled(), gc.get_threshold(), gc.get_freeze_count())))
    assert seen and set(seen) == {before}
    assert (gc.isenabled(), gc.get_threshold(), gc.get_freeze_count()) == before


def test_the_api_is_typed_and_lazy() -> None:
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", "import sys, kimi_audit; print('kimi_audit.checks' in sys.modules)"],
                         capture_output=True, text=True, check=True).stdout.strip()
    assert out == "False"  # `import kimi_audit` alone loads no stage
    with pytest.raises(AttributeError):
        kimi_audit.no_such_name  # noqa: B018
