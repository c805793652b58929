"""The one checks module: every check's message reads ``NAME=VALUE: expected WHAT IS ALLOWED``."""

import math

import pytest

from lantern import checks
from lantern.errors import ConfigError


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: checks.integer("num_images", 0, 1), "num_images=0: expected an integer >= 1"),
        (lambda: checks.integer("k", 2.5, 1), "k=2.5: expected an integer >= 1"),
        (lambda: checks.integer("k", True, 1), "k=true: expected an integer >= 1"),
        (lambda: checks.integer("depth", 40, 1, 32), "depth=40: expected an integer in [1, 32]"),
        (
            lambda: checks.real("temperature", -1, 0, note="0 = greedy"),
            "temperature=-1: expected a finite number >= 0 (0 = greedy)",
        ),
        (lambda: checks.real("lr", math.nan, 0, low_open=True), "lr=nan: expected a finite number > 0"),
        (lambda: checks.probability("top_p", 0, zero=False), "top_p=0: expected a number in (0, 1]"),
        (lambda: checks.probability("delta", "x"), "delta='x': expected a number in [0, 1]"),
        (lambda: checks.choice("init", "diag", ("random", "horizon")), "init='diag': expected one of random, horizon"),
        (lambda: checks.choice("mode", 1, ("a",)), "mode=1: expected one of a"),
        (lambda: checks.flag("l2_norm", "yes"), "l2_norm='yes': expected true or false"),
        (lambda: checks.optional(checks.integer, "scan", 0, 1), "scan=0: expected an integer >= 1 or null"),
        (
            lambda: checks.optional(checks.probability, "reuse", 2, zero=False, note="off: null"),
            "reuse=2: expected a number in (0, 1] or null (off: null)",
        ),
    ],
)
def test_each_check_names_the_value_and_what_is_allowed(call, message):
    with pytest.raises(ConfigError) as caught:
        call()
    assert str(caught.value) == message


def test_checks_return_the_value_in_the_type_callers_use(tmp_path):
    assert checks.integer("top_k", 5.0, 0) == 5 and isinstance(checks.integer("top_k", 5.0, 0), int)
    assert checks.real("cfg", 3, 0) == 3.0 and isinstance(checks.real("cfg", 3, 0), float)
    assert checks.optional(checks.integer, "scan", None, 1) is None
    assert checks.choice("dtype", "bfloat16", {"float32": 1, "bfloat16": 2}) == "bfloat16"
    (tmp_path / "f").write_text("x")
    assert checks.path("prompts.path", str(tmp_path / "f")) == tmp_path / "f"
    with pytest.raises(ConfigError, match=r"prompts.path='.*nope': expected an existing file \(it does not exist\)"):
        checks.path("prompts.path", str(tmp_path / "nope"))
    with pytest.raises(ConfigError, match=r"expected an existing file \(it is a folder\)"):
        checks.path("prompts.path", tmp_path)
