"""Unit tests of lib.positions (chapter 3): properties from the papers and input validation."""

from __future__ import annotations

import math

import pytest
import torch

from lib.positions import (
    ALiBi,
    LearnedPositionalEmbedding,
    RotaryEmbedding,
    SinusoidalPositionalEncoding,
    T5RelativePositionBias,
    alibi_slopes,
    apply_rotary,
    rope_frequencies,
    rope_rotate_half,
    rotary_interleaved,
    sinusoidal_offset_matrix,
    sinusoidal_positions,
    t5_relative_position_bucket,
)

# ---------------------------------------------------------------- sinusoidal


def test_sinusoidal_matches_the_formula_entry_by_entry():
    d_model = 10
    table = sinusoidal_positions(7, d_model)
    assert table.shape == (7, d_model) and table.dtype == torch.float32
    for pos in range(7):
        for i in range(d_model // 2):
            angle = pos / 10000 ** (2 * i / d_model)
            assert table[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
            assert table[pos, 2 * i + 1].item() == pytest.approx(
                math.cos(angle), abs=1e-6
            )


def test_sinusoidal_base_changes_the_wavelengths():
    assert not torch.allclose(
        sinusoidal_positions(5, 8), sinusoidal_positions(5, 8, base=100.0)
    )
    # the first pair has frequency 1 whatever the base
    assert torch.allclose(
        sinusoidal_positions(5, 8)[:, :2], sinusoidal_positions(5, 8, base=100.0)[:, :2]
    )


@pytest.mark.parametrize("k", [0, 1, 5, 37, -3])
def test_offset_matrix_moves_every_position_by_k(k):
    d_model, n = 16, 200
    table = sinusoidal_positions(n + 50, d_model).double()
    m_k = sinusoidal_offset_matrix(k, d_model).double()
    start = max(0, -k)
    positions = torch.arange(start, n)
    moved = table[positions] @ m_k.T  # row-vector form of M_k @ PE[pos]
    assert torch.allclose(moved, table[positions + k], atol=1e-5)


def test_offset_matrix_is_block_diagonal_and_orthogonal():
    m = sinusoidal_offset_matrix(9, 8)
    assert torch.allclose(m @ m.T, torch.eye(8), atol=1e-6)
    off_block = m.clone()
    for p in range(4):
        off_block[2 * p : 2 * p + 2, 2 * p : 2 * p + 2] = 0
    assert torch.count_nonzero(off_block) == 0
    assert torch.allclose(sinusoidal_offset_matrix(0, 8), torch.eye(8))


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [
        ((5, 7), ValueError, "d_model must be even"),
        ((-1, 8), ValueError, "n_positions must be an int >= 0, got -1"),
        ((5.0, 8), TypeError, "n_positions must be an int, got float 5.0"),
        (
            (5, 8, 1.0),
            ValueError,
            "base must be a finite number > 1, got 1.0; the papers use 10000",
        ),
        # before: accepted; every pair but the first had frequency 0, so positions did not vary
        ((5, 8, float("inf")), ValueError, "base must be a finite number > 1, got inf"),
        ((5, 8, float("nan")), ValueError, "base must be a finite number > 1, got nan"),
        ((5, 8, True), TypeError, "base must be a number, got bool True"),
        ((5, True), TypeError, "d_model must be an int, got bool True"),
    ],
)
def test_sinusoidal_rejects_bad_arguments(args, error, match):
    with pytest.raises(error, match=match):
        sinusoidal_positions(*args)


def test_offset_matrix_rejects_bad_arguments():
    with pytest.raises(TypeError, match="k must be an int"):
        sinusoidal_offset_matrix(1.5, 8)
    with pytest.raises(ValueError, match="d_model must be even"):
        sinusoidal_offset_matrix(1, 9)


def test_sinusoidal_module_adds_the_rows_at_the_offset():
    module = SinusoidalPositionalEncoding(d_model=8, max_len=32)
    x = torch.randn(2, 5, 8)
    assert torch.allclose(module(x), x + sinusoidal_positions(5, 8))
    assert torch.allclose(module(x, offset=3), x + sinusoidal_positions(8, 8)[3:])
    assert list(module.parameters()) == []


def test_sinusoidal_module_computes_rows_past_its_cache():
    module = SinusoidalPositionalEncoding(d_model=8, max_len=4)
    x = torch.zeros(1, 3, 8)
    assert torch.allclose(module(x, offset=10), sinusoidal_positions(13, 8)[10:])


def test_sinusoidal_module_validates():
    module = SinusoidalPositionalEncoding(d_model=8)
    with pytest.raises(
        ValueError,
        match=r"x must have shape \(\.\.\. seq d_model\) with d_model=8, got shape \(2, 5, 6\)",
    ):
        module(torch.randn(2, 5, 6))
    with pytest.raises(ValueError, match="offset must be an int >= 0, got -1"):
        module(torch.randn(2, 5, 8), offset=-1)
    with pytest.raises(TypeError, match="floating-point"):
        module(torch.ones(2, 5, 8, dtype=torch.long))
    with pytest.raises(
        ValueError, match=r"dropout must be a probability in \[0, 1\), got 1.5"
    ):
        SinusoidalPositionalEncoding(8, dropout=1.5)
    with pytest.raises(ValueError, match="dropout must be a probability in"):
        SinusoidalPositionalEncoding(8, dropout=-0.1)
    # before: a TypeError about comparing str and float
    with pytest.raises(TypeError, match="dropout must be a number, got str '0.1'"):
        SinusoidalPositionalEncoding(8, dropout="0.1")
    with pytest.raises(ValueError, match="d_model must be even, got 7"):
        SinusoidalPositionalEncoding(7)
    with pytest.raises(TypeError, match="max_len must be an int, got float 16.0"):
        SinusoidalPositionalEncoding(8, max_len=16.0)
    with pytest.raises(ValueError, match="base must be a finite number > 1, got inf"):
        SinusoidalPositionalEncoding(8, base=float("inf"))
    with pytest.raises(
        ValueError, match="x and pe must be on one device, got x on meta"
    ):
        module(torch.randn(1, 2, 8, device="meta"))


def test_sinusoidal_module_computes_float64_in_float64():
    # before: the float32 table was added to a float64 input (float32 accuracy)
    module = SinusoidalPositionalEncoding(d_model=8, max_len=64)
    x = torch.zeros(1, 40, 8, dtype=torch.float64)
    expected = sinusoidal_positions(45, 8, dtype=torch.float64)[5:]
    assert torch.equal(module(x, offset=5)[0], expected)
    assert not torch.equal(expected.float().double(), expected)  # float32 would differ
    assert torch.equal(
        module.double()(x, offset=5)[0], expected
    )  # after module.double() too
    with pytest.raises(TypeError, match="dtype must be a floating torch.dtype"):
        sinusoidal_positions(4, 8, dtype=torch.long)


def test_sinusoidal_module_keeps_the_input_dtype():
    module = SinusoidalPositionalEncoding(d_model=8)
    assert module(torch.randn(1, 3, 8, dtype=torch.bfloat16)).dtype == torch.bfloat16


# ---------------------------------------------------------------- learned


def test_learned_adds_its_rows_and_learns():
    module = LearnedPositionalEmbedding(max_len=10, d_model=4)
    x = torch.randn(3, 6, 4)
    out = module(x, offset=2)
    assert torch.allclose(out, x + module.embedding.weight[2:8])
    out.sum().backward()
    grad = module.embedding.weight.grad
    assert (
        grad[2:8].abs().sum() > 0
        and grad[:2].abs().sum() == 0
        and grad[8:].abs().sum() == 0
    )


def test_learned_refuses_positions_past_max_len():
    module = LearnedPositionalEmbedding(max_len=10, d_model=4)
    module(torch.randn(1, 10, 4))  # exactly max_len is fine
    with pytest.raises(ValueError, match=r"positions 5\.\.10 .* past max_len=10"):
        module(torch.randn(1, 6, 4), offset=5)
    with pytest.raises(ValueError, match="past max_len=10"):
        module(torch.randn(1, 11, 4))
    with pytest.raises(ValueError, match="offset must be an int >= 0"):
        module(torch.randn(1, 2, 4), offset=-2)
    with pytest.raises(ValueError, match="with d_model=4, got shape"):
        module(torch.randn(1, 2, 5))


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        # before: inf filled the table with infinities, NaN was refused deep inside torch
        (
            {"init_std": float("inf")},
            ValueError,
            "init_std must be a finite number >= 0, got inf",
        ),
        (
            {"init_std": float("nan")},
            ValueError,
            "init_std must be a finite number >= 0, got nan",
        ),
        ({"max_len": 10.0}, TypeError, "max_len must be an int, got float"),
        ({"d_model": 0}, ValueError, "d_model must be an int >= 1, got 0"),
    ],
)
def test_learned_rejects_bad_construction(kwargs, error, match):
    with pytest.raises(error, match=match):
        LearnedPositionalEmbedding(**{"max_len": 10, "d_model": 4, **kwargs})


def test_learned_input_on_another_device_is_a_clear_error():
    module = LearnedPositionalEmbedding(max_len=10, d_model=4)
    with pytest.raises(ValueError, match="x and weight must be on one device"):
        module(torch.randn(1, 2, 4, device="meta"))
    assert module(torch.randn(1, 2, 4, dtype=torch.float64)).dtype == torch.float64


# ---------------------------------------------------------------- RoPE


def test_rotate_half_is_a_quarter_turn():
    x = torch.randn(3, 8)
    assert torch.equal(rope_rotate_half(rope_rotate_half(x)), -x)
    assert torch.allclose((x * rope_rotate_half(x)).sum(-1), torch.zeros(3), atol=1e-6)


def test_rope_rotates_each_pair_by_position_times_frequency():
    d_head = 6
    rope = RotaryEmbedding(d_head)
    x = torch.randn(5, d_head)
    out = rope(x, offset=3)
    theta = rope_frequencies(d_head)
    half = d_head // 2
    for row in range(5):
        pos = 3 + row
        for i in range(half):
            c, s = math.cos(pos * theta[i]), math.sin(pos * theta[i])
            a, b = x[row, i].item(), x[row, i + half].item()
            assert out[row, i].item() == pytest.approx(a * c - b * s, abs=1e-5)
            assert out[row, i + half].item() == pytest.approx(a * s + b * c, abs=1e-5)


def test_rope_preserves_norms_and_position_zero():
    rope = RotaryEmbedding(16)
    x = torch.randn(2, 3, 20, 16)
    out = rope(x)
    assert out.shape == x.shape
    assert torch.allclose(out.norm(dim=-1), x.norm(dim=-1), atol=1e-5)
    assert torch.allclose(out[..., 0, :], x[..., 0, :])


def test_rope_scores_depend_only_on_the_relative_position():
    rope = RotaryEmbedding(32)
    q, k = torch.randn(32, dtype=torch.float64), torch.randn(32, dtype=torch.float64)
    rope = rope.double()

    def score(m: int, n: int) -> float:
        qm = rope(q.float().view(1, 32), offset=m)[0].double()
        kn = rope(k.float().view(1, 32), offset=n)[0].double()
        return float(qm @ kn)

    for distance in (0, 1, 7, 50):
        scores = [score(m, m - distance) for m in (distance, distance + 3, 100, 900)]
        assert max(scores) - min(scores) < 1e-3, scores


def test_rope_half_split_equals_interleaved_up_to_a_permutation():
    d_head = 8
    x = torch.randn(2, 3, 10, d_head, dtype=torch.float64)
    half_split_order = torch.cat(
        (torch.arange(0, d_head, 2), torch.arange(1, d_head, 2))
    )
    rope = RotaryEmbedding(d_head)
    ours = rope(x[..., half_split_order].float(), offset=4).double()
    reference = rotary_interleaved(x, offset=4)[..., half_split_order]
    assert torch.allclose(ours, reference, atol=1e-5)
    # and the two pairings really differ without the permutation
    assert not torch.allclose(
        rope(x.float(), offset=4).double(), rotary_interleaved(x, offset=4), atol=1e-2
    )


def test_rope_rotates_a_whole_batch_like_row_by_row_and_past_its_cache():
    rope = RotaryEmbedding(8, max_len=16)
    x = torch.randn(2, 4, 12, 8)
    whole = rope(x, offset=10)  # positions 10..21 cross the cache end at 16
    for t in range(12):
        assert torch.allclose(
            whole[..., t : t + 1, :],
            rope(x[..., t : t + 1, :], offset=10 + t),
            atol=1e-6,
        )
    assert torch.allclose(whole, rotary_interleaved_in_half_layout(x, 10), atol=1e-5)


def rotary_interleaved_in_half_layout(x: torch.Tensor, offset: int) -> torch.Tensor:
    d = x.shape[-1]
    to_interleaved = torch.stack(
        (torch.arange(d // 2), torch.arange(d // 2) + d // 2), -1
    ).flatten()
    back = torch.argsort(to_interleaved)
    return rotary_interleaved(x[..., to_interleaved], offset)[..., back]


def test_rope_keeps_dtype_and_has_no_parameters():
    rope = RotaryEmbedding(8)
    assert rope(torch.randn(1, 2, 3, 8, dtype=torch.bfloat16)).dtype == torch.bfloat16
    assert list(rope.parameters()) == []


def test_rope_validates():
    with pytest.raises(
        ValueError, match="d_head must be even, got 7; RoPE rotates pairs"
    ):
        RotaryEmbedding(7)
    rope = RotaryEmbedding(8)
    with pytest.raises(ValueError, match=r"with d_head=8, got shape \(2, 3, 6\)"):
        rope(torch.randn(2, 3, 6))
    with pytest.raises(ValueError, match="offset must be an int >= 0, got -1"):
        rope(torch.randn(2, 3, 8), offset=-1)
    with pytest.raises(TypeError, match="offset must be an int, got float 1.0"):
        rope(torch.randn(2, 3, 8), offset=1.0)
    with pytest.raises(TypeError, match="offset must be an int, got bool True"):
        rope(torch.randn(2, 3, 8), offset=True)
    with pytest.raises(ValueError, match="must both end in"):
        apply_rotary(torch.randn(3, 8), torch.randn(4, 8), torch.randn(4, 8))
    with pytest.raises(ValueError, match="d_head must be even"):
        rotary_interleaved(torch.randn(3, 5))
    with pytest.raises(TypeError, match="x must be a torch.Tensor, got list"):
        rotary_interleaved([[1.0, 2.0]])
    with pytest.raises(
        ValueError, match=r"x must have shape \(\.\.\. seq d_head\), got shape \(8,\)"
    ):
        rotary_interleaved(torch.randn(8))
    with pytest.raises(ValueError, match="base must be a finite number > 1, got inf"):
        RotaryEmbedding(8, base=float("inf"))
    with pytest.raises(ValueError, match="base must be a finite number > 1"):
        rope_frequencies(8, base=0.5)
    with pytest.raises(ValueError, match="x and cos_cached must be on one device"):
        rope(torch.randn(1, 2, 8, device="meta"))


def test_offsets_may_be_numpy_or_0d_tensor_integers():
    import numpy as np

    rope, x = RotaryEmbedding(8), torch.randn(1, 3, 8)
    assert torch.equal(rope(x, offset=np.int64(4)), rope(x, offset=4))
    assert torch.equal(rope(x, offset=torch.tensor(4)), rope(x, offset=4))


def test_rotate_half_needs_an_even_last_axis():
    # before: an odd axis was cut into unequal halves and "rotated" without a word
    with pytest.raises(ValueError, match="the last axis of x must be even, got 5"):
        rope_rotate_half(torch.randn(2, 5))
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        rope_rotate_half([1.0, 2.0])


def test_rotary_interleaved_refuses_integer_input():
    # before: the integer input was rotated in float64 and truncated back to integers
    with pytest.raises(
        TypeError, match="x must be a floating-point tensor, got dtype torch.int64"
    ):
        rotary_interleaved(torch.ones(3, 4, dtype=torch.long), offset=1)


def test_apply_rotary_needs_one_dtype_and_device():
    x, cos, sin = (
        torch.randn(3, 8, dtype=torch.float16),
        torch.randn(3, 8),
        torch.randn(3, 8),
    )
    # before: the float16 x came back as float32, silently promoted by the float32 tables
    with pytest.raises(
        TypeError, match="x, cos and sin must share a dtype, got x torch.float16"
    ):
        apply_rotary(x, cos, sin)
    with pytest.raises(ValueError, match="x, cos and sin must be on one device"):
        apply_rotary(x.float(), cos.to("meta"), sin.to("meta"))
    with pytest.raises(ValueError, match="d_head must be even, got 7"):
        apply_rotary(torch.randn(3, 7), torch.randn(3, 7), torch.randn(3, 7))
    assert apply_rotary(x, cos.half(), sin.half()).dtype == torch.float16


def test_rope_rotates_float64_to_float64_accuracy():
    # before: float32 tables gave float64 input float32 accuracy (about 1e-7)
    x = torch.randn(2, 3, 50, 16, dtype=torch.float64)
    reference = rotary_interleaved_in_half_layout(x, 1000)
    for rope in (
        RotaryEmbedding(16, max_len=64),
        RotaryEmbedding(16, max_len=64).double(),
    ):
        assert (rope(x, offset=1000) - reference).abs().max() < 1e-12
        assert (
            rope(x, offset=3) - rotary_interleaved_in_half_layout(x, 3)
        ).abs().max() < 1e-12
    cos, _ = RotaryEmbedding(16).cos_sin(0, 4)
    assert cos.dtype == torch.float32


# ---------------------------------------------------------------- ALiBi


def test_alibi_slopes_powers_of_two():
    assert torch.allclose(alibi_slopes(8), torch.tensor([2.0**-h for h in range(1, 9)]))
    assert torch.allclose(
        alibi_slopes(4), torch.tensor([2.0 ** (-2 * h) for h in range(1, 5)])
    )
    sixteen = alibi_slopes(16)
    assert sixteen[0].item() == pytest.approx(2**-0.5) and sixteen[
        -1
    ].item() == pytest.approx(2**-8)
    assert alibi_slopes(1).tolist() == [2.0**-8]


def test_alibi_slopes_other_counts_follow_the_paper():
    # 6 heads: the 4-head slopes, then 2 of the 8-head slopes (every other one)
    expected = [2**-2, 2**-4, 2**-6, 2**-8, 2**-1, 2**-3]
    assert torch.allclose(alibi_slopes(6), torch.tensor(expected))
    # 12 heads: all slopes distinct, the 8 first are the 8-head ones
    twelve = alibi_slopes(12)
    assert (
        torch.allclose(twelve[:8], alibi_slopes(8)) and len(set(twelve.tolist())) == 12
    )


def test_alibi_bias_values():
    alibi = ALiBi(4, causal=False)
    bias = alibi(3, 6, offset=2)
    assert bias.shape == (4, 3, 6)
    slopes = alibi_slopes(4)
    for h in range(4):
        for row in range(3):
            for j in range(6):
                assert bias[h, row, j].item() == pytest.approx(
                    -slopes[h].item() * abs(2 + row - j)
                )


def test_alibi_causal_masks_the_future_and_matches_on_the_past():
    causal, both = ALiBi(4, causal=True), ALiBi(4, causal=False)
    c, b = causal(5, 8, offset=3), both(5, 8, offset=3)
    future = torch.arange(8)[None, :] > (3 + torch.arange(5))[:, None]
    assert torch.isinf(c[:, future]).all() and (c[:, future] < 0).all()
    assert torch.equal(c[:, ~future], b[:, ~future])
    # softmax is shift-invariant per row, so slope * j gives the same attention (BLOOM's form)
    key = torch.arange(8).float()
    shifted = (alibi_slopes(4)[:, None, None] * key).masked_fill(future, float("-inf"))
    assert torch.allclose(c.softmax(-1), shifted.softmax(-1), atol=1e-6)
    assert list(causal.parameters()) == []


def test_alibi_validates():
    with pytest.raises(ValueError, match="n_heads must be an int >= 1, got 0"):
        ALiBi(0)
    with pytest.raises(ValueError, match="n_heads must be an int >= 1"):
        alibi_slopes(-2)
    with pytest.raises(TypeError, match="causal must be True or False, got str 'yes'"):
        ALiBi(2, causal="yes")
    with pytest.raises(ValueError, match="offset must be an int >= 0"):
        ALiBi(2)(3, 3, offset=-1)
    with pytest.raises(ValueError, match="q_len must be an int >= 1"):
        ALiBi(2)(0, 3)
    with pytest.raises(TypeError, match="k_len must be an int, got float 3.0"):
        ALiBi(2)(3, 3.0)


# ---------------------------------------------------------------- T5


def mesh_tf_bucket(
    relative_position: int, bidirectional: bool, num_buckets: int, max_distance: int
) -> int:
    """A scalar, plain-Python transcription of T5's bucketing, to compare against."""
    n = -relative_position
    ret = 0
    if bidirectional:
        num_buckets //= 2
        if n < 0:
            ret += num_buckets
        n = abs(n)
    else:
        n = max(n, 0)
    max_exact = num_buckets // 2
    if n < max_exact:
        return ret + n
    large = max_exact + int(
        math.log(n / max_exact)
        / math.log(max_distance / max_exact)
        * (num_buckets - max_exact)
    )
    return ret + min(large, num_buckets - 1)


@pytest.mark.parametrize(
    ("bidirectional", "num_buckets", "max_distance"),
    [(True, 32, 128), (False, 32, 128), (True, 16, 64), (True, 16, 40)],
)
def test_t5_buckets_match_a_scalar_reference(bidirectional, num_buckets, max_distance):
    rel = torch.arange(-300, 301)
    got = t5_relative_position_bucket(rel, bidirectional, num_buckets, max_distance)
    want = torch.tensor(
        [
            mesh_tf_bucket(r, bidirectional, num_buckets, max_distance)
            for r in rel.tolist()
        ]
    )
    assert torch.equal(got, want)


def test_t5_bucket_properties():
    past = torch.arange(0, 1000)  # distance d into the past is relative position -d
    for bidirectional, per_side in ((True, 16), (False, 32)):
        bucket = t5_relative_position_bucket(-past, bidirectional, 32, 128)
        exact = per_side // 2
        assert torch.equal(bucket[:exact], past[:exact])  # exact region
        assert (bucket[1:] >= bucket[:-1]).all()  # monotone in distance
        assert (bucket[128:] == per_side - 1).all()  # saturated from max_distance on
        assert bucket.max() == per_side - 1 and set(bucket.tolist()) == set(
            range(per_side)
        )
    future = t5_relative_position_bucket(torch.arange(1, 500), True, 32, 128)
    assert (future >= 16).all() and future[0] == 17
    assert (
        t5_relative_position_bucket(torch.arange(1, 500), False, 32, 128) == 0
    ).all()


def test_t5_bias_module_looks_up_its_table():
    module = T5RelativePositionBias(
        n_heads=3, num_buckets=8, max_distance=20, bidirectional=True
    )
    bias = module(4, 6, offset=2)
    assert bias.shape == (3, 4, 6)
    for row in range(4):
        for j in range(6):
            b = t5_relative_position_bucket(torch.tensor(j - (2 + row)), True, 8, 20)
            assert torch.equal(
                bias[:, row, j], module.relative_attention_bias.weight[b]
            )
    bias.sum().backward()
    assert module.relative_attention_bias.weight.grad.abs().sum() > 0
    # Toeplitz: the bias depends on j - i only
    assert torch.equal(bias[:, 1:, 1:], bias[:, :-1, :-1])


def test_t5_validates():
    with pytest.raises(TypeError, match="relative_position must be an integer tensor"):
        t5_relative_position_bucket(torch.tensor([1.5]))
    with pytest.raises(TypeError, match="relative_position must be an integer tensor"):
        t5_relative_position_bucket(2.0)
    with pytest.raises(ValueError, match="num_buckets must be even"):
        t5_relative_position_bucket(torch.tensor([1]), True, 31, 128)
    with pytest.raises(ValueError, match="max_distance=4 must exceed"):
        t5_relative_position_bucket(torch.tensor([1]), True, 32, 4)
    # before: any truthy value was taken for True
    with pytest.raises(
        TypeError, match="bidirectional must be True or False, got int 0"
    ):
        t5_relative_position_bucket(torch.tensor([1]), 0)
    with pytest.raises(ValueError, match="n_heads must be an int >= 1"):
        T5RelativePositionBias(0)
    with pytest.raises(ValueError, match="num_buckets must be even"):
        T5RelativePositionBias(2, num_buckets=9)
    with pytest.raises(ValueError, match="offset must be an int >= 0"):
        T5RelativePositionBias(2)(2, 2, offset=-3)
    with pytest.raises(TypeError, match="bidirectional must be True or False"):
        T5RelativePositionBias(2, bidirectional="no")
    # before: an infinite init_std filled the table with infinities
    with pytest.raises(
        ValueError, match="init_std must be a finite number >= 0, got inf"
    ):
        T5RelativePositionBias(2, init_std=float("inf"))


@pytest.mark.parametrize(
    "module", [ALiBi(3), ALiBi(3, causal=False), T5RelativePositionBias(3)]
)
def test_score_bias_modules_share_one_call(module):
    bias = module(
        2, 7, 5
    )  # decoding 2 new tokens with a cache of 7 keys: offset = 7 - 2
    assert bias.shape == (3, 2, 7) and bias.dtype == torch.float32
    # the bias of a query at position p equals that of the full-sequence call's row p
    full = module(7, 7, 0)
    assert torch.equal(bias, full[:, 5:7, :])


# ---------------------------------------------------------------- composed (issue 40, item 7)


def test_a_position_module_applied_to_another_width_names_both_widths():
    x = torch.randn(2, 5, 32)
    with pytest.raises(
        ValueError,
        match=r"SinusoidalPositionalEncoding: .* d_model=16, got shape \(2, 5, 32\)",
    ):
        SinusoidalPositionalEncoding(16)(x)
    with pytest.raises(ValueError, match=r"LearnedPositionalEmbedding: .* d_model=16"):
        LearnedPositionalEmbedding(10, 16)(x)
    with pytest.raises(ValueError, match=r"RotaryEmbedding: .* d_head=16, got shape"):
        RotaryEmbedding(16)(torch.randn(2, 4, 5, 8))


def test_position_modules_built_for_other_heads_fail_where_attention_takes_them():
    from lib.attention import MultiHeadAttention

    mha = MultiHeadAttention(32, 4).eval()  # d_head 8
    x = torch.randn(2, 5, 32)
    # each was "The size of tensor a (8) must match the size of tensor b (16)..."
    with pytest.raises(
        ValueError,
        match=r"MultiHeadAttention: rope \(RotaryEmbedding\) was built for d_head=16, "
        r"but is used with d_head=8",
    ):
        mha(x, rope=RotaryEmbedding(16))
    for module in (ALiBi(8), T5RelativePositionBias(8), ALiBi(1)):  # ALiBi(1): silent
        name = type(module).__name__
        with pytest.raises(
            ValueError,
            match=rf"position_bias \({name}\) was built for n_heads=\d, "
            "but is used with n_heads=4",
        ):
            mha(x, position_bias=module)
    # built for this attention, a module gives what its table gives
    alibi = ALiBi(4)
    assert torch.allclose(
        mha(x, position_bias=alibi), mha(x, position_bias=alibi(5, 5))
    )


def test_a_transformer_block_called_directly_checks_its_position_modules():
    from lib.models import TransformerBlock, TransformerConfig

    cfg = TransformerConfig(vocab_size=11, d_model=32, n_heads=4, n_layers=1)
    block = TransformerBlock(cfg)
    x = torch.randn(2, 5, 32)
    with pytest.raises(
        ValueError, match=r"rope \(RotaryEmbedding\) was built for d_head=4"
    ):
        block(x, rope=RotaryEmbedding(4))
    with pytest.raises(
        ValueError, match=r"bias must broadcast to .* got shape \(8, 5, 5\)"
    ):
        block(x, position_bias=ALiBi(8)(5, 5))


def test_rotations_refuse_heads_of_zero_width_and_dtypes_that_are_not():
    empty = torch.randn(2, 4, 5, 0)
    with pytest.raises(
        ValueError, match="the last axis of x must be an int >= 1, got 0"
    ):
        rope_rotate_half(empty)  # was: an empty result
    with pytest.raises(ValueError, match="apply_rotary.*d_head must be an int >= 1"):
        apply_rotary(empty, torch.zeros(5, 0), torch.zeros(5, 0))
    with pytest.raises(ValueError, match="d_head must be an int >= 1, got 0"):
        RotaryEmbedding(0)
    with pytest.raises(TypeError, match=r"cos_sin\(\): dtype must be a floating torch"):
        RotaryEmbedding(8).cos_sin(0, 5, "float32")
