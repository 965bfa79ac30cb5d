"""The chapter 5 checkers accept the reference answers and diagnose the usual mistakes."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from einops import einsum

from lib.exercises._common import ExerciseError
from lib.exercises.ffn import (
    check_ffn_param_count,
    check_gated_hidden_size,
    check_gelu_tanh_approx,
    check_swiglu_forward,
)

# --- Exercise 1: GELU, tanh form ---------------------------------------------------------


SQRT_2_OVER_PI = math.sqrt(2 / math.pi)


def _gelu_tanh(x, scale=SQRT_2_OVER_PI, cubic=0.044715):
    return 0.5 * x * (1 + torch.tanh(scale * (x + cubic * x**3)))


def test_gelu_checker_accepts_the_formula_and_torch():
    assert check_gelu_tanh_approx(_gelu_tanh)
    assert check_gelu_tanh_approx(lambda x: F.gelu(x, approximate="tanh"))


@pytest.mark.parametrize(
    ("wrong", "message"),
    [
        (lambda x: _gelu_tanh(x, cubic=0.0), "0.044715·x³ term"),
        (lambda x: _gelu_tanh(x, scale=2 / math.pi), "square root is missing"),
        (lambda x: _gelu_tanh(x, scale=math.sqrt(math.pi / 2)), "upside down"),
        (lambda x: 2 * _gelu_tanh(x), "factor 1/2"),
        (F.gelu, "exact \\(erf\\) GELU"),
        (lambda x: _gelu_tanh(x, cubic=0.05), "differs from the reference"),
        (lambda x: _gelu_tanh(x)[..., :-1], "shape"),
    ],
)
def test_gelu_checker_diagnoses(wrong, message):
    with pytest.raises(ExerciseError, match=message):
        check_gelu_tanh_approx(wrong)


def test_gelu_checker_catches_in_place_edits():
    def in_place(x):
        x.add_(1.0)  # right values, but the caller's tensor is changed
        return _gelu_tanh(x - 1.0)

    with pytest.raises(ExerciseError, match="in place"):
        check_gelu_tanh_approx(in_place)


def test_gelu_checker_reports_not_attempted():
    def stub(x):
        raise NotImplementedError

    assert check_gelu_tanh_approx(stub) is False


# --- Exercise 2: SwiGLU ------------------------------------------------------------------


def _swiglu(x, w_gate, w_value, w_out, gate_fn=F.silu, swap=False, value_fn=lambda t: t):
    if swap:
        w_gate, w_value = w_value, w_gate
    gate = einsum(x, w_gate, "b s d, d f -> b s f")
    value = einsum(x, w_value, "b s d, d f -> b s f")
    return einsum(gate_fn(gate) * value_fn(value), w_out, "b s f, f d -> b s d")


def test_swiglu_checker_accepts_the_reference():
    assert check_swiglu_forward(_swiglu)
    assert check_swiglu_forward(lambda x, g, v, o: (F.silu(x @ g) * (x @ v)) @ o)


@pytest.mark.parametrize(
    ("wrong", "message"),
    [
        (lambda *a: _swiglu(*a, swap=True), "value branch"),
        (lambda x, g, v, o: F.silu((x @ g) * (x @ v)) @ o, "after the product"),
        (lambda *a: _swiglu(*a, value_fn=F.silu), "both branches"),
        (lambda *a: _swiglu(*a, gate_fn=lambda t: t), "SiLU is missing"),
        (lambda *a: _swiglu(*a, gate_fn=torch.sigmoid), "GLU"),
        (lambda *a: _swiglu(*a, gate_fn=F.relu), "ReGLU"),
        (lambda *a: _swiglu(*a, gate_fn=F.gelu), "GEGLU"),
        (lambda x, g, v, o: F.silu(x @ g) * (x @ v), "output projection w_out"),
        (lambda *a: 1.01 * _swiglu(*a), "differs from the reference"),
    ],
)
def test_swiglu_checker_diagnoses(wrong, message):
    with pytest.raises(ExerciseError, match=message):
        check_swiglu_forward(wrong)


# --- Exercise 3: the 8/3 rule ------------------------------------------------------------


def _hidden(d_model, multiple_of):
    return -(-(8 * d_model // 3) // multiple_of) * multiple_of


def test_hidden_size_checker_accepts_the_reference():
    assert check_gated_hidden_size(_hidden)
    assert check_gated_hidden_size(lambda d, m: m * math.ceil((8 * d // 3) / m))


@pytest.mark.parametrize(
    ("wrong", "message"),
    [
        (lambda d, m: (8 * d // 3) // m * m, "rounds down"),
        (lambda d, m: (8 * d // 3 // m + 1) * m, "one multiple too many"),
        (lambda d, m: 8 * d // 3, "before rounding"),
        (lambda d, m: m * math.ceil(4 * d / m), "4 · d_model"),
        (lambda d, m: float(_hidden(d, m)), "return an int"),
        (lambda d, m: m * round((8 * d // 3) / m), "rounds down"),  # nearest rounds 7B down
        (lambda d, m: _hidden(d, m) + 1, "not a multiple"),
    ],
)
def test_hidden_size_checker_diagnoses(wrong, message):
    with pytest.raises(ExerciseError, match=message):
        check_gated_hidden_size(wrong)


def test_hidden_size_checker_wants_the_integer_part_first():
    # ceil(8/3·d / m)·m differs from the rule only when floor(8/3·d) is a multiple of m.
    with pytest.raises(ExerciseError, match="integer part of 8/3"):
        check_gated_hidden_size(lambda d, m: m * math.ceil(8 * d / 3 / m))


# --- Exercise 4: parameter count ---------------------------------------------------------


def _count(d_model, d_ff, gated, bias):
    n_in = 2 * d_ff if gated else d_ff
    return d_model * n_in + d_ff * d_model + ((n_in + d_model) if bias else 0)


def test_param_count_checker_accepts_the_reference():
    assert check_ffn_param_count(_count)


@pytest.mark.parametrize(
    ("wrong", "message"),
    [
        (lambda d, f, g, b: _count(d, f, g, b) - (d if b else 0), "output layer's bias"),
        (
            lambda d, f, g, b: _count(d, f, False, False) + (f + d if b else 0),
            "three weight matrices",
        ),
        (lambda d, f, g, b: _count(d, f, g, b) - (f if g and b else 0), "two input biases"),
        (lambda d, f, g, b: _count(d, f, g, True), "no biases to count"),
        (lambda d, f, g, b: float(_count(d, f, g, b)), "return an int"),
        (lambda d, f, g, b: _count(d, f, g, b) + 1, "count each matrix"),
    ],
)
def test_param_count_checker_diagnoses(wrong, message):
    with pytest.raises(ExerciseError, match=message):
        check_ffn_param_count(wrong)
