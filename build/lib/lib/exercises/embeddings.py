"""Checkers for the exercises of chapter 2 (embeddings)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from lib.exercises._common import (
    ExerciseError,
    call_without_mutation,
    checker,
    expect_close,
    expect_tensor,
)

__all__ = [
    "check_one_hot_embed",
    "check_seq2seq_embedding_params",
    "check_tied_log_probs",
    "check_expected_initial_loss",
]


def _call_explaining_errors(fn: Callable[..., Any], *args: Any, hints: dict[str, str]) -> Any:
    """Call ``fn`` without letting it mutate its inputs; turn a RuntimeError into a diagnosis.

    ``hints`` maps a lower-case fragment of PyTorch's error message to the advice to give.
    """
    try:
        return call_without_mutation(fn, *args)
    except NotImplementedError:  # a subclass of RuntimeError: "not attempted yet", not a bug
        raise
    except (RuntimeError, IndexError) as err:
        message = str(err).lower()
        advice = next((text for key, text in hints.items() if key in message), hints.get("", ""))
        raise ExerciseError(
            f"your function raised {type(err).__name__}: {err}" + (f". {advice}" if advice else "")
        ) from None


# --- Exercise 1 -----------------------------------------------------------------------------

_ONE_HOT_HINTS = {
    "dtype": "The one-hot and the table must have the same dtype: build the one-hot with "
    ".to(weight.dtype), not .float() (the checker's table is float64).",
    "scalar type": "The one-hot and the table must have the same dtype: build the one-hot with "
    ".to(weight.dtype), not .float() (the checker's table is float64).",
    "": "Check the shapes: the one-hot is (... vocab) with vocab = weight.shape[0] "
    "(pass num_classes=weight.shape[0]) and it multiplies weight (vocab d_model) as it is, "
    "not weight.T.",
}


@checker("Exercise 1: an embedding as a matrix product")
def check_one_hot_embed(
    one_hot_embed: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
) -> None:
    """``one_hot_embed(ids (...), weight (vocab d_model)) -> (... d_model)`` via one-hot @ weight."""
    gen = torch.Generator().manual_seed(2)
    vocab, d_model = 7, 5
    weight = torch.randn(vocab, d_model, dtype=torch.float64, generator=gen)
    # Every id appears, the largest included, some of them twice; leading shape (2, 4).
    ids = torch.tensor([[0, 6, 3, 3], [1, 2, 4, 5]])

    leaf = weight.clone().requires_grad_(True)
    got = _call_explaining_errors(one_hot_embed, ids, leaf, hints=_ONE_HOT_HINTS)
    expect_tensor(got, (2, 4, d_model), "one_hot_embed(ids of shape (2, 4), weight (7, 5))")
    if got.dtype != weight.dtype:
        raise ExerciseError(
            f"the result has dtype {got.dtype}, but the table is {weight.dtype}: make the "
            "one-hot in the table's dtype (.to(weight.dtype)) and do not convert the table"
        )
    expect_close(got, F.embedding(ids, weight), "the embedded vectors", atol=1e-12, rtol=0)

    # Gradients: the one-hot product must route each upstream gradient to its token's row.
    if got.grad_fn is None:
        raise ExerciseError(
            "no gradient reaches weight: do not detach it, copy it with torch.tensor(...) or "
            "compute under torch.no_grad()"
        )
    upstream = torch.randn(2, 4, d_model, dtype=torch.float64, generator=gen)
    (grad,) = torch.autograd.grad(got, leaf, upstream)
    reference = torch.zeros_like(weight).index_add_(0, ids.flatten(), upstream.reshape(-1, d_model))
    expect_close(grad, reference, "the gradient with respect to weight", atol=1e-12, rtol=0)

    # Ids that do not include the largest one: a one-hot sized by the ids, not the table, fails.
    small_ids = torch.tensor([1, 0, 2])
    got = _call_explaining_errors(
        one_hot_embed,
        small_ids,
        weight,
        hints={
            "": "This call's ids do not include the largest id (vocab - 1): size the one-hot "
            "by the table, F.one_hot(ids, num_classes=weight.shape[0])."
        },
    )
    expect_close(got, weight[small_ids], "the result for 1-D ids [1, 0, 2]", atol=1e-12, rtol=0)

    # A square table: the transposed product runs but gives the wrong rows.
    square = torch.randn(6, 6, dtype=torch.float64, generator=gen)
    square_ids = torch.tensor([[[5]], [[2]]])  # shape (2, 1, 1)
    got = _call_explaining_errors(one_hot_embed, square_ids, square, hints=_ONE_HOT_HINTS)
    expect_tensor(got, (2, 1, 1, 6), "the result for ids of shape (2, 1, 1) and a 6x6 table")
    if torch.allclose(got, square.T[square_ids], atol=1e-12) and not torch.allclose(
        got, square[square_ids], atol=1e-12
    ):
        raise ExerciseError(
            "with a square table your function returns columns, not rows: multiply by weight "
            "(vocab d_model), not weight.T"
        )
    expect_close(got, square[square_ids], "the result for a square 6x6 table", atol=1e-12, rtol=0)


# --- Exercise 2 -----------------------------------------------------------------------------


def _seq2seq_reference(src_vocab: int, tgt_vocab: int, d_model: int, sharing: str) -> int:
    if sharing == "none":
        return (src_vocab + 2 * tgt_vocab) * d_model
    if sharing == "decoder":
        return (src_vocab + tgt_vocab) * d_model
    if sharing == "all":
        return tgt_vocab * d_model
    raise ValueError(sharing)


@checker("Exercise 2: embedding parameters of an encoder-decoder")
def check_seq2seq_embedding_params(seq2seq_embedding_params: Callable[..., int]) -> None:
    """``seq2seq_embedding_params(src_vocab, tgt_vocab, d_model, sharing) -> int``."""
    src, tgt, d = 1_000, 3_000, 16  # different sizes, so a swapped vocabulary shows
    diagnoses = {
        "none": {
            (src + tgt) * d: "with sharing='none' there are three matrices: the encoder's "
            "embedding, the decoder's embedding and the output layer (tgt_vocab x d_model)",
            (2 * src + tgt) * d: "the output layer scores target tokens: it has tgt_vocab rows, "
            "not src_vocab",
        },
        "decoder": {
            (src + 2 * tgt) * d: "with sharing='decoder' the decoder's embedding and the output "
            "layer are one matrix: count it once",
            2 * tgt * d: "the encoder keeps its own embedding of src_vocab rows",
            2 * src * d: "the tied decoder matrix has tgt_vocab rows, the encoder's src_vocab",
        },
    }
    for sharing in ("none", "decoder"):
        got = seq2seq_embedding_params(src, tgt, d, sharing)
        want = _seq2seq_reference(src, tgt, d, sharing)
        if isinstance(got, bool) or not isinstance(got, int):
            raise ExerciseError(
                f"return a Python int (a count of parameters), got {type(got).__name__} {got!r}"
            )
        if got != want:
            hint = diagnoses[sharing].get(got, "")
            raise ExerciseError(
                f"seq2seq_embedding_params({src}, {tgt}, {d}, {sharing!r}) returned {got:,}, "
                f"expected {want:,}" + (f": {hint}" if hint else "")
            )

    vocab = 2_000
    got = seq2seq_embedding_params(vocab, vocab, d, "all")
    want = _seq2seq_reference(vocab, vocab, d, "all")
    if got != want:
        hint = (
            "with sharing='all' one matrix plays all three roles: count it once"
            if got in (2 * want, 3 * want)
            else ""
        )
        raise ExerciseError(
            f"seq2seq_embedding_params({vocab}, {vocab}, {d}, 'all') returned {got!r}, "
            f"expected {want:,}" + (f": {hint}" if hint else "")
        )

    try:
        got = seq2seq_embedding_params(src, tgt, d, "all")
    except ValueError:
        pass
    else:
        raise ExerciseError(
            f"sharing='all' with src_vocab={src} != tgt_vocab={tgt} returned {got!r}; one matrix "
            "cannot embed two vocabularies of different sizes, so raise a ValueError"
        )


# --- Exercise 3 -----------------------------------------------------------------------------


@checker("Exercise 3: tied log-probabilities")
def check_tied_log_probs(
    tied_log_probs: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
) -> None:
    """``tied_log_probs(hidden (... d_model), weight (vocab d_model)) -> (... vocab)``."""
    gen = torch.Generator().manual_seed(3)
    vocab, d_model = 6, 4
    hidden = torch.randn(2, 3, d_model, dtype=torch.float64, generator=gen)
    weight = torch.randn(vocab, d_model, dtype=torch.float64, generator=gen)
    logits = hidden @ weight.T
    want = F.log_softmax(logits, dim=-1)

    got = _call_explaining_errors(
        tied_log_probs,
        hidden,
        weight,
        hints={
            "": "hidden is (... d_model) and weight (vocab d_model): the logits are "
            "hidden @ weight.T, or einsum(hidden, weight, '... d_model, vocab d_model -> ... vocab')"
        },
    )
    expect_tensor(got, (2, 3, vocab), "tied_log_probs(hidden (2, 3, 4), weight (6, 4))")
    got = got.double()
    close = lambda a, b: torch.allclose(a, b, atol=1e-6)
    if close(got, logits):
        raise ExerciseError("you returned the raw logits: normalise them with F.log_softmax")
    if close(got, logits.softmax(-1)):
        raise ExerciseError(
            "you returned probabilities; the task asks for log-probabilities (F.log_softmax)"
        )
    if close(got, F.log_softmax(logits.softmax(-1), dim=-1)) or close(
        got, logits.softmax(-1).softmax(-1).log()
    ):
        raise ExerciseError(
            "the softmax was applied twice: log_softmax already includes one; apply it to the "
            "logits themselves"
        )
    if close(got, F.log_softmax(logits, dim=0)) or close(got, F.log_softmax(logits, dim=1)):
        raise ExerciseError("normalise over the vocabulary, the last axis (dim=-1)")
    expect_close(got, want, "the log-probabilities", atol=1e-6)

    # Confident logits: log(softmax(x)) underflows to -inf, log_softmax does not.
    big = _call_explaining_errors(tied_log_probs, 1000 * hidden, weight, hints={})
    if not torch.isfinite(big).all():
        raise ExerciseError(
            "with large logits some log-probabilities are -inf or NaN: log(softmax(x)) underflows; "
            "use F.log_softmax, which subtracts the maximum first"
        )
    expect_close(
        big.double(),
        F.log_softmax(1000 * logits, dim=-1),
        "the log-probabilities for large logits",
        atol=1e-6,
    )


# --- Exercise 4 -----------------------------------------------------------------------------


def _as_float(value: Any, what: str) -> float:
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return float(value.item())
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    raise ExerciseError(f"{what} should be a number, got {type(value).__name__} {value!r}")


@checker("Exercise 4: the loss of random logits")
def check_expected_initial_loss(expected_initial_loss: Callable[..., float]) -> None:
    """``expected_initial_loss(vocab_size, logit_std, n_samples) -> float`` (nats)."""
    for vocab in (65, 50_257):
        got = _as_float(expected_initial_loss(vocab, 0.0, 16), f"the loss for |V|={vocab}")
        want = math.log(vocab)
        if abs(got - want) > 1e-6:
            hints = {
                math.log2(vocab): "that is log base 2: cross-entropy in PyTorch is in nats (ln)",
                math.log10(vocab): "that is log base 10: cross-entropy in PyTorch is in nats (ln)",
                -want: "the sign is wrong: the loss is -log p(target), a positive number",
                1 / vocab: "that is the probability of the target; the loss is -ln of it",
            }
            hint = next((h for v, h in hints.items() if abs(got - v) < 1e-6), "")
            raise ExerciseError(
                f"with logit_std=0 every token has probability 1/{vocab}, so the loss is "
                f"ln {vocab} = {want:.6f}; you returned {got:.6f}" + (f" ({hint})" if hint else "")
            )

    # Monte Carlo against a larger reference sample; the tolerance is several standard errors.
    with torch.random.fork_rng():
        torch.manual_seed(4)
        for logit_std, tolerance in ((1.0, 0.05), (4.0, 0.25)):
            logits = logit_std * torch.randn(40_000, 65, dtype=torch.float64)
            want = (torch.logsumexp(logits, dim=-1) - logits[:, 0]).mean().item()
            got = _as_float(
                expected_initial_loss(65, logit_std, 20_000),
                f"the loss for logit_std={logit_std}",
            )
            if got < math.log(65) - tolerance:
                raise ExerciseError(
                    f"for logit_std={logit_std} you return {got:.3f} nats, below ln 65 = "
                    f"{math.log(65):.3f}; random logits can never beat the uniform guess on "
                    "average (Jensen's inequality), check the sign and the log"
                )
            if abs(got - want) > tolerance:
                approx = math.log(65) + logit_std**2 / 2
                hint = (
                    "; the expansion ln|V| + sigma^2/2 holds only for small sigma: sample logits "
                    "instead"
                    if abs(got - approx) < 1e-6
                    else ""
                )
                raise ExerciseError(
                    f"for logit_std={logit_std} you return {got:.3f} nats, expected about "
                    f"{want:.3f} (within {tolerance}){hint}"
                )
