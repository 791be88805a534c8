"""Strictness: per-mode defaults, explicit arguments over variables, clear errors for bad values."""

from __future__ import annotations

import pytest

from terminus_env.config import ConfigError
from terminus_env.protocol import Strictness


def test_training_is_strict_and_evaluation_lenient_by_default():
    assert Strictness.from_env("train", environ={}) == Strictness(strict_format=True, strict_truncation=True)
    assert Strictness.from_env(environ={}) == Strictness(strict_format=True, strict_truncation=True)
    assert Strictness.from_env("eval", environ={}) == Strictness(strict_format=False, strict_truncation=False)


def test_each_mode_reads_its_own_variables():
    environ = {"SWE_STRICT_FORMAT": "0", "SWE_STRICT_TRUNCATION": "false", "SWE_EVAL_STRICT_FORMAT": "1"}
    assert Strictness.from_env("train", environ=environ) == Strictness(False, False)
    assert Strictness.from_env("eval", environ=environ) == Strictness(True, False)
    assert Strictness.from_env("eval", environ={"SWE_EVAL_STRICT_TRUNCATION": "TRUE"}) == Strictness(False, True)


def test_explicit_arguments_win_over_variables():
    environ = {"SWE_STRICT_FORMAT": "0", "SWE_STRICT_TRUNCATION": "0"}
    assert Strictness.from_env("train", strict_format=True, environ=environ) == Strictness(True, False)
    assert Strictness.from_env("eval", strict_truncation=True, environ={}) == Strictness(False, True)
    # an explicit value means the (bad) variable is never consulted
    assert (
        Strictness.from_env("train", strict_format=False, environ={"SWE_STRICT_FORMAT": "maybe"}).strict_format is False
    )


@pytest.mark.parametrize(
    ("mode", "variable"),
    [
        ("train", "SWE_STRICT_FORMAT"),
        ("train", "SWE_STRICT_TRUNCATION"),
        ("eval", "SWE_EVAL_STRICT_FORMAT"),
        ("eval", "SWE_EVAL_STRICT_TRUNCATION"),
    ],
)
def test_bad_value_names_the_variable(mode, variable):
    with pytest.raises(ConfigError, match=variable) as caught:
        Strictness.from_env(mode, environ={variable: "strict"})
    assert "0, 1, true or false" in str(caught.value)


def test_unknown_mode_is_a_clear_error():
    with pytest.raises(ValueError, match="'train' or 'eval'"):
        Strictness.from_env("training", environ={})


def test_reads_os_environ_when_no_mapping_is_given(monkeypatch):
    monkeypatch.setenv("SWE_EVAL_STRICT_FORMAT", "1")
    monkeypatch.delenv("SWE_EVAL_STRICT_TRUNCATION", raising=False)
    assert Strictness.from_env("eval") == Strictness(True, False)
