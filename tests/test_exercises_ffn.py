"""The chapter 5 checkers accept the reference answers and diagnose the usual mistakes."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from lib.exercises._common import ExerciseError
from lib.exercises.ffn import (
    check_ffn_jacobian,
    check_matched_gated_d_ff,
    check_sigmoid_gelu_beta,
)
from lib.ffn import ffn_param_count, gated_ffn_hidden_size

# --- Exercise 1: the Jacobian of a GELU FFN -------------------------------------------------


def normal_pdf(h):
    return torch.exp(-0.5 * h**2) / math.sqrt(2 * math.pi)


def jacobian_with(derivative):
    def jacobian(x, w_in, b_in, w_out):
        h = w_in @ x + b_in
        return w_out @ torch.diag(derivative(h)) @ w_in

    return jacobian


jacobian_right = jacobian_with(lambda h: torch.special.ndtr(h) + h * normal_pdf(h))


def test_jacobian_accepts_the_reference(capsys):
    assert check_ffn_jacobian(jacobian_right) is True
    assert "all checks passed" in capsys.readouterr().out


def test_jacobian_accepts_autograd_too():
    def by_autograd(x, w_in, b_in, w_out):
        return torch.autograd.functional.jacobian(
            lambda v: w_out @ F.gelu(w_in @ v + b_in), x
        )

    assert check_ffn_jacobian(by_autograd) is True


def test_jacobian_reports_not_attempted(capsys):
    def stub(x, w_in, b_in, w_out):
        raise NotImplementedError

    assert check_ffn_jacobian(stub) is None
    assert "Exercise 1 not attempted yet" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("wrong", "match"),
    [
        (jacobian_with(torch.special.ndtr), r"Phi\(h\) \+ h phi\(h\)"),
        (
            lambda x, w_in, b_in, w_out: jacobian_right(x, w_in, b_in, w_out).T,
            "transposed",
        ),
        (jacobian_with(lambda h: (h > 0).double()), "ReLU's derivative"),
        (jacobian_with(F.gelu), "not GELU\\(h\\) itself"),
        (lambda x, w_in, b_in, w_out: w_out @ w_in, "differs from the reference"),
    ],
)
def test_jacobian_diagnoses_typical_mistakes(wrong, match):
    with pytest.raises(ExerciseError, match=match):
        check_ffn_jacobian(wrong)


# --- Exercise 2: the best sigmoid approximation of GELU -------------------------------------


def largest_gap(x, beta):
    return (F.gelu(x) - x * torch.sigmoid(beta * x)).abs().max().item()


def grid_search(loss, low=1.0, high=2.5):
    """A coarse grid, then a fine one around its best point (steps 1e-2, then 1e-4)."""
    coarse = min(torch.arange(low, high, 1e-2).tolist(), key=loss)
    return min(torch.arange(coarse - 1e-2, coarse + 1e-2, 1e-4).tolist(), key=loss)


def beta_by_grid_search(x):
    return grid_search(lambda beta: largest_gap(x, beta))


def beta_by_ternary_search(x):
    low, high = 1.0, 3.0
    for _ in range(60):
        third = (high - low) / 3
        if largest_gap(x, low + third) < largest_gap(x, high - third):
            high -= third
        else:
            low += third
    return (low + high) / 2


def beta_least_squares(x):
    return grid_search(
        lambda b: ((F.gelu(x) - x * torch.sigmoid(b * x)) ** 2).sum().item()
    )


def test_sigmoid_beta_accepts_a_ternary_search():
    assert check_sigmoid_gelu_beta(beta_by_ternary_search) is True


def test_sigmoid_beta_accepts_a_coarse_grid_search():
    assert check_sigmoid_gelu_beta(beta_by_grid_search) is True


@pytest.mark.parametrize(
    ("wrong", "match"),
    [
        (beta_least_squares, "squared"),
        (lambda x: 1.702, "usual constant"),
        (lambda x: largest_gap(x, beta_by_ternary_search(x)), "not the gap"),
        (lambda x: "1.77", "should be a number"),
    ],
)
def test_sigmoid_beta_diagnoses_typical_mistakes(wrong, match):
    with pytest.raises(ExerciseError, match=match):
        check_sigmoid_gelu_beta(wrong)


# --- Exercise 3: a gated FFN within a plain one's budget ------------------------------------


def matched_right(d_model, d_ff, bias, multiple_of):
    budget = ffn_param_count(d_model, d_ff, bias=bias)
    size = 0
    while ffn_param_count(d_model, size + multiple_of, gated=True, bias=bias) <= budget:
        size += multiple_of
    return size


def matched_llama_rule(d_model, d_ff, bias, multiple_of):
    return gated_ffn_hidden_size(d_model, multiple_of)


def matched_ignoring_biases(d_model, d_ff, bias, multiple_of):
    return 2 * d_ff // 3 // multiple_of * multiple_of


def matched_from_d_model(d_model, d_ff, bias, multiple_of):
    return matched_right(d_model, 4 * d_model, bias, multiple_of)


def test_matched_accepts_a_search_over_sizes():
    assert check_matched_gated_d_ff(matched_right) is True


@pytest.mark.parametrize(
    ("wrong", "match"),
    [
        (matched_llama_rule, "rounds 8/3 d_model up"),
        (matched_ignoring_biases, "balances the weights only"),
        (matched_from_d_model, "8/3 d_model holds only when"),
        (lambda d, f, bias, m: matched_right(d, f, bias, m) - m, "take the largest"),
        (
            lambda d, f, bias, m: float(matched_right(d, f, bias, m)),
            "should return an int",
        ),
    ],
)
def test_matched_diagnoses_typical_mistakes(wrong, match):
    with pytest.raises(ExerciseError, match=match):
        check_matched_gated_d_ff(wrong)


def test_checkers_reject_non_callables():
    with pytest.raises(TypeError, match="pass your function itself"):
        check_matched_gated_d_ff(11008)
