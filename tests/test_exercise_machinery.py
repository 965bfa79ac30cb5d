"""The shared checker machinery: not attempted, passed, and wrong answers with diagnoses."""

from __future__ import annotations

import pytest
import torch
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output

from lib.exercises._common import (
    ExerciseError,
    call_without_mutation,
    checker,
    expect_close,
    expect_tensor,
)


@checker("Exercise 0: double")
def check_double(candidate):
    x = torch.randn(3, 4)
    expect_close(call_without_mutation(candidate, x), 2 * x, "double(x)")


def test_not_attempted_says_what_to_do_and_returns_none(capsys):
    def stub(x):
        raise NotImplementedError

    # None: a notebook cell ending in the call shows the printed line and no "False" under it
    assert check_double(stub) is None
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        "Exercise 0 not attempted yet: replace the `raise` with your code."
    ]
    assert len(lines[0]) <= 72  # one line that fits the book's column at 1280 px


def test_a_stub_fails_the_solution_assert():
    def stub(x):
        raise NotImplementedError

    with pytest.raises(AssertionError):
        assert check_double(stub)


def test_the_not_attempted_result_displays_nothing_in_ipython():
    """What the book shows under a stub cell: the printed line, no result."""
    shell = InteractiveShell.instance()
    shell.user_ns["check_double"] = check_double
    with capture_output() as captured:
        shell.run_cell(
            "def stub(x):\n    raise NotImplementedError\n\ncheck_double(stub)"
        )
    assert captured.stdout.splitlines() == [
        "Exercise 0 not attempted yet: replace the `raise` with your code."
    ]


def test_right_answer_returns_true(capsys):
    assert check_double(lambda x: x + x) is True
    assert "all checks passed" in capsys.readouterr().out


def test_wrong_values_are_explained():
    with pytest.raises(
        ExerciseError, match=r"Exercise 0: double: double\(x\) differs .* at index"
    ):
        check_double(lambda x: 3 * x)


def test_wrong_shape_is_explained():
    with pytest.raises(ExerciseError, match=r"has shape \(4, 3\), expected \(3, 4\)"):
        check_double(lambda x: (2 * x).T)


def test_in_place_modification_is_caught():
    def in_place(x):
        x.mul_(2)
        return x

    with pytest.raises(ExerciseError, match="modified its input"):
        check_double(in_place)


def test_nan_is_explained_with_the_hint():
    with pytest.raises(ExerciseError, match="contains NaN.*masked"):
        expect_close(
            torch.tensor([float("nan"), 1.0]),
            torch.tensor([0.0, 1.0]),
            hint="a masked row?",
        )


def test_non_tensor_and_non_callable():
    with pytest.raises(ExerciseError, match="should be a torch.Tensor, got list"):
        expect_tensor([1, 2], (2,))
    with pytest.raises(TypeError, match="pass your function itself"):
        check_double(42)
