"""Checkers for the exercises of chapter 7 (pages 7.1, 7.3 and 7.4), numbered per page.

Each checker runs the reader's function on seeded inputs, compares it with a reference,
and names the typical mistake when it recognises one: spans appended instead of put
back, sentinels left in the text, spans given to the wrong sentinel; a min-p threshold
on the logits, or not scaled by the top probability, probabilities returned instead of
logits, removed tokens at 0 instead of -inf; the total-variation distance without its
1/2, an off-by-one in the geometric series, 0/0 when the two models agree; in MLA's
decoupled RoPE scores, a key left unrotated, queries rotated from position 0 instead of
their own positions, a rotated latent, or a missing content or position term.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable

import torch
from einops import einsum
from torch.nn.utils.rnn import pad_sequence

from lib.exercises._common import (
    ExerciseError,
    call_without_mutation,
    checker,
    expect_close,
    expect_number,
    expect_tensor,
    is_close,
)
from lib.objectives import IGNORE_INDEX, span_corruption_batch
from lib.positions import rope_frequencies, rope_rotate_half

__all__ = [
    "check_restore_spans",
    "check_min_p_filter",
    "check_speculation_rate",
    "rope_at",
    "check_decoupled_rope_scores",
]


# -- Exercise 1 of page 7.3 ------------------------------------------------------------


Example = tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[int]]


def _span_examples() -> list[Example]:
    """(original, inputs, targets, sentinel_ids) for rows of several lengths."""
    gen = torch.Generator().manual_seed(7)
    pad_id, sentinel_ids = 99, list(range(100, 140))
    lengths = [2, 3, 9, 20, 57, 120]
    rows = [torch.randint(0, 50, (n,), generator=gen) for n in lengths]
    batch = pad_sequence(rows, batch_first=True, padding_value=pad_id)
    corrupted = span_corruption_batch(
        batch,
        sentinel_ids=sentinel_ids,
        pad_id=pad_id,
        vocab_size=140,  # the ids 0..49, pad 99 and the sentinels 100..139
        generator=gen,
    )
    examples = []
    for row, inputs, targets in zip(rows, corrupted.inputs, corrupted.targets):
        inputs = inputs[inputs != pad_id]
        targets = targets[targets != IGNORE_INDEX]
        examples.append((row, inputs, targets, sentinel_ids))
    return examples


def _spans_of(targets: torch.Tensor, sentinels: set[int]) -> list[list[int]]:
    spans: list[list[int]] = []
    for token in targets.tolist():
        if token in sentinels:
            spans.append([])
        else:
            spans[-1].append(token)
    return spans[:-1]  # the final sentinel opens no span


@checker("Exercise 1 (page 7.3): undo span corruption")
def check_restore_spans(restore: Callable[..., torch.Tensor]) -> None:
    """``restore(inputs, targets, sentinel_ids)``: 1-D ``(in_len,)`` and ``(out_len,)``
    ids of one example, no padding, no eos -> the original ids ``(seq,)``."""
    for original, inputs, targets, sentinel_ids in _span_examples():
        what = f"restore_spans on a sequence of {len(original)} tokens"
        got = call_without_mutation(restore, inputs, targets, sentinel_ids)
        if isinstance(got, list):
            raise ExerciseError(f"{what} returned a list; return a 1-D torch.Tensor")
        if isinstance(got, torch.Tensor) and got.dim() == 1:
            if got.is_floating_point():
                message = f"returned dtype {got.dtype}; ids are integers"
                raise ExerciseError(f"{what} {message}")
            sentinels = set(sentinel_ids)
            left = sorted(sentinels & set(got.tolist()))
            if left:
                raise ExerciseError(
                    f"{what}: the result still holds sentinel ids {left}; each "
                    "sentinel in the input stands for its span, and the sentinels of "
                    "the target only mark where a span starts: none belongs in the "
                    "restored text"
                )
        expect_tensor(got, (len(original),), what)
        if torch.equal(got.long(), original):
            continue
        spans = _spans_of(targets, sentinels)
        kept = [t for t in inputs.tolist() if t not in sentinels]
        appended = kept + [t for span in spans for t in span]
        if got.tolist() == appended:
            raise ExerciseError(
                f"{what}: the spans were appended after the kept tokens; put each span "
                "back where its sentinel stands in the input"
            )
        if Counter(got.tolist()) == Counter(original.tolist()):
            raise ExerciseError(
                f"{what}: the right tokens in the wrong order. Span i is the run of "
                "tokens after sentinel i in the target (sentinel_0 span_0 sentinel_1 "
                "span_1 ...), and it replaces sentinel i in the input"
            )
        expected = original.tolist()
        raise ExerciseError(f"{what} is wrong: expected {expected}, got {got.tolist()}")


# -- Exercise 1 of page 7.4 ------------------------------------------------------------


def _min_p_reference(logits: torch.Tensor, min_p: float) -> torch.Tensor:
    probs = logits.softmax(dim=-1)
    threshold = min_p * probs.amax(dim=-1, keepdim=True)
    return logits.masked_fill(probs < threshold, float("-inf"))


def _same_logits(got: torch.Tensor, want: torch.Tensor) -> bool:
    if got.shape != want.shape or not torch.equal(got.isneginf(), want.isneginf()):
        return False
    finite = want.isfinite()
    return bool(torch.allclose(got[finite].double(), want[finite].double(), atol=1e-5))


@checker("Exercise 1 (page 7.4): min-p filtering")
def check_min_p_filter(min_p_filter: Callable[..., torch.Tensor]) -> None:
    """``min_p_filter(logits, min_p)``: ``(batch vocab)`` -> ``(batch vocab)`` with the
    tokens whose probability is below ``min_p`` times the row's largest at -inf."""
    gen = torch.Generator().manual_seed(3)
    spread = torch.tensor([[0.5], [1.0], [2.0], [4.0]])  # flat to peaked rows
    logits = torch.randn(4, 50, generator=gen) * spread
    logits = logits + 3.0  # all positive: tells a threshold on the logits apart
    for min_p in (0.05, 0.2, 1.0):
        what = f"min_p_filter(logits, {min_p})"
        got = call_without_mutation(min_p_filter, logits, min_p)
        want = _min_p_reference(logits, min_p)
        expect_tensor(got, tuple(logits.shape), what)
        if _same_logits(got, want):
            continue
        probs = logits.softmax(dim=-1)
        if got.is_floating_point() and torch.isnan(got).any():
            raise ExerciseError(
                f"{what} contains NaN; mask the logits with masked_fill(..., -inf) "
                "instead of multiplying them by a 0/1 mask"
            )
        if torch.allclose(got, want.softmax(dim=-1), atol=1e-6):
            raise ExerciseError(
                f"{what} returned probabilities; return the logits, with the removed "
                "tokens at -inf (the sampler applies the softmax)"
            )
        if torch.allclose(got, want.masked_fill(want.isneginf(), 0.0), atol=1e-6):
            raise ExerciseError(
                f"{what}: the removed tokens are 0, not -inf; a logit of 0 is still a "
                "possible token, only -inf gives it probability zero"
            )
        on_logits = logits.amax(dim=-1, keepdim=True) * min_p
        if _same_logits(got, logits.masked_fill(logits < on_logits, float("-inf"))):
            raise ExerciseError(
                f"{what}: the threshold is applied to the logits; min-p compares "
                "probabilities: softmax first, then p < min_p * p_max"
            )
        if _same_logits(got, logits.masked_fill(probs < min_p, float("-inf"))):
            raise ExerciseError(
                f"{what}: the threshold is min_p itself; it must scale with the "
                "confidence: remove tokens with p < min_p * (the row's largest p)"
            )
        keeps = probs >= min_p * probs.amax(dim=-1, keepdim=True)
        if _same_logits(got, logits.masked_fill(keeps, float("-inf"))):
            raise ExerciseError(
                f"{what}: the condition is inverted: keep the tokens with "
                "p >= min_p * p_max and remove the others"
            )
        kept, want_kept = int(got.isfinite().sum()), int(want.isfinite().sum())
        raise ExerciseError(
            f"{what} is wrong: it keeps {kept} tokens, the reference keeps {want_kept}"
        )


# -- Exercise 2 of page 7.4 ------------------------------------------------------------


@checker("Exercise 2 (page 7.4): tokens per target call")
def check_speculation_rate(
    speculation_rate: Callable[[torch.Tensor, torch.Tensor, int], tuple[float, float]],
) -> None:
    """``speculation_rate(p, q, n_draft)``: ``(vocab,)`` twice and an int -> ``(alpha,
    expected tokens per target call)``."""
    gen = torch.Generator().manual_seed(5)
    p = (2 * torch.randn(10, generator=gen, dtype=torch.float64)).softmax(-1)
    q = (2 * torch.randn(10, generator=gen, dtype=torch.float64)).softmax(-1)
    # disjoint supports, and a token that neither model can produce
    disjoint_p = torch.tensor([0.5, 0.5, 0.0, 0.0, 0.0], dtype=torch.float64)
    disjoint_q = torch.tensor([0.0, 0.0, 0.3, 0.7, 0.0], dtype=torch.float64)
    cases = [(p, q, 4, "random p and q"), (p, q, 1, "random p and q")]
    cases += [(disjoint_p, disjoint_q, 3, "p and q with disjoint supports")]
    # sums to 1 exactly, so that alpha is exactly 1
    same = torch.tensor([0.5, 0.25, 0.125, 0.125], dtype=torch.float64)
    cases += [(same, same.clone(), 4, "identical p and q")]
    for p_, q_, n_draft, label in cases:
        what = f"speculation_rate on {label}, n_draft={n_draft}"
        try:
            got = call_without_mutation(speculation_rate, p_, q_, n_draft)
        except ZeroDivisionError:
            raise ExerciseError(
                f"{what}: division by zero. With alpha = 1 (the models agree), "
                "(1 - alpha^(n+1)) / (1 - alpha) is 0/0: every proposal is accepted "
                "and a call yields n_draft + 1 tokens; handle that case (or sum the "
                "series)"
            ) from None
        if not isinstance(got, (tuple, list)) or len(got) != 2:
            raise ExerciseError(f"{what} should return a pair (alpha, expected_tokens)")
        alpha = expect_number(got[0], "alpha")
        tokens = expect_number(got[1], "the expected number of tokens")
        want_alpha = torch.minimum(p_, q_).sum().item()
        want_tokens = sum(want_alpha**i for i in range(n_draft + 1))

        if math.isnan(alpha):
            raise ExerciseError(
                f"{what}: alpha is NaN; p/q divides 0 by 0 where both are zero. "
                "Note q(x) min(1, p(x)/q(x)) = min(q(x), p(x)): no division needed"
            )
        if not math.isclose(alpha, want_alpha, rel_tol=1e-6, abs_tol=1e-9):
            total_variation = 0.5 * (p_ - q_).abs().sum().item()
            if math.isclose(alpha, 1 - 2 * total_variation, abs_tol=1e-9):
                raise ExerciseError(
                    f"{what}: alpha = 1 - sum|p - q| misses a factor 1/2: the "
                    "total-variation distance is (1/2) sum|p - q|, and alpha = "
                    "1 - TV = sum min(p, q)"
                )
            ratio = (p_ / q_).clamp(max=1.0)
            if math.isclose(alpha, ratio[q_ > 0].mean().item(), abs_tol=1e-9):
                raise ExerciseError(
                    f"{what}: alpha is the plain mean of min(1, p/q); the proposal is "
                    "drawn from q, so weight each token by q(x): "
                    "sum q(x) min(1, p(x)/q(x))"
                )
            got_want = f"alpha = {alpha:.6g}, expected {want_alpha:.6g}"
            raise ExerciseError(f"{what}: {got_want}")

        if math.isnan(tokens) or math.isinf(tokens):
            raise ExerciseError(
                f"{what}: the expected number of tokens is {tokens}; with alpha = 1 "
                "(the models agree) (1 - alpha^(n+1)) / (1 - alpha) is 0/0: every "
                "proposal is accepted and a call yields n_draft + 1 tokens"
            )
        if not math.isclose(tokens, want_tokens, rel_tol=1e-6, abs_tol=1e-9):
            if math.isclose(tokens, want_tokens - want_alpha**n_draft, abs_tol=1e-9):
                raise ExerciseError(
                    f"{what}: one term short: a call yields between 1 and n_draft + 1 "
                    "tokens, so the series runs over alpha^0 .. alpha^n_draft"
                )
            if math.isclose(tokens, want_tokens - 1, abs_tol=1e-9):
                raise ExerciseError(
                    f"{what}: this counts the accepted proposals only; every round "
                    "also adds one token of the target's own (the correction or the "
                    "bonus)"
                )
            raise ExerciseError(
                f"{what}: expected tokens = {tokens:.6g}, expected {want_tokens:.6g}"
            )


# -- Exercise 1 of page 7.1: MLA's decoupled RoPE key ------------------------------------------------


def rope_at(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """RoPE (chapter 3's half-split pairs, base 10,000) of ``x`` ``(... seq d)``, row
    ``j`` rotated by the angle of position ``positions[j]`` (``positions`` ``(seq,)``)."""
    angles = positions.double()[:, None] * rope_frequencies(x.shape[-1])
    angles = torch.cat([angles, angles], dim=-1).to(x.dtype)  # (seq d)
    return x * angles.cos() + rope_rotate_half(x) * angles.sin()


def _decoupled_scores(
    q_content, q_rope, latent, k_rope, w_uk, bug: str = ""
) -> torch.Tensor:
    """The reference scores, or those of one typical ``bug``."""
    q_pos, k_pos = q_content.shape[-2], latent.shape[-2]
    q_positions = (
        torch.arange(q_pos)
        if bug == "from_zero"
        else torch.arange(k_pos - q_pos, k_pos)
    )
    if bug == "rotated_latent":
        latent = rope_at(latent, torch.arange(k_pos))
    q_latent = einsum(q_content, w_uk, "b h q d, h d c -> b h q c")
    content = einsum(q_latent, latent, "b h q c, b k c -> b h q k")
    key = k_rope if bug == "unrotated_key" else rope_at(k_rope, torch.arange(k_pos))
    position = einsum(rope_at(q_rope, q_positions), key, "b h q r, b k r -> b h q k")
    if bug == "no_position":
        return content
    if bug == "no_content":
        return position
    return content + position


@checker("Exercise 1 (page 7.1): MLA's decoupled RoPE key")
def check_decoupled_rope_scores(scores: Callable[..., torch.Tensor]) -> None:
    """``scores(q_content, q_rope, latent, k_rope, w_uk)`` -> ``(batch heads q_pos
    k_pos)``: each head's content score read from the latents (``W_UK`` folded into the
    query) plus the score of its RoPE query against the one shared RoPE key, both
    rotated at their own positions (the queries are the last ``q_pos`` of the ``k_pos``
    positions)."""
    gen = torch.Generator().manual_seed(0)
    for batch, heads, q_pos, k_pos in [(2, 3, 5, 5), (1, 2, 1, 7), (2, 2, 3, 9)]:
        d_head, d_latent, d_rope = 4, 6, 4
        inputs = (
            torch.randn(batch, heads, q_pos, d_head, generator=gen),
            torch.randn(batch, heads, q_pos, d_rope, generator=gen),
            torch.randn(batch, k_pos, d_latent, generator=gen),
            torch.randn(batch, k_pos, d_rope, generator=gen),
            torch.randn(heads, d_head, d_latent, generator=gen),
        )
        what = f"scores with {q_pos} queries over {k_pos} positions"
        got = call_without_mutation(scores, *inputs)
        want = _decoupled_scores(*inputs)
        expect_tensor(got, tuple(want.shape), what)
        if is_close(got, want):
            continue
        mistakes = [
            ("unrotated_key", "the shared RoPE key must be rotated at its own position "
             "too (rope_at(k_rope, positions of the keys))"),
            ("from_zero", "the queries are the last q_pos positions (k_pos - q_pos .. "
             "k_pos - 1), not 0 .. q_pos - 1: a decoding step's one query stands at the "
             "end"),
            ("rotated_latent", "the latent is not rotated: RoPE sits only on the decoupled "
             "part, so that W_UK can still fold into the query"),
            ("no_position", "the position term is missing: add the score of the rotated "
             "RoPE query against the rotated shared key"),
            ("no_content", "the content term is missing: add (W_UKᵀ q) · c, the query "
             "folded through W_UK against the latents"),
        ]  # fmt: skip
        for bug, message in mistakes:
            if is_close(got, _decoupled_scores(*inputs, bug=bug)):
                raise ExerciseError(f"{what}: {message}")
        expect_close(got, want, what)
