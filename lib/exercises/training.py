"""Checkers for the exercises of chapter 8 (training).

Each checker runs the reader's function on several inputs, compares it with a reference and
names the typical mistake when it recognises one: a Noam warm-up without its d_model
factor, a rate that halves at twice the warm-up or one step off; Adam with decoupled instead of coupled (L2) weight decay, without bias
correction or with epsilon inside the square root; a label-smoothing floor of zero, with
the ε/(V-1) convention or with a term missing.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from lib.exercises._common import (
    ExerciseError,
    call_without_mutation,
    checker,
    expect_close,
    is_close,
)

__all__ = [
    "check_noam_plan",
    "check_adam_l2_step",
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


def _adam_reference(
    param, grad, m, v, step, *, lr, betas, eps, weight_decay, **mistakes
):
    """One step of Adam with L2 decay (torch.optim.Adam), or a typical wrong variant."""
    beta1, beta2 = betas
    if mistakes.get("decoupled"):
        param = param * (1 - lr * weight_decay)
    else:
        grad = grad + weight_decay * param
    m = beta1 * m + (1 - beta1) * grad
    v = beta2 * v + (1 - beta2) * grad * grad
    if mistakes.get("no_bias_correction"):
        m_hat, v_hat = m, v
    else:
        m_hat, v_hat = m / (1 - beta1**step), v / (1 - beta2**step)
    if mistakes.get("eps_inside"):
        return param - lr * m_hat / (v_hat + eps).sqrt(), m, v
    return param - lr * m_hat / (v_hat.sqrt() + eps), m, v


def _run_steps(step_fn, param, grads, settings):
    m, v = torch.zeros_like(param), torch.zeros_like(param)
    for t, grad in enumerate(grads, start=1):
        result = call_without_mutation(step_fn, param, grad, m, v, t, **settings)
        if not (isinstance(result, tuple) and len(result) == 3):
            raise ExerciseError(
                f"return the triple (param, exp_avg, exp_avg_sq), got {type(result).__name__}"
            )
        param, m, v = result
    return param, m, v


@checker("Exercise 2: Adam with L2 regularisation")
def check_adam_l2_step(adam_l2_step: Callable[..., tuple]) -> None:
    """``adam_l2_step(param, grad, exp_avg, exp_avg_sq, step, *, lr, betas, eps,
    weight_decay) -> (param, exp_avg, exp_avg_sq)``, as ``torch.optim.Adam`` does it."""
    gen = torch.Generator().manual_seed(0)
    start = torch.randn(6, 5, dtype=torch.float64, generator=gen) * 3
    grads = [
        torch.randn(6, 5, dtype=torch.float64, generator=gen) * s for s in (1e-3, 1, 10)
    ]
    # eps this large makes "eps inside the square root" visibly different
    settings = dict(lr=0.05, betas=(0.9, 0.99), eps=1e-3, weight_decay=0.3)
    weight = start.clone().requires_grad_()
    torch_adam = torch.optim.Adam([weight], **settings)
    for grad in grads:
        weight.grad = grad.clone()
        torch_adam.step()
    want = weight.detach()
    got, _, _ = _run_steps(adam_l2_step, start.clone(), grads, settings)
    if isinstance(got, torch.Tensor) and got.shape == want.shape:
        if torch.allclose(got, want, atol=1e-10):
            return
        for mistake, message in (
            (
                "decoupled",
                "you decayed the weights directly (decoupled, AdamW); Adam's L2 decay adds "
                "weight_decay · param to the gradient before the moments are updated",
            ),
            (
                "no_bias_correction",
                "the moments are not bias-corrected: divide exp_avg by (1 - beta1^step) and "
                "exp_avg_sq by (1 - beta2^step) before the update",
            ),
            (
                "eps_inside",
                "epsilon is inside the square root: Adam divides by sqrt(v_hat) + eps",
            ),
        ):
            wrong, _, _ = _run_steps(
                lambda *a, mistake=mistake, **k: _adam_reference(
                    *a, **k, **{mistake: True}
                ),
                start.clone(),
                grads,
                settings,
            )
            if torch.allclose(got, wrong, atol=1e-10):
                raise ExerciseError(message)
    expect_close(got, want, "the parameter after three steps", atol=1e-10, rtol=1e-8)


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
