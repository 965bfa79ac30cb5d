"""Checkers for the exercises of chapter 8 (training), numbered per page.

Each checker runs the reader's function on several inputs, compares it with a reference and
names the typical mistake when it recognises one: a Noam warm-up without its d_model
factor, a rate that halves at twice the warm-up or one step off; a loss scaler that steps
on an overflow, misses a NaN, does not halve or reset its count, grows its scale at the
wrong step or unscales in float16; a label-smoothing floor of zero, with the ε/(V-1)
convention or with a term missing; a stochastic rounding that rounds to nearest or
truncates, moves a bfloat16 value, tosses a fair coin or inverts the odds, or ignores
its generator; an early stop one evaluation early or late, that counts a tie as an
improvement, does not reset its count, returns an index or a best step it never saw.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from lib.exercises._common import (
    ExerciseError,
    checker,
    expect_close,
    expect_tensor,
    is_close,
)

__all__ = [
    "check_noam_plan",
    "check_scaler_step",
    "fp16_regression",
    "scaler_step_reference",
    "check_smoothed_loss_floor",
    "bfloat16_neighbours",
    "stochastic_round_reference",
    "check_stochastic_round",
    "early_stop_reference",
    "check_early_stop",
    "check_ledger_row",
]


@checker("Exercise 2 (page 8.1): plan a Noam schedule")
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


@checker("Exercise 1 (page 8.2): dynamic loss scaling")
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


@checker("Exercise 1 (page 8.1): a smoothed loss's floor")
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


# -- Exercise 2 of page 8.2: stochastic rounding to bfloat16 ---------------------------


def bfloat16_neighbours(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The two bfloat16 values around each float32 of ``x``, as float32: the one toward
    zero (``x``'s 16 low bits cleared) and the next one away from zero (equal to the
    first where ``x`` is a bfloat16 already)."""
    bits = x.view(torch.int32)
    toward = bits & -65536  # 0xFFFF0000: the bits bfloat16 keeps
    away = torch.where(toward == bits, toward, toward + 65536)
    return toward.view(torch.float32), away.view(torch.float32)


def stochastic_round_reference(
    x: torch.Tensor, generator: torch.Generator
) -> torch.Tensor:
    """``x`` (float32) to bfloat16, away from zero with probability the share of the
    gap that ``x`` has covered: 16 random bits added below bfloat16's mantissa, then
    cut off."""
    noise = torch.randint(0, 1 << 16, x.shape, generator=generator, dtype=torch.int32)
    bits = (x.view(torch.int32) + noise) & -65536
    return bits.view(torch.float32).to(torch.bfloat16)  # exact: the low bits are 0


def _rounding_call(stochastic_round, x, seed):
    before = x.clone()
    result = stochastic_round(x, torch.Generator().manual_seed(seed))
    if not torch.equal(x.view(torch.int32), before.view(torch.int32)):  # NaN != NaN
        raise ExerciseError(
            "your function modified x in place; compute a new tensor (x.view(torch.int32)"
            " shares x's memory: add to it with +, not +=)"
        )
    got = expect_tensor(result, tuple(x.shape), f"stochastic_round of {tuple(x.shape)}")
    if got.dtype != torch.bfloat16:
        raise ExerciseError(
            f"return a bfloat16 tensor, got {got.dtype}: clear the 16 low bits of the "
            "float32, and .to(torch.bfloat16) is then exact"
        )
    return got.float()


@checker("Exercise 2 (page 8.2): stochastic rounding")
def check_stochastic_round(
    stochastic_round: Callable[[torch.Tensor, torch.Generator], torch.Tensor],
) -> None:
    """``stochastic_round(x, generator)``: float32 ``x`` of any shape -> bfloat16 of its
    shape, each value one of its two bfloat16 neighbours, away from zero with
    probability the share of the gap between them that it has covered, drawn with
    ``generator``."""
    exact = (
        torch.tensor(
            [0.0, -0.0, 1.0, -2.5, 0.15625, 3.0e38, -1.0e-30, torch.inf, -torch.inf]
        )
        .bfloat16()
        .float()
    )  # bfloat16 values: nothing to round
    exact = exact.repeat(100_000, 1)  # so that a rare wrong draw shows
    got = _rounding_call(stochastic_round, exact, 0)
    if not torch.equal(got, exact):
        index = tuple((got != exact).nonzero()[0].tolist())
        value, wrong = exact[index], got[index]
        next_one = (value.view(torch.int32) + 65536).view(torch.float32)  # a step out
        hint = "a value bfloat16 holds has nothing to round"
        if wrong == next_one:
            hint = "add at most 0xFFFF below the kept bits (randint's high end is "
            hint += "exclusive: 1 << 16)"
        raise ExerciseError(
            f"{value.item():g} is a bfloat16 already and must stay as it is, got "
            f"{wrong.item():g}: {hint}"
        )
    for seed in (1, 2):
        nan = _rounding_call(stochastic_round, torch.tensor([torch.nan] * 3), seed)
        if not nan.isnan().all():
            raise ExerciseError(f"a NaN must stay NaN, got {nan.tolist()}")

    # fractions of the gap covered, on both sides of zero and at several scales
    share = torch.tensor([0.125, 0.25, 0.5, 0.75, 0.875])
    low = torch.tensor([1.0, -3.0, 1.0e-3, -7.5e4, 200.0])
    toward = low.bfloat16().float()
    _, away = bfloat16_neighbours(toward + toward.sign() * 1e-3 * toward.abs())
    x = toward + share * (away - toward)
    n_draws = 4000
    draws = _rounding_call(stochastic_round, x.repeat(n_draws, 1), 3)
    again = _rounding_call(stochastic_round, x.repeat(n_draws, 1), 3)
    neighbour = (draws == toward) | (draws == away)
    if not neighbour.all():
        row, col = (~neighbour).nonzero()[0].tolist()
        raise ExerciseError(
            f"{x[col].item():.9g} became {draws[row, col].item():.9g}, which is not one of "
            f"its two bfloat16 neighbours, {toward[col].item():.9g} and "
            f"{away[col].item():.9g}: round the bits, not the value"
        )
    if (draws == draws[0]).all():
        if torch.equal(draws[0], x.bfloat16().float()):
            kind = "the nearest bfloat16: that is round-to-nearest"
        elif torch.equal(draws[0], toward):
            kind = "the neighbour toward zero: that truncates"
        else:
            kind = "the same value"
        raise ExerciseError(
            f"every draw of each value is {kind}; round at random, away from zero "
            "with probability the share of the gap covered"
        )
    if not torch.equal(draws, again):
        raise ExerciseError(
            "two calls with generators of the same seed gave different results: draw "
            "the random bits with the generator passed in"
        )
    up = (draws == away).double().mean(dim=0)  # (5,): how often away from zero
    if not torch.allclose(up, share.double(), atol=0.04):
        shown = f"rounded away from zero {[round(u, 2) for u in up.tolist()]} of the "
        shown += f"time for shares {share.tolist()} of the gap"
        if torch.allclose(up, 1 - share.double(), atol=0.04):
            raise ExerciseError(
                f"{shown}: inverted; the closer x is to a neighbour, the likelier it "
                "is to round to it"
            )
        if torch.allclose(up, torch.full_like(up, 0.5), atol=0.04):
            raise ExerciseError(
                f"{shown}: a coin toss; the chance must be the share covered, so that "
                "the mean of many roundings is x"
            )
        raise ExerciseError(f"{shown}: the chance must be the share covered")


# -- Exercise 1 of page 8.4: early stopping --------------------------------------------


def early_stop_reference(
    steps: list[int], losses: list[float], patience: int
) -> tuple[int, int | None]:
    """``(stop_step, best_step)``: training stops at the evaluation where ``patience``
    evaluations in a row have not lowered the best held-out loss (an equal loss or a
    NaN does not), or at the last one; the best is the earliest lowest loss up to
    there (None if no loss was a number), as ``keep_best`` keeps it."""
    best, best_step, waited = math.inf, None, 0
    for step, loss in zip(steps, losses):
        if loss < best:
            best, best_step, waited = loss, step, 0
        else:
            waited += 1
            if waited == patience:
                return step, best_step
    return steps[-1], best_step


def _early_stop_variant(steps, losses, patience, mistake):
    """The answer of one typical mistake."""
    best, best_step, waited = math.inf, None, 0
    for index, (step, loss) in enumerate(zip(steps, losses)):
        better = loss <= best if mistake == "ties" else loss < best
        if better:
            best, best_step = loss, step
            waited = waited if mistake == "no_reset" else 0
            continue
        waited += 1
        if waited == {"early": patience - 1, "late": patience + 1}.get(
            mistake, patience
        ):
            stop = index if mistake == "index" else step
            if mistake == "global_best":
                finite = [(v, s) for v, s in zip(losses, steps) if v == v]
                best_step = min(finite)[1]
            return stop, best_step
    return steps[-1], best_step


_EARLY_STOP_MISTAKES = {
    "early": "one evaluation early: stop when `patience` evaluations in a row have not "
    "improved, not patience - 1",
    "late": "one evaluation late: stop at the patience-th evaluation in a row without "
    "improvement, not the one after",
    "ties": "an equal loss counted as an improvement: only a strictly lower loss "
    "resets the count (and keep_best keeps the earlier of two equal losses)",
    "no_reset": "the count of evaluations without improvement must start again at 0 "
    "after each improvement: patience counts evaluations in a row",
    "index": "that is the index of the evaluation; return its step (steps[index])",
    "global_best": "the best step comes from the evaluations up to the stop: training "
    "never sees the later ones",
}


def _early_stop_cases():
    steps = list(range(100, 1600, 100))
    # the H200 run of page 8.4: lowest at step 700, then rising
    h200 = [2.41, 1.90, 1.69, 1.59, 1.53, 1.51, 1.483, 1.484, 1.49, 1.52, 1.54,
            1.57, 1.60, 1.63, 1.65]  # fmt: skip
    bumpy = [3.0, 2.5, 2.6, 2.4, 2.45, 2.5, 2.3, 2.35, 2.4, 2.42, 2.2, 2.3, 2.3,
             2.3, 2.1]  # fmt: skip
    tie = [2.0, 1.5, 1.5, 1.6, 1.5, 1.7, 1.2, 1.8, 1.9, 2.0, 2.1, 2.2, 2.3, 2.4, 2.5]
    # no improvement after the first: the later fall comes after the stop
    never = [1.0, 1.5, 1.2, 1.1, 1.3, 1.4, 1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2]
    always = [2.0 - 0.1 * i for i in range(15)]
    diverged = [2.0, 1.8, 1.7, math.nan, 1.75, 1.6, 1.65, math.nan, 1.7, 1.8, 1.9,
                1.5, 1.4, 1.3, 1.2]  # fmt: skip
    cases = [("the H200 run's curve", h200, 3), ("a bumpy curve", bumpy, 2)]
    cases += [("a bumpy curve", bumpy, 3), ("a curve with ties", tie, 2)]
    cases += [("a curve with ties", tie, 3), ("a curve that never improves", never, 3)]
    cases += [("a curve that always improves", always, 2)]
    cases += [("a curve with NaN evaluations", diverged, 3)]
    return [(label, steps, losses, p) for label, losses, p in cases]


@checker("Exercise 1 (page 8.4): early stopping")
def check_early_stop(early_stop: Callable[..., tuple]) -> None:
    """``early_stop(steps, losses, patience) -> (stop_step, best_step)``: the held-out
    losses evaluated at ``steps``; stop at the evaluation where ``patience`` of them in
    a row have not lowered the best loss (ties and NaN do not), or at the last one, and
    keep the earliest lowest loss seen up to there."""
    answers = []
    for label, steps, losses, patience in _early_stop_cases():
        got = early_stop(list(steps), list(losses), patience)
        what = f"early_stop on {label}, patience {patience}"
        if not (isinstance(got, tuple | list) and len(got) == 2):
            raise ExerciseError(
                f"{what}: return a pair (stop_step, best_step), got {got!r}"
            )
        for name, value in zip(("stop_step", "best_step"), got):
            if isinstance(value, bool) or not isinstance(value, int):
                raise ExerciseError(
                    f"{what}: {name} should be an int, got {type(value).__name__} "
                    f"{value!r}"
                )
        answers.append((what, tuple(got), steps, losses, patience))
    wrong = [a for a in answers if a[1] != early_stop_reference(*a[2:])]
    if not wrong:
        return
    for mistake, message in _EARLY_STOP_MISTAKES.items():
        if all(got == _early_stop_variant(*rest, mistake) for _, got, *rest in answers):
            raise ExerciseError(message)
    what, got, steps, losses, patience = wrong[0]
    want = early_stop_reference(steps, losses, patience)
    shown = ", ".join(f"{s}: {v:g}" for s, v in zip(steps, losses))
    raise ExerciseError(f"{what} ({shown}) gives {got}, expected {want}")


@checker("Exercise: a row of your own in the ledger")
def check_ledger_row(my_row: Callable[[], object], seeds: int = 3) -> None:
    """``my_row() -> lib.runs.RecipeChange``: one change to the character GPT's
    recipe, with a name of its own, that changes something and trains. The checker
    then runs it beside the baseline on page 8.5's smoke sizes, ``seeds`` seeds paired
    with the baseline's, and prints its line of the table."""
    from dataclasses import fields

    from lib.ledger import ledger_rows, ledger_sizes, ledger_table, run_ledger
    from lib.models import TransformerConfig
    from lib.runs import RecipeChange

    row = my_row()
    if not isinstance(row, RecipeChange):
        raise ExerciseError(f"return a lib.runs.RecipeChange, got {type(row).__name__}")
    sizes = ledger_sizes("smoke")
    if row.name in ledger_rows(sizes):
        raise ExerciseError(
            f"the name {row.name!r} is taken (the page's rows: "
            f"{list(ledger_rows(sizes))}): give your change a name of its own"
        )
    known = {f.name for f in fields(TransformerConfig)}
    if unknown := sorted(set(row.model) - known):
        raise ExerciseError(f"{unknown} are not fields of lib.models.TransformerConfig")
    baseline = RecipeChange()
    same_model = all(
        row.model[k] == getattr(_recipe_config(sizes), k) for k in row.model
    )
    swaps = (row.optimizer, row.schedule, row.loss_fn)
    if same_model and all(part is None for part in swaps):
        raise ExerciseError(
            f"{row!r} changes nothing: set a configuration field to a value other "
            f"than the recipe's, or give an optimizer, schedule or loss_fn "
            f"(the baseline is {baseline!r})"
        )
    ledger = run_ledger(
        ["baseline", row], seeds=range(seeds), profile="smoke", progress=False
    )
    line = next(x for x in ledger_table(ledger["runs"]) if x["row"] == row.name)
    if not math.isfinite(line["loss"]) or line["loss"] > math.log(65):
        raise ExerciseError(
            f"{row.name!r} does not train: its validation loss {line['loss']:.3f} "
            f"is no better than a uniform guess ({math.log(65):.3f})"
        )
    print(
        f"{row.name}: {line['loss']:.3f} nats, {line['difference']:+.3f} "
        f"[{line['difference_low']:+.3f}, {line['difference_high']:+.3f}], "
        f"p {line['p']:.2f}"
    )


def _recipe_config(sizes):
    """The configuration the recipe builds at ``sizes`` (its vocabulary: 65)."""
    from lib.runs import _run_config

    return _run_config("gpt", sizes, 65)
