"""No false PASS, no traceback, round three (issue 41): each class of attack fixed at its root, each with a test that
failed before the fix."""

from __future__ import annotations

import contextlib
import json
from importlib import resources
from pathlib import Path

import pytest

from kimi_audit.checks.gates import parse_count
from kimi_audit.errors import KimiAuditError
from kimi_audit.model.config import model_config_from_dict
from kimi_audit.model.mtp_stages import stored_stages


def v4_flash() -> dict:
    return json.loads(resources.files("kimi_audit").joinpath("data/deepseek-v4-flash.config.json").read_text())


def test_a_stage_number_that_is_a_digit_to_isdigit_but_not_to_int() -> None:
    """`mtp.².x`: '²'.isdigit() is True, int('²') a ValueError; it is no stage number, the name stays unexpected."""
    cfg = model_config_from_dict(v4_flash())
    at = cfg.prefix + cfg.mtp_at
    assert stored_stages(cfg, [[f"{at}².x", f"{at}0.x"]]) == 1
    try:
        parse_count("\uff11\uff12")  # fullwidth digits: isdigit, but no count a gate takes
    except KimiAuditError:
        pass
    else:
        raise AssertionError("a fullwidth count passed")


def test_every_shipped_configs_values_of_the_wrong_json_type_are_one_line() -> None:
    """Each key of every shipped config (and its text_config and quantization_config) set to JSON of another
    type: read, or refused with a KimiAuditError (one line, exit 2), never a TypeError."""
    wrong = ([["x"]], {"a": 1}, True)
    shipped = [p for p in resources.files("kimi_audit").joinpath("data").iterdir() if p.name.endswith(".config.json")]
    writers = sorted((Path(__file__).parent / "data").glob("*/*/config.json"))  # the writers' own configs
    for path in sorted(shipped, key=lambda p: p.name) + writers:
        base = json.loads(path.read_text())
        keys = [(k,) for k in base] + [("text_config", k) for k in base.get("text_config", {})]
        quant = base.get("quantization_config") or {}
        keys += [("quantization_config", k) for k in quant]
        keys += [("quantization_config", k, kk) for k in quant if isinstance(quant[k], dict) for kk in quant[k]]
        for key in keys:
            for value in wrong:
                cfg = json.loads(json.dumps(base))
                where = cfg
                for part in key[:-1]:
                    where = where[part]
                where[key[-1]] = value
                with contextlib.suppress(KimiAuditError):
                    model_config_from_dict(cfg)


def test_layer_counts_are_bounded_before_any_schedule_is_built() -> None:
    """A billion layers is refused by the field reader, naming the count (it used to build the schedule first: 36 s
    for DeepSeek-V4's MTP stages; pytest's timeout stands guard)."""
    for name, key in (("deepseek-v4-flash.config.json", ("num_hidden_layers",)),
                      ("deepseek-v4-flash.config.json", ("num_nextn_predict_layers",)),
                      ("kimi-k3.config.json", ("text_config", "num_hidden_layers")),
                      ("kimi-k2.6.config.json", ("vision_config", "num_hidden_layers"))):
        cfg = json.loads(resources.files("kimi_audit").joinpath(f"data/{name}").read_text())
        where = cfg
        for part in key[:-1]:
            where = where[part]
        where[key[-1]] = 10**9
        try:
            model_config_from_dict(cfg)
        except KimiAuditError as e:
            assert "layers" in str(e), (name, key, str(e))
        else:
            raise AssertionError(f"{name} {key}: a billion layers accepted")


def test_an_endpoints_password_never_reaches_a_message(hub, tiny_dir, monkeypatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """HF_ENDPOINT with user info, a server that answers 500: the message, on stderr and in the -o report, names the
    host, never the password."""
    from typer.testing import CliRunner

    from hub_repos import TINY_REPO
    from kimi_audit.cli import app

    monkeypatch.setenv("HF_ENDPOINT", hub.endpoint.replace("//", "//user:s3cretPW@", 1))
    hub.add_fault("500", times=50)
    out = tmp_path / "r.json"
    result = CliRunner().invoke(app, ["audit", TINY_REPO, "--no-progress", "-o", str(out)])
    assert result.exit_code == 2, result.output
    assert "s3cretPW" not in result.output and "s3cretPW" not in out.read_text()
    assert "127.0.0.1" in result.output


@pytest.mark.parametrize(("name", "value", "says"), [
    ("HF_HUB_DOWNLOAD_TIMEOUT", "abc", "whole number"), ("HF_HOME", "/etc/passwd/x", "is a file"),
    ("HF_ENDPOINT", "http://127.0.0.1:99999", "Port out of range"), ("HF_ENDPOINT", "http://[::1", "IPv6"),
])
def test_a_bad_hub_variable_is_one_line_naming_it(monkeypatch, name: str, value: str, says: str) -> None:  # type: ignore[no-untyped-def]
    from typer.testing import CliRunner

    from kimi_audit.cli import app

    monkeypatch.setenv(name, value)
    result = CliRunner().invoke(app, ["audit", "test-org/none", "--no-progress"])
    assert result.exit_code == 2 and name in result.output and says in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize("fmt", ["sarif", "junit"])
def test_control_characters_in_names_never_reach_sarif_or_junit_raw(tiny_copy, fmt: str) -> None:  # type: ignore[no-untyped-def]
    """A tensor named with an OSC-8 escape and U+202E: SARIF's and JUnit's text holds them escaped, as the
    terminal, markdown and HTML renderers write them."""
    import numpy as np
    from safetensors.numpy import save_file
    from typer.testing import CliRunner

    from kimi_audit.cli import app

    name = "model.\x1b]8;;http://x\x07evil\x1b]8;;\x07.\u202eweight"
    save_file({name: np.zeros(2, np.float32)}, str(tiny_copy / "model-9-of-9.safetensors"))
    result = CliRunner().invoke(app, ["audit", str(tiny_copy), "--no-progress", "--format", fmt])
    assert result.exit_code == 1
    assert "\x1b" not in result.stdout and "\u202e" not in result.stdout and "\x07" not in result.stdout
    assert "\\u202e" in result.stdout or "u202e" in result.stdout


def test_v41_layer_id_lists_are_bounded_and_read_once() -> None:
    """DeepSeek-V4.1's kv/index source and Engram layer lists: at most one id per layer, distinct, read as sets (a
    0.9 MB list was scanned once per layer: past 30 s)."""
    import copy

    from test_deepseek_v41 import CONFIG

    cfg = copy.deepcopy(CONFIG)
    cfg["text_config"]["kv_source_layer_ids"] = [1] * 300_000
    with pytest.raises(KimiAuditError, match="300,000 ids"):
        model_config_from_dict(cfg)
    cfg = copy.deepcopy(CONFIG)
    n = 5_000
    cfg["text_config"].update(num_hidden_layers=n, compress_ratios=[0] + [1] * (n - 1),
                              kv_source_layer_ids=list(range(n)), index_source_layer_ids=list(range(n)))
    assert model_config_from_dict(cfg).num_hidden_layers == n


def test_verify_names_an_all_nan_c64_tensor(tiny_copy) -> None:  # type: ignore[no-untyped-def]
    """C64 is scanned as its F32 parts: an all-NaN complex tensor is a VALUE_NAN, as every other float type's."""
    import numpy as np
    from safetensors.numpy import save_file
    from typer.testing import CliRunner

    from kimi_audit.cli import app

    save_file({"x.c": np.full(4, np.nan + 1j * np.nan, dtype=np.complex64)},
              str(tiny_copy / "model-9-of-9.safetensors"))
    result = CliRunner().invoke(app, ["verify", str(tiny_copy), "--json", "--no-progress"])
    found = [f["code"] for f in json.loads(result.stdout)["findings"] if f.get("tensor") == "x.c"]
    assert "VALUE_NAN" in found
