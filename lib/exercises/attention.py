"""Checkers for the exercises of chapter 4 (attention).

Each checker runs the reader's function on random inputs, compares it with a reference, and
names the typical mistake when it recognises one: a missing 1/sqrt(d_head), a softmax over the
wrong axis, an inverted mask, NaN (or a uniform average, from a finite fill like -1e9) in a fully
masked row, an off-by-one causal diagonal, heads split in the wrong order, key/value heads tiled
instead of repeated.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from einops import rearrange, repeat

from lib.exercises._common import (
    ExerciseError,
    call_without_mutation,
    checker,
    expect_close,
    expect_tensor,
)

__all__ = [
    "check_masked_attention",
    "check_causal_mask_builder",
    "check_split_heads",
    "check_kv_head_repetition",
]


def _reference_attention(q, k, v, mask=None, *, scale=True, softmax_dim=-1, fill=float("-inf")):
    """The right answer, or (with the keyword arguments) a typical wrong one."""
    scores = q @ k.transpose(-1, -2)
    if scale:
        scores = scores / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, fill)
    dead = torch.isneginf(scores).all(dim=softmax_dim, keepdim=True)
    weights = torch.softmax(scores.masked_fill(dead, 0.0), dim=softmax_dim).masked_fill(dead, 0.0)
    return weights @ v


def _matches(got: torch.Tensor, want: torch.Tensor) -> bool:
    return (
        isinstance(got, torch.Tensor)
        and got.shape == want.shape
        and bool(torch.allclose(got.double(), want.double(), atol=1e-5, rtol=1e-4))
    )


@checker("Exercise 1: masked scaled dot-product attention")
def check_masked_attention(attention: Callable[..., torch.Tensor]) -> None:
    """``attention(q, k, v, mask)``: q ``(batch heads q_pos d_head)``, k and v
    ``(batch heads k_pos d_head)``, mask boolean broadcastable to ``(batch heads q_pos k_pos)``
    (True = may attend) or None; returns ``(batch heads q_pos d_head)``, zeros for fully
    masked rows."""
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 3, 5, 16, generator=gen)
    k = torch.randn(2, 3, 7, 16, generator=gen)
    v = torch.randn(2, 3, 7, 16, generator=gen)

    # 1. No mask: the scaling and the softmax axis.
    got = call_without_mutation(attention, q, k, v, None)
    want = _reference_attention(q, k, v)
    expect_tensor(got, tuple(want.shape), "attention(q, k, v, None)")
    if not _matches(got, want):
        if _matches(got, _reference_attention(q, k, v, scale=False)):
            raise ExerciseError(
                "the scores are not scaled: divide q·k by sqrt(d_head) before the softmax"
            )
        if _matches(got, _reference_attention(q, k, v, softmax_dim=-2)):
            raise ExerciseError(
                "the softmax runs over the queries (dim=-2); each query's weights must sum to "
                "one over the keys: softmax(scores, dim=-1)"
            )
        expect_close(got, want, "attention(q, k, v, None)")

    # 2. A padding-and-causal mask with live rows only.
    lengths = torch.tensor([7, 4])
    key_ok = torch.arange(7) < lengths[:, None]  # (batch k_pos)
    causal = torch.arange(7)[None, :] <= torch.arange(5)[:, None] + 2  # (q_pos k_pos)
    mask = key_ok[:, None, None, :] & causal
    got = call_without_mutation(attention, q, k, v, mask)
    want = _reference_attention(q, k, v, mask)
    if not _matches(got, want):
        if isinstance(got, torch.Tensor) and _matches(got, _reference_attention(q, k, v, ~mask)):
            raise ExerciseError(
                "the mask is inverted: True means 'may attend', so the False entries get -inf"
            )
        expect_close(got, want, "attention with a padding and causal mask")

    # 3. Some rows see nothing: they must give zeros, not NaN.
    dead_mask = mask.clone()
    dead_mask[1, :, :2] = False
    got = call_without_mutation(attention, q, k, v, dead_mask)
    want = _reference_attention(q, k, v, dead_mask)
    if _matches(got, _reference_attention(q, k, v, dead_mask, fill=-1e9)):
        raise ExerciseError(
            "fully masked rows give the average of all the values: a large finite fill such as "
            "-1e9 makes their softmax uniform instead of empty; find the rows with no allowed key "
            "and set their weights (or outputs) to zero"
        )
    expect_close(
        got,
        want,
        "attention with fully masked rows",
        hint="a row whose keys are all masked has softmax(all -inf) = 0/0 = NaN, and "
        "multiplying a 0/1 mask by -inf gives 0·(-inf) = NaN too; detect those rows and give "
        "them zero weights (use masked_fill, not multiplication)",
    )


@checker("Exercise 2: a causal mask")
def check_causal_mask_builder(build: Callable[[int, int], torch.Tensor]) -> None:
    """``build(q_len, k_len)`` -> boolean ``(q_len, k_len)``: query i (at absolute position
    k_len - q_len + i) may see key j iff j <= k_len - q_len + i."""
    for q_len, k_len in ((5, 5), (1, 1), (3, 7), (1, 6)):
        got = build(q_len, k_len)
        what = f"build({q_len}, {k_len})"
        expect_tensor(got, (q_len, k_len), what)
        if got.dtype != torch.bool:
            raise ExerciseError(
                f"{what} has dtype {got.dtype}; a mask is boolean (True = may attend)"
            )
        offset = k_len - q_len
        i = torch.arange(q_len)[:, None]
        j = torch.arange(k_len)[None, :]
        want = j <= i + offset
        if torch.equal(got, want):
            continue
        if torch.equal(got, j < i + offset):
            raise ExerciseError(
                f"{what}: the diagonal is missing; a token may attend to itself (j <= i, not j < i)"
            )
        if torch.equal(got, j <= i + offset + 1):
            raise ExerciseError(f"{what}: off by one, each query also sees the next token")
        if q_len == k_len and torch.equal(got, want.T):
            raise ExerciseError(
                f"{what}: the mask is transposed (upper triangular): rows are queries, columns "
                "keys, and a query may see keys at or before its own position"
            )
        if q_len != k_len and torch.equal(got, j <= i):
            raise ExerciseError(
                f"{what}: the triangle is aligned top-left; with more keys than queries the "
                "queries are the LAST q_len positions, so query i sits at position "
                "k_len - q_len + i"
            )
        raise ExerciseError(f"{what} is wrong: expected\n{want.int()}\ngot\n{got.int()}")


@checker("Exercise 3: split the heads")
def check_split_heads(split: Callable[[torch.Tensor, int], torch.Tensor]) -> None:
    """``split(x, n_heads)``: ``(batch seq (heads d_head))`` -> ``(batch heads seq d_head)``."""
    x = torch.randn(2, 5, 12, generator=torch.Generator().manual_seed(1))
    n_heads = 3
    got = call_without_mutation(split, x, n_heads)
    want = rearrange(x, "batch seq (heads d_head) -> batch heads seq d_head", heads=n_heads)
    if isinstance(got, torch.Tensor) and tuple(got.shape) == (2, 5, 3, 4):
        raise ExerciseError(
            "the result is (batch, seq, heads, d_head): the heads axis must come before seq, "
            "so that attention runs over seq for each head"
        )
    expect_tensor(got, tuple(want.shape), "split(x, n_heads)")
    if torch.equal(got, want):
        return
    wrong_order = rearrange(x, "batch seq (d_head heads) -> batch heads seq d_head", heads=n_heads)
    if torch.equal(got, wrong_order):
        raise ExerciseError(
            "d_model is split as (d_head heads); the heads are the outer factor: each head owns "
            "a contiguous block of d_head features, '(heads d_head)'"
        )
    if torch.equal(got, x.reshape(2, n_heads, 5, 4)):
        raise ExerciseError(
            "a plain reshape mixes positions and features; split the last axis, then move heads "
            "before seq (rearrange 'batch seq (heads d_head) -> batch heads seq d_head')"
        )
    expect_close(got, want, "split(x, n_heads)")


@checker("Exercise 4: repeat key/value heads for GQA")
def check_kv_head_repetition(repeat_kv: Callable[[torch.Tensor, int], torch.Tensor]) -> None:
    """``repeat_kv(x, n_rep)``: ``(batch kv_heads seq d_head)`` -> ``(batch (kv_heads n_rep) seq
    d_head)``, where query head h reads key/value head h // n_rep."""
    x = torch.randn(2, 3, 4, 5, generator=torch.Generator().manual_seed(2))
    for n_rep in (1, 4):
        got = call_without_mutation(repeat_kv, x, n_rep)
        want = repeat(x, "batch kv_heads seq d -> batch (kv_heads group) seq d", group=n_rep)
        expect_tensor(got, tuple(want.shape), f"repeat_kv(x, {n_rep})")
        if torch.equal(got, want):
            continue
        if torch.equal(got, x.repeat(1, n_rep, 1, 1)):
            raise ExerciseError(
                "the heads are tiled (0, 1, 2, 0, 1, 2, ...) but each key/value head must serve a "
                "block of consecutive query heads (0, 0, 0, 0, 1, 1, ...): h -> h // n_rep"
            )
        expect_close(got, want, f"repeat_kv(x, {n_rep})")
