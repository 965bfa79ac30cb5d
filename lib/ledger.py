# This file is generated from chapters/08-5-ledger.md by tools/tangle.py. Do not edit it by hand:
# edit the chapter's cells tagged "export", then run `python tools/tangle.py`.
# From chapters/08-5-ledger.md, section "8.5 A ledger of training choices".
"""A ledger of training choices for a small GPT, each measured with seeds
(page 8.5): the Muon optimiser, a warm-up-stable-decay schedule, z-loss,
and the runner that trains the baseline and each change alone.

* Muon: :func:`newton_schulz`, :class:`Muon` (one optimiser: Muon groups
  and AdamW groups), :func:`muon_optimizer` (a model's split).
* Schedule: :class:`WarmupStableDecaySchedule`, for
  :func:`lib.training.make_scheduler`.
* Loss: :func:`z_loss`, :class:`CrossEntropyZLoss` (a ``loss_fn`` for
  :func:`lib.training.train`).
* The ledger: :func:`ledger_rows` (each a :class:`lib.runs.RecipeChange`
  of the character GPT), :func:`run_ledger`, :func:`ledger_table`, with
  :func:`mean_interval`, :func:`paired_t_test` and :func:`holm`;
  ``python -m lib.ledger`` (:func:`ledger_main`) writes its record.
"""

from __future__ import annotations

import argparse
import functools
import math
import multiprocessing
import os
import shlex
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from einops import einsum
from torch import nn

from lib import _checks as check
from lib.batches import Batch
from lib.ffn import moe_balance_loss
from lib.models import TransformerBlock
from lib.objectives import IGNORE_INDEX
from lib.runs import RecipeChange, char_gpt_run, run_sizes
from lib.training import cross_entropy, model_loss, parameter_groups, unwrap_model
from lib.utils import PROFILE_ENV, PROFILES, git_commit, pick, set_threads, write_record

# The public names: every top-level name the export cells define (tools/tangle.py).
__all__ = [
    "NEWTON_SCHULZ_COEFFICIENTS",
    "newton_schulz",
    "MUON_UPDATE_RMS",
    "Muon",
    "muon_optimizer",
    "WSD_DECAY_SHAPES",
    "WarmupStableDecaySchedule",
    "z_loss",
    "CrossEntropyZLoss",
    "LEDGER_CPU_SIZES",
    "BALANCE_WEIGHT",
    "ledger_sizes",
    "ledger_rows",
    "t_two_sided_p",
    "t_quantile",
    "mean_interval",
    "paired_t_test",
    "holm",
    "run_ledger",
    "ledger_table",
    "ledger_main",
]


# From chapters/08-5-ledger.md, section "8.5 A ledger of training choices".
def _check_newton_schulz(matrix, steps=5, *, eps=1e-7) -> None:
    """A floating ``(... rows cols)`` tensor, ``steps >= 1``, ``eps >
    0``."""
    say = dict(owner="newton_schulz")
    check.tensor("matrix", matrix, "... rows cols", floating=True, **say)
    check.positive_int("steps", steps, **say)
    check.finite_float("eps", eps, low=0.0, low_open=True, **say)


# the range of each setting of a Muon group (and of each beta)
_RANGES = dict(
    lr=dict(low=0.0),
    weight_decay=dict(low=0.0),
    momentum=dict(low=0.0, high=1.0, high_open=True),
    eps=dict(low=0.0, low_open=True),
)


def _check_group(group: dict[str, Any]) -> None:
    """A parameter group of :class:`Muon`, its defaults filled in: a
    ``muon`` flag, settings in range, 2-D parameters where ``muon``."""
    say = dict(owner="Muon")
    if "muon" not in group:
        raise ValueError("Muon: each group needs a flag, muon=True|False")
    muon = check.boolean("muon", group["muon"], **say)
    for name, kept_in in _RANGES.items():
        check.finite_float(name, group[name], **kept_in, **say)
    check.boolean("nesterov", group["nesterov"], **say)
    check.positive_int("ns_steps", group["ns_steps"], **say)
    betas = group["betas"]
    if not isinstance(betas, tuple | list) or len(betas) != 2:
        raise TypeError(f"Muon: betas must be a pair, got {betas!r}")
    for i, beta in enumerate(betas):
        check.finite_float(f"betas[{i}]", beta, **_RANGES["momentum"], **say)
    shapes = [tuple(p.shape) for p in group["params"] if p.dim() != 2]
    if muon and shapes:
        raise ValueError(f"Muon: muon=True takes 2-D matrices, not {shapes}")


def _check_saved_state(optimizer, saved: Mapping[str, Any]) -> None:
    """Before a :class:`Muon` loads ``saved``: its groups carry this one's
    flags (PyTorch checks only their sizes)."""
    flags = [g["muon"] for g in optimizer.param_groups]
    saved_flags = [g.get("muon") for g in saved["param_groups"]]
    if flags != saved_flags:
        raise ValueError(f"Muon: muon flags {flags}, saved {saved_flags}")


def _check_wsd(schedule) -> None:
    """The fields of a :class:`WarmupStableDecaySchedule`."""
    say = dict(owner="WarmupStableDecaySchedule")
    total = check.positive_int("total", schedule.total, **say)
    check.int_in_range("warmup", schedule.warmup, 0, total, **say)
    share = dict(low=0.0, high=1.0)
    fraction = schedule.decay_fraction
    check.finite_float("decay_fraction", fraction, **share, low_open=True)
    check.finite_float("min_ratio", schedule.min_ratio, **share, **say)
    check.one_of("shape", schedule.shape, WSD_DECAY_SHAPES, **say)
    if schedule.warmup > schedule.decay_start:
        raise ValueError(f"{say['owner']}: warm-up and decay overlap")


def _check_z_loss(logits, targets=None, *, coefficient=1e-4, **_) -> None:
    """Floating ``(... vocab)`` logits, integer ``(...)`` targets (or
    None), a coefficient ``>= 0``."""
    say = dict(owner="z_loss")
    check.tensor("logits", logits, "... vocab", floating=True, **say)
    check.finite_float("coefficient", coefficient, low=0.0, **say)
    if targets is not None:
        check.tensor("targets", targets, integer=True, **say)
    if targets is not None and targets.shape != logits.shape[:-1]:
        got = f"{tuple(targets.shape)}, logits {tuple(logits.shape)}"
        raise ValueError(f"z_loss: targets' shape is logits' - vocab: {got}")


def _check_batch(batch: Any) -> None:
    keys = set(batch) if isinstance(batch, Mapping) else set()
    if not {"inputs", "targets"} <= keys:
        raise ValueError(f"a batch needs 'inputs', 'targets': {batch!r:.40}")


# From chapters/08-5-ledger.md, section "Muon: one step size for every direction of a matrix".
# the quintic's coefficients (a, b, c) of Muon's Newton-Schulz iteration
NEWTON_SCHULZ_COEFFICIENTS = (3.4445, -4.7750, 2.0315)


@check.front_door(_check_newton_schulz)
def newton_schulz(
    matrix: torch.Tensor, steps: int = 5, *, eps: float = 1e-7
) -> torch.Tensor:
    """Muon's orthogonalisation: about ``U·Vᵀ`` where ``matrix = U·S·Vᵀ``.

    Exactly ``U·φᵏ(S / (‖matrix‖_F + eps))·Vᵀ`` with ``k = steps`` and
    ``φ(σ) = aσ + bσ³ + cσ⁵`` (:data:`NEWTON_SCHULZ_COEFFICIENTS`): five
    steps put every singular value of at least 1/500 of the Frobenius norm
    in [0.68, 1.21]. Shapes: ``matrix`` ``(... rows cols)``, the result the
    same, in ``matrix``'s dtype (computed in float32, or float64).
    """
    a, b, c = NEWTON_SCHULZ_COEFFICIENTS
    x = matrix if matrix.dtype == torch.float64 else matrix.float()
    tall = x.shape[-2] > x.shape[-1]
    if tall:  # (short long): x·xᵀ is then the smaller Gram matrix
        x = x.mT
    # every singular value is at most the Frobenius norm: now all are <= 1
    x = x / (torch.linalg.matrix_norm(x, keepdim=True) + eps)
    for _ in range(steps):
        gram = einsum(x, x, "... short long, ... short2 long -> ... short short2")
        polynomial = b * gram + c * (gram @ gram)  # (... short short)
        x = a * x + polynomial @ x
    return (x.mT if tall else x).to(matrix.dtype)


# From chapters/08-5-ledger.md, section "Muon: one step size for every direction of a matrix".
# Moonshot's rule: a Muon step of RMS 0.2, about AdamW's, so that one
# learning rate and one weight decay serve both kinds of parameter
MUON_UPDATE_RMS = 0.2


class Muon(torch.optim.Optimizer):
    """Muon on the parameter groups flagged ``muon=True`` (2-D matrices),
    AdamW on those flagged ``muon=False``: one optimiser, so one scheduler,
    one clipping and one checkpoint serve both.

    Every group is a dict with ``params`` and ``muon``; it may override the
    defaults given here: ``lr``, ``weight_decay`` (decoupled, both kinds),
    Muon's ``momentum``, ``nesterov``, ``ns_steps``, AdamW's ``betas`` and
    ``eps``. A Muon step on a ``(rows, cols)`` matrix with gradient ``g``:
    ``b ← momentum·b + g``; ``u = g + momentum·b`` (Nesterov; else ``u =
    b``); ``p ← p·(1 - lr·weight_decay) - lr·0.2·√max(rows, cols)·
    newton_schulz(u, ns_steps)``. An AdamW step is ``torch.optim.AdamW``'s.
    """

    def __init__(
        self,
        params: Iterable[Mapping[str, Any]],
        lr: float,
        *,
        weight_decay: float = 0.0,
        momentum: float = 0.95,
        nesterov: bool = True,
        ns_steps: int = 5,
        betas: tuple[float, float] = (0.9, 0.98),
        eps: float = 1e-9,
    ) -> None:
        defaults = dict(
            lr=lr,
            weight_decay=weight_decay,
            momentum=momentum,
            nesterov=nesterov,
            ns_steps=ns_steps,
            betas=tuple(betas) if isinstance(betas, list) else betas,
            eps=eps,
        )
        super().__init__(params, defaults)

    def add_param_group(self, param_group: Mapping[str, Any]) -> None:
        # PyTorch's first: it makes params a list and fills in the defaults
        super().add_param_group(param_group)
        try:
            _check_group(self.param_groups[-1])
        except (TypeError, ValueError):
            self.param_groups.pop()  # as if never added
            raise

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        _check_saved_state(self, state_dict)
        super().load_state_dict(state_dict)

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        with check.trusting():  # newton_schulz: shapes are parameters'
            for group in self.param_groups:
                params = [p for p in group["params"] if p.grad is not None]
                if group["muon"]:
                    self._muon(params, group)
                else:
                    for p in params:
                        self._adamw(p, p.grad, self.state[p], group)
        return loss

    def _muon(self, params: list[torch.Tensor], group: dict) -> None:
        momentum, lr = group["momentum"], group["lr"]
        # the matrices of one shape go through Newton-Schulz together, as a
        # stack: fewer, larger products, which a GPU runs faster
        alike: dict[tuple, list] = {}
        for p in params:
            if not (state := self.state[p]):
                state["momentum_buffer"] = torch.zeros_like(p)
            buffer = state["momentum_buffer"].mul_(momentum).add_(p.grad)
            nesterov = group["nesterov"]
            u = p.grad.add(buffer, alpha=momentum) if nesterov else buffer
            kind = (p.shape, p.device, p.dtype)  # what can share a stack
            alike.setdefault(kind, []).append((p, u))
        for ((rows, cols), *_), pairs in alike.items():
            stack = torch.stack([u for _, u in pairs])  # (matrix rows cols)
            orthogonal = newton_schulz(stack, group["ns_steps"])
            scale = MUON_UPDATE_RMS * math.sqrt(max(rows, cols))
            for (p, _), step in zip(pairs, orthogonal):
                p.mul_(1.0 - lr * group["weight_decay"])
                p.add_(step, alpha=-lr * scale)

    @staticmethod
    def _adamw(p, grad, state, group) -> None:
        if not state:
            state.update(step=0, exp_avg=torch.zeros_like(p))
            state["exp_avg_sq"] = torch.zeros_like(p)
        state["step"] += 1
        (beta1, beta2), lr, step = (group["betas"], group["lr"], state["step"])
        exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
        p.mul_(1.0 - lr * group["weight_decay"])
        exp_avg.lerp_(grad, 1.0 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1.0 - beta2)
        # bias corrections: Adam's averages start at zero
        root_v_hat = exp_avg_sq.sqrt() / math.sqrt(1.0 - beta2**step)
        denominator = root_v_hat.add_(group["eps"])
        p.addcdiv_(exp_avg, denominator, value=-lr / (1.0 - beta1**step))


def muon_optimizer(
    model: nn.Module,
    lr: float,
    *,
    adamw_lr: float | None = None,
    weight_decay: float = 0.1,
    momentum: float = 0.95,
    nesterov: bool = True,
    ns_steps: int = 5,
    betas: tuple[float, float] = (0.9, 0.98),
    eps: float = 1e-9,
) -> Muon:
    """:class:`Muon` over a model's trainable parameters, in up to three
    groups: Muon at ``lr`` on the hidden matrices (the weights of the
    ``nn.Linear`` layers inside its :class:`lib.models.TransformerBlock`
    s); AdamW at ``adamw_lr`` (default ``lr``: Moonshot's scale lets one
    rate serve both) on the rest, split as
    :func:`lib.training.parameter_groups` splits it (other linear weights
    decayed; embeddings, the output head, norm gains and biases not).
    ``betas`` and ``eps`` are AdamW's, defaulting to
    :func:`lib.training.make_optimizer`'s."""
    decayed, exempt = parameter_groups(model, weight_decay)
    blocks = [m for m in model.modules() if isinstance(m, TransformerBlock)]
    hidden = {
        id(m.weight)
        for block in blocks
        for m in block.modules()
        if isinstance(m, nn.Linear)
    }
    matrices = [p for p in decayed["params"] if id(p) in hidden]
    if not matrices:
        raise ValueError("muon_optimizer: no nn.Linear in a TransformerBlock")
    adamw = dict(muon=False, lr=lr if adamw_lr is None else adamw_lr)
    groups = [
        dict(params=matrices, muon=True),
        dict(adamw, params=[p for p in decayed["params"] if id(p) not in hidden]),
        dict(adamw, params=exempt["params"], weight_decay=0.0),
    ]
    return Muon(
        [g for g in groups if g["params"]],
        lr,
        weight_decay=weight_decay,
        momentum=momentum,
        nesterov=nesterov,
        ns_steps=ns_steps,
        betas=betas,
        eps=eps,
    )


# From chapters/08-5-ledger.md, section "Warm-up, stable, decay".
# the decay's shape, of its progress t in [0, 1]: 1 - √t, or 1 - t
WSD_DECAY_SHAPES = ("1-sqrt", "linear")


@dataclass(frozen=True)
class WarmupStableDecaySchedule:
    """Linear warm-up to 1 over ``warmup`` steps, 1 on a plateau, then a
    decay to ``min_ratio`` over the last ``decay_fraction`` of ``total``
    steps (``min_ratio`` at ``total`` and after), shaped ``"1-sqrt"``
    (``1 - √t`` of its progress ``t``) or ``"linear"``.

    A multiplier of the base rate, for :func:`lib.training.make_scheduler`,
    like :class:`lib.training.WarmupCosineSchedule`. The decay takes
    ``decay_steps = max(1, round(decay_fraction·total))`` steps from
    ``decay_start = total - decay_steps``; before it, the value does not
    depend on ``total``.
    """

    warmup: int
    total: int
    decay_fraction: float = 0.2
    min_ratio: float = 0.1
    shape: str = "1-sqrt"

    def __post_init__(self) -> None:
        _check_wsd(self)

    @property
    def decay_steps(self) -> int:
        return max(1, round(self.decay_fraction * self.total))

    @property
    def decay_start(self) -> int:
        return self.total - self.decay_steps

    def __call__(self, step: int) -> float:
        if step < self.warmup:
            return (step + 1) / self.warmup
        if step < self.decay_start:
            return 1.0
        t = min(1.0, (step - self.decay_start) / self.decay_steps)
        left = 1.0 - (math.sqrt(t) if self.shape == "1-sqrt" else t)
        return self.min_ratio + (1.0 - self.min_ratio) * left


# From chapters/08-5-ledger.md, section "z-loss: keeping the softmax normaliser near 1".
@check.front_door(_check_z_loss)
def z_loss(
    logits: torch.Tensor,
    targets: torch.Tensor | None = None,
    *,
    coefficient: float = 1e-4,
    ignore_index: int = IGNORE_INDEX,
) -> torch.Tensor:
    """PaLM's auxiliary loss: ``coefficient · mean((log Z)²)``, ``log Z =
    logsumexp(logits)`` over the vocabulary, which pulls each softmax
    normaliser ``Z`` to 1.

    The mean is over the positions whose target is not ``ignore_index`` (all
    positions when ``targets`` is None); 0 when none is kept. Shapes:
    ``logits`` ``(... vocab)``, ``targets`` ``(...)``. Computed in float32.
    """
    log_z = torch.logsumexp(logits.float(), dim=-1)  # (...)
    if targets is None:
        keep = torch.ones_like(log_z, dtype=torch.bool)
    else:
        keep = targets != ignore_index
    # where, not a product: a NaN at an ignored position stays out
    squares = torch.where(keep, log_z.square(), 0.0)
    return coefficient * squares.sum() / keep.sum().clamp(min=1)


def _logits(model: nn.Module, batch: Batch) -> torch.Tensor:
    """The model's logits on a batch, called as
    :func:`lib.training.model_loss` calls it."""
    inputs, mask = batch["inputs"], batch.get("mask")
    if "decoder_inputs" in batch:
        decoder_mask = batch.get("decoder_mask")
        return model(inputs, batch["decoder_inputs"], mask, decoder_mask)
    return model(inputs, mask)


@dataclass(frozen=True)
class CrossEntropyZLoss:
    """A ``loss_fn`` for :func:`lib.training.train`: the cross-entropy of
    :func:`lib.training.model_loss` plus :func:`z_loss` (``coefficient``)
    over the same targets, while the model trains.

    In eval mode (:func:`lib.training.evaluate`, and train's evaluations)
    it is the cross-entropy alone, so that held-out losses compare with
    runs without z-loss; ``coefficient=0`` gives ``model_loss`` exactly.
    """

    coefficient: float = 1e-4
    label_smoothing: float = 0.0

    def __post_init__(self) -> None:
        say = dict(owner="CrossEntropyZLoss")
        check.finite_float("coefficient", self.coefficient, low=0.0, **say)
        check.probability("label_smoothing", self.label_smoothing, **say)

    def __call__(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        _check_batch(batch)
        logits, targets = _logits(model, batch), batch["targets"]
        smoothing = self.label_smoothing
        loss = cross_entropy(logits, targets, label_smoothing=smoothing)
        if self.coefficient == 0 or not unwrap_model(model).training:
            return loss
        coefficient = self.coefficient
        return loss + z_loss(logits, targets, coefficient=coefficient)


# From chapters/08-5-ledger.md, section "The ledger".
#: The ledger's model on a CPU (its record's sizes): over the smoke
#: profile's character GPT, 1,000 steps of 16 windows of 64 characters,
#: one evaluation at the end (so the kept weights are the last).
LEDGER_CPU_SIZES = dict(
    d_model=128, n_heads=4, n_layers=4, seq_len=64, batch_size=16,
    n_steps=1000, lr=2e-3, warmup=100, eval_iters=4,
)  # fmt: skip
#: The weight of the mixture of experts' load-balancing loss.
BALANCE_WEIGHT = 0.01


def ledger_sizes(profile: str | None = None, **overrides: Any) -> dict:
    """The ledger's GPT in ``profile`` (default: the active one): sizes of
    :func:`lib.runs.run_sizes`, one evaluation at the end, ``overrides``
    on top (the CPU record: :data:`LEDGER_CPU_SIZES` over smoke's)."""
    p = functools.partial(pick, profile=profile)
    sizes = (
        dict(
            d_model=p(smoke=64, colab=256, full=384),
            n_heads=p(smoke=4, colab=4, full=6),
            n_layers=p(smoke=2, colab=4, full=6),
            seq_len=p(smoke=64, colab=128, full=256),
            batch_size=p(smoke=16, full=64),
            dropout=0.0,
            n_steps=p(smoke=40, colab=600, full=1000, dry=1),
            warmup=p(smoke=4, colab=60, full=100),
            eval_iters=p(smoke=1, full=8, dry=1),
        )
        | overrides
    )
    sizes["eval_every"] = sizes["n_steps"]
    # a dry run's one step: warm-up and decay may not overlap
    sizes["warmup"] = min(sizes["warmup"], sizes["n_steps"] // 2)
    return run_sizes("gpt", profile, **sizes)


def _moe_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    """Cross-entropy, plus the experts' load-balancing loss while the model
    trains (its evaluations compare with the other rows')."""
    loss = model_loss(model, batch)
    if unwrap_model(model).training:
        loss = loss + BALANCE_WEIGHT * moe_balance_loss(model)
    return loss


def ledger_rows(sizes: Mapping[str, Any]) -> dict[str, RecipeChange]:
    """The ledger's rows for a GPT of ``sizes``: the recipe, then each
    change alone, by name."""
    muon = functools.partial(muon_optimizer, betas=(0.9, 0.99), eps=1e-8)
    rows = [
        RecipeChange(),  # the baseline: page 8.3's recipe
        RecipeChange("dropout 0.1", model=dict(dropout=0.1)),
        RecipeChange("QK-norm", model=dict(qk_norm=True)),
        RecipeChange("ReLU²", model=dict(activation="relu2")),
        RecipeChange("untied embeddings", model=dict(tie_embeddings=False)),
        RecipeChange("logits capped at 15", model=dict(logit_softcap=15.0)),
        RecipeChange("z-loss 1e-4", loss_fn=CrossEntropyZLoss(1e-4)),
        RecipeChange("Muon", optimizer=muon),
        RecipeChange("warm-up, stable, decay", schedule=WarmupStableDecaySchedule),
        RecipeChange(
            "4 experts, top 2",
            # two experts half as wide: the dense FFN's work per token
            model=dict(n_experts=4, experts_top_k=2, d_ff=2 * sizes["d_model"]),
            loss_fn=_moe_loss,
        ),
    ]
    # the changes that won alone (the first CPU ledger), all at once
    winners = [rows[i] for i in (2, 3, 4, 7, 8, 9)]
    rows.append(
        RecipeChange(
            "the winners together",
            model={k: v for row in winners for k, v in row.model.items()},
            optimizer=muon,
            schedule=WarmupStableDecaySchedule,
            loss_fn=_moe_loss,
        )
    )
    return {row.name: row for row in rows}


# From chapters/08-5-ledger.md, section "The ledger".
def t_two_sided_p(t: float, df: int) -> float:
    """``P(|T| >= |t|)`` for Student's t with ``df`` degrees of freedom (a
    positive integer), by the closed form for a whole ``df`` (Abramowitz and
    Stegun 26.7.3-4)."""
    check.positive_int("df", df, owner="t_two_sided_p")
    theta = math.atan(abs(t) / math.sqrt(df))
    cos2 = math.cos(theta) ** 2
    term = total = 1.0
    if df % 2 == 0:  # sin θ (1 + 1/2 cos²θ + 1·3/(2·4) cos⁴θ + ...)
        for k in range(1, df // 2):
            term *= (2 * k - 1) / (2 * k) * cos2
            total += term
        inside = math.sin(theta) * total
    else:  # 2/π (θ + sin θ cos θ (1 + 2/3 cos²θ + ...)); 2θ/π for df 1
        for k in range(1, (df - 1) // 2):
            term *= 2 * k / (2 * k + 1) * cos2
            total += term
        tail = math.sin(theta) * math.cos(theta) * total if df > 1 else 0.0
        inside = 2 / math.pi * (theta + tail)
    return min(1.0, max(0.0, 1.0 - inside))


def t_quantile(p: float, df: int) -> float:
    """The ``p`` quantile of Student's t, ``p`` in [0.5, 1), by bisection
    of :func:`t_two_sided_p`."""
    check.finite_float("p", p, low=0.5, high=1.0, owner="t_quantile")
    low, high = 0.0, 1e4
    for _ in range(100):
        middle = (low + high) / 2
        if t_two_sided_p(middle, df) > 2 * (1 - p):
            low = middle
        else:
            high = middle
    return (low + high) / 2


def mean_interval(
    values: Sequence[float], level: float = 0.95
) -> tuple[float, float, float]:
    """``(mean, low, high)``: the mean of ``values`` (two or more) and its
    ``level`` t-interval."""
    _check_values(values, "mean_interval")
    n, mean = len(values), sum(values) / len(values)
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = t_quantile(0.5 + level / 2, n - 1) * sd / math.sqrt(n)
    return mean, mean - half, mean + half


def paired_t_test(
    changed: Sequence[float], baseline: Sequence[float]
) -> tuple[float, float, float, float]:
    """``(difference, low, high, p)``: the mean of ``changed - baseline``,
    paired by seed, its 95 % interval and a paired t-test's two-sided p."""
    _check_paired(changed, baseline)
    differences = [a - b for a, b in zip(changed, baseline)]
    mean, low, high = mean_interval(differences)
    n = len(differences)
    sd = math.sqrt(sum((d - mean) ** 2 for d in differences) / (n - 1))
    if sd == 0:  # every seed moved by the same amount: certain, or no change
        return mean, low, high, 0.0 if mean else 1.0
    return mean, low, high, t_two_sided_p(mean / (sd / math.sqrt(n)), n - 1)


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's correction of ``p_values`` for their number ``m``: the
    smallest times m, the next times m - 1, ..., each at least the one
    before and at most 1."""
    m, running = len(p_values), 0.0
    adjusted = [0.0] * m
    for rank, i in enumerate(sorted(range(m), key=p_values.__getitem__)):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted


# From chapters/08-5-ledger.md, section "The ledger".
def _ledger_job(job: tuple) -> dict[str, Any]:
    """One row and seed: the recipe with the row's change, its validation
    loss per character and its times."""
    change, seed, profile, sizes, threads, device = job
    if threads:
        set_threads(threads)
    began = time.perf_counter()
    run = char_gpt_run(
        profile, sizes=sizes, seed=seed, device=device, progress=False,
        change=change,
    )  # fmt: skip
    return dict(
        row=change.name, seed=seed, loss=run["metrics"]["validation_loss"],
        train_seconds=run["metrics"]["train_seconds"],
        seconds=time.perf_counter() - began,
    )  # fmt: skip


def run_ledger(
    rows: Sequence[str | RecipeChange] | None = None,
    seeds: Sequence[int] = range(5),
    *,
    profile: str | None = None,
    sizes: Mapping[str, Any] | None = None,
    workers: int = 1,
    threads: int | None = None,
    device: str | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Train :func:`ledger_sizes`'s GPT (``sizes`` override them) with each
    of ``rows`` (names of :func:`ledger_rows`, or changes of one's own;
    default: every row) and each of ``seeds``. ``workers`` processes of
    ``threads`` threads share the runs. Returns ``{"sizes", "seeds",
    "runs": {row name: [one dict per seed]}}``."""
    _check_ledger(rows, seeds, workers, threads)
    sizes = ledger_sizes(profile, **dict(sizes or {}))
    known = ledger_rows(sizes)
    changes = [_ledger_row(row, known) for row in rows or known]
    overrides = {k: v for k, v in sizes.items() if k != "profile"}
    jobs = [
        (change, seed, sizes["profile"], overrides, threads, device)
        for seed in seeds for change in changes
    ]  # fmt: skip
    runs: dict[str, list] = {change.name: [] for change in changes}
    # fresh processes ("spawn"): none inherits a copy of torch's threads
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(workers, mp_context=context) as pool:
        done = map(_ledger_job, jobs) if workers == 1 else pool.map(_ledger_job, jobs)
        for i, result in enumerate(done, 1):
            runs[result["row"]].append(result)
            if progress:
                name, seed = result["row"], result["seed"]
                print(
                    f"[{i}/{len(jobs)}] {name}, seed {seed}: "
                    f"{result['loss']:.4f} ({result['seconds']:.0f} s)",
                    flush=True,
                )
    return dict(sizes=sizes, seeds=list(seeds), runs=runs)


def ledger_table(
    runs: Mapping[str, Sequence[Mapping[str, Any]]], baseline: str = "baseline"
) -> list[dict[str, Any]]:
    """A line per row of a ledger's ``runs``: mean loss per character with
    its 95 % interval, in bits per byte (Tiny Shakespeare: a byte a
    character), the difference from ``baseline`` paired by seed with its
    interval, p and Holm's p over the rows, and a run's mean seconds."""
    base = _by_seed(runs, baseline, baseline)
    lines = []
    for name in runs:
        losses = _by_seed(runs, name, baseline, seeds=base)
        mean, low, high = mean_interval(list(losses.values()))
        line = dict(
            row=name, seeds=len(losses), loss=mean, low=low, high=high,
            bits_per_byte=mean / math.log(2),
            seconds=sum(r["seconds"] for r in runs[name]) / len(losses),
        )  # fmt: skip
        if name != baseline:
            test = paired_t_test(list(losses.values()), list(base.values()))
            keys = ("difference", "difference_low", "difference_high", "p")
            line |= dict(zip(keys, test))
        lines.append(line)
    changed = [line for line in lines if "p" in line]
    for line, p in zip(changed, holm([line["p"] for line in changed])):
        line["p_holm"] = p
    return lines


# From chapters/08-5-ledger.md, section "The ledger".
def _check_ledger(rows, seeds, workers, threads) -> None:
    say = dict(owner="run_ledger")
    check.positive_int("workers", workers, **say)
    if threads is not None:
        check.positive_int("threads", threads, **say)
    seeds = list(seeds)
    if len(seeds) < 2 or len(set(seeds)) != len(seeds):
        raise ValueError(
            f"run_ledger: seeds must be 2 or more distinct seeds (an "
            f"interval needs two), got {seeds}"
        )
    if rows is not None and not list(rows):
        raise ValueError("run_ledger: rows is empty (None: every row)")


def _ledger_row(row, known: Mapping[str, RecipeChange]) -> RecipeChange:
    """A row by name, or a reader's own change."""
    if isinstance(row, RecipeChange):
        return row
    if row not in known:
        raise ValueError(f"run_ledger: no row {row!r}; the rows: {list(known)}")
    return known[row]


def _by_seed(runs, name, baseline, seeds=None) -> dict[int, float]:
    """``{seed: loss}`` of a row, in the baseline's order of seeds."""
    if name not in runs:
        raise ValueError(f"ledger_table: no {name!r} row among {list(runs)}")
    losses = {r["seed"]: r["loss"] for r in runs[name]}
    if seeds is not None and sorted(losses) != sorted(seeds):
        raise ValueError(
            f"ledger_table: {name!r} ran seeds {sorted(losses)}, the "
            f"{baseline!r} row {sorted(seeds)}: pair them by seed"
        )
    return {seed: losses[seed] for seed in (seeds or sorted(losses))}


def _check_values(values, owner: str) -> None:
    if len(values) < 2 or not all(math.isfinite(v) for v in values):
        raise ValueError(f"{owner}: needs 2 or more finite values, got {values}")


def _check_paired(changed, baseline) -> None:
    if len(changed) != len(baseline):
        raise ValueError(
            f"paired_t_test: {len(changed)} values against {len(baseline)}:"
            " a pair for each seed"
        )


# From chapters/08-5-ledger.md, section "The ledger on a CPU".
def ledger_main(argv: list[str] | None = None) -> dict[str, Any]:
    """``python -m lib.ledger [--cpu] [--profile P] [--seeds N] [--rows
    NAME ...] [--workers W] [--threads T] [--name NAME] [--out DIR]``: run
    the ledger and write its record, each run's loss in ``extra``.
    ``--cpu``: :data:`LEDGER_CPU_SIZES` on the CPU (the page's record)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="python -m lib.ledger")
    parser.add_argument("--cpu", action="store_true", help="the CPU record")
    parser.add_argument("--profile", choices=PROFILES, default=None)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--rows", nargs="+", help="names (default: all)")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--name", default=None)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    profile = "smoke" if args.cpu else args.profile
    if profile is not None:  # the process's profile, which the record names
        os.environ[PROFILE_ENV] = profile
    commit, began = (git_commit(), time.time())  # before the record changes it
    ledger = run_ledger(
        args.rows, range(args.seeds), profile=profile,
        sizes=LEDGER_CPU_SIZES if args.cpu else None, workers=args.workers,
        threads=args.threads, device="cpu" if args.cpu else None,
    )  # fmt: skip
    name = args.name or ("08-ledger-cpu" if args.cpu else "08-ledger")
    table = ledger_table(ledger["runs"])
    write_record(
        args.out or Path("book") / "results" / name, name=name,
        command=f"python -m lib.ledger {shlex.join(argv)}",
        wall_seconds=time.time() - began,
        metrics={line["row"]: line for line in table},
        config={"sizes": ledger["sizes"], "rows": list(ledger["runs"])},
        extra=dict(runs=ledger["runs"], seeds=ledger["seeds"],
                   workers=args.workers, threads=args.threads),
        device="cpu" if args.cpu else None, commit=commit,
    )  # fmt: skip
    return ledger | {"table": table}


# (in a notebook, __name__ is "__main__" too: do not start a run there)
if __name__ == "__main__" and "ipykernel" not in sys.modules:
    ledger_main()
