"""The checkers of chapter 8 accept the reference answers and diagnose typical mistakes."""

from __future__ import annotations

import math

import pytest

from lib.exercises._common import ExerciseError
from lib.exercises.training import (
    check_adam_l2_step,
    check_noam_plan,
    check_smoothed_loss_floor,
)


def noam_plan(d_model, peak_lr):
    warmup = round(1 / (d_model * peak_lr**2))
    return warmup, 4 * warmup


def test_noam_plan_accepts_the_reference():
    assert check_noam_plan(noam_plan)


@pytest.mark.parametrize(
    ("wrong", "match"),
    [
        (lambda d, p: (round(p**-2), 4 * round(p**-2)), "d_model factor is missing"),
        (lambda d, p: (noam_plan(d, p)[0], 2 * noam_plan(d, p)[0]), "not 1/n"),
        (lambda d, p: (noam_plan(d, p)[0], noam_plan(d, p)[1] + 1), "one off"),
        (lambda d, p: (noam_plan(d, p)[0], 9 * noam_plan(d, p)[0]), "for which n"),
        (lambda d, p: (noam_plan(d, p)[0] + 5, 0), "solve peak_lr"),
        (lambda d, p: noam_plan(d, p)[0], "return a pair"),
        (lambda d, p: (float(noam_plan(d, p)[0]), 1), "should be an int"),
    ],
)
def test_noam_plan_diagnoses_mistakes(wrong, match):
    with pytest.raises(ExerciseError, match=match):
        check_noam_plan(wrong)


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
