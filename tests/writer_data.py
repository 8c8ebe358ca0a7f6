"""What tests/data/gptq and tests/data/awq (written by their writers in their own venvs, tests/writers/) are
compared with: the unquantized model their PROVENANCE.json's config describes, built by transformers here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import kimi_audit


def unquantized_parameters(provenance: Path, out: Path) -> int:
    """The parameters of the generator's config, as transformers builds and saves the model unquantized."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cfg = json.loads(provenance.read_text())["config"]
    model = transformers.DeepseekV3ForCausalLM(transformers.DeepseekV3Config(**cfg)).to(torch.bfloat16)
    model.save_pretrained(out)
    return kimi_audit.audit(out).stats.parameters
