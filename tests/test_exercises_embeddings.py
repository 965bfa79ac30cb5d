"""The checkers of chapter 2 accept the reference answers and diagnose typical mistakes."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from einops import einsum

from lib.exercises._common import ExerciseError
from lib.exercises.embeddings import (
    check_expected_initial_loss,
    check_one_hot_embed,
    check_seq2seq_embedding_params,
    check_tied_log_probs,
)

# --- Exercise 1 -----------------------------------------------------------------------------


def one_hot_embed_reference(token_ids, weight):
    one_hot = F.one_hot(token_ids, weight.shape[0]).to(weight.dtype)
    return einsum(one_hot, weight, "... vocab, vocab d_model -> ... d_model")


def test_one_hot_embed_accepts_the_reference():
    assert check_one_hot_embed(one_hot_embed_reference) is True


def test_one_hot_embed_reports_not_attempted():
    def stub(token_ids, weight):
        raise NotImplementedError

    assert check_one_hot_embed(stub) is False


def test_one_hot_embed_rejects_a_float32_one_hot():
    def wrong(token_ids, weight):
        return F.one_hot(token_ids, weight.shape[0]).float() @ weight

    with pytest.raises(ExerciseError, match=r"same dtype.*\.to\(weight\.dtype\)"):
        check_one_hot_embed(wrong)


def test_one_hot_embed_rejects_a_converted_table():
    def wrong(token_ids, weight):
        return F.one_hot(token_ids, weight.shape[0]).float() @ weight.float()

    with pytest.raises(ExerciseError, match="dtype torch.float32, but the table is torch.float64"):
        check_one_hot_embed(wrong)


def test_one_hot_embed_rejects_a_transposed_table():
    def wrong(token_ids, weight):
        return F.one_hot(token_ids, weight.shape[1]).to(weight.dtype) @ weight.T

    with pytest.raises(ExerciseError, match=r"not weight\.T"):
        check_one_hot_embed(wrong)


def test_one_hot_embed_rejects_a_one_hot_sized_by_the_ids():
    def wrong(token_ids, weight):
        return F.one_hot(token_ids).to(weight.dtype) @ weight  # no num_classes

    with pytest.raises(ExerciseError, match=r"num_classes=weight\.shape\[0\]"):
        check_one_hot_embed(wrong)


def test_one_hot_embed_rejects_a_detached_result():
    def wrong(token_ids, weight):
        return one_hot_embed_reference(token_ids, weight.detach())

    with pytest.raises(ExerciseError, match="no gradient reaches weight"):
        check_one_hot_embed(wrong)


def test_one_hot_embed_rejects_an_in_place_change():
    def wrong(token_ids, weight):
        token_ids.clamp_(max=weight.shape[0] - 1)
        token_ids += 0
        out = one_hot_embed_reference(token_ids, weight)
        token_ids[...] = 0
        return out

    with pytest.raises(ExerciseError, match="modified its input"):
        check_one_hot_embed(wrong)


# --- Exercise 2 -----------------------------------------------------------------------------


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


# --- Exercise 3 -----------------------------------------------------------------------------


def tied_log_probs_reference(hidden, weight):
    return F.log_softmax(einsum(hidden, weight, "... d, vocab d -> ... vocab"), dim=-1)


def test_tied_log_probs_accepts_the_reference():
    assert check_tied_log_probs(tied_log_probs_reference) is True


@pytest.mark.parametrize(
    ("wrong", "match"),
    [
        (lambda h, w: F.log_softmax(h @ w, dim=-1), r"hidden @ weight\.T"),
        (lambda h, w: h @ w.T, "raw logits"),
        (lambda h, w: (h @ w.T).softmax(-1), "returned probabilities"),
        (lambda h, w: F.log_softmax((h @ w.T).softmax(-1), dim=-1), "softmax was applied twice"),
        (lambda h, w: F.log_softmax(h @ w.T, dim=0), "last axis"),
        (lambda h, w: (h @ w.T).softmax(-1).log(), "underflows; use F.log_softmax"),
    ],
    ids=["no-transpose", "logits", "probs", "double-softmax", "wrong-axis", "log-of-softmax"],
)
def test_tied_log_probs_diagnoses_typical_mistakes(wrong, match):
    with pytest.raises(ExerciseError, match=match):
        check_tied_log_probs(wrong)


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
        logits = logit_std * torch.randn(n_samples, vocab_size, dtype=torch.float64, generator=gen)
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
