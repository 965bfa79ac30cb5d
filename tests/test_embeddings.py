"""Unit tests of lib.embeddings (chapter 2)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lib.embeddings import (
    TokenEmbedding,
    Unembedding,
    embedding_param_count,
    init_embedding_,
)

# --- init_embedding_ ---------------------------------------------------------------------------


def test_init_embedding_has_the_requested_std_and_zero_padding_row():
    weight = torch.empty(2_000, 64)
    out = init_embedding_(
        weight, 0.02, padding_idx=7, generator=torch.Generator().manual_seed(0)
    )
    assert out is weight  # in place
    assert torch.equal(weight[7], torch.zeros(64))
    others = torch.cat([weight[:7], weight[8:]])
    assert abs(others.std().item() - 0.02) < 0.0005
    assert abs(others.mean().item()) < 0.0005


def test_init_embedding_is_reproducible_with_a_generator():
    a = init_embedding_(
        torch.empty(5, 3), 1.0, generator=torch.Generator().manual_seed(1)
    )
    b = init_embedding_(
        torch.empty(5, 3), 1.0, generator=torch.Generator().manual_seed(1)
    )
    assert torch.equal(a, b)


@pytest.mark.parametrize(
    ("weight", "std", "kwargs", "error", "match"),
    [
        (
            torch.empty(3),
            1.0,
            {},
            ValueError,
            r"weight must have shape \(vocab d_model\), got shape \(3,\)",
        ),
        (
            torch.empty(3, 2, dtype=torch.long),
            1.0,
            {},
            TypeError,
            "weight must be a floating-point",
        ),
        (
            torch.empty(3, 2),
            -1.0,
            {},
            ValueError,
            "std must be a finite number >= 0, got -1.0",
        ),
        (
            torch.empty(3, 2),
            float("nan"),
            {},
            ValueError,
            "std must be a finite number",
        ),
        (
            torch.empty(3, 2),
            float("inf"),
            {},
            ValueError,
            "std must be a finite number >= 0, got inf",
        ),
        (torch.empty(3, 2), True, {}, TypeError, "std must be a number, got bool True"),
        (
            torch.empty(3, 2),
            1.0,
            {"padding_idx": 3},
            ValueError,
            r"padding_idx must be an int in 0\.\.2, got 3",
        ),
        (
            torch.empty(3, 2),
            1.0,
            {"padding_idx": 1.0},
            TypeError,
            "padding_idx must be an int",
        ),
    ],
)
def test_init_embedding_rejects_bad_input(weight, std, kwargs, error, match):
    with pytest.raises(error, match=match):
        init_embedding_(weight, std, **kwargs)


def test_init_embedding_checks_padding_idx_before_touching_the_weight():
    # Before: the weight was redrawn, then the bad padding_idx raised: a failed call changed it.
    weight = torch.ones(3, 2)
    with pytest.raises(ValueError, match="padding_idx"):
        init_embedding_(weight, 1.0, padding_idx=5)
    assert torch.equal(weight, torch.ones(3, 2))


# --- TokenEmbedding ----------------------------------------------------------------------------


def test_token_embedding_is_a_table_lookup_and_a_one_hot_product():
    torch.manual_seed(0)
    embed = TokenEmbedding(11, 6)
    ids = torch.randint(0, 11, (3, 4, 5))
    got = embed(ids)
    assert got.shape == (3, 4, 5, 6)
    assert torch.equal(got, embed.weight[ids])
    one_hot = F.one_hot(ids, 11).float()
    assert torch.allclose(got, one_hot @ embed.weight)


def test_token_embedding_gradient_is_a_scatter_add_over_ids():
    torch.manual_seed(0)
    embed = TokenEmbedding(5, 3)
    ids = torch.tensor([[1, 1, 4]])
    upstream = torch.randn(1, 3, 3)
    embed(ids).backward(upstream)
    grad = embed.weight.grad
    assert torch.allclose(grad[1], upstream[0, 0] + upstream[0, 1])
    assert torch.allclose(grad[4], upstream[0, 2])
    assert torch.equal(grad[[0, 2, 3]], torch.zeros(3, 3))


def test_default_init_gives_rows_of_length_about_one():
    torch.manual_seed(0)
    embed = TokenEmbedding(4_000, 256)
    assert embed.init_std == pytest.approx(256**-0.5)
    norms = embed.weight.detach().norm(dim=-1)
    assert abs(norms.mean().item() - 1.0) < 0.01


def test_scale_multiplies_by_sqrt_d_model():
    torch.manual_seed(0)
    plain = TokenEmbedding(10, 64)
    scaled = TokenEmbedding(10, 64, scale=True)
    with torch.no_grad():
        scaled.weight.copy_(plain.weight)
    ids = torch.arange(10)
    assert torch.allclose(scaled(ids), plain(ids) * 8.0)  # sqrt(64) = 8
    assert "scale=sqrt(64)" in repr(scaled)


def test_padding_row_is_zero_and_gets_no_gradient():
    embed = TokenEmbedding(6, 4, padding_idx=0)
    assert torch.equal(embed.weight[0], torch.zeros(4))
    ids = torch.tensor([[0, 2, 0]])
    embed(ids).sum().backward()
    assert torch.equal(embed.weight.grad[0], torch.zeros(4))
    assert torch.equal(embed.weight.grad[2], torch.ones(4))


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.int16, torch.uint8])
def test_integer_dtypes_are_accepted(dtype):
    embed = TokenEmbedding(7, 2)
    ids = torch.tensor([0, 6, 3], dtype=dtype)
    assert torch.equal(embed(ids), embed.weight[ids.long()])


def test_empty_input_gives_empty_output():
    embed = TokenEmbedding(7, 2)
    assert embed(torch.zeros(2, 0, dtype=torch.long)).shape == (2, 0, 2)


@pytest.mark.parametrize(
    ("ids", "error", "match"),
    [
        (
            torch.tensor([0, 9, 12]),
            ValueError,
            r"token_ids must be in 0\.\.9, got 0\.\.12; was the tokenizer's",
        ),
        (
            torch.tensor([3, -1]),
            ValueError,
            r"token_ids must be in 0\.\.9, got -1\.\.3",
        ),
        (
            torch.tensor([1.0, 2.0]),
            TypeError,
            "token_ids must be an integer tensor, got dtype torch.float32; token ids are indices",
        ),
        (
            torch.tensor([True, False]),
            TypeError,
            "token_ids must be an integer tensor, got dtype torch.bool",
        ),
        ([1, 2], TypeError, r"token_ids must be a torch.Tensor, got list \[1, 2\]"),
    ],
)
def test_bad_ids_are_clear_errors(ids, error, match):
    embed = TokenEmbedding(10, 4)
    with pytest.raises(error, match=match):
        embed(ids)


def test_check_ids_false_skips_the_check():
    embed = TokenEmbedding(10, 4, check_ids=False)
    with pytest.raises(IndexError):  # PyTorch's own error, not ours
        embed(torch.tensor([12]))
    with pytest.raises(TypeError, match="integer tensor"):  # the cheap checks stay
        embed(torch.tensor([1.0]))


def test_small_integer_dtypes_are_accepted():
    embed = TokenEmbedding(10, 4)
    ids = torch.tensor([[1, 9]])
    for dtype in (torch.uint8, torch.int16, torch.int32):
        assert torch.equal(embed(ids.to(dtype)), embed(ids))


def test_ids_on_another_device_are_a_clear_error():
    embed = TokenEmbedding(10, 4)
    with pytest.raises(
        ValueError,
        match=r"token_ids and weight must be on one device, got token_ids on meta",
    ):
        embed(torch.zeros(2, dtype=torch.long, device="meta"))


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "match"),
    [
        ((0, 4), {}, ValueError, "vocab_size must be an int >= 1, got 0"),
        ((10, 2.5), {}, TypeError, "d_model must be an int, got float 2.5"),
        ((True, 4), {}, TypeError, "vocab_size must be an int, got bool True"),
        (
            (10, 4),
            {"padding_idx": 10},
            ValueError,
            r"padding_idx must be an int in 0\.\.9, got 10",
        ),
        (
            (10, 4),
            {"padding_idx": -1},
            ValueError,
            r"padding_idx must be an int in 0\.\.9, got -1",
        ),
        # before: bool("no") is True, so the vectors were silently scaled
        (
            (10, 4),
            {"scale": "no"},
            TypeError,
            "scale must be True or False, got str 'no'",
        ),
        (
            (10, 4),
            {"check_ids": 0},
            TypeError,
            "check_ids must be True or False, got int 0",
        ),
        # before: NaN reached init_embedding_ and was reported as a bad "std"
        (
            (10, 4),
            {"init_std": float("nan")},
            ValueError,
            "init_std must be a finite number >= 0, got nan",
        ),
        (
            (10, 4),
            {"init_std": -0.1},
            ValueError,
            "init_std must be a finite number >= 0",
        ),
    ],
)
def test_token_embedding_rejects_bad_construction(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        TokenEmbedding(*args, **kwargs)


# --- Unembedding -------------------------------------------------------------------------------


def test_untied_unembedding_is_a_linear_layer_without_bias():
    torch.manual_seed(0)
    head = Unembedding(8, 20)
    hidden = torch.randn(2, 3, 8)
    assert head(hidden).shape == (2, 3, 20)
    assert torch.allclose(head(hidden), F.linear(hidden, head.weight), atol=1e-6)
    assert not head.is_tied and head.bias is None
    assert sum(p.numel() for p in head.parameters()) == 20 * 8


def test_the_fused_unembedding_equals_the_chapters_einsum():
    from einops import einsum

    torch.manual_seed(0)
    head = Unembedding(8, 20, bias=True)
    with torch.no_grad():
        head.bias.normal_()
    hidden = torch.randn(2, 3, 8, dtype=torch.float64)
    head = head.double()
    by_einsum = einsum(hidden, head.weight, "... d_model, vocab d_model -> ... vocab")
    assert torch.allclose(head(hidden), by_einsum + head.bias, rtol=0, atol=1e-12)


def test_bias_is_added_and_starts_at_zero():
    torch.manual_seed(0)
    head = Unembedding(8, 20, bias=True)
    assert torch.equal(head.bias, torch.zeros(20))
    with torch.no_grad():
        head.bias.fill_(1.5)
    hidden = torch.randn(4, 8)
    assert torch.allclose(head(hidden), hidden @ head.weight.T + 1.5, atol=1e-6)


def test_tied_unembedding_shares_one_parameter_and_gathers_both_gradients():
    torch.manual_seed(0)
    embed = TokenEmbedding(12, 5)
    head = Unembedding(5, 12, tie_to=embed)
    assert head.weight is embed.weight and head.is_tied
    model = nn.ModuleDict({"embed": embed, "head": head})
    assert sum(p.numel() for p in model.parameters()) == 12 * 5  # listed once

    ids = torch.tensor([[3, 7]])
    logits = head(embed(ids))
    assert torch.allclose(logits, embed.weight[ids] @ embed.weight.T, atol=1e-6)
    logits.logsumexp(-1).sum().backward()
    # The gradient has an input part (rows 3 and 7 only) and an output part (every row).
    expected = torch.zeros(12, 5)
    w = embed.weight.detach()
    probs = (w[ids] @ w.T).softmax(-1)  # (1 2 vocab)
    expected += probs[0].T @ w[ids[0]]  # output side: d/dW of logsumexp(h W^T)
    expected[ids[0]] += probs[0] @ w  # input side: d/dh, routed to the rows of the ids
    assert torch.allclose(embed.weight.grad, expected, atol=1e-5)


def test_tying_survives_a_dtype_conversion():
    embed = TokenEmbedding(6, 4)
    head = Unembedding(4, 6, tie_to=embed)
    model = nn.ModuleDict({"embed": embed, "head": head}).double()
    assert model["head"].weight is model["embed"].weight
    assert model["embed"].weight.dtype == torch.float64


def test_scaled_embedding_does_not_scale_the_tied_output():
    torch.manual_seed(0)
    embed = TokenEmbedding(9, 16, scale=True)
    head = Unembedding(16, 9, tie_to=embed)
    hidden = torch.randn(3, 16)
    assert torch.allclose(head(hidden), hidden @ embed.weight.T, atol=1e-6)


def test_tiny_init_gives_initial_loss_ln_vocab():
    torch.manual_seed(0)
    vocab = 500
    embed = TokenEmbedding(vocab, 32, init_std=0.02)
    head = Unembedding(32, vocab, tie_to=embed)
    ids = torch.randint(0, vocab, (64, 16))
    loss = F.cross_entropy(head(embed(ids[:, :-1])).flatten(0, 1), ids[:, 1:].flatten())
    assert abs(loss.item() - math.log(vocab)) < 1e-3


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (
            {"tie_to": TokenEmbedding(10, 3)},
            ValueError,
            r"weight has shape \(10, 3\).*\(10, 4\)",
        ),
        (
            {"tie_to": nn.ReLU()},
            TypeError,
            "tie_to must be an embedding module .* got ReLU",
        ),
    ],
)
def test_unembedding_rejects_a_bad_tie(kwargs, error, match):
    with pytest.raises(error, match=match):
        Unembedding(4, 10, **kwargs)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        # before: bool("yes") made a bias silently
        ({"bias": "yes"}, TypeError, "bias must be True or False, got str 'yes'"),
        (
            {"init_std": float("inf")},
            ValueError,
            "init_std must be a finite number >= 0, got inf",
        ),
        # before: ignored without a word when tied
        (
            {"init_std": -1.0, "tie_to": TokenEmbedding(10, 4)},
            ValueError,
            "init_std must be a finite",
        ),
        ({}, None, None),
    ],
)
def test_unembedding_checks_its_options(kwargs, error, match):
    if error is None:
        assert Unembedding(4, 10, **kwargs).bias is None
        return
    with pytest.raises(error, match=match):
        Unembedding(4, 10, **kwargs)


def test_unembedding_dtype_and_device_must_match_the_weight():
    head = Unembedding(4, 10)
    # before: "expected scalar type Double but found Float" from inside einsum
    with pytest.raises(
        TypeError,
        match="hidden and weight must share a dtype, got hidden torch.float64, weight torch.float32",
    ):
        head(torch.randn(2, 4, dtype=torch.float64))
    with pytest.raises(ValueError, match="hidden and weight must be on one device"):
        head(torch.randn(2, 4, device="meta"))
    assert head.double()(torch.randn(2, 4, dtype=torch.float64)).dtype == torch.float64
    with torch.autocast(
        "cpu", dtype=torch.bfloat16
    ):  # autocast casts the weight itself
        assert Unembedding(4, 10)(torch.randn(2, 4, dtype=torch.bfloat16)).shape == (
            2,
            10,
        )


def test_unembedding_accepts_a_plain_nn_embedding():
    embed = nn.Embedding(10, 4)
    head = Unembedding(4, 10, tie_to=embed)
    assert head.weight is embed.weight


@pytest.mark.parametrize(
    ("hidden", "error", "match"),
    [
        (
            torch.randn(2, 5),
            ValueError,
            r"hidden must have shape \(\.\.\. d_model\) with d_model=4, got shape \(2, 5\)",
        ),
        (torch.tensor(1.0), ValueError, r"got shape \(\)"),
        (
            torch.tensor([[1, 2, 3, 4]]),
            TypeError,
            r"floating-point tensor, got dtype torch.int64 \(ids\? embed them first\)",
        ),
        ([1.0, 2.0, 3.0, 4.0], TypeError, "hidden must be a torch.Tensor, got list"),
    ],
)
def test_unembedding_rejects_bad_hidden(hidden, error, match):
    with pytest.raises(error, match=match):
        Unembedding(4, 10)(hidden)


# --- embedding_param_count ---------------------------------------------------------------------


def test_param_count_of_real_models():
    # GPT-3 175B: token table and 2048 learned positions, tied output.
    assert embedding_param_count(50_257, 12_288, n_positions=2_048) == 642_723_840
    # BERT-base: tokens, 512 positions, 2 segment types.
    assert (
        embedding_param_count(30_522, 768, n_positions=512, n_segment_types=2)
        == 23_835_648
    )
    # The base transformer: one shared matrix.
    assert embedding_param_count(37_000, 512) == 18_944_000


def test_param_count_matches_real_modules():
    embed = TokenEmbedding(50, 8)
    for tied, bias in [(True, False), (False, False), (False, True), (True, True)]:
        head = Unembedding(8, 50, tie_to=embed if tied else None, bias=bias)
        model = nn.ModuleDict({"embed": embed, "head": head})
        counted = sum(p.numel() for p in model.parameters())
        assert counted == embedding_param_count(50, 8, tied=tied, output_bias=bias)


def test_untied_counts_the_matrix_twice():
    assert embedding_param_count(100, 10, tied=False) == 2 * embedding_param_count(
        100, 10
    )


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "match"),
    [
        ((0, 10), {}, ValueError, "vocab_size must be an int >= 1, got 0"),
        ((10, -1), {}, ValueError, "d_model must be an int >= 1, got -1"),
        (
            (10, 10),
            {"n_positions": -5},
            ValueError,
            "n_positions must be an int >= 0, got -5",
        ),
        (
            (10, 10),
            {"n_segment_types": 1.5},
            TypeError,
            "n_segment_types must be an int, got float 1.5",
        ),
        # before: bool("no") is True, so the count was silently that of a tied model
        (
            (10, 10),
            {"tied": "no"},
            TypeError,
            "tied must be True or False, got str 'no'",
        ),
        (
            (10, 10),
            {"output_bias": 1},
            TypeError,
            "output_bias must be True or False, got int 1",
        ),
    ],
)
def test_param_count_rejects_bad_input(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        embedding_param_count(*args, **kwargs)
