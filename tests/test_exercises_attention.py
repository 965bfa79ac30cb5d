"""The chapter 4 checkers accept right answers and diagnose the typical wrong ones."""

from __future__ import annotations

import math

import pytest
import torch

from lib.exercises._common import ExerciseError
from lib.exercises.attention import (
    check_attention_entropy,
    check_left_padded_cache_mask,
    check_max_len_for_scores,
)

# -- Exercise 1 -------------------------------------------------------------------------------


def mask_right(n_pads, q_len, k_len):
    query = torch.arange(q_len) + (k_len - q_len)
    key = torch.arange(k_len)
    causal = key[None, :] <= query[:, None]
    real = key[None, :] >= n_pads[:, None]
    return real[:, None, None, :] & causal


def test_left_padded_mask_accepts_the_reference(capsys):
    assert check_left_padded_cache_mask(mask_right) is True
    assert "all checks passed" in capsys.readouterr().out


def test_left_padded_mask_not_attempted_prints_what_to_do(capsys):
    def stub(n_pads, q_len, k_len):
        raise NotImplementedError

    assert check_left_padded_cache_mask(stub) is None
    assert "not attempted" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("wrong", "message"),
    [
        (
            lambda n, q, k: (
                mask_right(n, q, k) | (torch.arange(k) >= k - n[:, None])[:, None, None]
            ),
            "differs",
        ),
        (
            lambda n, q, k: (
                (torch.arange(k)[None, :] < (k - n)[:, None])[:, None, None, :]
                & mask_right(torch.zeros_like(n), q, k)
            ),
            "last n_pads keys",
        ),
        (lambda n, q, k: mask_right(n, q, k)[:, 0], "keep a head axis"),
        (lambda n, q, k: mask_right(n + 1, q, k), "off by one"),
        (
            lambda n, q, k: mask_right(torch.zeros_like(n), q, k),
            "padding keys are visible",
        ),
        (lambda n, q, k: ~mask_right(n, q, k), "inverted"),
        (lambda n, q, k: mask_right(n, q, k).int(), "boolean"),
    ],
)
def test_left_padded_mask_diagnoses(wrong, message):
    with pytest.raises(ExerciseError, match=message):
        check_left_padded_cache_mask(wrong)


def test_left_padded_mask_recognises_the_top_left_triangle():
    def top_left(n_pads, q_len, k_len):
        key = torch.arange(k_len)
        causal = key[None, :] <= torch.arange(q_len)[:, None]
        return (key[None, :] >= n_pads[:, None])[:, None, None, :] & causal

    with pytest.raises(ExerciseError, match="aligned top-left"):
        check_left_padded_cache_mask(top_left)


# -- Exercise 2 -------------------------------------------------------------------------------


def entropy_right(weights):
    per_query = -torch.xlogy(weights, weights).sum(-1)  # (batch heads q_pos)
    live = (weights.sum(-1) > 0).to(weights.dtype)
    return (per_query * live).sum((0, 2)) / live.sum((0, 2))


def test_entropy_accepts_the_reference(capsys):
    assert check_attention_entropy(entropy_right) is True


@pytest.mark.parametrize(
    ("wrong", "message"),
    [
        (lambda w: entropy_right(w) / math.log(2), "bits"),
        (lambda w: -torch.xlogy(w, w).sum(-1).mean((0, 2)), "fully masked rows"),
        (lambda w: -torch.xlogy(w, w).sum(-1).mean(), "shape"),
    ],
)
def test_entropy_diagnoses(wrong, message):
    with pytest.raises(ExerciseError, match=message):
        check_attention_entropy(wrong)


def test_entropy_nan_is_named():
    with pytest.raises(ExerciseError, match="0 \\* log 0"):
        check_attention_entropy(lambda w: -(w * w.log()).sum(-1).mean((0, 2)))


# -- Exercise 3 -------------------------------------------------------------------------------


def max_len_right(budget, batch, n_heads, bytes_per_value):
    return math.isqrt(budget // (batch * n_heads * bytes_per_value))


def test_max_len_accepts_the_reference():
    assert check_max_len_for_scores(max_len_right) is True


@pytest.mark.parametrize(
    ("wrong", "message"),
    [
        (lambda b, n, h, v: math.isqrt(b // (h * v)), "every sequence of the batch"),
        (lambda b, n, h, v: math.isqrt(b // (n * v)), "every head"),
        (lambda b, n, h, v: math.isqrt(b // (n * h)), "bytes per value"),
        (lambda b, n, h, v: math.ceil(math.sqrt(b / (n * h * v))), "round down"),
        (lambda b, n, h, v: math.sqrt(b / (n * h * v)), "return an int"),
    ],
)
def test_max_len_diagnoses(wrong, message):
    with pytest.raises(ExerciseError, match=message):
        check_max_len_for_scores(wrong)
