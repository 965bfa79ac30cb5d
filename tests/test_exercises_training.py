"""The checkers of chapter 8 accept the reference answers and diagnose typical mistakes."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest
import torch

from lib.exercises._common import ExerciseError
from lib.exercises.training import (
    _early_stop_variant,
    bfloat16_neighbours,
    check_early_stop,
    check_noam_plan,
    check_scaler_step,
    check_smoothed_loss_floor,
    check_stochastic_round,
    early_stop_reference,
    fp16_regression,
    scaler_step_reference,
    stochastic_round_reference,
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


# -- Exercise 2 of page 8.2: stochastic rounding ---------------------------------------


def _bits(x):
    return x.view(torch.int32)


def rounding(x, generator, mistake=None):
    """Stochastic rounding to bfloat16, right or with one typical mistake."""
    high = (1 << 16) + (mistake == "inclusive")
    noise = torch.randint(0, high, x.shape, generator=generator, dtype=torch.int32)
    if mistake == "global_rng":
        noise = torch.randint(0, high, x.shape, dtype=torch.int32)
    if mistake == "nearest":
        return x.bfloat16()
    toward = _bits(x) & -65536
    fraction = _bits(x) & 65535
    away = torch.where(fraction == 0, toward, toward + 65536)
    if mistake == "truncate":
        return toward.view(torch.float32).bfloat16()
    if mistake == "coin":
        up = noise < (1 << 15)
        return torch.where(up, away, toward).view(torch.float32).bfloat16()
    if mistake == "inverted":
        up = (fraction > 0) & (noise < 65536 - fraction)
        return torch.where(up, away, toward).view(torch.float32).bfloat16()
    rounded = ((_bits(x) + noise) & -65536).view(torch.float32)
    if mistake == "float32":
        return rounded
    if mistake == "in_place":
        x.view(torch.int32).add_(noise)
        x.view(torch.int32).bitwise_and_(-65536)
        return x.bfloat16()
    if mistake == "value_noise":  # noise on the value, then round to nearest
        return (x + (noise.float() / 65536 - 0.5) * 1e-2 * x.abs()).bfloat16()
    return rounded.bfloat16()


def test_stochastic_round_accepts_the_reference():
    assert check_stochastic_round(rounding)
    assert check_stochastic_round(stochastic_round_reference)


def test_stochastic_round_is_unbiased_and_between_the_neighbours():
    x = torch.tensor([1.0 + 2**-9, -3.3, 1e-3, 65504.7])
    toward, away = bfloat16_neighbours(x)
    assert (toward.abs() <= x.abs()).all() and (away.abs() >= x.abs()).all()
    draws = stochastic_round_reference(
        x.repeat(20_000, 1), torch.Generator().manual_seed(0)
    ).float()
    assert ((draws == toward) | (draws == away)).all()
    gap = (away - toward).abs()
    assert ((draws.mean(0) - x).abs() < 0.02 * gap).all()


@pytest.mark.parametrize(
    ("mistake", "match"),
    [
        ("nearest", "round-to-nearest"),
        ("truncate", "truncates"),
        ("coin", "a coin toss"),
        ("inverted", "inverted"),
        ("global_rng", "the generator passed in"),
        ("inclusive", "randint's high end is exclusive"),
        ("float32", "return a bfloat16 tensor"),
        ("in_place", "modified x in place"),
        ("value_noise", "must stay as it is|not one of its two bfloat16 neighbours"),
    ],
)
def test_stochastic_round_diagnoses_mistakes(mistake, match):
    def wrong(x, generator):
        return rounding(x, generator, mistake=mistake)

    with pytest.raises(ExerciseError, match=match):
        check_stochastic_round(wrong)


def test_stochastic_round_checks_the_shape_and_reports_not_attempted(capsys):
    with pytest.raises(ExerciseError, match="has shape"):
        check_stochastic_round(lambda x, g: rounding(x, g).flatten())
    with pytest.raises(ExerciseError, match="NaN must stay NaN"):
        check_stochastic_round(lambda x, g: rounding(x, g).masked_fill(x.isnan(), 0))

    def stub(x, generator):
        raise NotImplementedError

    assert check_stochastic_round(stub) is None
    assert "Exercise 2 (page 8.2) not attempted" in capsys.readouterr().out


# -- Exercise 1 of page 8.4: early stopping --------------------------------------------


def test_early_stop_accepts_the_reference():
    assert check_early_stop(early_stop_reference)


def test_early_stop_reference_on_plain_curves():
    steps = [10, 20, 30, 40, 50]
    assert early_stop_reference(steps, [5, 4, 3, 2, 1], 2) == (50, 50)  # never stops
    assert early_stop_reference(steps, [1, 2, 3, 4, 5], 2) == (30, 10)  # never improves
    assert early_stop_reference(steps, [3, 2, 2, 2, 1], 2) == (
        40,
        20,
    )  # ties: the first
    assert early_stop_reference(steps, [3, math.nan, 2, math.nan, 4], 2) == (50, 30)
    assert early_stop_reference(steps, [3, 2, 2, 2, 1], 1) == (30, 20)


def test_early_stop_on_the_h200_run():
    """Patience 3 on the recorded H200 run: the best at step 700, the stop at 1,000."""
    record = Path(__file__).parent.parent / "book/results/08-training-gpt/eval.csv"
    if not record.is_file():
        pytest.skip("no H200 record in this copy")
    rows = list(csv.DictReader(record.open()))
    steps, losses = [int(r["step"]) for r in rows], [float(r["loss"]) for r in rows]
    assert early_stop_reference(steps, losses, 3) == (1000, 700)


@pytest.mark.parametrize(
    ("mistake", "match"),
    [
        ("early", "one evaluation early"),
        ("late", "one evaluation late"),
        ("ties", "an equal loss counted as an improvement"),
        ("no_reset", "start again at 0 after each improvement"),
        ("index", "the index of the evaluation"),
        ("global_best", "training never sees the later ones"),
    ],
)
def test_early_stop_diagnoses_mistakes(mistake, match):
    def wrong(steps, losses, patience):
        return _early_stop_variant(steps, losses, patience, mistake)

    with pytest.raises(ExerciseError, match=match):
        check_early_stop(wrong)


def test_early_stop_checks_what_it_returns():
    def stops_at_the_best(steps, losses, patience):
        _, best = early_stop_reference(steps, losses, patience)
        return best, best

    with pytest.raises(ExerciseError, match="expected"):
        check_early_stop(stops_at_the_best)
    with pytest.raises(ExerciseError, match="return a pair"):
        check_early_stop(lambda s, losses, p: early_stop_reference(s, losses, p)[0])
    with pytest.raises(ExerciseError, match="should be an int"):
        check_early_stop(lambda s, losses, p: (float(s[-1]), s[0]))


def test_the_moved_checkers_are_numbered_by_their_pages(capsys):
    """Chapter 8's checkers name the page of their exercise."""
    assert check_smoothed_loss_floor(floor) and check_noam_plan(noam_plan)
    out = capsys.readouterr().out
    assert "Exercise 1 (page 8.1)" in out and "Exercise 2 (page 8.1)" in out
    assert check_scaler_step(scaler_step_reference)
    assert "Exercise 1 (page 8.2)" in capsys.readouterr().out
