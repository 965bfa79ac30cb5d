"""The shared checker machinery: not attempted, passed, and wrong answers with diagnoses."""

from __future__ import annotations

import pytest
import torch

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


def test_not_attempted_returns_false(capsys):
    def stub(x):
        raise NotImplementedError

    assert check_double(stub) is False
    assert "not attempted" in capsys.readouterr().out


def test_right_answer_returns_true(capsys):
    assert check_double(lambda x: x + x) is True
    assert "all checks passed" in capsys.readouterr().out


def test_wrong_values_are_explained():
    with pytest.raises(ExerciseError, match=r"Exercise 0: double: double\(x\) differs .* at index"):
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
            torch.tensor([float("nan"), 1.0]), torch.tensor([0.0, 1.0]), hint="a masked row?"
        )


def test_non_tensor_and_non_callable():
    with pytest.raises(ExerciseError, match="should be a torch.Tensor, got list"):
        expect_tensor([1, 2], (2,))
    with pytest.raises(TypeError, match="pass your function itself"):
        check_double(42)
