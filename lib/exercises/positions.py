"""Checkers for the exercises of chapter 3 (positions).

Each checker compares the reader's function with a reference written here on several
inputs and, when they differ, tests the answer against the typical mistakes (positions
scaled the wrong way, the interleaved layout where the half-split one is asked for, the
exponent of the base inverted, a window off by one, the offset of the queries forgotten) to
say which one was made.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from lib.exercises._common import (
    ExerciseError,
    call_without_mutation,
    checker,
    expect_close,
    expect_number,
    expect_tensor,
    is_close,
)
from lib.positions import alibi_slopes

__all__ = [
    "check_interpolated_cos_sin",
    "check_ntk_scaled_base",
    "check_sliding_window_alibi",
]


# -- Exercise 1 -------------------------------------------------------------------------------
def _cos_sin(
    positions: torch.Tensor, d_head: int, *, interleaved: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables ``(pos d_head)`` for (possibly fractional) positions, float64."""
    theta = 10000.0 ** (-torch.arange(0, d_head, 2, dtype=torch.float64) / d_head)
    angle = positions.double()[:, None] * theta[None, :]
    if interleaved:
        angle = angle.repeat_interleave(2, dim=-1)  # pairs (2i, 2i+1)
    else:
        angle = torch.cat((angle, angle), dim=-1)  # pairs (i, i + d/2)
    return angle.cos(), angle.sin()


def _as_pair(
    got: Any, shape: tuple[int, int], call: str
) -> tuple[torch.Tensor, torch.Tensor]:
    if not (isinstance(got, (tuple, list)) and len(got) == 2):
        raise ExerciseError(
            f"{call} should return a pair (cos, sin), got {type(got).__name__}"
        )
    cos = expect_tensor(got[0], shape, f"the cos table of {call}")
    sin = expect_tensor(got[1], shape, f"the sin table of {call}")
    return cos, sin


@checker("Exercise 1: RoPE for a longer context")
def check_interpolated_cos_sin(fn: Callable[[int, int, int, int], tuple]) -> None:
    """``fn(seq, d_head, trained_len, target_len) -> (cos, sin)``, each ``(seq d_head)``."""
    for seq, d_head, trained, target in (
        (16, 8, 8, 16),
        (40, 16, 10, 40),
        (12, 32, 12, 12),
    ):
        call = f"interpolated_cos_sin({seq}, {d_head}, {trained}, {target})"
        cos, sin = _as_pair(fn(seq, d_head, trained, target), (seq, d_head), call)
        positions = torch.arange(seq, dtype=torch.float64)
        want_cos, want_sin = _cos_sin(positions * trained / target, d_head)
        if is_close(cos, want_cos) and is_close(sin, want_sin):
            continue
        if is_close(cos, want_sin) and is_close(sin, want_cos):
            raise ExerciseError(f"{call}: cos and sin are swapped; return (cos, sin)")
        wrong = {
            "inverted": _cos_sin(positions * target / trained, d_head),
            "unscaled": _cos_sin(positions, d_head),
            "interleaved": _cos_sin(
                positions * trained / target, d_head, interleaved=True
            ),
        }
        hints = {
            "inverted": (
                "the positions were stretched by target_len / trained_len; interpolation "
                "squeezes them: position m becomes m * trained_len / target_len, so that "
                "every angle stays inside the range seen in training"
            ),
            "unscaled": (
                "the positions are not scaled at all; multiply them by "
                "trained_len / target_len before computing the angles"
            ),
            "interleaved": (
                "the angles are laid out for interleaved pairs (2i, 2i+1); RotaryEmbedding "
                "and apply_rotary pair dimension i with i + d_head/2, so the angles of the "
                "d_head/2 pairs are repeated as two halves: torch.cat((angle, angle), -1)"
            ),
        }
        for name, (other_cos, other_sin) in wrong.items():
            if is_close(cos, other_cos) and is_close(sin, other_sin):
                raise ExerciseError(f"{call}: {hints[name]}")
        expect_close(cos, want_cos.to(cos.dtype), f"the cos table of {call}")
        expect_close(sin, want_sin.to(sin.dtype), f"the sin table of {call}")


# -- Exercise 2 -------------------------------------------------------------------------------


@checker("Exercise 2: NTK-aware scaling of the base")
def check_ntk_scaled_base(fn: Callable[[float, int, float], float]) -> None:
    """``fn(base, d_head, scale) -> float``: the base whose slowest pair is ``scale`` slower."""
    for base, d_head, scale in (
        (10000.0, 128, 4.0),
        (10000.0, 8, 2.0),
        (500.0, 64, 8.0),
    ):
        call = f"ntk_scaled_base({base:g}, {d_head}, {scale:g})"
        got = expect_number(fn(base, d_head, scale), call)
        exponent = d_head / (d_head - 2)
        want = base * scale**exponent
        if math.isclose(got, want, rel_tol=1e-9):
            continue
        slowest = (d_head - 2) / d_head  # theta_last = base ** -slowest
        got_ratio = (got / base) ** slowest if got > 0 else float("nan")
        where = f"{call} returned {got:.6g}, expected {want:.6g}"
        if math.isclose(got, base * scale, rel_tol=1e-9):
            raise ExerciseError(
                f"{where}: multiplying the base by the scale slows the slowest pair by only "
                f"scale^((d-2)/d) = {got_ratio:.4g}, not by {scale:g}; its frequency is "
                "base^(-(d-2)/d), so solve base'^(-(d-2)/d) = base^(-(d-2)/d) / scale"
            )
        if math.isclose(got, base * scale ** (1 / exponent), rel_tol=1e-9):
            raise ExerciseError(
                f"{where}: the exponent is inverted; the slowest pair turns at "
                "base^(-(d-2)/d), so the base must grow by scale^(d/(d-2))"
            )
        if math.isclose(got, base / scale**exponent, rel_tol=1e-9):
            raise ExerciseError(
                f"{where}: a smaller base makes every pair faster; to slow the slowest pair "
                "down, the base must grow"
            )
        raise ExerciseError(where)


# -- Exercise 3 -------------------------------------------------------------------------------
def _window_alibi(
    n_heads: int, q_len: int, k_len: int, offset: int, window: int, *, shift: int = 0
) -> torch.Tensor:
    """The reference (``shift`` moves the window's far edge, for the off-by-one variants)."""
    query = torch.arange(offset, offset + q_len)[:, None]
    key = torch.arange(k_len)[None, :]
    distance = (query - key).double()  # (q_pos k_pos)
    bias = -alibi_slopes(n_heads).double()[:, None, None] * distance
    visible = (distance >= 0) & (distance < window + shift)
    return bias.masked_fill(~visible, float("-inf"))


_WINDOW_CASES = (
    (4, 6, 6, 0, 3),  # a full sequence
    (2, 2, 9, 7, 4),  # two new queries after seven cached keys
    (8, 5, 5, 0, 1),  # each query sees itself only
    (4, 3, 12, 9, 20),  # a window longer than the sequence: plain causal ALiBi
    (1, 10, 10, 0, 4),
)


@checker("Exercise 3: ALiBi with a sliding window")
def check_sliding_window_alibi(fn: Callable[..., torch.Tensor]) -> None:
    """``fn(n_heads, q_len, k_len, offset, window) -> (heads q_len k_len)`` bias."""
    for n_heads, q_len, k_len, offset, window in _WINDOW_CASES:
        call = f"sliding_window_alibi({n_heads}, {q_len}, {k_len}, {offset}, {window})"
        got = call_without_mutation(fn, n_heads, q_len, k_len, offset, window)
        got = expect_tensor(got, (n_heads, q_len, k_len), call)
        if not got.is_floating_point():
            raise ExerciseError(
                f"{call} should be a float tensor, got dtype {got.dtype}"
            )
        want = _window_alibi(n_heads, q_len, k_len, offset, window)
        masked = torch.isinf(want)
        same_mask = torch.equal(torch.isinf(got) & (got < 0), masked)
        if same_mask and is_close(
            got.masked_fill(masked, 0), want.masked_fill(masked, 0)
        ):
            continue
        _diagnose_window(got, want, n_heads, q_len, k_len, offset, window, call)


def _diagnose_window(got, want, n_heads, q_len, k_len, offset, window, call) -> None:
    got = got.double()
    visible = torch.isfinite(want)
    got_visible = torch.isfinite(got)
    if (got_visible & ~visible).any() and (got[~visible] < -1e4).all():
        raise ExerciseError(
            f"{call}: masked entries must be -inf, so that softmax gives them weight 0 "
            "exactly; yours are large negative numbers"
        )
    for shift, words in ((1, "one key too many"), (-1, "one key too few")):
        other = _window_alibi(n_heads, q_len, k_len, offset, window, shift=shift)
        if torch.equal(got_visible, torch.isfinite(other)):
            raise ExerciseError(
                f"{call}: each query sees {words}; query i sees the keys j with "
                "i - window < j <= i: exactly `window` keys, itself included"
            )
    not_offset = _window_alibi(n_heads, q_len, k_len, 0, window)
    if offset and torch.equal(got_visible, torch.isfinite(not_offset)):
        raise ExerciseError(
            f"{call}: the queries sit at positions offset .. offset + q_len - 1 = "
            f"{offset} .. {offset + q_len - 1}, after {offset} cached keys, not from 0"
        )
    causal_only = _window_alibi(n_heads, q_len, k_len, offset, k_len + offset)
    if window < k_len and torch.equal(got_visible, torch.isfinite(causal_only)):
        raise ExerciseError(
            f"{call}: keys more than window - 1 = {window - 1} positions back must be "
            "masked too (-inf); you kept only the causal mask"
        )
    if not torch.equal(got_visible, visible):
        raise ExerciseError(f"{call}: the -inf entries are not where they should be")
    if torch.allclose(got[visible], -want[visible]):
        raise ExerciseError(
            f"{call}: the sign of the bias is wrong; ALiBi subtracts slope * distance, so "
            "far keys get a lower score"
        )
    zeroed = got.masked_fill(~visible, 0)
    expect_close(zeroed, want.masked_fill(~visible, 0), f"the visible part of {call}")
