"""The checkers of chapter 8 accept the reference answers and diagnose typical mistakes."""

from __future__ import annotations

import math

import pytest

from lib.exercises._common import ExerciseError
from lib.exercises.training import (
    check_adam_l2_step,
    check_noam_peak,
    check_smoothed_loss_floor,
)


def noam_peak(d_model, warmup):
    return warmup, d_model**-0.5 * warmup**-0.5


def test_noam_peak_accepts_the_reference():
    assert check_noam_peak(noam_peak)


@pytest.mark.parametrize(
    ("wrong", "match"),
    [
        (lambda d, w: (w - 1, d**-0.5 * w**-0.5), "one off: steps count from 1"),
        (lambda d, w: (w, w**-0.5), "d_model\\^-0.5 factor is missing"),
        (lambda d, w: (w, d**0.5 * w**-0.5), "not by its square root"),
        (lambda d, w: (2 * w, d**-0.5 * w**-0.5), "where do n\\^-0.5"),
        (lambda d, w: w, "return a pair"),
        (lambda d, w: (float(w), 1.0), "should be an int"),
    ],
)
def test_noam_peak_diagnoses_mistakes(wrong, match):
    with pytest.raises(ExerciseError, match=match):
        check_noam_peak(wrong)


def adam_l2(param, grad, m, v, step, *, lr, betas, eps, weight_decay, mistake=None):
    beta1, beta2 = betas
    if mistake == "decoupled":
        param = param * (1 - lr * weight_decay)
    else:
        grad = grad + weight_decay * param
    m = beta1 * m + (1 - beta1) * grad
    v = beta2 * v + (1 - beta2) * grad * grad
    if mistake == "no_bias":
        m_hat, v_hat = m, v
    else:
        m_hat, v_hat = m / (1 - beta1**step), v / (1 - beta2**step)
    if mistake == "eps_inside":
        return param - lr * m_hat / (v_hat + eps).sqrt(), m, v
    return param - lr * m_hat / (v_hat.sqrt() + eps), m, v


def test_adam_l2_step_accepts_the_reference():
    assert check_adam_l2_step(adam_l2)


@pytest.mark.parametrize(
    ("mistake", "match"),
    [
        ("decoupled", "decoupled, AdamW"),
        ("no_bias", "not bias-corrected"),
        ("eps_inside", "epsilon is inside the square root"),
    ],
)
def test_adam_l2_step_diagnoses_mistakes(mistake, match):
    def wrong(*args, **kwargs):
        return adam_l2(*args, **kwargs, mistake=mistake)

    with pytest.raises(ExerciseError, match=match):
        check_adam_l2_step(wrong)


def test_adam_l2_step_catches_in_place_updates_and_bad_returns():
    def in_place(param, grad, m, v, step, *, lr, betas, eps, weight_decay):
        m.mul_(betas[0]).add_((1 - betas[0]) * (grad + weight_decay * param))
        return adam_l2(param, grad, m * 0, v, step, lr=lr, betas=betas, eps=eps,
                       weight_decay=weight_decay)  # fmt: skip

    with pytest.raises(ExerciseError, match="modified its input"):
        check_adam_l2_step(in_place)
    with pytest.raises(ExerciseError, match="return the triple"):
        check_adam_l2_step(lambda *a, **k: adam_l2(*a, **k)[0])


def test_adam_l2_step_reports_not_attempted():
    def stub(*args, **kwargs):
        raise NotImplementedError

    assert not check_adam_l2_step(stub)


def floor(smoothing, vocab):
    right, other = 1 - smoothing + smoothing / vocab, smoothing / vocab
    return -(right * math.log(right) + (vocab - 1) * other * math.log(other))


def test_smoothed_loss_floor_accepts_the_reference():
    assert check_smoothed_loss_floor(floor)


def other_convention(smoothing, vocab):
    right, other = 1 - smoothing, smoothing / (vocab - 1)
    return -(right * math.log(right) + (vocab - 1) * other * math.log(other))


@pytest.mark.parametrize(
    ("wrong", "match"),
    [
        (lambda s, v: 0.0, "never reaches 0"),
        (other_convention, "ε/\\(V-1\\) convention"),
        (
            lambda s, v: -(1 - s + s / v) * math.log(1 - s + s / v),
            "a term is missing",
        ),
        (lambda s, v: floor(s, v) + 0.1, "expected"),
        (lambda s, v: "0.5", "return a float"),
    ],
)
def test_smoothed_loss_floor_diagnoses_mistakes(wrong, match):
    with pytest.raises(ExerciseError, match=match):
        check_smoothed_loss_floor(wrong)
