"""Checkers for the exercises of chapter 5 (the feed-forward network).

Each checker compares the reader's answer with a reference written here and, when they
differ, tries the usual wrong answers first (GELU's derivative without its second term, a
transposed Jacobian, the squared error minimised instead of the largest, a hidden size
rounded up past the budget or biases forgotten) so that the message says what went wrong.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F

from lib.exercises._common import (
    ExerciseError,
    call_without_mutation,
    checker,
    expect_close,
    expect_number,
    expect_tensor,
)

__all__ = [
    "check_ffn_jacobian",
    "check_sigmoid_gelu_beta",
    "check_matched_gated_d_ff",
]


def _matches(got: torch.Tensor, want: torch.Tensor, atol: float = 1e-8) -> bool:
    return got.shape == want.shape and torch.allclose(
        got.double(), want.double(), atol=atol
    )


# -- Exercise 1 -------------------------------------------------------------------------------
def _jacobian_with(
    derivative: Callable[[torch.Tensor], torch.Tensor], x, w_in, b_in, w_out
):
    """``w_out @ diag(derivative(w_in x + b_in)) @ w_in``: ``(d_model d_model)``."""
    pre = w_in @ x + b_in  # (d_ff)
    return w_out @ (derivative(pre)[:, None] * w_in)


def _gelu_derivative(h: torch.Tensor) -> torch.Tensor:
    return torch.special.ndtr(h) + h * torch.exp(-0.5 * h**2) / math.sqrt(2 * math.pi)


def _tanh_gelu_derivative(h: torch.Tensor) -> torch.Tensor:
    h = h.detach().requires_grad_(True)
    (grad,) = torch.autograd.grad(F.gelu(h, approximate="tanh").sum(), h)
    return grad


def _randn(generator: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=generator, dtype=torch.float64)


@checker("Exercise 1: the Jacobian of a GELU FFN")
def check_ffn_jacobian(jacobian: Callable[..., torch.Tensor]) -> None:
    """``jacobian(x, w_in, b_in, w_out) -> (d_model d_model)``, ``J[o, i] = dy_o / dx_i``."""
    generator = torch.Generator().manual_seed(5)
    for d_model, d_ff in ((4, 16), (6, 10), (8, 32)):
        x, b_in = 1.5 * _randn(generator, d_model), _randn(generator, d_ff)
        w_in = _randn(generator, d_ff, d_model)
        w_out = _randn(generator, d_model, d_ff) / math.sqrt(d_ff)
        call = f"jacobian(x, w_in, b_in, w_out) with d_model={d_model}, d_ff={d_ff}"
        got = call_without_mutation(jacobian, x, w_in, b_in, w_out)
        expect_tensor(got, (d_model, d_model), call)
        if got.requires_grad:
            got = got.detach()

        want = torch.autograd.functional.jacobian(
            lambda v, w_in=w_in, b_in=b_in, w_out=w_out: (
                w_out @ F.gelu(w_in @ v + b_in)
            ),
            x,
        )
        if _matches(got, want):
            continue
        args = (x, w_in, b_in, w_out)
        wrong = {
            "transposed": (
                want.T,
                "your matrix is transposed: row o holds the derivatives of output o, "
                "J[o, i] = dy_o / dx_i, which is w_out @ diag(gelu'(h)) @ w_in",
            ),
            "cdf_only": (
                _jacobian_with(torch.special.ndtr, *args),
                "GELU(h) = h Phi(h), so by the product rule its derivative is "
                "Phi(h) + h phi(h), with phi the standard normal density; you kept Phi(h)",
            ),
            "tanh": (
                _jacobian_with(_tanh_gelu_derivative, *args),
                "that is the derivative of the tanh approximation; this FFN uses the "
                "exact GELU (F.gelu's default)",
            ),
            "relu": (
                _jacobian_with(lambda h: (h > 0).double(), *args),
                "that is ReLU's derivative (a step); GELU's is Phi(h) + h phi(h)",
            ),
            "activation_not_derivative": (
                _jacobian_with(F.gelu, *args),
                "the middle factor is GELU'(h), the derivative, not GELU(h) itself",
            ),
        }
        for wrong_matrix, hint in wrong.values():
            if _matches(got, wrong_matrix):
                raise ExerciseError(f"{call}: {hint}")
        expect_close(got, want, call, atol=1e-8)


# -- Exercise 2 -------------------------------------------------------------------------------
def _gelu_gap(x: torch.Tensor, beta: float) -> float:
    """The largest ``|GELU(x) - x sigmoid(beta x)|`` over the points ``x``."""
    exact = 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))
    return (exact - x * torch.sigmoid(beta * x)).abs().max().item()


def _best_beta(x: torch.Tensor, loss: Callable[[torch.Tensor, float], float]) -> float:
    """Minimise a quasi-convex ``loss(x, beta)`` over beta in [0.5, 4] by ternary search."""
    low, high = 0.5, 4.0
    for _ in range(120):
        third = (high - low) / 3
        if loss(x, low + third) < loss(x, high - third):
            high -= third
        else:
            low += third
    return (low + high) / 2


def _squared_gap(x: torch.Tensor, beta: float) -> float:
    exact = 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))
    return ((exact - x * torch.sigmoid(beta * x)) ** 2).sum().item()


@contextlib.contextmanager
def _one_thread() -> Iterator[None]:
    """Run small elementwise work on one thread: a thread pool costs more than it saves
    here, and far more on a busy machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@checker("Exercise 2: the best sigmoid approximation of GELU")
def check_sigmoid_gelu_beta(best_beta: Callable[[torch.Tensor], float]) -> None:
    """``best_beta(x) -> beta`` minimising the largest gap ``|GELU - x sigmoid(beta x)|``."""
    with _one_thread():
        _check_sigmoid_gelu_beta(best_beta)


def _check_sigmoid_gelu_beta(best_beta: Callable[[torch.Tensor], float]) -> None:
    grids = [
        torch.linspace(-6, 6, 12_001, dtype=torch.float64),
        torch.linspace(-1, 1, 4_001, dtype=torch.float64),
        torch.linspace(-2, 5, 7_001, dtype=torch.float64),
    ]
    answers = []
    for x in grids:
        call = f"best_beta(x) on {len(x):,} points in [{x[0]:g}, {x[-1]:g}]"
        got = expect_number(call_without_mutation(best_beta, x), call)
        answers.append(got)
        want = _best_beta(x, _gelu_gap)
        best_gap = _gelu_gap(x, want)
        if got > 0 and _gelu_gap(x, got) <= 1.005 * best_gap:
            continue
        where = (
            f"{call} returned {got:.4f}, whose largest gap is {_gelu_gap(x, got):.5f}; "
            f"beta = {want:.4f} reaches {best_gap:.5f}"
        )
        if math.isclose(got, best_gap, rel_tol=1e-3):
            raise ExerciseError(f"{where}: return beta itself, not the gap it reaches")
        if abs(got - _best_beta(x, _squared_gap)) < 2e-3:
            raise ExerciseError(
                f"{where}: you minimised the squared (or mean) error; the task is the "
                "largest error over the points, max |GELU(x) - x sigmoid(beta x)|"
            )
        if abs(got - 1.702) < 1e-3:
            raise ExerciseError(
                f"{where}: 1.702 is the usual constant, not the best one for these points; "
                "search over beta (the largest gap has a single minimum in beta)"
            )
        raise ExerciseError(where)
    if len(set(answers)) == 1:
        raise ExerciseError(
            f"you returned {answers[0]} for every grid; the best beta depends on the points"
        )


# -- Exercise 3 -------------------------------------------------------------------------------
def _ffn_params(d_model: int, d_ff: int, gated: bool, bias: bool) -> int:
    n_in = 2 * d_ff if gated else d_ff
    return d_model * n_in + d_ff * d_model + ((n_in + d_model) if bias else 0)


def _matched(d_model: int, d_ff: int, bias: bool, multiple_of: int) -> int:
    budget = _ffn_params(d_model, d_ff, gated=False, bias=bias)
    per_unit = 3 * d_model + (2 if bias else 0)  # one hidden unit of a gated FFN
    largest = (budget - (d_model if bias else 0)) // per_unit
    return largest // multiple_of * multiple_of


_MATCHED_CASES = (
    (4096, 16384, False, 256),  # LLaMA-7B's shape
    (48, 192, True, 1),  # the biases decide: 127, not 128
    (768, 3072, True, 64),
    (512, 2048, False, 1),  # T5-like, d_ff = 4 d_model
    (1024, 2816, False, 128),  # a d_ff that is not 4 d_model
    (64, 256, True, 64),
)


@checker("Exercise 3: a gated FFN within a plain one's budget")
def check_matched_gated_d_ff(matched: Callable[[int, int, bool, int], int]) -> None:
    """``matched(d_model, d_ff, bias, multiple_of) -> int``: the largest d_ff that fits."""
    for d_model, d_ff, bias, multiple_of in _MATCHED_CASES:
        call = f"matched_gated_d_ff({d_model}, {d_ff}, bias={bias}, multiple_of={multiple_of})"
        got = matched(d_model, d_ff, bias, multiple_of)
        if isinstance(got, bool) or not isinstance(got, int):
            raise ExerciseError(
                f"{call} should return an int, got {type(got).__name__} {got!r}"
            )
        want = _matched(d_model, d_ff, bias, multiple_of)
        if got == want:
            continue
        budget = _ffn_params(d_model, d_ff, gated=False, bias=bias)
        where = f"{call} returned {got:,}, expected {want:,}"
        if got % multiple_of:
            raise ExerciseError(
                f"{where}: the hidden size must be a multiple of {multiple_of}"
            )
        cost = _ffn_params(d_model, got, gated=True, bias=bias)
        fits = f"{cost:,} parameters against the plain FFN's {budget:,}"
        if d_ff != 4 * d_model and got == _matched(
            d_model, 4 * d_model, bias, multiple_of
        ):
            raise ExerciseError(
                f"{where} ({fits}): 8/3 d_model holds only when the plain FFN has "
                f"d_ff = 4 d_model; here d_ff = {d_ff}, so match 2 d_model d_ff"
            )
        if cost > budget and bias and got == 2 * d_ff // 3 // multiple_of * multiple_of:
            raise ExerciseError(
                f"{where} ({fits}): 2/3 of d_ff balances the weights only; a gated FFN "
                "also has 2 d_ff + d_model biases against the plain one's d_ff + d_model"
            )
        if cost > budget and got == multiple_of * -(-(8 * d_model // 3) // multiple_of):
            raise ExerciseError(
                f"{where} ({fits}): LLaMA's rule rounds 8/3 d_model up, which can go over "
                "the budget; round down"
            )
        if cost > budget:
            raise ExerciseError(f"{where}: {fits}, over the budget")
        raise ExerciseError(
            f"{where}: {got:,} fits ({fits}), but {want:,} fits too; take the largest "
            "multiple that fits"
        )
