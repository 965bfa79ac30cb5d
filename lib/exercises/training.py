"""Checkers for the exercises of chapter 8 (training).

Each checker runs the reader's function on several inputs, compares it with a reference and
names the typical mistake when it recognises one: a Noam warm-up without its d_model
factor, a rate that halves at twice the warm-up or one step off; a loss scaler that steps
on an overflow, misses a NaN, does not halve or reset its count, grows its scale at the
wrong step or unscales in float16; a label-smoothing floor of zero, with the ε/(V-1)
convention or with a term missing.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from lib.exercises._common import (
    ExerciseError,
    checker,
    expect_close,
    is_close,
)

__all__ = [
    "check_noam_plan",
    "check_scaler_step",
    "fp16_regression",
    "scaler_step_reference",
    "check_smoothed_loss_floor",
]


@checker("Exercise 1: plan a Noam schedule")
def check_noam_plan(noam_plan: Callable[[int, float], tuple[int, int]]) -> None:
    """``noam_plan(d_model, peak_lr) -> (warmup, half_step)``: the warm-up length whose Noam
    schedule peaks at ``peak_lr`` (rounded to the nearest int), and the first 1-based step
    at which the rate has fallen to half that peak or below."""
    for d_model, warmup in ((512, 4000), (64, 10), (1024, 250), (8, 1), (768, 2000)):
        peak_lr = d_model**-0.5 * warmup**-0.5
        got = noam_plan(d_model, peak_lr)
        if not (isinstance(got, tuple) and len(got) == 2):
            raise ExerciseError(f"return a pair (warmup, half_step), got {got!r}")
        for name, value in zip(("warmup", "half_step"), got):
            if isinstance(value, bool) or not isinstance(value, int):
                raise ExerciseError(
                    f"{name} should be an int, got {type(value).__name__} {value!r}"
                )
        got_warmup, half_step = got
        call = f"noam_plan({d_model}, {peak_lr:.4g})"
        if got_warmup != warmup:
            if got_warmup == round(peak_lr**-2) and d_model != 1:
                raise ExerciseError(
                    f"{call} gives warmup {got_warmup}: the peak is d_model^-0.5 · "
                    "warmup^-0.5, so warmup = 1 / (d_model · peak_lr²); the d_model "
                    "factor is missing"
                )
            raise ExerciseError(
                f"{call} gives warmup {got_warmup}, expected {warmup}: solve "
                "peak_lr = d_model^-0.5 · warmup^-0.5 for warmup, and round"
            )
        if half_step == 2 * warmup:
            raise ExerciseError(
                f"{call} gives half_step {half_step} = 2 · warmup: after the peak the rate "
                "falls as n^-0.5, not 1/n, so it takes 4 times the steps to halve"
            )
        if half_step in (4 * warmup - 1, 4 * warmup + 1):
            raise ExerciseError(
                f"{call} gives half_step {half_step}, one off: n^-0.5 = warmup^-0.5 / 2 "
                "exactly at n = 4 · warmup"
            )
        if half_step != 4 * warmup:
            raise ExerciseError(
                f"{call} gives half_step {half_step}; for which n is n^-0.5 half of warmup^-0.5?"
            )


def scaler_step_reference(
    grads: list[torch.Tensor], scale: float, good_steps: int, *, growth_interval: int
) -> tuple[list[torch.Tensor] | None, float, int]:
    """One step of dynamic loss scaling, as ``torch.amp.GradScaler`` makes it (growth and
    back-off factors 2 and 1/2): the float32 unscaled gradients, or None to skip the step,
    then the next scale and the next count of good steps."""
    if not all(bool(torch.isfinite(g).all()) for g in grads):
        return None, scale / 2, 0
    unscaled = [g.float() / scale for g in grads]
    if good_steps + 1 == growth_interval:
        return unscaled, scale * 2, 0
    return unscaled, scale, good_steps + 1


def fp16_regression(
    scaler_step: Callable[..., tuple] | None,
    n_steps: int = 60,
    *,
    scale: float = 2.0**56,
    growth_interval: int = 10,
) -> tuple[list[float], int]:
    """Fit a linear model whose float16 gradients underflow without scaling.

    The weights are float32 (the master copy); each step casts them to float16, computes
    the predictions in float16 and a loss of about 1e-9 in float32 (its gradients are
    around 1e-11, below float16's smallest subnormal), and runs the backward pass on
    ``loss × scale``, which gives float16 gradients. ``scaler_step`` (None: no scaling)
    turns them into the float32 gradients of Adam's step, or skips the step. Returns the
    loss before each step and the number of skipped steps.
    """
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(64, 8, generator=gen).half()
    y = x.float() @ torch.randn(8, generator=gen)
    master = torch.zeros(8, requires_grad=True)
    # Adam ignores the gradients' size, so an eps far below them keeps it exact
    adam = torch.optim.Adam([master], lr=0.05, eps=1e-30)
    losses, skipped, good = [], 0, 0
    for _ in range(n_steps):
        weights = master.detach().half().requires_grad_()
        loss = ((x @ weights).float() - y).pow(2).mean() * 2.0**-30
        losses.append(loss.item())
        (loss * (scale if scaler_step else 1.0)).backward()
        if scaler_step is None:
            grads: list[torch.Tensor] | None = [weights.grad.float()]
        else:
            grads, scale, good = scaler_step(
                [weights.grad], scale, good, growth_interval=growth_interval
            )
        if grads is None:
            skipped += 1
            continue
        master.grad = grads[0].float()
        adam.step()
    return losses, skipped


def _expect_step(result: object, n_grads: int) -> tuple[list | None, float, int]:
    if not (isinstance(result, tuple) and len(result) == 3):
        raise ExerciseError(
            "return the triple (grads or None, scale, good_steps), got "
            f"{type(result).__name__}"
        )
    grads, scale, good = result
    if grads is not None:
        if not isinstance(grads, list | tuple) or len(grads) != n_grads:
            raise ExerciseError(
                f"return a list of {n_grads} gradients (or None to skip), got {grads!r:.60}"
            )
        if any(
            not isinstance(g, torch.Tensor) or g.dtype != torch.float32 for g in grads
        ):
            raise ExerciseError(
                "return float32 gradients: the optimiser updates the float32 master "
                "weights, and a float16 result loses the small gradients again"
            )
    if isinstance(scale, torch.Tensor):
        scale = float(scale)
    if isinstance(good, torch.Tensor):
        good = int(good)
    return grads, scale, good


def _call(scaler_step, grads, scale, good, interval):
    before = [g.clone() for g in grads]
    result = scaler_step(list(grads), scale, good, growth_interval=interval)
    # compared bit for bit: NaN != NaN
    same = (
        torch.equal(g.view(torch.int16), b.view(torch.int16))
        for g, b in zip(grads, before)
    )
    if not all(same):
        raise ExerciseError(
            "your function modified the gradients in place; compute new tensors "
            "(e.g. g.float() / scale, not g.div_(scale))"
        )
    return _expect_step(result, len(grads))


@checker("Exercise 2: dynamic loss scaling")
def check_scaler_step(scaler_step: Callable[..., tuple]) -> None:
    """``scaler_step(grads, scale, good_steps, *, growth_interval) -> (grads or None,
    scale, good_steps)``: ``grads`` are float16 gradients of ``loss × scale``; skip and
    halve on inf or NaN, else unscale in float32 and double the scale after
    ``growth_interval`` good steps in a row."""
    gen = torch.Generator().manual_seed(0)
    true_grads = [
        torch.randn(4, 3, generator=gen) * 1e-6,
        torch.randn(5, generator=gen) * 1e-3,
    ]
    true_grads[0][0, 0] = 1e-8  # below float16's smallest subnormal, 6e-8
    scale = 2.0**16
    finite = [(g * scale).half() for g in true_grads]

    grads, _, _ = _call(scaler_step, finite, scale, 0, 3)
    if grads is None:
        raise ExerciseError(
            "finite gradients were skipped: only inf or NaN skips a step"
        )
    if is_close(grads[0], finite[0].float(), atol=0, rtol=1e-6):
        raise ExerciseError("the gradients are still scaled: divide them by the scale")
    if not is_close(grads[0], true_grads[0], atol=1e-12, rtol=1e-2):
        halved = (finite[0] / scale).float()
        if is_close(grads[0], halved, atol=0, rtol=1e-6):
            raise ExerciseError(
                "you unscaled in float16: the small gradients underflow to 0 again "
                "(1e-8 in the first tensor); cast to float32, then divide"
            )
        expect_close(
            grads[0], true_grads[0], "the unscaled gradient", atol=1e-12, rtol=1e-2
        )

    for bad, what in ((torch.inf, "an inf"), (torch.nan, "a NaN")):
        broken = [g.clone() for g in finite]
        broken[1][2] = bad
        grads, new_scale, good = _call(scaler_step, broken, scale, 2, 3)
        if grads is not None:
            hint = " (NaN != NaN: check with torch.isfinite)" * (what == "a NaN")
            raise ExerciseError(
                f"gradients with {what} must skip the step: return None{hint}"
            )
        if new_scale != scale / 2:
            raise ExerciseError(
                f"after an overflow at scale {scale:g} the scale should halve to "
                f"{scale / 2:g}, got {new_scale!r}"
            )
        if good != 0:
            raise ExerciseError(
                f"after an overflow good_steps starts again at 0, got {good!r}: the "
                "growth waits for growth_interval good steps in a row"
            )

    # a run of good steps: the scale doubles on the 3rd, the 6th...
    trajectory, want, current, count = [], [], scale, 0
    reference_scale, reference_count = scale, 0
    for _ in range(7):
        _, current, count = _call(scaler_step, finite, current, count, 3)
        _, reference_scale, reference_count = scaler_step_reference(
            finite, reference_scale, reference_count, growth_interval=3
        )
        trajectory.append((current, count))
        want.append((reference_scale, reference_count))
    if trajectory != want:
        scales = [s / scale for s, _ in trajectory]
        counts = [c for _, c in trajectory]
        shown = f"scales (÷ the first) {scales}, good_steps {counts}; expected " + str(
            [s / scale for s, _ in want]
        )
        if all(s == 1 for s in scales):
            raise ExerciseError(f"the scale never grows: {shown}")
        if scales[0] == 2:
            raise ExerciseError(
                f"the scale grows after every good step: {shown}; double it only after "
                "growth_interval good steps in a row"
            )
        if scales[1] == 2 and scales[2] == 2:
            raise ExerciseError(f"the scale doubles one step early: {shown}")
        if scales[2] == 1 and scales[3] == 2:
            raise ExerciseError(f"the scale doubles one step late: {shown}")
        if counts[2] != 0:
            raise ExerciseError(f"reset good_steps to 0 when the scale grows: {shown}")
        raise ExerciseError(f"wrong scale schedule: {shown}")

    losses, skipped = fp16_regression(scaler_step)
    if not (skipped > 0 and losses[-1] < 0.05 * losses[0]):
        raise ExerciseError(
            f"a float16 model trained with your scaler does not learn: the loss goes "
            f"from {losses[0]:.2e} to {losses[-1]:.2e} ({skipped} steps skipped)"
        )


@checker("Exercise 3: the floor of a label-smoothed loss")
def check_smoothed_loss_floor(
    smoothed_loss_floor: Callable[[float, int], float],
) -> None:
    """``smoothed_loss_floor(smoothing, vocab_size) -> float``: the minimum over all logits
    of the label-smoothed cross-entropy (PyTorch's convention, ε/V on every class)."""
    for smoothing, vocab in ((0.1, 10), (0.2, 3), (0.05, 1000)):
        got = smoothed_loss_floor(smoothing, vocab)
        if isinstance(got, torch.Tensor):
            got = float(got)
        if not isinstance(got, (int, float)) or isinstance(got, bool):
            raise ExerciseError(f"return a float, got {type(got).__name__}")
        right, other = 1 - smoothing + smoothing / vocab, smoothing / vocab
        want = -(right * math.log(right) + (vocab - 1) * other * math.log(other))
        if is_close(got, want, atol=1e-12, rtol=1e-6):
            continue
        if got == 0:
            raise ExerciseError(
                "the smoothed loss never reaches 0: the best prediction is the smoothed "
                "target q itself, and the loss is then q's cross-entropy with itself, its "
                "entropy"
            )
        wrong_right, wrong_other = 1 - smoothing, smoothing / (vocab - 1)
        other_convention = -(
            wrong_right * math.log(wrong_right)
            + (vocab - 1) * wrong_other * math.log(wrong_other)
        )
        if is_close(got, other_convention, atol=1e-12, rtol=1e-6):
            raise ExerciseError(
                "that is the ε/(V-1) convention (ε spread over the wrong classes only); "
                "cross_entropy (like PyTorch) spreads ε/V over all V classes, the correct "
                "one included, which gets 1 - ε + ε/V"
            )
        if is_close(got, -right * math.log(right), atol=1e-12, rtol=1e-6) or is_close(
            got, -(vocab - 1) * other * math.log(other), atol=1e-12, rtol=1e-6
        ):
            raise ExerciseError(
                "a term is missing: the entropy sums -q log q over the correct class and all "
                "V-1 others"
            )
        raise ExerciseError(
            f"smoothed_loss_floor({smoothing}, {vocab}) gives {got:.6g}, expected {want:.6g}"
        )
