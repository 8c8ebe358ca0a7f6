"""No false PASS, no traceback, round three (issue 41): each class of attack fixed at its root, each with a test that
failed before the fix."""

from __future__ import annotations

import json
from importlib import resources

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
        parse_count("１２")  # fullwidth digits: isdigit, but no count a gate takes
    except KimiAuditError:
        pass
    else:
        raise AssertionError("a fullwidth count passed")
