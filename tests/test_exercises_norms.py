"""The chapter 6 checkers accept the reference answers and diagnose the typical wrong ones."""

from __future__ import annotations

import pytest
import torch

from lib.exercises._common import ExerciseError
from lib.exercises.norms import check_layer_norm, check_pre_ln_residual, check_rms_norm

# ---------------------------------------------------------------- Exercise 1: LayerNorm


def layer_norm_ok(x, weight, bias, eps):
    mean = x.mean(-1, keepdim=True)
    var = (x - mean).pow(2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps) * weight + bias


def test_layer_norm_accepts_the_reference_and_torch():
    assert check_layer_norm(layer_norm_ok) is True
    assert check_layer_norm(
        lambda x, w, b, eps: torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b, eps)
    )


def test_layer_norm_not_attempted(capsys):
    def stub(x, weight, bias, eps):
        raise NotImplementedError

    assert check_layer_norm(stub) is None
    assert "not attempted" in capsys.readouterr().out


def test_layer_norm_eps_outside_the_root():
    def wrong(x, weight, bias, eps):
        mean = x.mean(-1, keepdim=True)
        std = (x - mean).pow(2).mean(-1, keepdim=True).sqrt()
        return (x - mean) / (std + eps) * weight + bias

    with pytest.raises(ExerciseError, match=r"Exercise 1.*inside\* the square root"):
        check_layer_norm(wrong)


def test_layer_norm_unbiased_variance():
    def wrong(x, weight, bias, eps):
        mean = x.mean(-1, keepdim=True)
        return (x - mean) / torch.sqrt(x.var(-1, keepdim=True) + eps) * weight + bias

    with pytest.raises(ExerciseError, match="biased variance"):
        check_layer_norm(wrong)


def test_layer_norm_wrong_axis():
    def wrong(x, weight, bias, eps):
        mean = x.mean(-2, keepdim=True)
        var = (x - mean).pow(2).mean(-2, keepdim=True)
        return (x - mean) / torch.sqrt(var + eps) * weight + bias

    with pytest.raises(ExerciseError, match="sequence axis"):
        check_layer_norm(wrong)


def test_layer_norm_in_place_modification():
    def wrong(x, weight, bias, eps):
        x -= x.mean(-1, keepdim=True)
        x /= torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)
        return x * weight + bias

    with pytest.raises(ExerciseError, match="in place"):
        check_layer_norm(wrong)


def test_layer_norm_missing_affine_and_wrong_shape():
    def no_affine(x, weight, bias, eps):
        mean = x.mean(-1, keepdim=True)
        return (x - mean) / torch.sqrt((x - mean).pow(2).mean(-1, keepdim=True) + eps)

    with pytest.raises(ExerciseError, match="gain and bias are missing"):
        check_layer_norm(no_affine)
    with pytest.raises(ExerciseError, match=r"shape \(3, 5\), expected \(3, 5, 8\)"):
        check_layer_norm(lambda x, w, b, eps: x.mean(-1))


def test_layer_norm_unknown_mistake_gets_the_generic_diagnosis():
    with pytest.raises(ExerciseError, match="differs from the reference"):
        check_layer_norm(lambda x, w, b, eps: layer_norm_ok(x, w, b, eps) + 0.1)


# ---------------------------------------------------------------- Exercise 2: RMSNorm


def rms_norm_ok(x, weight, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def test_rms_norm_accepts_the_reference_and_torch():
    assert check_rms_norm(rms_norm_ok) is True
    assert check_rms_norm(lambda x, w, eps: torch.nn.functional.rms_norm(x, (x.shape[-1],), w, eps))


def test_rms_norm_subtracting_the_mean():
    def wrong(x, weight, eps):
        centred = x - x.mean(-1, keepdim=True)
        return centred / torch.sqrt(centred.pow(2).mean(-1, keepdim=True) + eps) * weight

    with pytest.raises(ExerciseError, match=r"Exercise 2.*does not subtract the mean"):
        check_rms_norm(wrong)


def test_rms_norm_eps_outside_and_sum_instead_of_mean():
    with pytest.raises(ExerciseError, match="inside\\* the square root"):
        check_rms_norm(lambda x, w, eps: x / (x.pow(2).mean(-1, keepdim=True).sqrt() + eps) * w)
    with pytest.raises(ExerciseError, match="mean of the squares, not of their sum"):
        check_rms_norm(lambda x, w, eps: x / torch.sqrt(x.pow(2).sum(-1, keepdim=True) + eps) * w)


# ---------------------------------------------------------------- Exercise 3: pre-LN step


def test_pre_ln_residual_accepts_the_reference():
    assert check_pre_ln_residual(lambda x, norm, f: x + f(norm(x))) is True


def test_pre_ln_residual_rejects_post_ln_order():
    with pytest.raises(ExerciseError, match=r"Exercise 3.*that is post-LN"):
        check_pre_ln_residual(lambda x, norm, f: norm(x + f(x)))


def test_pre_ln_residual_rejects_norm_on_the_skip_path():
    with pytest.raises(ExerciseError, match="skip path must carry x itself"):
        check_pre_ln_residual(lambda x, norm, f: norm(x) + f(norm(x)))


def test_pre_ln_residual_rejects_missing_pieces():
    with pytest.raises(ExerciseError, match="residual connection is missing"):
        check_pre_ln_residual(lambda x, norm, f: f(norm(x)))
    with pytest.raises(ExerciseError, match="normalisation is missing"):
        check_pre_ln_residual(lambda x, norm, f: x + f(x))


def test_pre_ln_residual_rejects_in_place_update():
    def wrong(x, norm, f):
        x += f(norm(x))
        return x

    with pytest.raises(ExerciseError, match="in place"):
        check_pre_ln_residual(wrong)
