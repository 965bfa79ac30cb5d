"""The checkers of chapter 7 accept the reference answers and diagnose mistakes."""

from __future__ import annotations

import pytest
import torch

from lib.exercises._common import ExerciseError
from lib.exercises.families import (
    check_min_p_filter,
    check_restore_spans,
    check_speculation_rate,
)


def _not_attempted(*args):
    raise NotImplementedError


CHECKERS = [check_restore_spans, check_min_p_filter, check_speculation_rate]


@pytest.mark.parametrize("check", CHECKERS)
def test_not_attempted_is_reported_not_raised(check):
    assert check(_not_attempted) is None


# -- Exercise 1: undo span corruption -------------------------------------------------


def _spans(targets, sentinels):
    """{sentinel: the tokens after it in the target}, and the sentinels in order."""
    spans, order, current = {}, [], None
    for token in targets.tolist():
        if token in sentinels:
            current = spans.setdefault(token, [])
            order.append(token)
        elif current is not None:
            current.append(token)
    return spans, order


def restore(inputs, targets, sentinel_ids):
    spans, _ = _spans(targets, set(sentinel_ids))
    out = []
    for token in inputs.tolist():
        out += spans[token] if token in spans else [token]
    return torch.tensor(out)


def restore_keeping_sentinels(inputs, targets, sentinel_ids):
    spans, _ = _spans(targets, set(sentinel_ids))
    out = []
    for token in inputs.tolist():
        out += [token, *spans[token]] if token in spans else [token]
    return torch.tensor(out)


def restore_appending(inputs, targets, sentinel_ids):
    spans, order = _spans(targets, set(sentinel_ids))
    kept = [t for t in inputs.tolist() if t not in spans]
    return torch.tensor(kept + [t for s in order for t in spans[s]])


def restore_popping_from_the_end(inputs, targets, sentinel_ids):
    """Takes the spans last-in first-out (list.pop() instead of list.pop(0))."""
    spans, order = _spans(targets, set(sentinel_ids))
    queue = [spans[s] for s in order[:-1]]  # the final sentinel opens no span
    out = []
    for token in inputs.tolist():
        out += queue.pop() if token in spans else [token]
    return torch.tensor(out)


def restore_as_list(inputs, targets, sentinel_ids):
    return restore(inputs, targets, sentinel_ids).tolist()


def restore_in_place(inputs, targets, sentinel_ids):
    out = restore(inputs, targets, sentinel_ids)
    inputs[0] = -1
    return out


def test_restore_spans_accepts_the_reference():
    assert check_restore_spans(restore)


@pytest.mark.parametrize(
    ("wrong", "match"),
    [
        (restore_keeping_sentinels, "still holds sentinel ids"),
        (restore_appending, "appended after the kept tokens"),
        (restore_popping_from_the_end, "wrong order.*replaces sentinel i"),
        (restore_as_list, "returned a list"),
        (restore_in_place, "modified its input"),
        (lambda i, t, s: restore(i, t, s)[:-1], "has shape"),
        (lambda i, t, s: restore(i, t, s).float(), "dtype torch.float32"),
        (lambda i, t, s: restore(i, t, s).flip(0), "is wrong|wrong order"),
    ],
)
def test_restore_spans_diagnoses_mistakes(wrong, match):
    with pytest.raises(ExerciseError, match=match):
        check_restore_spans(wrong)


# -- Exercise 2: min-p filtering ------------------------------------------------------


def min_p(logits, min_p):
    probs = logits.softmax(dim=-1)
    threshold = min_p * probs.amax(-1, keepdim=True)
    return logits.masked_fill(probs < threshold, float("-inf"))


def test_min_p_filter_accepts_the_reference():
    assert check_min_p_filter(min_p)


def _in_place(logits, p):
    probs = logits.softmax(-1)
    logits[probs < p * probs.amax(-1, keepdim=True)] = float("-inf")
    return logits


@pytest.mark.parametrize(
    ("wrong", "match"),
    [
        (lambda x, p: min_p(x, p).softmax(-1), "returned probabilities"),
        (lambda x, p: min_p(x, p).nan_to_num(neginf=0.0), "are 0, not -inf"),
        (
            lambda x, p: x.masked_fill(x < p * x.amax(-1, keepdim=True), float("-inf")),
            "applied to the logits",
        ),
        (
            lambda x, p: x.masked_fill(x.softmax(-1) < p, float("-inf")),
            "the threshold is min_p itself",
        ),
        (
            lambda x, p: x.masked_fill(
                x.softmax(-1) >= p * x.softmax(-1).amax(-1, keepdim=True), float("-inf")
            ),
            "inverted",
        ),
        (lambda x, p: x * min_p(x, p).isfinite(), "0, not -inf|contains NaN"),
        (
            lambda x, p: x * torch.where(min_p(x, p).isfinite(), 1.0, float("inf")),
            "contains NaN|is wrong",
        ),
        (_in_place, "modified its input"),
        (lambda x, p: min_p(x, p)[:, :-1], "has shape"),
        (lambda x, p: min_p(x, p / 2), "keeps .* tokens, the reference keeps"),
    ],
)
def test_min_p_filter_diagnoses_mistakes(wrong, match):
    with pytest.raises(ExerciseError, match=match):
        check_min_p_filter(wrong)


# -- Exercise 3: tokens per target call -----------------------------------------------


def rate(p, q, n_draft):
    alpha = torch.minimum(p, q).sum().item()
    return alpha, sum(alpha**i for i in range(n_draft + 1))


def rate_closed_form(p, q, n_draft):
    """The closed form of the series, with its alpha = 1 case."""
    alpha = torch.minimum(p, q).sum().item()
    if alpha == 1.0:
        return alpha, n_draft + 1.0
    return alpha, (1 - alpha ** (n_draft + 1)) / (1 - alpha)


def rate_from_alpha(alpha, n_draft):
    return alpha, sum(alpha**i for i in range(n_draft + 1))


def test_speculation_rate_accepts_the_reference_and_the_closed_form():
    assert check_speculation_rate(rate)
    assert check_speculation_rate(rate_closed_form)
    as_tensors = lambda p, q, n: tuple(torch.tensor(v) for v in rate(p, q, n))
    assert check_speculation_rate(as_tensors)


@pytest.mark.parametrize(
    ("wrong", "match"),
    [
        (
            lambda p, q, n: (1 - (p - q).abs().sum().item(), 1.0),
            "misses a factor 1/2",
        ),
        (
            lambda p, q, n: (
                (p / q).clamp(max=1)[q > 0].mean().item(),
                1.0,
            ),
            "plain mean of min\\(1, p/q\\)",
        ),
        (
            lambda p, q, n: (q * (p / q).clamp(max=1)).sum().item(),
            "should return a pair",
        ),
        (
            lambda p, q, n: rate_from_alpha(rate(p, q, n)[0], n - 1),
            "one term short",
        ),
        (
            lambda p, q, n: (rate(p, q, n)[0], rate(p, q, n)[1] - 1),
            "accepted proposals only",
        ),
        (
            lambda p, q, n: (
                rate(p, q, n)[0],
                (1 - rate(p, q, n)[0] ** (n + 1)) / (1 - rate(p, q, n)[0]),
            ),
            "division by zero",
        ),
        (
            lambda p, q, n: (
                rate(p, q, n)[0],
                float(
                    (1 - torch.tensor(rate(p, q, n)[0]) ** (n + 1))
                    / (1 - torch.tensor(rate(p, q, n)[0]))
                ),
            ),
            "0/0",
        ),
        (
            lambda p, q, n: rate_from_alpha((q * (p / q).clamp(max=1)).sum().item(), n),
            "alpha is NaN",
        ),
        (lambda p, q, n: (rate(p, q, n)[0], "many"), "should be a number"),
    ],
)
def test_speculation_rate_diagnoses_mistakes(wrong, match):
    with pytest.raises(ExerciseError, match=match):
        check_speculation_rate(wrong)


# -- Exercise 4: MLA's decoupled RoPE key ------------------------------------------------


def _decoupled(q_content, q_rope, latent, k_rope, w_uk):
    from lib.exercises.families import _decoupled_scores

    return _decoupled_scores(q_content, q_rope, latent, k_rope, w_uk)


def test_decoupled_rope_scores_accepts_the_reference_and_reports_a_stub(capsys):
    from lib.exercises.families import check_decoupled_rope_scores

    assert check_decoupled_rope_scores(_decoupled)

    def stub(*args):
        raise NotImplementedError

    assert check_decoupled_rope_scores(stub) is None
    assert "Exercise 1 (page 7.1)" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("bug", "match"),
    [
        ("unrotated_key", "shared RoPE key must be rotated"),
        ("from_zero", "the queries are the last q_pos positions"),
        ("rotated_latent", "the latent is not rotated"),
        ("no_position", "the position term is missing"),
        ("no_content", "the content term is missing"),
    ],
)
def test_decoupled_rope_scores_names_each_typical_mistake(bug, match):
    from lib.exercises._common import ExerciseError
    from lib.exercises.families import _decoupled_scores, check_decoupled_rope_scores

    def wrong(*inputs):
        return _decoupled_scores(*inputs, bug=bug)

    with pytest.raises(ExerciseError, match=match):
        check_decoupled_rope_scores(wrong)


def test_rope_at_is_chapter_3s_rotation():
    """rope_at agrees with lib.positions.RotaryEmbedding at the same positions."""
    from lib.exercises.families import rope_at
    from lib.positions import RotaryEmbedding

    x = torch.randn(2, 3, 7, 8)
    rotary = RotaryEmbedding(8)
    assert torch.allclose(
        rope_at(x, torch.arange(4, 11)), rotary(x, offset=4), atol=1e-5
    )
