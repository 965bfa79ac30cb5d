"""The checkers of chapter 4 accept the reference answers and diagnose typical mistakes."""

from __future__ import annotations

import math

import pytest
import torch
from einops import rearrange

from lib.exercises._common import ExerciseError
from lib.exercises.attention import (
    check_causal_mask_builder,
    check_kv_head_repetition,
    check_masked_attention,
    check_split_heads,
)


def _attention(q, k, v, mask=None, *, scale=True, dim=-1, invert=False, safe=True, fill=None):
    scores = q @ k.transpose(-1, -2)
    if scale:
        scores = scores / math.sqrt(q.shape[-1])
    if mask is not None:
        fill = float("-inf") if fill is None else fill
        scores = scores.masked_fill(mask if invert else ~mask, fill)
    if not safe:
        return torch.softmax(scores, dim=dim) @ v
    dead = torch.isneginf(scores).all(dim=dim, keepdim=True)
    weights = torch.softmax(scores.masked_fill(dead, 0.0), dim=dim).masked_fill(dead, 0.0)
    return weights @ v


def test_masked_attention_accepts_the_reference():
    assert check_masked_attention(_attention)


@pytest.mark.parametrize(
    ("wrong", "match"),
    [
        (lambda q, k, v, m=None: _attention(q, k, v, m, scale=False), "not scaled.*sqrt"),
        (lambda q, k, v, m=None: _attention(q, k, v, m, dim=-2), "softmax runs over the queries"),
        (lambda q, k, v, m=None: _attention(q, k, v, m, invert=True), "mask is inverted"),
        (lambda q, k, v, m=None: _attention(q, k, v, m, safe=False), "contains NaN.*0·\\(-inf\\)"),
        (lambda q, k, v, m=None: _attention(q, k, v, m, fill=-1e9), "finite fill such as -1e9"),
        (lambda q, k, v, m=None: _attention(q, k, v, m)[..., :1], "has shape"),
    ],
)
def test_masked_attention_diagnoses_mistakes(wrong, match):
    with pytest.raises(ExerciseError, match=match):
        check_masked_attention(wrong)


def test_masked_attention_catches_in_place_edits():
    def edits_q(q, k, v, mask=None):
        q /= math.sqrt(q.shape[-1])
        return _attention(q * math.sqrt(q.shape[-1]), k, v, mask)

    with pytest.raises(ExerciseError, match="modified its input"):
        check_masked_attention(edits_q)


def test_not_attempted_is_reported_not_raised():
    def stub(*args):
        raise NotImplementedError

    assert check_masked_attention(stub) is None


def _causal(q_len, k_len):
    return torch.arange(k_len)[None, :] <= torch.arange(q_len)[:, None] + (k_len - q_len)


def test_causal_mask_builder_accepts_the_reference():
    assert check_causal_mask_builder(_causal)


@pytest.mark.parametrize(
    ("wrong", "match"),
    [
        (
            lambda q, k: torch.arange(k)[None, :] < torch.arange(q)[:, None] + (k - q),
            "diagonal is missing",
        ),
        (
            lambda q, k: torch.arange(k)[None, :] <= torch.arange(q)[:, None] + (k - q) + 1,
            "off by one",
        ),
        (lambda q, k: _causal(q, k).T if q == k else _causal(q, k), "transposed"),
        (lambda q, k: torch.arange(k)[None, :] <= torch.arange(q)[:, None], "aligned top-left"),
        (lambda q, k: _causal(q, k).float(), "dtype torch.float32"),
        (lambda q, k: _causal(q, q), "has shape"),
    ],
)
def test_causal_mask_builder_diagnoses_mistakes(wrong, match):
    with pytest.raises(ExerciseError, match=match):
        check_causal_mask_builder(wrong)


def test_split_heads_accepts_the_reference():
    assert check_split_heads(
        lambda x, h: rearrange(x, "batch seq (heads d) -> batch heads seq d", heads=h)
    )


@pytest.mark.parametrize(
    ("wrong", "match"),
    [
        (lambda x, h: rearrange(x, "b s (d heads) -> b heads s d", heads=h), r"\(d_head heads\)"),
        (
            lambda x, h: rearrange(x, "b s (heads d) -> b s heads d", heads=h),
            "heads axis must come before seq",
        ),
        (lambda x, h: x.reshape(x.shape[0], h, x.shape[1], -1), "plain reshape"),
    ],
)
def test_split_heads_diagnoses_mistakes(wrong, match):
    with pytest.raises(ExerciseError, match=match):
        check_split_heads(wrong)


def test_kv_head_repetition_accepts_the_reference():
    assert check_kv_head_repetition(lambda x, n: x.repeat_interleave(n, dim=1))


@pytest.mark.parametrize(
    ("wrong", "match"),
    [
        (lambda x, n: x.repeat(1, n, 1, 1), "tiled"),
        (lambda x, n: x.repeat_interleave(n, dim=2), "has shape"),
    ],
)
def test_kv_head_repetition_diagnoses_mistakes(wrong, match):
    with pytest.raises(ExerciseError, match=match):
        check_kv_head_repetition(wrong)
