"""Unit tests of lib.attention: masks, both backends, multi-head attention, the KV cache."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from lib.attention import (
    ATTENTION_BACKENDS,
    KVCache,
    MultiHeadAttention,
    additive_mask,
    attention_crossover_length,
    attention_layer_flops,
    causal_mask,
    combine_masks,
    kv_cache_bytes,
    padding_mask,
    repeat_kv_heads,
    scaled_dot_product_attention,
    sdpa_attention,
    set_attention_backend,
)

# The backends this chapter defines. Others (chapter 9's kernels) register themselves in the
# same registry when their module is imported, and have tests of their own.
CORE_BACKENDS = ("math", "sdpa")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def _qkv(batch=2, heads=4, kv_heads=4, q_len=5, k_len=7, d_head=8):
    return (
        torch.randn(batch, heads, q_len, d_head),
        torch.randn(batch, kv_heads, k_len, d_head),
        torch.randn(batch, kv_heads, k_len, d_head),
    )


def _decode(mha, x, prefill=1, **kwargs):
    """Run x through mha: the first `prefill` positions at once, then one token at a time."""
    out, cache = mha(x[:, :prefill], causal=True, use_cache=True, **kwargs)
    outputs = [out]
    for t in range(prefill, x.shape[1]):
        out, cache = mha(
            x[:, t : t + 1], causal=True, past=cache, use_cache=True, **kwargs
        )
        outputs.append(out)
    return torch.cat(outputs, dim=1), cache


# ----------------------------------------------------------------------------- masks


def test_padding_mask_marks_real_tokens():
    mask = padding_mask(torch.tensor([3, 1, 0]), max_len=4)
    assert mask.shape == (3, 1, 1, 4) and mask.dtype == torch.bool
    assert mask[:, 0, 0].tolist() == [
        [True, True, True, False],
        [True, False, False, False],
        [False, False, False, False],
    ]
    assert padding_mask([2, 4]).shape == (2, 1, 1, 4)  # max_len defaults to the longest


@pytest.mark.parametrize(
    ("lengths", "max_len", "error", "match"),
    [
        (
            torch.tensor([[1, 2]]),
            3,
            ValueError,
            r"lengths must have shape \(batch\), got shape \(1, 2\)",
        ),
        (
            torch.tensor([1.0, 2.0]),
            3,
            TypeError,
            "lengths must be an integer tensor, got dtype torch.float32",
        ),
        (torch.tensor([1, -1]), 3, ValueError, ">= 0"),
        (torch.tensor([1, 5]), 3, ValueError, "exceeds max_len=3"),
    ],
)
def test_padding_mask_rejects_bad_lengths(lengths, max_len, error, match):
    with pytest.raises(error, match=match):
        padding_mask(lengths, max_len)


def test_causal_mask_square_is_lower_triangular():
    assert torch.equal(causal_mask(5), torch.ones(5, 5, dtype=torch.bool).tril())


def test_causal_mask_with_more_keys_is_the_bottom_rows():
    full = causal_mask(9)
    for q_len in (1, 3, 9):
        assert torch.equal(causal_mask(q_len, 9), full[9 - q_len :])
    # an explicit offset: queries at positions 2, 3 see keys 0..2 and 0..3
    assert causal_mask(2, 6, offset=2).sum(-1).tolist() == [3, 4]


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [
        ((0,), ValueError, "q_len must be an int >= 1, got 0"),
        ((2, 0), ValueError, "k_len must be an int >= 1, got 0"),
        ((2.5,), TypeError, "q_len must be an int, got float 2.5"),
    ],
)
def test_causal_mask_rejects_bad_lengths(args, error, match):
    with pytest.raises(error, match=match):
        causal_mask(*args)


def test_combine_masks_is_a_broadcast_and():
    combined = combine_masks(padding_mask([4, 2]), None, causal_mask(4))
    assert combined.shape == (2, 1, 4, 4)
    assert combined[1, 0].sum() == 1 + 2 + 2 + 2
    assert combine_masks(None, None) is None
    with pytest.raises(
        TypeError, match=r"masks\[0\] must be a boolean tensor, got dtype torch.float32"
    ):
        combine_masks(torch.ones(3, 3))
    with pytest.raises(ValueError, match=r"\(3, 3\) and \(4, 4\) do not broadcast"):
        combine_masks(causal_mask(3), causal_mask(4))


def test_additive_mask_is_zero_or_minus_infinity():
    bias = additive_mask(causal_mask(3))
    assert (
        torch.equal(bias.isneginf(), ~causal_mask(3))
        and bias[causal_mask(3)].eq(0).all()
    )
    with pytest.raises(TypeError, match="boolean"):
        additive_mask(torch.zeros(2, 2))


# ------------------------------------------------------------------ the two backends


def test_math_path_matches_the_formula():
    q, k, v = _qkv()
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    out, weights = scaled_dot_product_attention(q, k, v, return_weights=True)
    assert torch.allclose(weights, scores.softmax(-1), atol=1e-6)
    assert torch.allclose(out, scores.softmax(-1) @ v, atol=1e-6)
    assert torch.allclose(weights.sum(-1), torch.ones(2, 4, 5))


def test_math_path_matches_torch_sdpa_with_a_random_mask():
    q, k, v = _qkv()
    mask = torch.rand(2, 1, 5, 7) > 0.4
    mask[..., 0] = True  # no dead rows: torch's own result is then unambiguous
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert torch.allclose(scaled_dot_product_attention(q, k, v, mask), want, atol=1e-5)


MASKS = {
    "none": lambda: None,
    "padding": lambda: padding_mask([7, 4]),
    "causal": lambda: causal_mask(5, 7),
    "causal and padding": lambda: combine_masks(
        causal_mask(5, 7), padding_mask([7, 2])
    ),
    "per head": lambda: torch.rand(1, 4, 5, 7) > 0.3,
    "all masked": lambda: torch.zeros(5, 7, dtype=torch.bool),
    "some rows dead": lambda: combine_masks(
        causal_mask(5, 7, offset=-2), padding_mask([7, 3])
    ),
}


@pytest.mark.parametrize("kv_heads", [4, 2, 1], ids=["mha", "gqa", "mqa"])
@pytest.mark.parametrize("with_bias", [False, True], ids=["no-bias", "bias"])
@pytest.mark.parametrize("mask_kind", list(MASKS))
def test_backends_agree(mask_kind, with_bias, kv_heads):
    q, k, v = _qkv(kv_heads=kv_heads)
    mask = MASKS[mask_kind]()
    bias = torch.randn(4, 5, 7) if with_bias else None
    math_out = scaled_dot_product_attention(q, k, v, mask, bias)
    sdpa_out = sdpa_attention(q, k, v, mask, bias)
    assert not torch.isnan(math_out).any() and not torch.isnan(sdpa_out).any()
    assert torch.allclose(math_out, sdpa_out, atol=1e-5)


@pytest.mark.parametrize("q_len", [1, 3, 7])
def test_causal_flag_is_bottom_right_in_both_backends(q_len):
    q, k, v = _qkv(q_len=q_len)
    want = scaled_dot_product_attention(q, k, v, causal_mask(q_len, 7))
    for backend in CORE_BACKENDS:
        attention = ATTENTION_BACKENDS[backend]
        assert torch.allclose(attention(q, k, v, causal=True), want, atol=1e-5)


@pytest.mark.parametrize("backend", CORE_BACKENDS)
def test_fully_masked_rows_give_zeros_and_finite_gradients(backend):
    q, k, v = (t.requires_grad_() for t in _qkv())
    mask = torch.ones(2, 1, 5, 7, dtype=torch.bool)
    mask[1, :, 2] = False  # query 2 of sequence 1 may see nothing
    mask[0] = False  # sequence 0 sees nothing at all
    out = ATTENTION_BACKENDS[backend](q, k, v, mask)
    assert torch.equal(out[0], torch.zeros_like(out[0]))
    assert torch.equal(out[1, :, 2], torch.zeros_like(out[1, :, 2]))
    assert out[1, :, 3].abs().sum() > 0
    out.sum().backward()
    for tensor in (q, k, v):
        assert torch.isfinite(tensor.grad).all()


@pytest.mark.parametrize("backend", CORE_BACKENDS)
def test_minus_infinity_bias_rows_give_zeros(backend):
    q, k, v = _qkv()
    bias = torch.zeros(5, 7)
    bias[0] = float("-inf")  # the additive form of a dead row
    out = ATTENTION_BACKENDS[backend](q, k, v, bias=bias)
    assert (
        torch.equal(out[:, :, 0], torch.zeros(2, 4, 8)) and not torch.isnan(out).any()
    )


def test_repeat_kv_heads_gives_consecutive_groups():
    x = torch.arange(3).float().reshape(1, 3, 1, 1)
    assert repeat_kv_heads(x, 2).flatten().tolist() == [0, 0, 1, 1, 2, 2]
    assert repeat_kv_heads(x, 1) is x
    with pytest.raises(ValueError, match="n_rep"):
        repeat_kv_heads(x, 0)


def test_gqa_matches_explicit_per_head_attention():
    q, k, v = _qkv(heads=6, kv_heads=2)
    out = scaled_dot_product_attention(q, k, v)
    for h in range(6):  # query heads 0-2 read kv head 0, 3-5 read kv head 1
        single = scaled_dot_product_attention(
            q[:, h : h + 1], k[:, h // 3 : h // 3 + 1], v[:, h // 3 : h // 3 + 1]
        )
        assert torch.allclose(out[:, h : h + 1], single, atol=1e-6)


def test_dropout_on_the_weights():
    q, k, v = _qkv()
    _, weights = scaled_dot_product_attention(
        q, k, v, dropout_p=0.5, return_weights=True
    )
    assert (weights == 0).float().mean() > 0.3  # about half the weights are dropped
    kept = weights[weights > 0]
    assert kept.max() <= 2.0 + 1e-6  # survivors are scaled by 1 / (1 - p)


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("shapes", "match"),
    [
        (
            ((2, 4, 5, 8), (2, 4, 7, 6), (2, 4, 7, 8)),
            r"k must have shape \(batch kv_heads k_pos d_head\) with batch=2, d_head=8, got shape "
            r"\(2, 4, 7, 6\); batch and d_head as in q \(2, 4, 5, 8\)",
        ),
        (
            ((2, 5, 8), (2, 4, 7, 8), (2, 4, 7, 8)),
            r"q must have shape \(batch heads q_pos d_head\), got shape \(2, 5, 8\)",
        ),
        (
            ((2, 4, 5, 8), (2, 3, 7, 8), (2, 3, 7, 8)),
            "4 heads, not a multiple of the 3",
        ),
        (
            ((2, 4, 5, 8), (2, 4, 7, 8), (2, 4, 6, 8)),
            r"v must have shape .* with batch=2, kv_heads=4, k_pos=7, got shape \(2, 4, 6, 8\)",
        ),
        (
            ((2, 4, 5, 8), (3, 4, 7, 8), (3, 4, 7, 8)),
            r"k must have shape .* with batch=2",
        ),
        (
            ((2, 4, 5, 8), (2, 0, 7, 8), (2, 0, 7, 8)),
            "4 heads, not a multiple of the 0",
        ),
    ],
)
@pytest.mark.parametrize("backend", CORE_BACKENDS)
def test_bad_shapes_are_named(backend, shapes, match):
    q, k, v = (torch.randn(*shape) for shape in shapes)
    with pytest.raises(ValueError, match=match):
        ATTENTION_BACKENDS[backend](q, k, v)


@pytest.mark.parametrize("backend", CORE_BACKENDS)
def test_non_tensor_input_is_named(backend):
    q, k, v = _qkv()
    with pytest.raises(TypeError, match="k must be a torch.Tensor, got list"):
        ATTENTION_BACKENDS[backend](q, k.tolist(), v, causal=True)


@pytest.mark.parametrize("backend", CORE_BACKENDS)
def test_mask_that_does_not_broadcast_is_named(backend):
    q, k, v = _qkv()
    with pytest.raises(
        ValueError,
        match=r"mask must broadcast to \(batch heads q_pos k_pos\) = \(2, 4, 5, 7\), got shape \(5, 6\)",
    ):
        ATTENTION_BACKENDS[backend](q, k, v, torch.ones(5, 6, dtype=torch.bool))
    with pytest.raises(
        ValueError, match=r"bias must broadcast to .* got shape \(3, 5, 7\)"
    ):
        ATTENTION_BACKENDS[backend](q, k, v, bias=torch.zeros(3, 5, 7))
    with pytest.raises(
        ValueError, match=r"mask must broadcast to .* got shape \(1, 1, 1, 5, 7\)"
    ):
        ATTENTION_BACKENDS[backend](
            q, k, v, torch.ones(1, 1, 1, 5, 7, dtype=torch.bool)
        )
    with pytest.raises(
        TypeError,
        match="mask must be a boolean tensor, got dtype torch.float32; .* as bias=",
    ):
        ATTENTION_BACKENDS[backend](q, k, v, torch.ones(5, 7))


# ------------------------------------------------------------ multi-head attention


def _torch_mha_and_ours(d_model=32, n_heads=4, backend="sdpa"):
    theirs = torch.nn.MultiheadAttention(d_model, n_heads, batch_first=True)
    ours = MultiHeadAttention(d_model, n_heads, backend=backend)
    with torch.no_grad():
        ours.qkv_proj.weight.copy_(theirs.in_proj_weight)
        ours.qkv_proj.bias.copy_(theirs.in_proj_bias)
        ours.out_proj.weight.copy_(theirs.out_proj.weight)
        ours.out_proj.bias.copy_(theirs.out_proj.bias)
    return theirs, ours


def test_plain_call_returns_a_tensor():
    mha = MultiHeadAttention(32, 4)
    out = mha(torch.randn(2, 6, 32))
    assert isinstance(out, torch.Tensor) and out.shape == (2, 6, 32)


@pytest.mark.parametrize("backend", CORE_BACKENDS)
def test_self_attention_equals_torch_multihead_attention(backend):
    theirs, ours = _torch_mha_and_ours(backend=backend)
    x = torch.randn(3, 9, 32)
    lengths = torch.tensor([9, 5, 1])
    want, want_weights = theirs(
        x, x, x, key_padding_mask=~padding_mask(lengths)[:, 0, 0]
    )
    got = ours(x, mask=padding_mask(lengths))
    assert torch.allclose(got, want, atol=1e-5)
    _, weights = ours(x, mask=padding_mask(lengths), need_weights=True)
    assert torch.allclose(
        weights.mean(1), want_weights, atol=1e-5
    )  # torch averages heads


@pytest.mark.parametrize("backend", CORE_BACKENDS)
def test_cross_attention_equals_torch_multihead_attention(backend):
    theirs, ours = _torch_mha_and_ours(backend=backend)
    x, context = torch.randn(2, 3, 32), torch.randn(2, 8, 32)
    want, _ = theirs(x, context, context)
    got = ours(x, context)
    assert got.shape == (2, 3, 32) and torch.allclose(got, want, atol=1e-5)


@pytest.mark.parametrize("backend", CORE_BACKENDS)
@pytest.mark.parametrize("n_kv_heads", [8, 4, 1])
@pytest.mark.parametrize("prefill", [1, 4])
def test_incremental_decoding_equals_full_causal_forward(backend, n_kv_heads, prefill):
    mha = MultiHeadAttention(64, 8, n_kv_heads=n_kv_heads, backend=backend).eval()
    x = torch.randn(2, 9, 64)
    stepped, cache = _decode(mha, x, prefill=prefill)
    assert isinstance(cache, KVCache) and cache.seq_len == 9
    assert cache.keys.shape == (2, n_kv_heads, 9, 8)
    assert torch.allclose(stepped, mha(x, causal=True), atol=1e-5)


def test_cross_attention_cache_is_reused_not_recomputed():
    mha = MultiHeadAttention(32, 4).eval()
    x, context = torch.randn(2, 5, 32), torch.randn(2, 6, 32)
    full = mha(x, context)
    out0, cache = mha(x[:, :1], context, use_cache=True)
    steps = [out0]
    for t in range(1, 5):
        out, cache_next = mha(
            x[:, t : t + 1], torch.zeros_like(context), past=cache, use_cache=True
        )
        assert cache_next is cache  # the context's keys and values do not grow
        steps.append(out)
    assert torch.allclose(torch.cat(steps, 1), full, atol=1e-5)


def test_need_weights_and_use_cache_together():
    mha = MultiHeadAttention(32, 4, n_kv_heads=2)
    out, cache, weights = mha(
        torch.randn(2, 5, 32), causal=True, use_cache=True, need_weights=True
    )
    assert out.shape == (2, 5, 32) and cache.keys.shape == (2, 2, 5, 8)
    assert weights.shape == (2, 4, 5, 5) and torch.equal(
        weights[0, 0].triu(1), torch.zeros(5, 5)
    )
    assert torch.allclose(weights.sum(-1), torch.ones(2, 4, 5))


def test_mqa_and_mha_are_the_ends_of_gqa():
    mha = MultiHeadAttention(32, 4)
    assert mha.n_kv_heads == 4 and mha.qkv_proj.out_features == 3 * 32
    mqa = MultiHeadAttention(32, 4, n_kv_heads=1)
    assert mqa.qkv_proj.out_features == 32 + 2 * 8
    # an MQA layer equals an MHA layer whose four kv heads are copies of the single one
    big = MultiHeadAttention(32, 4)
    with torch.no_grad():
        w, b = mqa.qkv_proj.weight, mqa.qkv_proj.bias
        q_w, k_w, v_w = w[:32], w[32:40], w[40:48]
        q_b, k_b, v_b = b[:32], b[32:40], b[40:48]
        big.qkv_proj.weight.copy_(torch.cat([q_w, k_w.repeat(4, 1), v_w.repeat(4, 1)]))
        big.qkv_proj.bias.copy_(torch.cat([q_b, k_b.repeat(4), v_b.repeat(4)]))
        big.out_proj.load_state_dict(mqa.out_proj.state_dict())
    x = torch.randn(2, 6, 32)
    assert torch.allclose(mqa(x, causal=True), big(x, causal=True), atol=1e-5)


def test_dropout_only_in_training():
    mha = MultiHeadAttention(32, 4, dropout=0.5)
    x = torch.randn(2, 6, 32)
    mha.eval()
    assert torch.equal(mha(x), mha(x))
    mha.train()
    assert not torch.allclose(mha(x), mha(x))


# ---------------------------------------------------------------- positions plug in


positions = pytest.importorskip("lib.positions")


def _position_hooks(n_heads, d_head):
    return {
        "rope": dict(rope=positions.RotaryEmbedding(d_head)),
        "alibi": dict(position_bias=positions.ALiBi(n_heads)),
        "t5": dict(
            position_bias=positions.T5RelativePositionBias(n_heads, bidirectional=False)
        ),
    }


@pytest.mark.parametrize("scheme", ["rope", "alibi", "t5"])
def test_positions_backends_agree_and_cache_equals_full(scheme):
    hooks = _position_hooks(4, 8)[scheme]
    math_mha = MultiHeadAttention(32, 4, n_kv_heads=2, backend="math").eval()
    sdpa_mha = MultiHeadAttention(32, 4, n_kv_heads=2, backend="sdpa").eval()
    sdpa_mha.load_state_dict(math_mha.state_dict())
    x = torch.randn(2, 8, 32)
    full = math_mha(x, causal=True, **hooks)
    assert not torch.allclose(
        full, math_mha(x, causal=True), atol=1e-3
    )  # the scheme acts
    assert torch.allclose(sdpa_mha(x, causal=True, **hooks), full, atol=1e-5)
    stepped, _ = _decode(sdpa_mha, x, prefill=3, **hooks)
    assert torch.allclose(stepped, full, atol=1e-5)


def test_rope_is_applied_to_queries_and_keys_at_their_positions():
    rope = positions.RotaryEmbedding(8)
    mha = MultiHeadAttention(32, 4, backend="math")
    x = torch.randn(1, 5, 32)
    _, weights = mha(x, rope=rope, need_weights=True)
    q, k, _ = mha.qkv_proj(x).split(32, dim=-1)
    q = q.reshape(1, 5, 4, 8).transpose(1, 2)
    k = k.reshape(1, 5, 4, 8).transpose(1, 2)
    scores = rope(q) @ rope(k).transpose(-1, -2) / math.sqrt(8)
    assert torch.allclose(weights, scores.softmax(-1), atol=1e-5)


def test_position_bias_module_equals_its_tensor():
    alibi = positions.ALiBi(4, causal=False)
    mha = MultiHeadAttention(32, 4)
    x = torch.randn(2, 6, 32)
    assert torch.allclose(
        mha(x, position_bias=alibi), mha(x, position_bias=alibi(6, 6, 0)), atol=1e-6
    )


# ---------------------------------------------------------------- module bad input


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(d_model=30, n_heads=4), "d_model=30 is not divisible by n_heads=4"),
        (
            dict(d_model=32, n_heads=4, n_kv_heads=3),
            "n_heads=4 is not divisible by n_kv_heads=3",
        ),
        (dict(d_model=32, n_heads=0), "n_heads must be an int >= 1, got 0"),
        (
            dict(d_model=32, n_heads=4, backend="flash"),
            r"backend must be one of .*'math', 'sdpa'.*, got str 'flash'; register_attention_backend",
        ),
        (dict(d_model=32, n_heads=4, dropout=1.0), "dropout"),
    ],
)
def test_bad_configuration_is_a_clear_error(kwargs, match):
    with pytest.raises(ValueError, match=match):
        MultiHeadAttention(**kwargs)


def test_bad_module_inputs_are_named():
    mha = MultiHeadAttention(32, 4)
    with pytest.raises(
        ValueError,
        match=r"MultiHeadAttention: x must have shape \(batch q_pos d_model\) with d_model=32, "
        r"got shape \(6, 32\)",
    ):
        mha(torch.randn(6, 32))
    with pytest.raises(ValueError, match=r"got shape \(2, 6, 16\)"):
        mha(torch.randn(2, 6, 16))
    with pytest.raises(
        ValueError, match=r"context must have shape .* got shape \(2, 4, 8\)"
    ):
        mha(torch.randn(2, 6, 32), torch.randn(2, 4, 8))
    with pytest.raises(
        ValueError,
        match=r"context must have shape \(batch k_pos d_model\) with batch=2, d_model=32, got "
        r"shape \(3, 4, 32\); x is \(2, 6, 32\)",
    ):
        mha(torch.randn(2, 6, 32), torch.randn(3, 4, 32))
    with pytest.raises(
        ValueError, match=r"mask must broadcast to .* got shape \(2, 1, 1, 5\)"
    ):
        mha(torch.randn(2, 6, 32), mask=padding_mask([5, 3]))
    with pytest.raises(TypeError, match="past must be a KVCache, got tuple"):
        mha(torch.randn(2, 1, 32), past=(torch.zeros(1), torch.zeros(1)))
    wrong_cache = KVCache(torch.zeros(2, 2, 3, 8), torch.zeros(2, 2, 3, 8))
    with pytest.raises(
        ValueError,
        match=r"past.keys must have shape .* with batch=2, kv_heads=4, d_head=8, got shape "
        r"\(2, 2, 3, 8\); a cache fits only the layer that made it",
    ):
        mha(torch.randn(2, 1, 32), past=wrong_cache)
    with pytest.raises(ValueError, match="cross-attention"):
        mha(torch.randn(2, 6, 32), torch.randn(2, 4, 32), rope=lambda t, offset=0: t)


def test_kv_cache_validates_its_tensors():
    with pytest.raises(
        ValueError,
        match=r"KVCache: values must have shape .* seq=3, got shape \(2, 2, 4, 8\); batch, "
        r"kv_heads and seq as in keys \(2, 2, 3, 8\)",
    ):
        KVCache(torch.zeros(2, 2, 3, 8), torch.zeros(2, 2, 4, 8))
    cache = KVCache(torch.zeros(2, 2, 3, 8), torch.zeros(2, 2, 3, 8))
    assert cache.extend(torch.ones(2, 2, 1, 8), torch.ones(2, 2, 1, 8)).seq_len == 4
    with pytest.raises(
        ValueError,
        match=r"keys must have shape .* kv_heads=2.*; cannot append to a cache of keys",
    ):
        cache.extend(torch.ones(2, 4, 1, 8), torch.ones(2, 4, 1, 8))
    with pytest.raises(
        ValueError, match=r"values must have shape .* new=1, d_v=8, got shape"
    ):
        cache.extend(torch.ones(2, 2, 1, 8), torch.ones(2, 2, 2, 8))


# ------------------------------------------------------------------------ costs


def test_kv_cache_bytes():
    assert kv_cache_bytes(80, 64, 128, 4096) == 10 * 2**30
    assert kv_cache_bytes(80, 8, 128, 4096, batch_size=16) == 20 * 2**30
    assert kv_cache_bytes(1, 1, 1, 1, bytes_per_value=4) == 8
    with pytest.raises(
        ValueError, match=r"kv_cache_bytes\(\): n_kv_heads must be an int >= 1, got 0"
    ):
        kv_cache_bytes(12, 0, 64, 1024)


def test_kv_cache_bytes_matches_a_real_cache():
    mha = MultiHeadAttention(64, 8, n_kv_heads=2)
    _, cache = mha(torch.randn(3, 10, 64), use_cache=True)
    stored = cache.keys.numel() * 4 + cache.values.numel() * 4
    assert stored == kv_cache_bytes(1, 2, 8, 10, batch_size=3, bytes_per_value=4)


def test_flop_formulas_and_crossover():
    flops = attention_layer_flops(1024, 768)
    assert flops == {
        "scores": 4 * 1024**2 * 768,
        "projections": 8 * 1024 * 768**2,
        "ffn": 16 * 1024 * 768**2,
    }
    for d in (16, 64, 768):
        n_star = attention_crossover_length(d)
        assert n_star == 6 * d
        below, at, above = (
            attention_layer_flops(n, d) for n in (n_star - 1, n_star, n_star + 1)
        )
        assert below["scores"] < below["projections"] + below["ffn"]
        assert at["scores"] == at["projections"] + at["ffn"]
        assert above["scores"] > above["projections"] + above["ffn"]
    assert attention_crossover_length(64, d_ff=128) == 2 * 64 + 128
    with pytest.raises(ValueError, match="seq_len must be an int >= 1, got 0"):
        attention_layer_flops(0, 64)


# --- Options for the model families (issue 7): scale, d_head, bf16 bias, registry, cache ---


@pytest.mark.parametrize("backend", ["math", "sdpa"])
def test_scale_reaches_every_backend_and_the_weights(backend):
    q, k, v = _qkv()
    scores = torch.einsum("bhqd,bhkd->bhqk", q, k) * 1.0  # T5: no 1/sqrt(d_head)
    expected = torch.softmax(scores, -1) @ v
    out = ATTENTION_BACKENDS[backend](q, k, v, scale=1.0)
    assert torch.allclose(out, expected, atol=1e-5)
    assert not torch.allclose(out, ATTENTION_BACKENDS[backend](q, k, v), atol=1e-3)
    mha = MultiHeadAttention(32, 4, backend=backend, scale=1.0).eval()
    x = torch.randn(2, 6, 32)
    out, weights = mha(x, need_weights=True)
    qh = mha.qkv_proj(x)[..., :32].reshape(2, 6, 4, 8).transpose(1, 2)
    kh = mha.qkv_proj(x)[..., 32:64].reshape(2, 6, 4, 8).transpose(1, 2)
    assert torch.allclose(
        weights, torch.softmax(qh @ kh.transpose(-1, -2), -1), atol=1e-5
    )
    assert torch.allclose(mha(x), out, atol=1e-5)


def test_d_head_lets_heads_differ_from_d_model():
    mha = MultiHeadAttention(20, 3, d_head=16, backend="math").eval()
    assert mha.qkv_proj.weight.shape == (3 * 48, 20) and mha.out_proj.weight.shape == (
        20,
        48,
    )
    x = torch.randn(2, 5, 20)
    out, weights = mha(x, causal=True, need_weights=True)
    assert out.shape == (2, 5, 20) and weights.shape == (2, 3, 5, 5)
    sdpa = MultiHeadAttention(20, 3, d_head=16, backend="sdpa").eval()
    sdpa.load_state_dict(mha.state_dict())
    assert torch.allclose(sdpa(x, causal=True), out, atol=1e-5)
    with pytest.raises(ValueError, match="d_head must be an int >= 1, got 0"):
        MultiHeadAttention(20, 3, d_head=0)


def test_options_after_the_sizes_are_keyword_only():
    with pytest.raises(TypeError):
        MultiHeadAttention(32, 4, 4, False)  # bias passed positionally


@pytest.mark.parametrize(
    ("bad", "error", "match"),
    [
        (float("nan"), ValueError, "scale must be a finite number > 0, got nan"),
        (float("inf"), ValueError, "scale must be a finite number > 0, got inf"),
        (
            0.0,
            ValueError,
            "scale must be a finite number > 0, got 0.0",
        ),  # was: uniform weights
        (
            -1.0,
            ValueError,
            "scale must be a finite number > 0, got -1.0",
        ),  # was: inverted
        ("1.0", TypeError, "scale must be a number, got str '1.0'"),
        (True, TypeError, "scale must be a number, got bool True"),
        (torch.tensor(1.0), TypeError, "scale must be a number, got a tensor"),
    ],
)
def test_non_finite_non_positive_or_non_numeric_scale_is_rejected(bad, error, match):
    q, k, v = _qkv()
    for backend in ("math", "sdpa"):
        with pytest.raises(error, match=match):
            ATTENTION_BACKENDS[backend](q, k, v, scale=bad)
    with pytest.raises(error, match=match):
        MultiHeadAttention(32, 4, scale=bad)


@pytest.mark.parametrize("bad", [-0.1, 1.0, float("nan")])
def test_dropout_outside_zero_one_is_rejected(bad):
    q, k, v = _qkv()
    for backend in ("math", "sdpa"):
        with pytest.raises(
            ValueError, match=r"dropout_p must be a probability in \[0, 1\)"
        ):
            ATTENTION_BACKENDS[backend](q, k, v, dropout_p=bad)
        with pytest.raises(
            TypeError, match="dropout_p must be a number, got bool True"
        ):
            ATTENTION_BACKENDS[backend](q, k, v, dropout_p=True)


def _bias(kind, heads, q_len, k_len):
    from lib.positions import ALiBi, T5RelativePositionBias

    if kind == "alibi":
        return ALiBi(heads, causal=False)(q_len, k_len)
    if kind == "t5":
        return T5RelativePositionBias(heads)(q_len, k_len)
    return additive_mask(padding_mask([k_len, k_len - 2]))  # fp32 -inf/0 mask


@pytest.mark.parametrize("backend", ["math", "sdpa"])
@pytest.mark.parametrize("kind", ["alibi", "t5", "additive_mask"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fp32_bias_works_with_every_query_dtype(backend, kind, dtype):
    q, k, v = (t.to(dtype) for t in _qkv())
    bias = _bias(kind, 4, 5, 7)
    assert bias.dtype == torch.float32
    with torch.no_grad():
        out = ATTENTION_BACKENDS[backend](q, k, v, bias=bias)
        reference = scaled_dot_product_attention(
            q.float(), k.float(), v.float(), bias=bias
        )
    assert out.dtype == dtype
    tolerance = 1e-5 if dtype == torch.float32 else 5e-2
    assert (out.float() - reference).abs().max() < tolerance


def test_mismatched_dtypes_or_devices_are_a_clear_error():
    q, k, v = _qkv()
    with pytest.raises(
        TypeError,
        match="q, k and v must share a dtype, got q torch.float64, k torch.float32, v torch.float32",
    ):
        scaled_dot_product_attention(q.double(), k, v)
    with pytest.raises(
        TypeError, match="q must be a floating-point tensor, got dtype torch.int64"
    ):
        sdpa_attention(q.long(), k.long(), v.long())
    with pytest.raises(
        ValueError, match="q, k and v must be on one device, got q on cpu, k on meta"
    ):
        sdpa_attention(q, k.to("meta"), v)


def test_a_lazy_backend_name_works_before_its_module_is_imported():
    # chapter 9's backends register themselves when lib.flash is imported; their names
    # must work in a fresh process that never imported it
    code = (
        "import sys, torch\n"
        "from lib.attention import MultiHeadAttention, attention_backend_names\n"
        "from lib.attention import set_attention_backend\n"
        "assert 'lib.flash' not in sys.modules\n"
        "assert {'flash_torch', 'flash_triton'} <= set(attention_backend_names())\n"
        "torch.manual_seed(0)\n"
        "mha, x = MultiHeadAttention(16, 2), torch.randn(2, 5, 16)\n"
        "reference = mha(x, causal=True)\n"
        "assert set_attention_backend(mha, 'flash_torch') is mha\n"
        "assert 'lib.flash' in sys.modules and mha.backend == 'flash_torch'\n"
        "assert torch.allclose(mha(x, causal=True), reference, atol=1e-5)\n"
        "assert MultiHeadAttention(16, 2, backend='flash_triton').backend == 'flash_triton'\n"
        "print('ok')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=False,
        cwd=Path(__file__).resolve().parent.parent,
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_module_checks_its_arguments_once_then_trusts_the_backend(monkeypatch):
    from lib import _checks

    counted = []
    original = _checks.attention_inputs

    def counting(*args, **kwargs):
        counted.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(_checks, "attention_inputs", counting)
    mha = MultiHeadAttention(16, 2, backend="math")
    x = torch.randn(2, 5, 16)
    mha(x, mask=padding_mask([5, 3]), causal=True)
    mha(x, need_weights=True)
    set_attention_backend(mha, "sdpa")
    mha(x, mask=padding_mask([5, 3]))
    assert counted == []  # the module's own checks covered the backend's arguments
    scaled_dot_product_attention(*(torch.randn(1, 2, 3, 8) for _ in range(3)))
    assert counted == [1]  # a direct call of the public function still checks
    assert not _checks.trusted()  # and trust ends with the call that turned it on


def test_trust_ends_when_a_checked_call_raises():
    from lib import _checks

    mha = MultiHeadAttention(16, 2)
    with pytest.raises(ValueError, match="x must have shape"):
        mha(torch.randn(2, 5, 8))
    assert not _checks.trusted()
    from lib.attention import ATTENTION_BACKENDS, register_attention_backend

    def boom(q, k, v, mask=None, bias=None, dropout_p=0.0, *, scale=None, causal=False):
        assert _checks.trusted()  # called by the checked module
        raise RuntimeError("boom")

    register_attention_backend("test_boom", boom, replace=True)
    try:
        with pytest.raises(RuntimeError, match="boom"):  # a failure after the checks
            MultiHeadAttention(16, 2, backend="test_boom")(torch.randn(2, 5, 16))
    finally:
        del ATTENTION_BACKENDS["test_boom"]
    assert not _checks.trusted()
    with _checks.trusting():
        assert _checks.trusted()
        with _checks.trusting():
            assert _checks.trusted()
        assert _checks.trusted()
    assert not _checks.trusted()


def test_registry_and_set_attention_backend():
    from lib.attention import register_attention_backend, set_attention_backend

    calls = []

    def spy(q, k, v, mask=None, bias=None, dropout_p=0.0, *, scale=None, causal=False):
        calls.append((q.shape, scale, causal))
        return sdpa_attention(
            q, k, v, mask, bias, dropout_p, scale=scale, causal=causal
        )

    register_attention_backend("spy_test", spy)
    try:
        model = torch.nn.Sequential(
            MultiHeadAttention(32, 4), MultiHeadAttention(32, 4)
        )
        x = torch.randn(2, 3, 32)
        before = model(x)
        assert set_attention_backend(model, "spy_test") is model
        assert all(m.backend == "spy_test" for m in model)
        assert torch.allclose(model(x), before, atol=1e-6)
        assert len(calls) == 2
        with pytest.raises(
            ValueError,
            match=r"backend must be one of .*'sdpa', 'spy_test'.*, got str 'nope'",
        ):
            set_attention_backend(model, "nope")
        with pytest.raises(ValueError, match="exists; pass replace=True"):
            register_attention_backend("sdpa", spy)
        with pytest.raises(ValueError, match="no MultiHeadAttention"):
            set_attention_backend(torch.nn.Linear(2, 2), "math")
    finally:
        ATTENTION_BACKENDS.pop("spy_test", None)


def test_kv_cache_select_reorders_beams_and_crop_rolls_back():
    keys, values = torch.randn(3, 2, 5, 4), torch.randn(3, 2, 5, 4)
    cache = KVCache(keys, values)
    chosen = cache.select(torch.tensor([2, 2, 0]))
    assert torch.equal(chosen.keys, keys[[2, 2, 0]]) and torch.equal(
        chosen.values, values[[2, 2, 0]]
    )
    cropped = cache.crop(3)
    assert cropped.seq_len == 3 and torch.equal(cropped.keys, keys[:, :, :3])
    with pytest.raises(
        IndexError, match=r"indices \[3\] out of range for a batch of 3 \(rows 0\.\.2\)"
    ):
        cache.select(torch.tensor([3]))
    with pytest.raises(
        TypeError, match="indices must be an integer tensor, got dtype torch.float32"
    ):
        cache.select(torch.tensor([0.0]))
    with pytest.raises(ValueError, match=r"length must be an int in 0\.\.5, got 6"):
        cache.crop(6)


def test_beam_reordered_cache_decodes_like_the_reordered_batch():
    mha = MultiHeadAttention(32, 4, n_kv_heads=2).eval()
    x = torch.randn(3, 6, 32)
    _, cache = mha(x[:, :5], causal=True, use_cache=True)
    order = torch.tensor([1, 1, 2])
    step, _ = mha(x[order, 5:], causal=True, past=cache.select(order), use_cache=True)
    assert torch.allclose(step, mha(x[order], causal=True)[:, 5:], atol=1e-5)


@pytest.mark.parametrize("garbage", [float("nan"), float("inf"), 1e4])
@pytest.mark.parametrize("backend", ["math", "sdpa", "flash_torch"])
def test_a_masked_position_contributes_nothing_whatever_it_holds(backend, garbage):
    # issue 32: 0 * NaN is NaN, so a NaN in a padded key or value reached every output
    import warnings

    from lib.attention import ATTENTION_BACKENDS, attention_backend_names

    assert backend in attention_backend_names()
    MultiHeadAttention(8, 2, backend=backend)  # loads a lazy backend
    attend = ATTENTION_BACKENDS[backend]
    q, k, v = _qkv(batch=2, heads=4, kv_heads=2)
    mask = padding_mask([5, 7], max_len=7)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # flash falls back for a mask
        base = attend(q, k, v, mask, causal=True)
        k_bad, v_bad = k.clone(), v.clone()
        k_bad[0, :, 5:], v_bad[0, :, 6] = garbage, garbage
        out = attend(q, k_bad, v_bad, mask, causal=True)
    assert torch.isfinite(out).all()
    assert torch.allclose(out, base, atol=1e-6)


def test_a_masked_position_contributes_nothing_to_the_module_or_its_gradient():
    mha = MultiHeadAttention(16, 2)
    context = torch.randn(2, 6, 16)
    context[1, 4:] = float("nan")  # padding filled with garbage
    x = torch.randn(2, 3, 16, requires_grad=True)
    mask = padding_mask([6, 4])
    out = mha(x, context, mask=mask)
    assert torch.isfinite(out).all()
    clean = context.clone()
    clean[1, 4:] = 0.0
    assert torch.allclose(out, mha(x, clean, mask=mask), atol=1e-6)
    out.sum().backward()
    assert torch.isfinite(x.grad).all()
    weights = mha(x, context, mask=mask, need_weights=True)[1]
    assert torch.equal(weights[1, :, :, 4:], torch.zeros(2, 3, 2))


# --- Bad input, swept (issue 7): each case was a silent wrong answer or an unclear error ---


def test_padding_mask_bad_max_len_and_lengths():
    # a float max_len gave a mask of another length: arange(4.5) has 5 entries
    with pytest.raises(TypeError, match="max_len must be an int, got float 4.5"):
        padding_mask([2, 3], max_len=4.5)
    with pytest.raises(TypeError, match="max_len must be an int, got bool True"):
        padding_mask([1, 1], max_len=True)
    with pytest.raises(
        TypeError, match="lengths must be a tensor or a list of ints, got NoneType"
    ):
        padding_mask(None)  # was: "Could not infer dtype of NoneType"
    with pytest.raises(
        TypeError, match="lengths must be a tensor or a list of ints, got str"
    ):
        padding_mask("abc")
    with pytest.raises(
        TypeError, match="lengths must be an integer tensor, got dtype torch.bool"
    ):
        padding_mask([True, False])
    assert padding_mask([2, 3], max_len=np.int64(4)).shape == (2, 1, 1, 4)


def test_causal_mask_accepts_any_integer_and_refuses_the_rest():
    want = causal_mask(2, 6, 3)
    assert torch.equal(
        causal_mask(np.int64(2), np.int64(6), np.int64(3)), want
    )  # was refused
    assert torch.equal(causal_mask(2, 6, offset=torch.tensor(3)), want)
    with pytest.raises(TypeError, match="q_len must be an int, got bool True"):
        causal_mask(True)  # was accepted as 1
    with pytest.raises(TypeError, match="offset must be an int, got float 1.0"):
        causal_mask(2, 4, offset=1.0)
    with pytest.raises(TypeError, match="k_len must be an int, got float 4.0"):
        causal_mask(2, 4.0)


def test_combine_masks_on_two_devices_says_so():
    # was: "masks of shapes (3, 3) and (3, 3) do not broadcast"
    with pytest.raises(
        ValueError,
        match=r"masks\[0\] and masks\[2\] must be on one device, got masks\[0\] on cpu",
    ):
        combine_masks(causal_mask(3), None, causal_mask(3, device="meta"))


@pytest.mark.parametrize("dtype", [torch.long, torch.bool, "float32"])
def test_additive_mask_needs_a_floating_dtype(dtype):
    # torch.long was "value cannot be converted to type int64_t without overflow"
    with pytest.raises(TypeError, match="dtype must be a floating torch.dtype"):
        additive_mask(causal_mask(3), dtype)
    assert additive_mask(causal_mask(3), torch.float64).dtype == torch.float64


def test_repeat_kv_heads_bad_arguments():
    x = torch.randn(1, 2, 3, 4)
    with pytest.raises(TypeError, match="n_rep must be an int, got bool True"):
        repeat_kv_heads(x, True)  # was accepted as 1
    with pytest.raises(TypeError, match="x must be a torch.Tensor, got list"):
        repeat_kv_heads(
            x.tolist(), 2
        )  # was: AttributeError 'list' object has no attribute 'dim'
    assert repeat_kv_heads(x, np.int64(2)).shape == (1, 4, 3, 4)


@pytest.mark.parametrize("backend", ["math", "sdpa"])
def test_mask_and_bias_on_another_device_are_named(backend):
    q, k, v = _qkv()
    # both were a RuntimeError from deep inside masked_fill or the kernel
    with pytest.raises(
        ValueError, match="q and mask must be on one device, got q on cpu, mask on meta"
    ):
        ATTENTION_BACKENDS[backend](q, k, v, causal_mask(5, 7, device="meta"))
    with pytest.raises(ValueError, match="q and bias must be on one device"):
        ATTENTION_BACKENDS[backend](q, k, v, bias=torch.zeros(5, 7, device="meta"))


@pytest.mark.parametrize("backend", ["math", "sdpa"])
def test_bias_of_another_float_dtype_is_cast(backend):
    q, k, v = _qkv()
    bias = torch.randn(4, 5, 7, dtype=torch.float64)
    out = ATTENTION_BACKENDS[backend](q, k, v, bias=bias)
    assert out.dtype == torch.float32
    assert torch.allclose(
        out, ATTENTION_BACKENDS[backend](q, k, v, bias=bias.float()), atol=1e-6
    )
    with pytest.raises(
        TypeError, match="bias must be a floating-point tensor, got dtype torch.int64"
    ):
        ATTENTION_BACKENDS[backend](q, k, v, bias=torch.zeros(5, 7, dtype=torch.long))


@pytest.mark.parametrize("backend", ["math", "sdpa"])
def test_flags_must_be_bools(backend):
    q, k, v = _qkv()
    # causal="no" is truthy: it applied a causal mask without a word
    with pytest.raises(TypeError, match="causal must be True or False, got str 'no'"):
        ATTENTION_BACKENDS[backend](q, k, v, causal="no")
    with pytest.raises(
        TypeError, match="return_weights must be True or False, got int 1"
    ):
        scaled_dot_product_attention(q, k, v, return_weights=1)


def test_registry_refuses_bad_names_and_functions():
    from lib.attention import register_attention_backend, set_attention_backend

    with pytest.raises(ValueError, match="name must be a non-empty str, got ''"):
        register_attention_backend("", sdpa_attention)
    with pytest.raises(TypeError, match="name must be a str, got NoneType"):
        register_attention_backend(None, sdpa_attention)
    with pytest.raises(TypeError, match="fn must be callable, got str"):
        register_attention_backend("text_test", "sdpa")
    with pytest.raises(TypeError, match="replace must be True or False, got int 1"):
        register_attention_backend("sdpa", sdpa_attention, replace=1)
    assert "text_test" not in ATTENTION_BACKENDS
    # was: AttributeError 'str' object has no attribute 'modules'
    with pytest.raises(TypeError, match="model must be an nn.Module, got str"):
        set_attention_backend("model", "math")
    with pytest.raises(
        ValueError, match=r"backend must be one of .*, got list \['math'\]"
    ):
        MultiHeadAttention(
            32, 4, backend=["math"]
        )  # unhashable: not a TypeError from the dict


def test_kv_cache_refuses_mismatched_or_non_tensors():
    keys = torch.zeros(2, 2, 3, 8)
    with pytest.raises(
        TypeError, match="KVCache: keys must be a torch.Tensor, got list"
    ):
        KVCache([1.0], keys)  # was: AttributeError
    with pytest.raises(TypeError, match="keys and values must share a dtype"):
        KVCache(keys, keys.double())
    with pytest.raises(ValueError, match="keys and values must be on one device"):
        KVCache(keys, keys.to("meta"))  # was accepted
    with pytest.raises(TypeError, match="keys must be a floating-point tensor"):
        KVCache(keys.long(), keys.long())


def test_kv_cache_extend_keeps_its_dtype():
    cache = KVCache(
        torch.zeros(2, 2, 3, 8, dtype=torch.bfloat16),
        torch.zeros(2, 2, 3, 8).bfloat16(),
    )
    new = torch.ones(2, 2, 1, 8)
    # torch.cat promoted the whole cache to fp32 without a word
    with pytest.raises(
        TypeError,
        match="cache, keys and values must share a dtype, got cache torch.bfloat16",
    ):
        cache.extend(new, new)
    assert cache.extend(new.bfloat16(), new.bfloat16()).keys.dtype == torch.bfloat16


def test_kv_cache_select_and_crop_bad_arguments():
    keys = torch.randn(3, 2, 5, 4)
    cache = KVCache(keys, keys.clone())
    # a negative index passed the old range check, then failed inside index_select
    with pytest.raises(
        IndexError,
        match=r"indices \[-1\] out of range for a batch of 3 \(rows 0\.\.2\)",
    ):
        cache.select(torch.tensor([-1]))
    with pytest.raises(
        TypeError, match="indices must be an integer tensor, got dtype torch.bool"
    ):
        cache.select(torch.tensor([True, False, True]))
    with pytest.raises(
        TypeError, match="indices must be a tensor or a list of ints, got str"
    ):
        cache.select("012")
    assert torch.equal(cache.select([2, 0]).keys, keys[[2, 0]])
    assert cache.crop(np.int64(2)).seq_len == 2  # was refused
    with pytest.raises(TypeError, match="length must be an int, got bool True"):
        cache.crop(True)
    with pytest.raises(TypeError, match="length must be an int, got float 2.0"):
        cache.crop(2.0)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(n_heads=4.0), TypeError, "n_heads must be an int, got float 4.0"),
        (dict(n_kv_heads=True), TypeError, "n_kv_heads must be an int, got bool True"),
        (dict(d_head=8.0), TypeError, "d_head must be an int, got float 8.0"),
        (dict(bias=1), TypeError, "bias must be True or False, got int 1"),
        (dict(qk_norm="yes"), TypeError, "qk_norm must be True or False"),
        (dict(dropout=True), TypeError, "dropout must be a number, got bool True"),
        (
            dict(dropout=-0.1),
            ValueError,
            r"dropout must be a probability in \[0, 1\), got -0.1",
        ),
    ],
)
def test_bad_configuration_types(kwargs, error, match):
    with pytest.raises(error, match=f"MultiHeadAttention: {match}"):
        MultiHeadAttention(**{"d_model": 32, "n_heads": 4, **kwargs})


def test_numpy_sizes_are_ints():
    mha = MultiHeadAttention(np.int64(32), np.int64(4), np.int64(2), d_head=np.int64(8))
    assert type(mha.n_heads) is int and type(mha.d_head) is int
    assert mha(torch.randn(1, 3, 32)).shape == (1, 3, 32)


def test_bad_forward_arguments_are_named():
    mha = MultiHeadAttention(32, 4)
    x = torch.randn(2, 6, 32)
    with pytest.raises(
        TypeError,
        match="x and weight must share a dtype, got x torch.float64, weight torch.float32",
    ):
        mha(x.double())  # was: "mat1 and mat2 must have the same dtype"
    with pytest.raises(
        TypeError, match="x must be a floating-point tensor, got dtype torch.int64"
    ):
        mha(torch.ones(2, 6, 32, dtype=torch.long))
    # a truthy string returned a tuple (use_cache) or a causal result (causal) without a word
    with pytest.raises(
        TypeError, match="use_cache must be True or False, got str 'no'"
    ):
        mha(x, use_cache="no")
    with pytest.raises(TypeError, match="causal must be True or False, got str 'yes'"):
        mha(x, causal="yes")
    with pytest.raises(
        TypeError, match="need_weights must be True or False, got int 1"
    ):
        mha(x, need_weights=1)
    with pytest.raises(
        TypeError, match="position_bias must be a tensor or a module .* got list"
    ):
        mha(x, position_bias=[0.0])  # was: "'list' object is not callable"
    with pytest.raises(TypeError, match="rope must be callable, got int"):
        mha(x, rope=3)
    with pytest.raises(TypeError, match="context and weight must share a dtype"):
        mha(x, torch.randn(2, 4, 32, dtype=torch.float64))
    with pytest.raises(ValueError, match="q and mask must be on one device"):
        mha(x, mask=padding_mask([6, 2]).to("meta"))


def test_module_runs_under_autocast():
    mha = MultiHeadAttention(32, 4).eval()
    x = torch.randn(2, 6, 32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = mha(x.bfloat16(), causal=True)
    assert out.dtype == torch.bfloat16
    assert (out.float() - mha(x, causal=True)).abs().max() < 0.1


def test_cost_functions_refuse_floats_and_bools():
    with pytest.raises(
        TypeError, match=r"kv_cache_bytes\(\): seq_len must be an int, got float"
    ):
        kv_cache_bytes(1, 1, 64, 1024.0)
    with pytest.raises(
        TypeError, match="bytes_per_value must be an int, got bool True"
    ):
        kv_cache_bytes(1, 1, 64, 1024, bytes_per_value=True)
    assert type(kv_cache_bytes(np.int64(2), 1, 1, 1)) is int
    with pytest.raises(ValueError, match="d_ff must be an int >= 1, got 0"):
        attention_layer_flops(16, 64, d_ff=0)
    with pytest.raises(
        TypeError, match=r"attention_crossover_length\(\): d_model must be an int"
    ):
        attention_crossover_length(64.0)


def test_a_one_dimensional_key_mask_works_on_both_backends():
    q, k, v = _qkv()
    mask = torch.tensor([True] * 4 + [False] * 3)  # (k_pos,): broadcasts to every query
    reference = scaled_dot_product_attention(q, k[:, :, :4], v[:, :, :4])
    for backend in ("math", "sdpa"):
        assert torch.allclose(
            ATTENTION_BACKENDS[backend](q, k, v, mask), reference, atol=1e-5
        )


def test_cross_attention_from_the_cache_alone_needs_no_context():
    """cross_attention=True lets a decoder step read the encoder's cached keys and values."""
    mha = MultiHeadAttention(32, n_heads=4, n_kv_heads=2).eval()
    x, context = torch.randn(2, 5, 32), torch.randn(2, 6, 32)
    full = mha(x, context)
    _, cache = mha(x[:, :1], context, use_cache=True)
    for t in range(5):
        step, same = mha(
            x[:, t : t + 1], past=cache, use_cache=True, cross_attention=True
        )
        assert same is cache  # the encoder's keys and values are reused, not extended
        assert torch.allclose(step, full[:, t : t + 1], atol=1e-5)
    # the old spelling (context together with past) still works and agrees
    old = mha(x[:, :1], torch.zeros_like(context), past=cache)
    assert torch.allclose(old, full[:, :1], atol=1e-5)
    with pytest.raises(ValueError, match="cross_attention=True needs"):
        mha(x, cross_attention=True)
    with pytest.raises(TypeError, match="cross_attention"):
        mha(x, context, cross_attention="yes")


def test_mha_checks_the_cache_it_is_given():
    """A cache of another dtype, or values of another width, are named at the front
    door (the cache is extended with trust on: torch.cat would promote a bf16 cache or
    fail deep inside)."""
    from lib.attention import KVCache, MultiHeadAttention

    mha = MultiHeadAttention(16, 4)
    x = torch.randn(1, 3, 16)
    _, cache = mha(x, use_cache=True)
    bf16 = KVCache(cache.keys.bfloat16(), cache.values.bfloat16())
    with pytest.raises(
        TypeError, match="past.keys, past.values and weight must share a dtype"
    ):
        mha(x, past=bf16, use_cache=True)
    narrow = KVCache(cache.keys, cache.values[..., :2])
    with pytest.raises(
        ValueError, match=r"past.values must have shape .* got shape \(1, 4, 3, 2\)"
    ):
        mha(x, past=narrow, use_cache=True)
    out, longer = mha(x, past=cache, use_cache=True)
    assert out.shape == (1, 3, 16) and longer.seq_len == 6


# ----------------------------------------------------------------------------- QK-norm


def _qk_norm_by_hand(mha, x, **attention):
    """QK-norm's forward written out: F.rms_norm over d_head on each head's q and k."""
    q, k, v = mha.qkv_proj(x).split([mha.q_dim, mha.kv_dim, mha.kv_dim], dim=-1)
    q = q.unflatten(-1, (mha.n_heads, mha.d_head)).transpose(1, 2)
    k = k.unflatten(-1, (mha.n_kv_heads, mha.d_head)).transpose(1, 2)
    v = v.unflatten(-1, (mha.n_kv_heads, mha.d_head)).transpose(1, 2)
    q = F.rms_norm(q, (mha.d_head,), mha.q_norm_gain, eps=1e-6)
    k = F.rms_norm(k, (mha.d_head,), mha.k_norm_gain, eps=1e-6)
    out = scaled_dot_product_attention(q, k, v, **attention)
    return mha.out_proj(out.transpose(1, 2).flatten(2)), q, k


@pytest.mark.parametrize("backend", CORE_BACKENDS)
def test_qk_norm_equals_a_hand_computation_and_starts_with_unit_gains(backend):
    mha = MultiHeadAttention(32, 4, 2, backend=backend, qk_norm=True).eval()
    assert torch.equal(mha.q_norm_gain, torch.ones(8))
    assert torch.equal(mha.k_norm_gain, torch.ones(8))
    with torch.no_grad():
        mha.q_norm_gain.uniform_(0.5, 2.0)
        mha.k_norm_gain.uniform_(0.5, 2.0)
        x = 5 * torch.randn(2, 6, 32)
        by_hand, _, _ = _qk_norm_by_hand(mha, x, causal=True)
        assert torch.allclose(mha(x, causal=True), by_hand, atol=1e-5)
    assert "qk_norm=True" in repr(mha)
    assert MultiHeadAttention(32, 4).q_norm_gain is None  # off by default


def test_qk_norm_bounds_every_score_by_scale_d_head_and_the_gains():
    """|scale * q_hat . k_hat| <= scale * d_head * max|g_q| * max|g_k| (Cauchy-Schwarz:
    a normalised vector is at most sqrt(d_head) long), whatever the weights."""
    for scale in (None, 1.0):
        mha = MultiHeadAttention(32, 4, qk_norm=True, scale=scale)
        with torch.no_grad():
            mha.qkv_proj.weight.mul_(1000.0)  # weights grown far beyond their init
            mha.q_norm_gain.uniform_(-3.0, 3.0)
            mha.k_norm_gain.uniform_(-2.0, 2.0)
            _, q, k = _qk_norm_by_hand(mha, 100 * torch.randn(3, 9, 32))
            scale_value = 8**-0.5 if scale is None else scale
            scores = scale_value * (q @ k.transpose(-1, -2))
            gains = mha.q_norm_gain.abs().max() * mha.k_norm_gain.abs().max()
            bound = scale_value * 8 * gains
        assert scores.abs().max() <= bound
        assert scores.abs().max() > 0.3 * bound  # the bound is not vacuous here


def test_qk_norm_makes_attention_blind_to_the_scale_of_w_q_and_w_k():
    mha = MultiHeadAttention(32, 4, qk_norm=True, backend="math").eval()
    x = torch.randn(2, 7, 32)
    _, before = mha(x, causal=True, need_weights=True)
    with torch.no_grad():
        mha.qkv_proj.weight[:64] *= 50.0  # the query and key rows
        mha.qkv_proj.bias[:64] *= 50.0
    _, after = mha(x, causal=True, need_weights=True)
    assert torch.allclose(before, after, atol=1e-5)


@pytest.mark.parametrize("n_kv_heads", [4, 2, 1])
@pytest.mark.parametrize("backend", CORE_BACKENDS)
def test_qk_norm_caches_normalised_keys_so_decoding_equals_the_full_forward(
    n_kv_heads, backend
):
    from lib.positions import RotaryEmbedding

    mha = MultiHeadAttention(32, 4, n_kv_heads, backend=backend, qk_norm=True).eval()
    with torch.no_grad():
        mha.q_norm_gain.uniform_(0.5, 2.0)  # the key gains stay 1: RMS 1 below
    rope = RotaryEmbedding(8)
    x = 3 * torch.randn(2, 9, 32)
    stepped, cache = _decode(mha, x, prefill=3, rope=rope)
    assert torch.allclose(stepped, mha(x, causal=True, rope=rope), atol=1e-5)
    # the cached keys are the normalised ones, then rotated (rotation keeps the RMS)
    rms = cache.keys.pow(2).mean(-1).sqrt()
    assert torch.allclose(rms, torch.ones_like(rms), atol=1e-4)


def test_qk_norm_in_cross_attention_normalises_the_context_keys_once():
    mha = MultiHeadAttention(32, 4, qk_norm=True).eval()
    decoder_x, encoder_out = torch.randn(2, 4, 32), torch.randn(2, 6, 32)
    first, cache = mha(decoder_x[:, :1], encoder_out, use_cache=True)
    later = mha(decoder_x[:, 1:], past=cache, cross_attention=True)
    full = mha(decoder_x, encoder_out)
    assert torch.allclose(torch.cat([first, later], 1), full, atol=1e-5)


def test_qk_norm_runs_under_autocast():
    mha = MultiHeadAttention(32, 4, qk_norm=True).eval()
    x = torch.randn(2, 6, 32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = mha(x.bfloat16(), causal=True)
    assert out.dtype == torch.bfloat16
    assert (out.float() - mha(x, causal=True)).abs().max() < 0.1


# --- issue 40, item 7: modules composed with bad input -----------------------------------


def test_a_bias_callable_is_checked_by_what_it_returns():
    mha = MultiHeadAttention(32, 4).eval()
    x = torch.randn(2, 5, 32)
    # each was a broadcasting error deep in PyTorch, an AttributeError, or (a bool
    # "bias") a silent result: True added 1.0 to the scores
    bad = {
        "must broadcast to .* got shape \\(5, 6\\)": lambda q, k, o: torch.zeros(
            q, k + 1
        ),
        "must be a torch.Tensor, got list": lambda q, k, o: [0.0],
        "must be a floating-point tensor": lambda q, k, o: torch.ones(q, k).bool(),
    }
    for match, bias in bad.items():
        with pytest.raises(
            (TypeError, ValueError), match=f"position_bias\\(5, 5, 0\\) {match}"
        ):
            mha(x, position_bias=bias)
    calls = []

    def bias(q_len, k_len, offset):
        calls.append((q_len, k_len, offset))
        return torch.zeros(4, q_len, k_len)

    out, cache = mha(x, position_bias=bias, use_cache=True)
    assert torch.allclose(out, mha(x), atol=1e-6)
    # checked once at the front door, then computed by the body: with the offset
    mha(x[:, :2], position_bias=bias, past=cache)
    assert calls == [(5, 5, 0)] * 2 + [(2, 7, 5)] * 2


def test_a_causal_mask_with_more_queries_than_keys_needs_an_offset():
    with pytest.raises(ValueError, match=r"causal_mask\(\): a causal mask with more "):
        causal_mask(5, 3)  # was: 2 rows that see nothing
    assert causal_mask(5, 3, offset=2).sum(-1).tolist() == [3, 3, 3, 3, 3]  # placed
    # asked for, the bottom-right rows are still there (the backends' causal=True)
    assert causal_mask(5, 3, offset=-2).sum(-1).tolist() == [0, 0, 1, 2, 3]


def test_heads_of_zero_width_are_refused():
    empty = torch.randn(2, 4, 5, 0)
    for backend in ("math", "sdpa"):  # math divided by zero, sdpa returned (2, 4, 5, 0)
        with pytest.raises(ValueError, match=r"has d_head=0.*d_model < n_heads"):
            ATTENTION_BACKENDS[backend](empty, empty, empty)
    with pytest.raises(ValueError, match="d_model=2 is not divisible by n_heads=4"):
        MultiHeadAttention(2, 4)
    with pytest.raises(ValueError, match="d_head must be an int >= 1, got 0"):
        MultiHeadAttention(32, 4, d_head=0)


def _kv(length, batch=2, heads=3, width=4, start=0.0):
    """Keys and values whose entries say their position: start, start+1, ..."""
    positions = torch.arange(length, dtype=torch.float32).add(start)
    positions = positions.reshape(1, 1, length, 1)
    return (
        positions.expand(batch, heads, length, width).clone(),
        -positions.expand(batch, heads, length, width).clone(),
    )


@torch.no_grad()
def test_kv_cache_extends_in_place_and_equals_concatenation():
    cache, keys, values = KVCache(*_kv(3)), *_kv(3)
    for step in range(300):  # past one block of 256 positions
        k, v = _kv(1, start=3 + step)
        cache = cache.extend(k, v)
        keys, values = torch.cat([keys, k], 2), torch.cat([values, v], 2)
        assert torch.equal(cache.keys, keys) and torch.equal(cache.values, values)
    # written in place: the latest cache is a view of a buffer with room
    buffer = cache._room[0]
    assert cache.keys.data_ptr() == buffer.data_ptr() and buffer.shape[2] == 512


@torch.no_grad()
def test_kv_cache_never_overwrites_what_another_cache_sees():
    base = KVCache(*_kv(4)).extend(*_kv(1, start=4))  # 5 positions, a buffer
    before = base.keys.clone()
    left = base.extend(*_kv(1, start=100))  # the newest: in place
    right = base.extend(*_kv(1, start=200))  # base extended again: a copy
    assert torch.equal(base.keys, before)
    assert left.keys[0, 0, -1, 0] == 100 and right.keys[0, 0, -1, 0] == 200
    assert right._room[0].data_ptr() != left._room[0].data_ptr()
    # a cropped cache (a rolled-back draft) writes into a buffer of its own
    cropped = left.crop(3)
    again = cropped.extend(*_kv(1, start=300))
    assert torch.equal(left.keys[:, :, :6], torch.cat([before, left.keys[:, :, 5:]], 2))
    assert left.keys[0, 0, 3, 0] == 3 and again.keys[0, 0, 3, 0] == 300
    # reordered rows (beam search) too
    chosen = left.select(torch.tensor([1, 0]))
    chosen.extend(*_kv(1, start=400))
    assert left.keys[0, 0, -1, 0] == 100


def test_kv_cache_under_autograd_concatenates_and_backpropagates():
    keys = torch.randn(1, 2, 3, 4, requires_grad=True)
    cache = KVCache(keys, torch.randn(1, 2, 3, 4)).extend(
        torch.randn(1, 2, 1, 4), torch.randn(1, 2, 1, 4)
    )
    assert cache._room is None  # concatenated: nothing written in place
    cache.keys.sum().backward()
    assert torch.equal(keys.grad, torch.ones_like(keys))
