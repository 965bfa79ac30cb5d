"""The checkers of chapter 8 accept the reference answers and diagnose typical mistakes."""

from __future__ import annotations

import math

import pytest
import torch

from lib.exercises._common import ExerciseError
from lib.exercises.training import (
    check_noam_plan,
    check_scaler_step,
    check_smoothed_loss_floor,
    fp16_regression,
    scaler_step_reference,
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


def scaler_step(grads, scale, good_steps, *, growth_interval, mistake=None):
    """A dynamic loss scaler, right or with one typical mistake."""
    if mistake == "isinf":  # misses NaN
        bad = any(bool(torch.isinf(g).any()) for g in grads)
    else:
        bad = not all(bool(torch.isfinite(g).all()) for g in grads)
    if bad:
        if mistake == "steps_anyway":
            return [g.float() / scale for g in grads], scale / 2, 0
        if mistake == "no_backoff":
            return None, scale, 0
        if mistake == "keeps_count":
            return None, scale / 2, good_steps
        return None, scale / 2, 0
    if mistake == "fp16_unscale":
        unscaled = [(g / scale).float() for g in grads]
    elif mistake == "still_scaled":
        unscaled = [g.float() for g in grads]
    elif mistake == "fp16_result":
        unscaled = [g / scale for g in grads]
    else:
        unscaled = [g.float() / scale for g in grads]
    good_steps += 1
    due = {
        "grows_early": good_steps + 1 >= growth_interval,
        "grows_late": good_steps > growth_interval,
        "grows_always": True,
        "never_grows": False,
    }.get(mistake, good_steps == growth_interval)
    if due:
        return unscaled, scale * 2, good_steps if mistake == "no_reset" else 0
    return unscaled, scale, good_steps


def test_scaler_step_accepts_the_reference():
    assert check_scaler_step(scaler_step)
    assert check_scaler_step(scaler_step_reference)


def test_the_reference_matches_torch_grad_scaler():
    """The reference's schedule is GradScaler's: halve and reset on an overflow, double
    after growth_interval good steps (on the CPU, where GradScaler works too)."""
    weight = torch.nn.Parameter(torch.ones(3))
    optimizer = torch.optim.SGD([weight], lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=3)
    scale, good = 2.0**10, 0
    for step in range(9):
        optimizer.zero_grad()
        scaler.scale(weight.sum()).backward()
        if step in (4, 5):
            weight.grad[0] = torch.inf if step == 4 else torch.nan
        grads, scale, good = scaler_step_reference(
            [weight.grad.clone()], scale, good, growth_interval=3
        )
        scaler.step(optimizer)
        scaler.update()
        assert scaler.get_scale() == scale and (grads is None) == (step in (4, 5))


def test_float16_gradients_underflow_without_scaling():
    losses, skipped = fp16_regression(None)
    assert skipped == 0 and losses[-1] == losses[0]  # every gradient was 0
    losses, skipped = fp16_regression(scaler_step_reference)
    assert skipped > 0 and losses[-1] < 0.05 * losses[0]


@pytest.mark.parametrize(
    ("mistake", "match"),
    [
        ("isinf", "torch.isfinite"),
        ("steps_anyway", "must skip the step"),
        ("no_backoff", "should halve"),
        ("keeps_count", "starts again at 0"),
        ("fp16_unscale", "unscaled in float16"),
        ("still_scaled", "still scaled"),
        ("fp16_result", "return float32 gradients"),
        ("grows_early", "one step early"),
        ("grows_late", "one step late"),
        ("grows_always", "after every good step"),
        ("never_grows", "never grows"),
        ("no_reset", "reset good_steps"),
    ],
)
def test_scaler_step_diagnoses_mistakes(mistake, match):
    def wrong(*args, **kwargs):
        return scaler_step(*args, **kwargs, mistake=mistake)

    with pytest.raises(ExerciseError, match=match):
        check_scaler_step(wrong)


def test_scaler_step_catches_in_place_updates_and_bad_returns():
    def in_place(grads, scale, good_steps, *, growth_interval):
        grads[0].div_(2)
        return scaler_step(grads, scale, good_steps, growth_interval=growth_interval)

    with pytest.raises(ExerciseError, match="modified the gradients in place"):
        check_scaler_step(in_place)
    with pytest.raises(ExerciseError, match="return the triple"):
        check_scaler_step(lambda *a, **k: scaler_step(*a, **k)[0])
    with pytest.raises(ExerciseError, match="finite gradients were skipped"):
        check_scaler_step(lambda g, s, n, **k: (None, s / 2, 0))


def test_scaler_step_reports_not_attempted():
    def stub(*args, **kwargs):
        raise NotImplementedError

    assert not check_scaler_step(stub)


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
