"""The checkers of chapter 2 accept the reference answers and diagnose typical mistakes."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from lib.exercises._common import ExerciseError
from lib.exercises.embeddings import (
    check_embedding_backward,
    check_expected_initial_loss,
    check_rows_updated,
    check_seq2seq_embedding_params,
)

# --- Exercise 1 -----------------------------------------------------------------------------


def backward_reference(token_ids, grad_output, vocab_size, padding_idx):
    d_model = grad_output.shape[-1]
    grad = torch.zeros(vocab_size, d_model, dtype=grad_output.dtype)
    grad.index_add_(0, token_ids.flatten(), grad_output.reshape(-1, d_model))
    if padding_idx is not None:
        grad[padding_idx] = 0
    return grad


def backward_assigned(token_ids, grad_output, vocab_size, padding_idx):
    d_model = grad_output.shape[-1]
    grad = torch.zeros(vocab_size, d_model, dtype=grad_output.dtype)
    grad[token_ids.flatten()] += grad_output.reshape(
        -1, d_model
    )  # repeated ids: one wins
    if padding_idx is not None:
        grad[padding_idx] = 0
    return grad


def backward_with_padding(token_ids, grad_output, vocab_size, padding_idx):
    return backward_reference(token_ids, grad_output, vocab_size, None)


def backward_averaged(token_ids, grad_output, vocab_size, padding_idx):
    counts = torch.bincount(token_ids.flatten(), minlength=vocab_size).clamp(min=1)
    return (
        backward_reference(token_ids, grad_output, vocab_size, padding_idx)
        / counts[:, None]
    )


def backward_in_place(token_ids, grad_output, vocab_size, padding_idx):
    grad = backward_reference(token_ids, grad_output, vocab_size, padding_idx)
    grad_output.zero_()
    return grad


def test_embedding_backward_accepts_the_reference(capsys):
    assert check_embedding_backward(backward_reference) is True
    assert "all checks passed" in capsys.readouterr().out


def test_embedding_backward_reports_not_attempted(capsys):
    def stub(token_ids, grad_output, vocab_size, padding_idx):
        raise NotImplementedError

    assert check_embedding_backward(stub) is None
    assert "Exercise 1 not attempted yet" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("wrong", "match"),
    [
        (backward_assigned, r"one position's gradient.*index_add_"),
        (backward_with_padding, "padding row 0 received a gradient"),
        (backward_averaged, "averaged"),
        (backward_in_place, "modified its input"),
        (lambda ids, g, v, p: backward_reference(ids, g, v, p).T, r"the table's shape"),
    ],
)
def test_embedding_backward_diagnoses_typical_mistakes(wrong, match):
    with pytest.raises(ExerciseError, match=match):
        check_embedding_backward(wrong)


# --- Exercise 2 -----------------------------------------------------------------------------


def rows_reference(probs, n_tokens):
    return float((-torch.expm1(n_tokens * torch.log1p(-probs))).sum())


def test_rows_updated_accepts_the_reference_and_the_plain_formula():
    assert check_rows_updated(rows_reference) is True
    assert check_rows_updated(lambda p, n: (1 - (1 - p) ** n).sum()) is True


@pytest.mark.parametrize(
    ("wrong", "match"),
    [
        (lambda p, n: ((1 - p) ** n).sum().item(), "get \\*no\\* gradient"),
        (lambda p, n: (n * p).clamp(max=1).sum().item(), r"min\(1, n p_i\)"),
        (lambda p, n: len(p) * (1 - (1 - 1 / len(p)) ** n), "equally likely"),
        (lambda p, n: float(n), "counts positions"),
        (lambda p, n: "3", "should be a number"),
    ],
)
def test_rows_updated_diagnoses_typical_mistakes(wrong, match):
    with pytest.raises(ExerciseError, match=match):
        check_rows_updated(wrong)


# --- Exercise 3 -----------------------------------------------------------------------------


def seq2seq_reference(src_vocab, tgt_vocab, d_model, sharing):
    if sharing == "none":
        return (src_vocab + 2 * tgt_vocab) * d_model
    if sharing == "decoder":
        return (src_vocab + tgt_vocab) * d_model
    if src_vocab != tgt_vocab:
        raise ValueError("joint vocabulary needed")
    return tgt_vocab * d_model


def test_seq2seq_accepts_the_reference():
    assert check_seq2seq_embedding_params(seq2seq_reference) is True


def test_seq2seq_rejects_a_forgotten_output_layer():
    def wrong(src_vocab, tgt_vocab, d_model, sharing):
        if sharing == "none":
            return (src_vocab + tgt_vocab) * d_model
        return seq2seq_reference(src_vocab, tgt_vocab, d_model, sharing)

    with pytest.raises(ExerciseError, match="three matrices"):
        check_seq2seq_embedding_params(wrong)


def test_seq2seq_rejects_a_tied_matrix_counted_twice():
    def wrong(src_vocab, tgt_vocab, d_model, sharing):
        if sharing == "decoder":
            return (src_vocab + 2 * tgt_vocab) * d_model
        return seq2seq_reference(src_vocab, tgt_vocab, d_model, sharing)

    with pytest.raises(ExerciseError, match="count it once"):
        check_seq2seq_embedding_params(wrong)


def test_seq2seq_rejects_all_shared_counted_three_times():
    def wrong(src_vocab, tgt_vocab, d_model, sharing):
        if sharing == "all":
            return 3 * tgt_vocab * d_model
        return seq2seq_reference(src_vocab, tgt_vocab, d_model, sharing)

    with pytest.raises(ExerciseError, match="one matrix plays all three roles"):
        check_seq2seq_embedding_params(wrong)


def test_seq2seq_rejects_a_missing_vocabulary_check():
    def wrong(src_vocab, tgt_vocab, d_model, sharing):
        if sharing == "all":
            return tgt_vocab * d_model
        return seq2seq_reference(src_vocab, tgt_vocab, d_model, sharing)

    with pytest.raises(ExerciseError, match="raise a ValueError"):
        check_seq2seq_embedding_params(wrong)


def test_seq2seq_rejects_a_float():
    def wrong(src_vocab, tgt_vocab, d_model, sharing):
        return float(seq2seq_reference(src_vocab, tgt_vocab, d_model, sharing))

    with pytest.raises(ExerciseError, match="return a Python int"):
        check_seq2seq_embedding_params(wrong)


# --- Exercise 4 -----------------------------------------------------------------------------


def expected_initial_loss_reference(vocab_size, logit_std, n_samples=4096):
    logits = logit_std * torch.randn(n_samples, vocab_size, dtype=torch.float64)
    return F.cross_entropy(logits, torch.zeros(n_samples, dtype=torch.long)).item()


def test_expected_initial_loss_accepts_the_reference():
    assert check_expected_initial_loss(expected_initial_loss_reference) is True


def test_expected_initial_loss_leaves_the_global_rng_alone():
    # A correct answer that samples from its own generator: the global RNG must not move,
    # because the checker draws its reference samples inside torch.random.fork_rng().
    def own_generator(vocab_size, logit_std, n_samples=4096):
        gen = torch.Generator().manual_seed(9)
        logits = logit_std * torch.randn(
            n_samples, vocab_size, dtype=torch.float64, generator=gen
        )
        return F.cross_entropy(logits, torch.zeros(n_samples, dtype=torch.long)).item()

    torch.manual_seed(123)
    before = torch.random.get_rng_state()
    assert check_expected_initial_loss(own_generator) is True
    assert torch.equal(torch.random.get_rng_state(), before)


@pytest.mark.parametrize(
    ("wrong", "match"),
    [
        (lambda v, s, n=16: math.log2(v), "log base 2"),
        (lambda v, s, n=16: -math.log(v), "sign is wrong"),
        (lambda v, s, n=16: 1 / v, "probability of the target"),
        (lambda v, s, n=16: math.log(v) + s**2 / 2, "holds only for small sigma"),
        (
            lambda v, s, n=16: math.log(v) - s,
            "can never beat the uniform guess",
        ),
    ],
    ids=["log2", "negative", "probability", "small-sigma-formula", "below-uniform"],
)
def test_expected_initial_loss_diagnoses_typical_mistakes(wrong, match):
    with pytest.raises(ExerciseError, match=match):
        check_expected_initial_loss(wrong)
