"""The chapter 3 checkers accept right answers and diagnose the typical wrong ones."""

from __future__ import annotations

import pytest
import torch

from lib.exercises._common import ExerciseError
from lib.exercises.positions import (
    check_interpolated_cos_sin,
    check_ntk_scaled_base,
    check_sliding_window_alibi,
)
from lib.positions import ALiBi, RotaryEmbedding, rope_frequencies

# -- Exercise 1 -------------------------------------------------------------------------------


def cos_sin(seq, d_head, scale, *, interleaved=False):
    positions = torch.arange(seq, dtype=torch.float64) * scale
    angle = positions[:, None] * rope_frequencies(d_head)[None, :]
    if interleaved:
        angle = angle.repeat_interleave(2, dim=-1)
    else:
        angle = torch.cat((angle, angle), dim=-1)
    return angle.cos(), angle.sin()


def interpolated_right(seq, d_head, trained_len, target_len):
    return cos_sin(seq, d_head, trained_len / target_len)


def test_interpolation_accepts_the_reference_in_float32_too(capsys):
    assert check_interpolated_cos_sin(interpolated_right) is True
    assert "all checks passed" in capsys.readouterr().out

    def in_float32(seq, d_head, trained_len, target_len):
        cos, sin = interpolated_right(seq, d_head, trained_len, target_len)
        return cos.float(), sin.float()

    assert check_interpolated_cos_sin(in_float32) is True


def test_interpolation_without_scaling_equals_the_module():
    cos, sin = interpolated_right(16, 8, 16, 16)
    module_cos, module_sin = RotaryEmbedding(8, max_len=16).cos_sin(
        0, 16, torch.float64
    )
    assert torch.allclose(cos, module_cos) and torch.allclose(sin, module_sin)


def test_interpolation_reports_not_attempted(capsys):
    def stub(seq, d_head, trained_len, target_len):
        raise NotImplementedError

    assert check_interpolated_cos_sin(stub) is None
    assert "Exercise 1 not attempted yet" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("wrong", "match"),
    [
        (
            lambda s, d, t, g: cos_sin(s, d, g / t),
            "stretched by target_len / trained_len",
        ),
        (lambda s, d, t, g: cos_sin(s, d, 1.0), "not scaled at all"),
        (
            lambda s, d, t, g: cos_sin(s, d, t / g, interleaved=True),
            "interleaved pairs",
        ),
        (lambda s, d, t, g: cos_sin(s, d, t / g)[::-1], "swapped"),
        (lambda s, d, t, g: cos_sin(s, d, t / g)[0], "pair \\(cos, sin\\)"),
    ],
)
def test_interpolation_diagnoses_typical_mistakes(wrong, match):
    with pytest.raises(ExerciseError, match=match):
        check_interpolated_cos_sin(wrong)


# -- Exercise 2 -------------------------------------------------------------------------------


def ntk_right(base, d_head, scale):
    return base * scale ** (d_head / (d_head - 2))


def test_ntk_accepts_the_reference_and_keeps_its_promise():
    assert check_ntk_scaled_base(ntk_right) is True
    theta, scaled = (
        rope_frequencies(128),
        rope_frequencies(128, ntk_right(10000.0, 128, 4.0)),
    )
    assert torch.isclose(scaled[0], theta[0])  # the fastest pair is untouched
    assert torch.isclose(scaled[-1], theta[-1] / 4)  # the slowest is 4 times slower


@pytest.mark.parametrize(
    ("wrong", "match"),
    [
        (lambda base, d, s: base * s, "slows the slowest pair by only"),
        (lambda base, d, s: base * s ** ((d - 2) / d), "exponent is inverted"),
        (lambda base, d, s: base / s ** (d / (d - 2)), "must grow"),
        (lambda base, d, s: "big", "should be a number"),
    ],
)
def test_ntk_diagnoses_typical_mistakes(wrong, match):
    with pytest.raises(ExerciseError, match=match):
        check_ntk_scaled_base(wrong)


# -- Exercise 3 -------------------------------------------------------------------------------


def window_right(n_heads, q_len, k_len, offset, window):
    bias = ALiBi(n_heads, causal=True)(q_len, k_len, offset)
    query = torch.arange(offset, offset + q_len)[:, None]
    too_far = query - torch.arange(k_len)[None, :] >= window
    return bias.masked_fill(too_far, float("-inf"))


def window_plus_one(n_heads, q_len, k_len, offset, window):
    return window_right(n_heads, q_len, k_len, offset, window + 1)


def window_without_offset(n_heads, q_len, k_len, offset, window):
    return window_right(n_heads, q_len, k_len, 0, window)  # queries placed at 0, 1, ...


def window_large_negative(n_heads, q_len, k_len, offset, window):
    bias = window_right(n_heads, q_len, k_len, offset, window)
    return bias.masked_fill(torch.isinf(bias), -1e9)


def test_sliding_window_accepts_the_reference():
    assert check_sliding_window_alibi(window_right) is True


@pytest.mark.parametrize(
    ("wrong", "match"),
    [
        (window_plus_one, "one key too many"),
        (window_without_offset, "not from 0"),
        (lambda h, q, k, o, w: ALiBi(h)(q, k, o), "kept only the causal mask"),
        (window_large_negative, "must be -inf"),
        (lambda h, q, k, o, w: window_right(h, q, k, o, w).abs().neg() * -1, "sign"),
        (lambda h, q, k, o, w: window_right(h, q, k, o, w).permute(1, 2, 0), "shape"),
    ],
)
def test_sliding_window_diagnoses_typical_mistakes(wrong, match):
    with pytest.raises(ExerciseError, match=match):
        check_sliding_window_alibi(wrong)


def test_checkers_reject_non_callables():
    with pytest.raises(TypeError, match="pass your function itself"):
        check_ntk_scaled_base(10000.0)
