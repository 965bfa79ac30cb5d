"""The machinery every checker shares: the error type, the decorator, tensor comparisons."""

from __future__ import annotations

import functools
import math
import numbers
from collections.abc import Callable
from typing import Any

import torch

__all__ = [
    "NOT_ATTEMPTED",
    "ExerciseError",
    "checker",
    "call_without_mutation",
    "expect_tensor",
    "expect_close",
]


class ExerciseError(AssertionError):
    """The reader's answer is wrong; the message says how."""


#: What a checker prints, after "Exercise N", for a stub not yet filled in: one line that
#: fits the book's narrowest column (72 characters).
NOT_ATTEMPTED = "not attempted yet: replace the `raise` with your code."


def checker(title: str) -> Callable[[Callable[..., None]], Callable[..., bool | None]]:
    """Turn a function that raises :class:`ExerciseError` into a friendly checker.

    The wrapped checker prints a success line and returns ``True`` when every check passes,
    and re-raises every :class:`ExerciseError` with the exercise's title in front. When the
    answer still raises ``NotImplementedError`` (the stub as the chapter shows it), it prints
    one line that says what to do and returns ``None``: a notebook cell that ends in the
    checker call then shows that line and nothing else (Jupyter displays no ``None``), and
    the notebook runs on. ``assert check(solution)`` still fails for a stub, since ``None``
    is falsy.
    """

    def decorate(check: Callable[..., None]) -> Callable[..., bool | None]:
        @functools.wraps(check)
        def run(
            candidate: Callable[..., Any], *args: Any, **kwargs: Any
        ) -> bool | None:
            if not callable(candidate):
                raise TypeError(
                    f"{title}: pass your function itself (e.g. check(my_fn)), "
                    f"not {type(candidate).__name__}"
                )
            try:
                check(candidate, *args, **kwargs)
            except NotImplementedError:
                print(f"{title.split(':')[0]} {NOT_ATTEMPTED}")
                return None
            except ExerciseError as err:
                raise ExerciseError(f"{title}: {err}") from None
            print(f"{title}: all checks passed.")
            return True

        return run

    return decorate


def call_without_mutation(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call ``fn`` and fail if it changed any tensor argument in place."""
    before = [a.detach().clone() if isinstance(a, torch.Tensor) else None for a in args]
    result = fn(*args, **kwargs)
    for i, (arg, saved) in enumerate(zip(args, before)):
        if saved is not None and not torch.equal(arg.detach(), saved):
            raise ExerciseError(
                f"your function modified its input (argument {i}) in place; "
                "compute a new tensor instead (e.g. x = x + 1, not x += 1)"
            )
    return result


def expect_tensor(
    got: Any, shape: tuple[int, ...], what: str = "the result"
) -> torch.Tensor:
    """Fail unless ``got`` is a tensor of the given shape."""
    if not isinstance(got, torch.Tensor):
        raise ExerciseError(
            f"{what} should be a torch.Tensor, got {type(got).__name__}"
        )
    if tuple(got.shape) != tuple(shape):
        raise ExerciseError(
            f"{what} has shape {tuple(got.shape)}, expected {tuple(shape)}"
        )
    return got


def is_close(
    got: object,
    want: torch.Tensor | float,
    atol: float = 1e-5,
    *,
    rtol: float = 1e-4,
    equal_nan: bool = False,
) -> bool:
    """Whether ``got`` is ``want``: a tensor of ``want``'s shape and values, or a number
    within the tolerances of a number (for diagnosing a wrong answer by comparing it with
    typical mistakes: it never raises). The one closeness test of every checker."""
    if not isinstance(want, torch.Tensor):
        return (
            isinstance(got, numbers.Real)
            and not isinstance(got, bool)
            and math.isclose(got, want, rel_tol=rtol, abs_tol=atol)
        )
    return (
        isinstance(got, torch.Tensor)
        and got.shape == want.shape
        and bool(
            torch.allclose(
                got.double(), want.double(), atol=atol, rtol=rtol, equal_nan=equal_nan
            )
        )
    )


def expect_number(value: Any, what: str) -> float:
    """``value`` as a float: a Python int or float, or a one-element tensor (not a bool)."""
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return float(value.item())
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    raise ExerciseError(
        f"{what} should be a number, got {type(value).__name__} {value!r}"
    )


def expect_close(
    got: torch.Tensor,
    want: torch.Tensor,
    what: str = "the result",
    *,
    atol: float = 1e-5,
    rtol: float = 1e-4,
    hint: str = "",
) -> None:
    """Fail unless ``got`` matches ``want`` in shape and values; explain NaNs and the worst entry."""
    expect_tensor(got, tuple(want.shape), what)
    if (
        got.is_floating_point()
        and torch.isnan(got).any()
        and not torch.isnan(want).any()
    ):
        raise ExerciseError(
            f"{what} contains NaN ({int(torch.isnan(got).sum())} entries)"
            + (f"; {hint}" if hint else "")
        )
    if not torch.allclose(
        got.double(), want.double(), atol=atol, rtol=rtol, equal_nan=True
    ):
        diff = (got.double() - want.double()).abs()
        worst = int(diff.flatten().nan_to_num(float("inf")).argmax())
        index = tuple(
            int(i) for i in torch.unravel_index(torch.tensor(worst), diff.shape)
        )
        raise ExerciseError(
            f"{what} differs from the reference: at index {index} you have "
            f"{got[index].item():.6g}, expected {want[index].item():.6g} "
            f"(max abs difference {diff.max().item():.3g})"
            + (f"; {hint}" if hint else "")
        )
