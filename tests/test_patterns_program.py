"""model.patterns asks RE2's compiled program itself (google-re2's `_regexp.Match`) whether a module name matches,
not its `match` wrapper (a generator and a Match object per name): the answers must be the wrapper's, name for
name, and where google-re2 exposes no program the wrapper answers."""

from __future__ import annotations

import pytest

import kimi_audit.model.patterns as patterns

PATTERNS = [r".*mlp\.(gate|up)_proj.*", r"lm_head", r".*\.experts\.\d+\.down_proj$", "é.*", r"re:model\..*"]
NAMES = ["model.layers.1.mlp.gate_proj", "lm_head", "lm_headx", "x.lm_head", "model.layers.3.mlp.experts.17.down_proj",
         "model.layers.3.mlp.experts.17.down_proj.weight", "éa", "aé", "", "model.layers.0.self_attn.q_proj",
         "modèle.layers.1.mlp.up_proj", "model.layers.1.mlp.up_proj\n", "\x00lm_head"]


def _wrapper(p: patterns.NamePatterns) -> list[bool]:
    return [p.regex.match(n) is not None for n in NAMES]


@pytest.mark.parametrize("k", range(len(PATTERNS)))
def test_the_program_answers_as_the_wrapper(k: int) -> None:
    p = patterns.compile_patterns(PATTERNS[k:k + 1] + PATTERNS[:k], "test")
    assert p is not None and patterns._program(p.encoded) is not None  # the fast path is the one tested
    assert p.match_many(NAMES) == [p.match(n) for n in NAMES] == _wrapper(p)
    assert any(_wrapper(p)) and not all(_wrapper(p))


def test_without_the_program_the_wrapper_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    p = patterns.compile_patterns(PATTERNS, "test")
    assert p is not None
    expected = _wrapper(p)
    monkeypatch.setattr(patterns, "_NO_MATCH", None)
    assert patterns._program(p.encoded) is None
    assert p.match_many(NAMES) == [p.match(n) for n in NAMES] == expected
