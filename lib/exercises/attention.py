"""Checkers for the exercises of chapter 4 (attention).

Each checker compares the reader's function with a reference written here and, when they
differ, tests the answer against the typical mistakes (a padding mask taken from the wrong
end, a causal triangle aligned to the wrong corner, NaN from ``0 · log 0``, logarithms in
the wrong base, fully masked rows counted in an average, a forgotten head or batch factor,
a square root rounded the wrong way) to say which one was made.
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

__all__ = [
    "check_left_padded_cache_mask",
    "check_attention_entropy",
    "check_max_len_for_scores",
]


# -- Exercise 1 -------------------------------------------------------------------------------
def _left_padded_mask(n_pads: torch.Tensor, q_len: int, k_len: int, *, corner="bottom"):
    """Reference ``(batch 1 q_pos k_pos)``: key ``j`` is real and not after the query."""
    offset = k_len - q_len if corner == "bottom" else 0
    query = torch.arange(q_len) + offset
    key = torch.arange(k_len)
    causal = key[None, :] <= query[:, None]  # (q_pos k_pos)
    real = key[None, :] >= n_pads[:, None]  # (batch k_pos)
    return (real[:, None, None, :] & causal[None, None]).clone()


@checker("Exercise 1: a causal mask for a left-padded cache")
def check_left_padded_cache_mask(
    fn: Callable[[torch.Tensor, int, int], torch.Tensor],
) -> None:
    """``fn(n_pads, q_len, k_len) -> (batch 1 q_pos k_pos)`` boolean, True = may attend."""
    cases = ((torch.tensor([0, 2, 3]), 5, 5), (torch.tensor([1, 0]), 1, 6))
    cases += ((torch.tensor([3, 0, 1, 4]), 2, 7),)
    for n_pads, q_len, k_len in cases:
        call = f"left_padded_cache_mask({n_pads.tolist()}, {q_len}, {k_len})"
        got = call_without_mutation(fn, n_pads, q_len, k_len)
        want = _left_padded_mask(n_pads, q_len, k_len)
        if (
            isinstance(got, torch.Tensor)
            and got.shape == want.shape[:1] + want.shape[2:]
        ):
            raise ExerciseError(
                f"{call} has shape {tuple(got.shape)}: keep a head axis of size 1, "
                "(batch 1 q_pos k_pos), so the mask broadcasts over the heads"
            )
        expect_tensor(got, tuple(want.shape), call)
        if got.dtype != torch.bool:
            raise ExerciseError(f"{call} has dtype {got.dtype}; a mask is boolean")
        if torch.equal(got, want):
            continue
        right_padded = torch.arange(k_len)[None, :] < (k_len - n_pads)[:, None]
        causal = _left_padded_mask(torch.zeros_like(n_pads), q_len, k_len)
        if torch.equal(got, right_padded[:, None, None, :] & causal):
            raise ExerciseError(
                f"{call}: you masked the last n_pads keys; with left padding the pads are "
                "the first n_pads positions, so key j is real when j >= n_pads"
            )
        if torch.equal(got, _left_padded_mask(n_pads, q_len, k_len, corner="top")):
            raise ExerciseError(
                f"{call}: the causal triangle is aligned top-left; the queries are the last "
                "q_len positions, so query i sits at k_len - q_len + i"
            )
        if torch.equal(got, _left_padded_mask(n_pads + 1, q_len, k_len)):
            raise ExerciseError(
                f"{call}: off by one: key j = n_pads is the first real token"
            )
        if torch.equal(got, causal):
            raise ExerciseError(f"{call}: the padding keys are visible; mask them too")
        if torch.equal(got, ~want):
            raise ExerciseError(f"{call} is inverted: True means 'may attend'")
        raise ExerciseError(
            f"{call} differs from the reference: {got[:, 0].int().tolist()}"
        )


# -- Exercise 2 -------------------------------------------------------------------------------
def _entropy(weights: torch.Tensor, *, base: float = math.e, keep_dead: bool = False):
    w = weights.double()
    plogp = torch.where(w > 0, w * torch.log(w.clamp_min(1e-300)), torch.zeros_like(w))
    per_query = -plogp.sum(-1) / math.log(base)  # (batch heads q_pos)
    live = (w.sum(-1) > 0).double() if not keep_dead else torch.ones_like(per_query)
    return (per_query * live).sum((0, 2)) / live.sum((0, 2))


def _random_weights(generator: torch.Generator) -> torch.Tensor:
    scores = torch.randn(2, 3, 6, 6, generator=generator, dtype=torch.float64) * 2
    causal = torch.ones(6, 6, dtype=torch.bool).tril()
    weights = torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1)
    weights[1, :, :2] = 0.0  # two fully masked queries (left padding)
    return weights.float()


@checker("Exercise 2: attention entropy per head")
def check_attention_entropy(fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
    """``fn(weights (batch heads q_pos k_pos)) -> (heads,)``, in nats."""
    generator = torch.Generator().manual_seed(0)
    uniform = torch.ones(1, 2, 3, 4) / 4
    want = torch.full((2,), math.log(4))
    got = call_without_mutation(fn, uniform)
    expect_tensor(got, (2,), "the entropy of 2 uniform heads over 4 keys")
    if torch.allclose(
        got.double(), torch.full((2,), 2.0, dtype=torch.float64), atol=1e-4
    ):
        raise ExerciseError(
            "4 equal weights gave 2.0: that is bits; use the natural log"
        )
    expect_close(
        got, want, "the entropy of uniform weights over 4 keys (ln 4)", atol=1e-4
    )
    weights = _random_weights(generator)
    got = call_without_mutation(fn, weights)
    want = _entropy(weights)
    what = "the mean entropy per head of causal weights with two dead rows"
    if isinstance(got, torch.Tensor) and torch.isnan(got).any():
        raise ExerciseError(
            f"{what} contains NaN: a zero weight gives 0 * log 0 = 0 * -inf; "
            "count 0 log 0 as 0 (e.g. torch.xlogy or torch.where)"
        )
    expect_tensor(got, (3,), what)
    if torch.allclose(got.double(), _entropy(weights, keep_dead=True), atol=1e-4):
        raise ExerciseError(
            f"{what}: the fully masked rows (all weights 0) were counted as entropy 0; "
            "leave them out of the average"
        )
    expect_close(got, want, what, atol=1e-4)


# -- Exercise 3 -------------------------------------------------------------------------------
def _max_len(budget: int, batch: int, n_heads: int, bytes_per_value: int) -> int:
    return math.isqrt(budget // (batch * n_heads * bytes_per_value))


@checker("Exercise 3: the longest sequence whose scores fit")
def check_max_len_for_scores(fn: Callable[[int, int, int, int], int]) -> None:
    """``fn(budget_bytes, batch, n_heads, bytes_per_value) -> int``."""
    cases = (
        (2**30, 1, 1, 4),
        (80 * 10**9, 8, 32, 2),
        (10**6, 3, 5, 4),
        (2**40 - 1, 7, 12, 2),
    )
    cases += ((4 * 1024 * 1024 - 1, 1, 1, 4),)  # one byte short of 1024² fp32 scores
    for budget, batch, heads, nbytes in cases:
        call = f"max_len_for_scores({budget}, {batch}, {heads}, {nbytes})"
        got = fn(budget, batch, heads, nbytes)
        want = _max_len(budget, batch, heads, nbytes)
        if isinstance(got, bool) or not isinstance(got, int):
            raise ExerciseError(
                f"{call} returned {got!r}; return an int (a whole length)"
            )
        if got == want:
            continue
        if got == _max_len(budget, 1, heads, nbytes):
            raise ExerciseError(
                f"{call} = {got}: every sequence of the batch has its scores"
            )
        if got == _max_len(budget, batch, 1, nbytes):
            raise ExerciseError(f"{call} = {got}: every head has its own n x n scores")
        if got == _max_len(budget, batch, heads, 1):
            raise ExerciseError(f"{call} = {got}: multiply by the bytes per value")
        if got == want + 1:
            raise ExerciseError(
                f"{call} = {got}: that length needs "
                f"{batch * heads * got * got * nbytes} bytes, over the budget; round down"
            )
        raise ExerciseError(f"{call} = {got}, expected {want}")
