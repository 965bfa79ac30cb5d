"""Checkers for the exercises of chapter 2 (embeddings).

Each checker compares the reader's answer with a reference written here and, when they
differ, tries the usual wrong answers (a gradient assigned instead of accumulated, the
padding row forgotten, probabilities of a row never drawn added instead of multiplied, a
matrix counted twice) to say which one was made.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

from lib.exercises._common import (
    ExerciseError,
    call_without_mutation,
    checker,
    expect_close,
    expect_number,
    expect_tensor,
)

__all__ = [
    "check_embedding_backward",
    "check_rows_updated",
    "check_seq2seq_embedding_params",
    "check_expected_initial_loss",
]


# --- Exercise 1 -----------------------------------------------------------------------------
def _embedding_grad(
    token_ids: torch.Tensor,
    grad_output: torch.Tensor,
    vocab_size: int,
    padding_idx: int | None,
) -> torch.Tensor:
    """The reference: autograd through ``F.embedding``."""
    weight = torch.zeros(vocab_size, grad_output.shape[-1], dtype=grad_output.dtype)
    weight.requires_grad_(True)
    F.embedding(token_ids, weight, padding_idx=padding_idx).backward(grad_output)
    return weight.grad


def _assigned(token_ids, grad_output, vocab_size, padding_idx, d_model) -> torch.Tensor:
    """``grad[ids] = g``: each row keeps one of its positions' gradients."""
    grad = torch.zeros(vocab_size, d_model, dtype=grad_output.dtype)
    grad[token_ids.flatten()] = grad_output.reshape(-1, d_model)
    if padding_idx is not None:
        grad[padding_idx] = 0
    return grad


@checker("Exercise 1: the embedding's gradient by hand")
def check_embedding_backward(backward: Callable[..., torch.Tensor]) -> None:
    """``backward(token_ids, grad_output, vocab_size, padding_idx) -> (vocab d_model)``."""
    generator = torch.Generator().manual_seed(1)
    cases = [
        (
            torch.tensor([[3, 1, 3], [0, 5, 3]]),
            6,
            None,
        ),  # token 3 three times, 2 and 4 never
        (torch.tensor([[3, 1, 3], [0, 5, 3]]), 6, 0),  # 0 is padding
        (torch.tensor([4, 4, 4, 4]), 5, None),
        (torch.randint(0, 50, (4, 16), generator=generator), 50, 7),
        (torch.randint(0, 9, (2, 3, 5), generator=generator), 9, None),
    ]
    for token_ids, vocab_size, padding_idx in cases:
        d_model = 4
        shape = (*token_ids.shape, d_model)
        grad_output = torch.randn(shape, generator=generator, dtype=torch.float64)
        call = f"backward(ids of shape {tuple(token_ids.shape)}, ..., {vocab_size}, {padding_idx})"
        got = call_without_mutation(
            backward, token_ids, grad_output, vocab_size, padding_idx
        )
        want = _embedding_grad(token_ids, grad_output, vocab_size, padding_idx)
        if isinstance(got, torch.Tensor) and tuple(got.shape) == (d_model, vocab_size):
            raise ExerciseError(
                f"{call} has shape {tuple(got.shape)}: the gradient of the table has the "
                f"table's shape (vocab d_model) = {(vocab_size, d_model)}"
            )
        expect_tensor(got, (vocab_size, d_model), call)
        if torch.allclose(got.double(), want, atol=1e-9):
            continue
        _diagnose_backward(
            got, want, token_ids, grad_output, vocab_size, padding_idx, call
        )


def _diagnose_backward(
    got, want, token_ids, grad_output, vocab_size, padding_idx, call
):
    d_model = grad_output.shape[-1]
    got = got.double()
    assigned = _assigned(token_ids, grad_output, vocab_size, padding_idx, d_model)
    if torch.allclose(got, assigned, atol=1e-9):
        raise ExerciseError(
            f"{call}: rows of tokens that occur several times hold one position's gradient, "
            "not the sum of all of them. Indexed assignment (grad[ids] = g, or grad[ids] += g) "
            "keeps one value per repeated index; accumulate with grad.index_add_(0, ids, g)"
        )
    counts = torch.bincount(token_ids.flatten(), minlength=vocab_size).clamp(min=1)
    if torch.allclose(got, want / counts[:, None].double(), atol=1e-9):
        raise ExerciseError(
            f"{call}: you averaged the gradients of a token's positions; the lookup copies "
            "the row to every position, so its gradient is their sum"
        )
    if padding_idx is not None:
        unpadded = _embedding_grad(token_ids, grad_output, vocab_size, None)
        if torch.allclose(got, unpadded, atol=1e-9):
            raise ExerciseError(
                f"{call}: the padding row {padding_idx} received a gradient; the padding "
                "row never does (it stays at its initial zero), so zero that row"
            )
    expect_close(got, want, call, atol=1e-9)


# --- Exercise 2 -----------------------------------------------------------------------------


@checker("Exercise 2: the rows a batch updates")
def check_rows_updated(rows_updated: Callable[[torch.Tensor, int], float]) -> None:
    """``rows_updated(probs (vocab), n_tokens) -> float``: expected distinct tokens drawn."""
    generator = torch.Generator().manual_seed(2)
    zipf = 1 / torch.arange(1, 50_258, dtype=torch.float64)
    cases = [
        (torch.full((4,), 0.25, dtype=torch.float64), 1),
        (torch.tensor([0.5, 0.5, 0.0], dtype=torch.float64), 10),
        (torch.tensor([0.7, 0.2, 0.1], dtype=torch.float64), 3),
        (zipf / zipf.sum(), 8_192),
        (zipf / zipf.sum(), 1),
    ]
    for _ in range(4):
        alpha = torch.rand(200, generator=generator, dtype=torch.float64) * 2
        probs = torch.distributions.Dirichlet(alpha + 0.05).sample()
        cases.append(
            (probs / probs.sum(), int(torch.randint(1, 500, (1,), generator=generator)))
        )
    for probs, n_tokens in cases:
        call = f"rows_updated(probs over {len(probs)} tokens, n_tokens={n_tokens})"
        got = expect_number(call_without_mutation(rows_updated, probs, n_tokens), call)
        never = torch.exp(n_tokens * torch.log1p(-probs))  # P(no draw is token i)
        want = float((1 - never).sum())
        if math.isclose(got, want, rel_tol=1e-6, abs_tol=1e-9):
            continue
        where = f"{call} returned {got:.6g}, expected {want:.6g}"
        vocab = len(probs)
        wrong = {
            "never": float(never.sum()),
            "capped": float((n_tokens * probs).clamp(max=1).sum()),
            "uniform": vocab * (1 - (1 - 1 / vocab) ** n_tokens),
            "occurrences": float(n_tokens),
        }
        if math.isclose(got, wrong["never"], rel_tol=1e-6):
            raise ExerciseError(
                f"{where}: that is the expected number of rows that get *no* gradient, "
                "sum_i (1 - p_i)^n; subtract each term from 1"
            )
        if math.isclose(got, wrong["capped"], rel_tol=1e-6):
            raise ExerciseError(
                f"{where}: min(1, n p_i) is not a probability of being drawn at least once; "
                "a token is missed by all n draws with probability (1 - p_i)^n"
            )
        if math.isclose(got, wrong["uniform"], rel_tol=1e-6) and not math.isclose(
            wrong["uniform"], want, rel_tol=1e-6
        ):
            raise ExerciseError(
                f"{where}: you assumed every token equally likely; use each token's own p_i"
            )
        if math.isclose(got, wrong["occurrences"], rel_tol=1e-9):
            raise ExerciseError(
                f"{where}: that counts positions, not distinct rows; a row drawn twice is "
                "still one row"
            )
        raise ExerciseError(where)


# --- Exercise 3 -----------------------------------------------------------------------------


def _seq2seq_reference(
    src_vocab: int, tgt_vocab: int, d_model: int, sharing: str
) -> int:
    if sharing == "none":
        return (src_vocab + 2 * tgt_vocab) * d_model
    if sharing == "decoder":
        return (src_vocab + tgt_vocab) * d_model
    if sharing == "all":
        return tgt_vocab * d_model
    raise ValueError(sharing)


@checker("Exercise 3: embedding parameters of an encoder-decoder")
def check_seq2seq_embedding_params(
    seq2seq_embedding_params: Callable[..., int],
) -> None:
    """``seq2seq_embedding_params(src_vocab, tgt_vocab, d_model, sharing) -> int``."""
    src, tgt, d = 1_000, 3_000, 16  # different sizes, so a swapped vocabulary shows
    diagnoses = {
        "none": {
            (src + tgt)
            * d: "with sharing='none' there are three matrices: the encoder's "
            "embedding, the decoder's embedding and the output layer (tgt_vocab x d_model)",
            (2 * src + tgt)
            * d: "the output layer scores target tokens: it has tgt_vocab rows, "
            "not src_vocab",
        },
        "decoder": {
            (src + 2 * tgt)
            * d: "with sharing='decoder' the decoder's embedding and the output "
            "layer are one matrix: count it once",
            2 * tgt * d: "the encoder keeps its own embedding of src_vocab rows",
            2
            * src
            * d: "the tied decoder matrix has tgt_vocab rows, the encoder's src_vocab",
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


# --- Exercise 4 -----------------------------------------------------------------------------


@checker("Exercise 4: the loss of random logits")
def check_expected_initial_loss(expected_initial_loss: Callable[..., float]) -> None:
    """``expected_initial_loss(vocab_size, logit_std, n_samples) -> float`` (nats)."""
    for vocab in (65, 50_257):
        got = expect_number(
            expected_initial_loss(vocab, 0.0, 16), f"the loss for |V|={vocab}"
        )
        want = math.log(vocab)
        if abs(got - want) > 1e-6:
            hints = {
                math.log2(
                    vocab
                ): "that is log base 2: cross-entropy in PyTorch is in nats (ln)",
                math.log10(
                    vocab
                ): "that is log base 10: cross-entropy in PyTorch is in nats (ln)",
                -want: "the sign is wrong: the loss is -log p(target), a positive number",
                1
                / vocab: "that is the probability of the target; the loss is -ln of it",
            }
            hint = next((h for v, h in hints.items() if abs(got - v) < 1e-6), "")
            raise ExerciseError(
                f"with logit_std=0 every token has probability 1/{vocab}, so the loss is "
                f"ln {vocab} = {want:.6f}; you returned {got:.6f}"
                + (f" ({hint})" if hint else "")
            )

    # Monte Carlo against a larger reference sample; the tolerance is several standard errors.
    with torch.random.fork_rng():
        torch.manual_seed(4)
        for logit_std, tolerance in ((1.0, 0.05), (4.0, 0.25)):
            logits = logit_std * torch.randn(40_000, 65, dtype=torch.float64)
            want = (torch.logsumexp(logits, dim=-1) - logits[:, 0]).mean().item()
            got = expect_number(
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
