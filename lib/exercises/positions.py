"""Checkers for the exercises of chapter 3 (positions).

Each checker compares the reader's function with a reference on several inputs and, when
they differ, tests the answer against the typical mistakes (sin and cos swapped, ``i``
instead of ``2i`` in the exponent, a rotation in the wrong direction, the wrong pairing,
the past and the future swapped) to say which one was made.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from lib.exercises._common import (
    ExerciseError,
    call_without_mutation,
    checker,
    expect_close,
    expect_tensor,
)
from lib.positions import t5_relative_position_bucket

__all__ = [
    "check_sinusoidal_table",
    "check_rope_rotate_pairs",
    "check_alibi_head_slopes",
    "check_t5_bucket",
]


def _sinusoidal_variants(n: int, d: int) -> dict[str, torch.Tensor]:
    """The right table and the usual wrong ones, ``(n d)`` each, float64."""
    pos = torch.arange(n, dtype=torch.float64)[:, None]
    pair = torch.arange(d // 2, dtype=torch.float64)[None, :]
    right_angle = pos / 10000 ** (2 * pair / d)
    wrong_angle = pos / 10000 ** (pair / d)

    def interleave(even: torch.Tensor, odd: torch.Tensor) -> torch.Tensor:
        return torch.stack((even, odd), dim=-1).reshape(n, d)

    return {
        "right": interleave(right_angle.sin(), right_angle.cos()),
        "swapped": interleave(right_angle.cos(), right_angle.sin()),
        "exponent_i": interleave(wrong_angle.sin(), wrong_angle.cos()),
        "blocks": torch.cat((right_angle.sin(), right_angle.cos()), dim=-1),
    }


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.allclose(a.double(), b.double(), atol=1e-4)


@checker("Exercise 1: the sinusoidal table")
def check_sinusoidal_table(fn: Callable[[int, int], torch.Tensor]) -> None:
    """``fn(n_positions, d_model)`` must return the ``(n_positions d_model)`` table."""
    for n, d in ((50, 16), (9, 6), (200, 64)):
        got = expect_tensor(fn(n, d), (n, d), f"sinusoidal_table({n}, {d})")
        if not got.is_floating_point():
            raise ExerciseError(f"the table should hold floats, got dtype {got.dtype}")
        variants = _sinusoidal_variants(n, d)
        if _close(got, variants["right"]):
            continue
        if _close(got, variants["swapped"]):
            raise ExerciseError(
                "sin and cos are swapped: even columns 2i hold sin(pos / 10000^(2i/d)), "
                "odd columns 2i+1 hold cos (row 0 should read 0, 1, 0, 1, ...)"
            )
        if _close(got, variants["exponent_i"]):
            raise ExerciseError(
                "the exponent uses the pair index i where the formula has 2i: "
                "the frequency of pair i is 10000^(-2i/d), so that the last pair's is near 1/10000"
            )
        if _close(got, variants["blocks"]):
            raise ExerciseError(
                "you put all the sines first and all the cosines after; the formula "
                "interleaves them: column 2i is a sine, column 2i+1 the cosine of the same angle"
            )
        expect_close(got, variants["right"].to(got.dtype), f"sinusoidal_table({n}, {d})", atol=1e-4)


def _rotate_interleaved(
    x: torch.Tensor, positions: torch.Tensor, base: float = 10000.0
) -> torch.Tensor:
    """Reference: rotate pairs (2i, 2i+1) of each row of x by positions * theta_i. (seq d)."""
    d = x.shape[-1]
    theta = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    angle = positions.double()[:, None] * theta[None, :]
    a, b = x.double()[:, 0::2], x.double()[:, 1::2]
    out = torch.stack((a * angle.cos() - b * angle.sin(), a * angle.sin() + b * angle.cos()), -1)
    return out.reshape(x.shape)


def _rotate_half_split(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """The same rotation with the half-split pairing (i, i + d/2): a typical mix-up."""
    d = x.shape[-1]
    order = torch.cat((torch.arange(0, d, 2), torch.arange(1, d, 2)))
    back = torch.argsort(order)
    return _rotate_interleaved(x[:, back], positions)[:, order]


@checker("Exercise 2: rotate pairs by RoPE")
def check_rope_rotate_pairs(fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> None:
    """``fn(x, positions)``: x ``(seq d_head)``, positions ``(seq)`` int -> ``(seq d_head)``,
    with the paper's interleaved pairs ``(2i, 2i+1)`` rotated by ``position * theta_i``."""
    generator = torch.Generator().manual_seed(3)
    for seq, d in ((6, 8), (5, 16)):
        x = torch.randn(seq, d, generator=generator, dtype=torch.float64)
        positions = torch.tensor([0, 1, 2, 7, 30, 100, 5][:seq])
        got = call_without_mutation(fn, x, positions)
        got = expect_tensor(got, (seq, d), f"rope_rotate_pairs(x of shape {(seq, d)}, positions)")
        want = _rotate_interleaved(x, positions)
        if _close(got, want):
            continue
        if _close(got, _rotate_interleaved(x, -positions)):
            raise ExerciseError(
                "your rotation goes the wrong way: (a, b) by angle α becomes "
                "(a cos α − b sin α, a sin α + b cos α); check the signs of the sin terms"
            )
        if _close(got, _rotate_half_split(x, positions)):
            raise ExerciseError(
                "you paired dimension i with i + d/2 (the half-split layout); this exercise "
                "uses the paper's pairing, neighbours (2i, 2i+1)"
            )
        if not torch.allclose(got[0].double(), x[0], atol=1e-6):
            raise ExerciseError(
                "the row at position 0 should come back unchanged (a rotation by angle 0)"
            )
        if not torch.allclose(got.double().norm(dim=-1), x.norm(dim=-1), atol=1e-4):
            raise ExerciseError(
                "a rotation keeps lengths, but your rows changed norm: each pair (a, b) must be "
                "rotated as a unit, with cos and sin of the same angle"
            )
        expect_close(
            got,
            want.to(got.dtype),
            "the rotated vectors",
            atol=1e-5,
            hint="pair i turns by position * 10000^(-2i/d_head)",
        )


def _alibi_reference(n: int) -> list[float]:
    def geometric(k: int) -> list[float]:
        return [2.0 ** (-8.0 * h / k) for h in range(1, k + 1)]

    closest = 2 ** math.floor(math.log2(n))
    return geometric(closest) + geometric(2 * closest)[0::2][: n - closest]


@checker("Exercise 3: ALiBi slopes")
def check_alibi_head_slopes(fn: Callable[[int], torch.Tensor]) -> None:
    """``fn(n_heads)`` returns the ``(heads)`` slopes, in the order of the authors' code."""
    for n in (8, 1, 2, 4, 16, 6, 12, 20):
        got = fn(n)
        got = (
            torch.as_tensor(got, dtype=torch.float64) if not isinstance(got, torch.Tensor) else got
        )
        expect_tensor(got, (n,), f"alibi_slopes({n})")
        want = torch.tensor(_alibi_reference(n), dtype=torch.float64)
        if _close(got, want):
            continue
        naive = torch.tensor([2.0 ** (-8.0 * h / n) for h in range(1, n + 1)], dtype=torch.float64)
        if n & (n - 1) and _close(got, naive):
            raise ExerciseError(
                f"for n_heads={n}, not a power of two, ALiBi does not use 2^(-8h/n): it takes "
                "the slopes of the largest power of two below n_heads, then every other slope of "
                "twice that many heads"
            )
        if _close(got.double().sort().values, want.sort().values):
            raise ExerciseError(
                f"alibi_slopes({n}) has the right values in the wrong order; keep the authors' "
                "order (the power-of-two block first, then the extra slopes)"
            )
        expect_close(got, want.to(got.dtype), f"alibi_slopes({n})", atol=1e-6)


@checker("Exercise 4: T5 buckets")
def check_t5_bucket(fn: Callable[[int, bool, int, int], int]) -> None:
    """``fn(relative_position, bidirectional, num_buckets, max_distance)`` returns an int bucket;
    ``relative_position = key_pos − query_pos`` (negative: the key is in the past)."""
    for bidirectional, num_buckets, max_distance in (
        (True, 32, 128),
        (False, 32, 128),
        (True, 16, 40),
    ):
        config = (
            f"bidirectional={bidirectional}, num_buckets={num_buckets}, max_distance={max_distance}"
        )
        relatives = range(-300, 301)
        got = {r: int(fn(r, bidirectional, num_buckets, max_distance)) for r in relatives}
        # The reference is the chapter's own function, which tests/test_positions.py checks
        # against a scalar transcription of T5's bucketing.
        buckets = t5_relative_position_bucket(
            torch.tensor(list(relatives)), bidirectional, num_buckets, max_distance
        )
        want = dict(zip(relatives, buckets.tolist()))
        if got == want:
            continue
        if all(got[r] == want[-r] for r in relatives if -r in want):
            raise ExerciseError(
                f"({config}) past and future are swapped: relative_position is key − query, so a "
                "negative value is a key in the past, whose distance is −relative_position"
            )
        if max(got.values()) >= num_buckets or min(got.values()) < 0:
            raise ExerciseError(
                f"({config}) you return buckets outside 0..{num_buckets - 1}: far distances must "
                "saturate in the last bucket (clamp the logarithmic part)"
            )
        r = next(r for r in sorted(relatives, key=abs) if got[r] != want[r])
        raise ExerciseError(
            f"({config}) for relative_position={r} you return bucket {got[r]}, expected {want[r]}"
        )
