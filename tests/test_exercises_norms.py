"""The chapter 6 checkers accept right answers and diagnose the typical wrong ones."""

from __future__ import annotations

import math

import pytest

from lib.exercises._common import ExerciseError
from lib.exercises.norms import (
    check_layer_norm_backward,
    check_rms_norm_backward,
    check_stream_rms,
)

# -- Exercise 1 -------------------------------------------------------------------------------


def statistics(x, eps):
    mean = x.mean(-1, keepdim=True)
    sigma = (x.var(-1, unbiased=False, keepdim=True) + eps).sqrt()
    return (x - mean) / sigma, sigma


def layer_norm_backward_right(x, weight, grad_out, eps):
    x_hat, sigma = statistics(x, eps)
    g = grad_out * weight
    grad_x = (
        g - g.mean(-1, keepdim=True) - x_hat * (g * x_hat).mean(-1, keepdim=True)
    ) / sigma
    return grad_x, (grad_out * x_hat).sum((0, 1)), grad_out.sum((0, 1))


def test_layer_norm_backward_accepts_the_reference(capsys):
    assert check_layer_norm_backward(layer_norm_backward_right) is True
    assert "all checks passed" in capsys.readouterr().out


def test_layer_norm_backward_not_attempted(capsys):
    def stub(x, weight, grad_out, eps):
        raise NotImplementedError

    assert check_layer_norm_backward(stub) is None
    assert "not attempted" in capsys.readouterr().out


def constant_statistics(x, weight, grad_out, eps):
    _, sigma = statistics(x, eps)
    _, grad_weight, grad_bias = layer_norm_backward_right(x, weight, grad_out, eps)
    return grad_out * weight / sigma, grad_weight, grad_bias


def constant_sigma(x, weight, grad_out, eps):
    _, sigma = statistics(x, eps)
    g = grad_out * weight
    _, grad_weight, grad_bias = layer_norm_backward_right(x, weight, grad_out, eps)
    return (g - g.mean(-1, keepdim=True)) / sigma, grad_weight, grad_bias


def no_gain(x, weight, grad_out, eps):
    return layer_norm_backward_right(x, weight * 0 + 1, grad_out, eps)[0], *(
        layer_norm_backward_right(x, weight, grad_out, eps)[1:]
    )


def unsummed(x, weight, grad_out, eps):
    x_hat, _ = statistics(x, eps)
    grad_x, _, grad_bias = layer_norm_backward_right(x, weight, grad_out, eps)
    return grad_x, grad_out * x_hat, grad_bias


def in_place(x, weight, grad_out, eps):
    result = layer_norm_backward_right(x, weight, grad_out, eps)
    x.sub_(1.0)
    return result


@pytest.mark.parametrize(
    ("wrong", "message"),
    [
        (constant_statistics, "treats the mean and sigma as constants"),
        (constant_sigma, "sigma's dependence on x"),
        (no_gain, "ignores the gain"),
        (unsummed, "sum their gradients over batch and seq"),
        (in_place, "modified its input"),
        (lambda *args: layer_norm_backward_right(*args)[0], "return a triple"),
    ],
)
def test_layer_norm_backward_diagnoses(wrong, message):
    with pytest.raises(ExerciseError, match=message):
        check_layer_norm_backward(wrong)


# -- Exercise 2 -------------------------------------------------------------------------------


def rms_backward_right(x, weight, grad_out, eps):
    rms = (x.pow(2).mean(-1, keepdim=True) + eps).sqrt()
    g = grad_out * weight
    return g / rms - x * (g * x).mean(-1, keepdim=True) / rms**3


def test_rms_backward_accepts_the_reference():
    assert check_rms_norm_backward(rms_backward_right) is True


def rms_constant(x, weight, grad_out, eps):
    return grad_out * weight / (x.pow(2).mean(-1, keepdim=True) + eps).sqrt()


def layer_norm_formula(x, weight, grad_out, eps):
    rms = (x.pow(2).mean(-1, keepdim=True) + eps).sqrt()
    g, x_hat = grad_out * weight, x / rms
    centred = g - g.mean(-1, keepdim=True)
    return (centred - x_hat * (g * x_hat).mean(-1, keepdim=True)) / rms


@pytest.mark.parametrize(
    ("wrong", "message"),
    [
        (rms_constant, "treats the RMS as a constant"),
        (layer_norm_formula, "LayerNorm's gradient"),
        (lambda x, w, g, eps: rms_backward_right(x, w, g, eps)[0], "shape"),
    ],
)
def test_rms_backward_diagnoses(wrong, message):
    with pytest.raises(ExerciseError, match=message):
        check_rms_norm_backward(wrong)


# -- Exercise 3 -------------------------------------------------------------------------------


def test_stream_rms_accepts_the_reference():
    assert check_stream_rms(lambda n, r, s: math.sqrt(r**2 + n * s**2)) is True


@pytest.mark.parametrize(
    ("wrong", "message"),
    [
        (lambda n, r, s: r + n * s, "variances"),
        (lambda n, r, s: math.sqrt(1 + n * s**2), "input's own variance"),
        (lambda n, r, s: r**2 + n * s**2, "take its root"),
        (lambda n, r, s: str(r), "return a number"),
    ],
)
def test_stream_rms_diagnoses(wrong, message):
    with pytest.raises(ExerciseError, match=message):
        check_stream_rms(wrong)
