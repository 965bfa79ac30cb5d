# This file is generated from chapters/08-1-training.md by tools/tangle.py. Do not edit it by hand:
# edit the chapter's cells tagged "export", then run `python tools/tangle.py`.
# From chapters/08-1-training.md, section "A training loop in twenty lines".
"""Training (chapter 8 of the course): from a loss to three trained model
families.

* Loss: :func:`cross_entropy` (from logits, with an ignore index and label
  smoothing).
* Optimiser: :func:`adamw_step` (one step written out),
  :func:`parameter_groups` (decay on matrices only), :func:`make_optimizer`,
  :func:`clip_grad_norm`.
* Schedules: :class:`NoamSchedule`, :class:`WarmupCosineSchedule`,
  :func:`make_scheduler`.
* Checkpoints: :func:`save_checkpoint` (atomic; one model file of
  :func:`lib.model_file.save_model` inside, with the tokenizer when given
  one), :func:`load_checkpoint`
  (``weights_only=True``, mismatches named, all or nothing),
  :func:`latest_checkpoint`, RNG states.
* The loop: :func:`model_loss`, :func:`evaluate`, :func:`train` (mixed
  precision, accumulation, clipping, evaluation, checkpoints, DDP, compile)
  on :mod:`lib.batches`.
* Several processes: :func:`shard_batch` (joining them:
  :func:`lib.efficiency.distributed_setup`).

Memory and speed (activation checkpointing, FLOPs, GPU time, several GPUs):
:mod:`lib.efficiency`; the chapter's three experiments (a character GPT, a
BERT, a T5): :mod:`lib.runs`.
"""

from __future__ import annotations

import contextlib
import copy
import math
import numbers
import os
import random
import time
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from einops import reduce
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

from lib import _checks as check
from lib.batches import Batch
from lib.model_file import (
    ModelFileError,
    atomic_save,
    check_packed,
    content_sha256,
    pack_model,
    packed_differences,
    plain_values,
    remove_stale_temporaries,
    tokenizer_from_state,
)
from lib.objectives import IGNORE_INDEX
from lib.utils import Precision, autocast, get_precision, get_profile

# The public names: every top-level name the export cells define (tools/tangle.py).
__all__ = [
    "cross_entropy",
    "adamw_step",
    "parameter_groups",
    "make_optimizer",
    "clip_grad_norm",
    "NoamSchedule",
    "WarmupCosineSchedule",
    "make_scheduler",
    "CheckpointError",
    "rng_states",
    "set_rng_states",
    "unwrap_model",
    "save_checkpoint",
    "load_checkpoint",
    "latest_checkpoint",
    "model_loss",
    "shard_batch",
    "evaluate",
    "TrainHistory",
    "NonFiniteLossError",
    "tokens_in",
    "train",
]


# From chapters/08-1-training.md, section "The loss: cross-entropy from logits".
def _check_cross_entropy(logits, targets, ignore_index, label_smoothing):
    """:func:`cross_entropy`'s arguments. The ids are checked against the
    vocabulary on the CPU only: on a GPU that would sync each step."""
    check.tensor("logits", logits, floating=True, owner="cross_entropy")
    check.tensor("targets", targets, integer=True, hint="(int64 ids)")
    if targets.shape != logits.shape[:-1]:
        shapes = f"{tuple(targets.shape)}, logits {tuple(logits.shape)}"
        raise ValueError(f"targets must have the shape of logits minus vocab: {shapes}")
    check.probability("label_smoothing", label_smoothing, owner="cross_entropy")
    if targets.is_cpu:  # on a GPU: no sync to check
        keep = targets != ignore_index
        hint = f"a target to skip is ignore_index={ignore_index}"
        check.ids_in_range("targets", targets[keep], logits.shape[-1], hint=hint)


# From chapters/08-1-training.md, section "The loss: cross-entropy from logits".
def cross_entropy(
    logits: torch.Tensor,
    targets: torch.Tensor,
    *,
    ignore_index: int = IGNORE_INDEX,
    label_smoothing: float = 0.0,
) -> torch.Tensor:
    """Mean cross-entropy of ``targets`` under ``softmax(logits)``, computed
    in float32.

    Shapes: ``logits`` ``(... vocab)``, ``targets`` ``(...)`` integer ids;
    positions whose target is ``ignore_index`` do not count. With
    ``label_smoothing`` ε the target is ``(1-ε)·one_hot + ε/vocab``
    (PyTorch's convention). A batch in which every target is ignored has
    loss 0 (PyTorch returns NaN), so it cannot stop a run. The ids are
    checked against the vocabulary on the CPU only: on a GPU that would sync
    each step.
    """
    _check_cross_entropy(logits, targets, ignore_index, label_smoothing)
    keep = targets != ignore_index
    logits = logits.float()
    log_probs = logits - torch.logsumexp(logits, dim=-1, keepdim=True)
    safe_targets = targets.long().masked_fill(~keep, 0).unsqueeze(-1)
    per_position = -log_probs.gather(-1, safe_targets).squeeze(-1)
    if label_smoothing > 0.0:
        uniform = -reduce(log_probs, "... vocab -> ...", "mean")
        # (1-ε)·own + ε·uniform, written as own + ε·(uniform - own)
        per_position = per_position + label_smoothing * (uniform - per_position)
    n_kept = keep.sum().clamp(min=1)  # the loss is 0 if none is kept
    return (per_position * keep).sum() / n_kept


# From chapters/08-1-training.md, section "The optimiser: Adam, AdamW and what to decay".
def _check_adam(lr, betas, eps, weight_decay) -> list[float]:
    """Adam's settings: ``lr`` and ``weight_decay`` >= 0, ``eps`` > 0,
    ``betas`` a pair in [0, 1) (at 1 the bias correction divides by zero).
    """
    check.finite_float("lr", lr, low=0.0)
    check.finite_float("weight_decay", weight_decay, low=0.0)
    check.finite_float("eps", eps, low=0.0, low_open=True)
    if not isinstance(betas, tuple | list) or len(betas) != 2:
        raise TypeError(f"betas must be a pair (beta1, beta2), got {betas!r}")
    beta = dict(low=0.0, high=1.0, high_open=True)
    return [check.finite_float(f"betas[{i}]", b, **beta) for i, b in enumerate(betas)]


def _check_max_norm(max_norm: float) -> None:
    check.instance("max_norm", max_norm, numbers.Real, what="a number")
    # (a negative max_norm would flip the gradients)
    if isinstance(max_norm, bool) or not max_norm > 0:
        raise ValueError(f"max_norm must be > 0 (inf: only measure), got {max_norm}")


def _check_adamw_step(tensors, step, lr, betas, eps, weight_decay):
    """:func:`adamw_step`'s arguments; the two betas."""
    check.int_at_least("step", step, 1, owner="adamw_step", hint="(it counts from 1)")
    beta1, beta2 = _check_adam(lr, betas, eps, weight_decay)
    for name, x in tensors.items():
        check.tensor(name, x, floating=True, owner="adamw_step")
    if len(shapes := {tuple(x.shape) for x in tensors.values()}) > 1:
        raise ValueError(f"adamw_step: the tensors must share a shape, got {shapes}")
    return beta1, beta2


# From chapters/08-1-training.md, section "The optimiser: Adam, AdamW and what to decay".
def adamw_step(
    param: torch.Tensor,
    grad: torch.Tensor,
    exp_avg: torch.Tensor,
    exp_avg_sq: torch.Tensor,
    step: int,
    *,
    lr: float,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    weight_decay: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One AdamW update, as ``torch.optim.AdamW`` makes it; nothing changes
    in place.

    ``step`` counts from 1. Shapes: all four tensors alike; returns the new
    ``(param, exp_avg, exp_avg_sq)``.
    """
    tensors = dict(param=param, grad=grad, exp_avg=exp_avg, exp_avg_sq=exp_avg_sq)
    beta1, beta2 = _check_adamw_step(tensors, step, lr, betas, eps, weight_decay)
    # decoupled: the moments never see the decay
    param = param * (1.0 - lr * weight_decay)
    exp_avg = beta1 * exp_avg + (1.0 - beta1) * grad
    exp_avg_sq = beta2 * exp_avg_sq + (1.0 - beta2) * grad * grad
    m_hat = exp_avg / (1.0 - beta1**step)
    v_hat = exp_avg_sq / (1.0 - beta2**step)
    return param - lr * m_hat / (v_hat.sqrt() + eps), exp_avg, exp_avg_sq


# From chapters/08-1-training.md, section "The optimiser: Adam, AdamW and what to decay".
def parameter_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Two optimiser groups: linear layers' weight matrices (decayed) and
    the rest.

    The rest, with ``weight_decay=0``: biases, norm gains, embeddings and
    position tables (and a head tied to the embedding). Frozen parameters
    are left out.
    """
    check.instance("model", model, nn.Module, what="a torch.nn.Module")
    check.finite_float("weight_decay", weight_decay, low=0.0)
    matrices = {id(m.weight) for m in model.modules() if isinstance(m, nn.Linear)}
    decay, no_decay = [], []
    for p in model.parameters():  # each parameter once, even when tied
        if p.requires_grad:
            (decay if id(p) in matrices else no_decay).append(p)
    return [
        {"params": decay, "weight_decay": float(weight_decay)},
        {"params": no_decay, "weight_decay": 0.0},
    ]


# From chapters/08-1-training.md, section "The optimiser: Adam, AdamW and what to decay".
def make_optimizer(
    model: nn.Module,
    lr: float,
    *,
    weight_decay: float = 0.1,
    betas: tuple[float, float] = (0.9, 0.98),
    eps: float = 1e-9,
    fused: bool | None = None,
) -> torch.optim.AdamW:
    """AdamW over :func:`parameter_groups`; ``fused`` defaults to True when
    the parameters are all on CUDA or all on the CPU (PyTorch's fused
    kernel runs on both)."""
    _check_adam(lr, betas, eps, weight_decay)
    groups = parameter_groups(model, weight_decay)
    if fused is None:
        kinds = {p.device.type for g in groups for p in g["params"]}
        fused = kinds in ({"cuda"}, {"cpu"}) or None
    return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, fused=fused)


# From chapters/08-1-training.md, section "The optimiser: Adam, AdamW and what to decay".
def clip_grad_norm(parameters: Iterable[torch.Tensor], max_norm: float) -> torch.Tensor:
    """Scale all gradients by ``min(1, max_norm / global_norm)`` in place.

    Returns the global 2-norm before clipping (float32), as
    ``torch.nn.utils.clip_grad_norm_`` does; ``max_norm=math.inf`` only
    measures it.
    """
    _check_max_norm(max_norm)
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return torch.tensor(0.0)
    norms = torch.stack([torch.linalg.vector_norm(g.float()) for g in grads])
    total = torch.linalg.vector_norm(norms)
    if max_norm < math.inf:  # (math.inf: only measure)
        scale = (max_norm / (total + 1e-6)).clamp(max=1.0)
        for g in grads:
            g.mul_(scale.to(g.dtype))
    return total


# From chapters/08-1-training.md, section "Learning-rate schedules".
@dataclass(frozen=True)
class NoamSchedule:
    """``d_model^-0.5 · min(n^-0.5, n · warmup^-1.5)`` at optimiser step
    ``n = step + 1``.

    A multiplier of the base learning rate (``LambdaLR`` counts ``step``
    from 0).
    """

    d_model: int
    warmup: int

    def __post_init__(self) -> None:
        check.positive_ints(d_model=self.d_model, warmup=self.warmup)

    def __call__(self, step: int) -> float:
        n = step + 1
        return self.d_model**-0.5 * min(n**-0.5, n * self.warmup**-1.5)


@dataclass(frozen=True)
class WarmupCosineSchedule:
    """Linear warm-up to 1 over ``warmup`` steps, then cosine decay to
    ``min_ratio`` at ``total`` steps (and ``min_ratio`` after). A multiplier
    of the base rate."""

    warmup: int
    total: int
    min_ratio: float = 0.1

    def __post_init__(self) -> None:
        check.positive_int("total", self.total)
        check.int_in_range("warmup", self.warmup, 0, self.total, hint="(0..total)")
        check.finite_float("min_ratio", self.min_ratio, low=0.0, high=1.0)

    def __call__(self, step: int) -> float:
        if step < self.warmup:
            return (step + 1) / self.warmup
        progress = min(1.0, (step - self.warmup) / max(1, self.total - self.warmup))
        cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
        return self.min_ratio + (1.0 - self.min_ratio) * cosine


def make_scheduler(
    optimizer: torch.optim.Optimizer, schedule: Callable[[int], float]
) -> torch.optim.lr_scheduler.LambdaLR:
    """A ``LambdaLR`` that multiplies each group's base rate by
    ``schedule(step)``."""
    check.instance("optimizer", optimizer, torch.optim.Optimizer, what="an optimizer")
    check.function("schedule", schedule, hint="(a function step -> factor)")
    return torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)


# From chapters/08-1-training.md, section "Checkpoints".
def _plain_state(value: Any, where: str) -> Any:
    """``value`` made of what ``torch.load(weights_only=True)`` reads back
    (:func:`lib.model_file.plain_values`): anything else is refused now,
    naming where it is, rather than making a checkpoint that cannot be
    loaded."""
    try:
        return plain_values(value, where)
    except ModelFileError as err:
        raise CheckpointError(str(err)) from None


def _sha256(state: Mapping[str, Any]) -> str:
    """The digest of a checkpoint's content; its model file counts by its
    own sha256, so that no weight is hashed twice."""
    content = {k: v for k, v in state.items() if k != "sha256"}
    if isinstance(content["model"], Mapping) and "sha256" in content["model"]:
        content["model"] = content["model"]["sha256"]
    return content_sha256(content)


# optimisers whose per-parameter states have the parameter's shape
_ELEMENTWISE = (
    torch.optim.Adam,
    torch.optim.AdamW,
    torch.optim.SGD,
    torch.optim.RMSprop,
    torch.optim.Adagrad,
    torch.optim.Adamax,
    torch.optim.NAdam,
    torch.optim.RAdam,
    torch.optim.Adadelta,
)


def _optimizer_problems(optimizer, saved: Mapping[str, Any]) -> list[str]:
    """Why ``optimizer`` cannot take the saved state, checked before
    anything is loaded (PyTorch checks the groups only while it loads, and
    the shapes of Adam's moments not at all)."""
    groups, saved_groups = optimizer.param_groups, saved["param_groups"]
    if len(groups) != len(saved_groups):
        n, m = len(saved_groups), len(groups)
        return [f"the optimizer has {m} parameter groups, the file {n}"]
    sizes = [len(g["params"]) for g in groups]
    saved_sizes = [len(g["params"]) for g in saved_groups]
    if sizes != saved_sizes:
        return [
            f"the optimizer's groups hold {sizes} parameters, the file's {saved_sizes}"
        ]
    if not isinstance(optimizer, _ELEMENTWISE):
        return []
    params = [p for g in groups for p in g["params"]]
    ids = [i for g in saved_groups for i in g["params"]]
    problems = []
    for param, index in zip(params, ids):
        for name, value in saved["state"].get(index, {}).items():
            elementwise = isinstance(value, torch.Tensor) and value.dim()
            if elementwise and value.shape != param.shape:
                problems.append(
                    f"optimizer {name} of parameter {index}: "
                    f"{tuple(value.shape)} in the checkpoint, "
                    f"{tuple(param.shape)} in the optimizer"
                )
    return problems[:5]


def _problems(state, target, strict_config, **objects) -> list[str]:
    """Everything that keeps a checkpoint from loading into ``target`` and
    ``objects``, found before any of them changes."""
    packed, source = state["model"], "the checkpoint"
    problems = packed_differences(packed, target, source=source)
    ignored = []
    if not strict_config:  # only what cannot load: keys and shapes
        loose = packed_differences(packed, target, strict=False, source=source)
        ignored = [p for p in problems if p not in loose]
        problems = loose
    for name, given in objects.items():
        # a run without a loss scaler (a CPU, bf16) may resume with one (a
        # T4's fp16): the scaler then starts afresh (load_checkpoint warns)
        if given is not None and state[name] is None and name != "scaler":
            problems.append(f"no {name} state")
    optimizer = objects["optimizer"]
    if optimizer is not None and state["optimizer"] is not None:
        problems += _optimizer_problems(optimizer, state["optimizer"])
    scheduler = objects["scheduler"]
    positions = {"last_epoch", "_step_count"}
    if isinstance(scheduler, torch.optim.lr_scheduler.LambdaLR) and (
        not positions <= set(state["scheduler"] or positions)
    ):
        problems.append("the scheduler state has no position")
    if ignored and not problems:
        warnings.warn(
            "loading a checkpoint of another configuration (strict_config"
            f"=False): {' | '.join(ignored)}",
            stacklevel=4,
        )
    return problems


def _restore_settings_and_position(optimizer, scheduler, state: Mapping) -> None:
    """Resume *this* run's settings at the saved position (the rule in the
    prose): the saved moments and step counts; the caller's rates, betas,
    weight decay, schedule (``LambdaLR.load_state_dict`` would overwrite the
    schedule and the base rates)."""
    if optimizer is not None:
        # the caller's settings
        kept = [dict(g) for g in optimizer.param_groups]
        optimizer.load_state_dict(state["optimizer"])
        for group, settings in zip(optimizer.param_groups, kept):
            group.update({k: v for k, v in settings.items() if k != "params"})
    if isinstance(scheduler, torch.optim.lr_scheduler.LambdaLR):
        for position in ("last_epoch", "_step_count"):
            setattr(scheduler, position, state["scheduler"][position])
        groups, bases = scheduler.optimizer.param_groups, scheduler.base_lrs
        for group, base, schedule in zip(groups, bases, scheduler.lr_lambdas):
            group["lr"] = base * schedule(scheduler.last_epoch)
        scheduler._last_lr = [group["lr"] for group in groups]
    elif scheduler is not None:
        scheduler.load_state_dict(state["scheduler"])


def _read_checkpoint(path: Path, map_location, hint: str) -> dict:
    """A checkpoint's verified content, its model file under ``"model"``
    (a checkpoint of format 2, the weights alone, is wrapped as one)."""
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as err:
        message = (
            f"{path} is not a readable checkpoint (truncated or corrupted?).{hint}"
        )
        cause = f" The cause, in full: {type(err).__name__}: {err}"
        raise CheckpointError(message + cause, damaged=True) from err
    known = (_FORMAT, _FORMAT_2)
    if not isinstance(state, dict) or state.get("format") not in known:
        raise CheckpointError(
            f"{path} is not a checkpoint written by lib.training", damaged=True
        )
    if state["format"] == _FORMAT_2:
        if state.pop("sha256", None) != content_sha256(state):
            raise CheckpointError(
                f"{path} is damaged: not its sha256.{hint}", damaged=True
            )
        weights, config = state["model"], state["extra"].get("config")
        state["model"] = dict(kind=None, config=config, arguments={})
        state["model"]["state_dict"] = weights
        return state
    try:
        check_packed(state["model"], str(path))
    except ModelFileError as err:
        raise CheckpointError(f"{err}.{hint}", damaged=True) from None
    if state.get("sha256") != _sha256(state):  # a changed byte
        raise CheckpointError(f"{path} is damaged: not its sha256.{hint}", damaged=True)
    return state


def _saved_checkpoints(directory: str | os.PathLike) -> list[tuple[int, Path]]:
    """``(step, path)`` of every ``step-*.pt`` in ``directory``, oldest
    first."""
    steps = {p: p.stem.removeprefix("step-") for p in Path(directory).glob("step-*.pt")}
    return sorted((int(digits), p) for p, digits in steps.items() if digits.isdigit())


# From chapters/08-1-training.md, section "Checkpoints".
class CheckpointError(ModelFileError):
    """A checkpoint cannot be used: unreadable, damaged or not a checkpoint
    of lib.training (then ``damaged`` is True, and resuming skips it), saved
    from another model or configuration, or asked to hold what it cannot.
    A :class:`~lib.model_file.ModelFileError`."""


_FORMAT = "lib.training/3"  # 3: the model (and tokenizer) as a model file
_FORMAT_2 = "lib.training/2"  # the weights alone; still read
# the fields of NumPy's generator state that follow its keys
_NUMPY_STATE = ("position", "has_gauss", "cached_gaussian")


def rng_states() -> dict[str, Any]:
    """The state of every random number generator: Python, NumPy, torch
    (CPU, CUDA)."""
    _, keys, position, has_gauss, cached = np.random.get_state()
    after_keys = (int(position), int(has_gauss), float(cached))
    numpy_state = {
        "keys": torch.from_numpy(keys.astype(np.int64)),
        **dict(zip(_NUMPY_STATE, after_keys)),
    }
    cuda = torch.cuda.is_available()
    return {
        "python": random.getstate(),
        "numpy": numpy_state,
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if cuda else [],
    }


def set_rng_states(states: Mapping[str, Any]) -> None:
    """Restore the generators from :func:`rng_states`."""
    if not isinstance(states, Mapping) or set(states) != set(rng_states()):
        raise ValueError(f"states must be a dict of rng_states(), got {states!r:.80}")
    random.setstate(states["python"])
    n = states["numpy"]
    keys = n["keys"].numpy().astype(np.uint32)
    np.random.set_state(("MT19937", keys, *(n[k] for k in _NUMPY_STATE)))
    torch.set_rng_state(states["torch"].cpu())
    if states["cuda"] and torch.cuda.is_available():
        # a run saved on more GPUs than this machine has: the first ones
        # (each process of a DDP run uses its own device's)
        count = min(len(states["cuda"]), torch.cuda.device_count())
        for device, state in enumerate(states["cuda"][:count]):
            torch.cuda.set_rng_state(state.cpu(), device)


def unwrap_model(model: nn.Module) -> nn.Module:
    """The plain module inside ``torch.compile`` and
    ``DistributedDataParallel``."""
    check.instance("model", model, nn.Module, what="a torch.nn.Module")
    while hasattr(model, "_orig_mod") or isinstance(model, DistributedDataParallel):
        compiled = hasattr(model, "_orig_mod")  # else it is DDP's
        model = model._orig_mod if compiled else model.module
    return model


def save_checkpoint(
    path: str | os.PathLike,
    *,
    model: nn.Module,
    step: int,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any = None,
    scaler: torch.amp.GradScaler | None = None,
    extra: Mapping[str, Any] | None = None,
    tokenizer: Any = None,
) -> Path:
    """Write a checkpoint atomically: a temporary file in the same folder,
    then rename (:func:`lib.model_file.atomic_save`, which first removes
    the temporaries a killed save left there).

    Holds one model file (:func:`lib.model_file.pack_model`: the kind, the
    configuration, the weights and their sha256, and ``tokenizer``, a
    :class:`~lib.tokenizer.CharTokenizer` or
    :class:`~lib.tokenizer.BPETokenizer`, if given; all of which
    :func:`lib.model_file.load_model` reads too), and around it the
    optimiser, scheduler and scaler states, ``step`` (the next step to run,
    which is also the position in the data), every RNG state, ``extra``
    (plain values and tensors only: NumPy values and paths are converted,
    other objects refused) and a sha256 of all of it, which
    :func:`load_checkpoint` verifies.
    """
    path = Path(path)
    check.int_at_least("step", step, 0, owner="save_checkpoint")
    extra = _plain_state(dict(extra or {}), "extra")
    packed = pack_model(unwrap_model(model), tokenizer)
    state = dict(format=_FORMAT, step=int(step), model=packed)
    parts = dict(optimizer=optimizer, scheduler=scheduler, scaler=scaler)
    state |= {k: None if v is None else v.state_dict() for k, v in parts.items()}
    state |= dict(rng=rng_states(), extra=extra)
    state["sha256"] = _sha256(state)
    return atomic_save(state, path)


def load_checkpoint(
    path: str | os.PathLike,
    *,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any = None,
    scaler: torch.amp.GradScaler | None = None,
    map_location: str | torch.device = "cpu",
    restore_rng: bool = True,
    strict_config: bool = True,
) -> dict[str, Any]:
    """Load a checkpoint of :func:`save_checkpoint` into the given objects
    (in place), all of them or none.

    Loads with ``torch.load(weights_only=True)`` and verifies the sha256s.
    Raises :class:`CheckpointError` naming the problem, before any object
    changes: an unreadable (truncated) or damaged (checksum) file, with the
    other checkpoints of its folder; a model of another kind or
    configuration (the fields that change what the weights mean; the kind's
    runtime fields, such as ``attn_backend`` and ``dropout``, may differ);
    a model of another shape (the mismatched keys and shapes); an optimiser
    whose groups or moments do not fit. ``strict_config=False`` loads a
    model of another configuration on purpose, with a warning naming the
    fields, as long as its shapes fit. The optimiser and a ``LambdaLR``
    scheduler keep the caller's settings (rates, betas, weight decay,
    schedule) and take the saved state and position. Returns the whole
    state (``state["step"]``, ``state["extra"]``, ``state["model"]``: the
    model file), and ``state["tokenizer"]``: the tokenizer it carries,
    rebuilt (None: it carries none).
    """
    path, target = Path(path), unwrap_model(model)
    check.booleans(
        restore_rng=restore_rng, strict_config=strict_config, owner="load_checkpoint"
    )
    if not path.is_file():
        raise CheckpointError(f"no checkpoint at {path}")
    others = sorted(p.name for p in path.parent.glob("step-*.pt") if p != path)
    hint = f" Other checkpoints in {path.parent}: {', '.join(others)}." * bool(others)
    state = _read_checkpoint(path, map_location, hint)
    try:  # before anything loads, like the rest
        saved_tokenizer = state["model"].get("tokenizer")
        tokenizer = tokenizer_from_state(saved_tokenizer, str(path))
    except ModelFileError as err:
        raise CheckpointError(str(err)) from None
    objects = dict(optimizer=optimizer, scheduler=scheduler, scaler=scaler)
    if problems := _problems(state, target, strict_config, **objects):
        raise CheckpointError(f"{path} does not fit: {' | '.join(problems)}")
    # everything fits: now, and only now, load it all
    target.load_state_dict(state["model"]["state_dict"])
    _restore_settings_and_position(optimizer, scheduler, state)
    if scaler is not None and state["scaler"]:
        scaler.load_state_dict(state["scaler"])
    elif scaler is not None and scaler.is_enabled():
        warnings.warn(
            f"{path} holds no loss-scaler state (its run had no fp16 "
            "scaling): the scaler starts from its initial scale",
            stacklevel=2,
        )
    if restore_rng:
        set_rng_states(state["rng"])
    return state | dict(tokenizer=tokenizer)


def latest_checkpoint(directory: str | os.PathLike) -> Path | None:
    """The checkpoint ``step-*.pt`` with the highest step in ``directory``,
    or None."""
    return max(_saved_checkpoints(directory), default=(None, None))[1]


# From chapters/08-1-training.md, section "The training loop".
def _rows(batch: Batch) -> int:
    sizes = {v.shape[0] for v in batch.values()}
    if len(sizes) != 1:
        shapes = {k: tuple(v.shape) for k, v in batch.items()}
        raise ValueError(f"a batch's tensors must share their first axis, got {shapes}")
    return sizes.pop()


def _check_shard(batch, rank, world_size, even) -> tuple[int, int, int]:
    """:func:`shard_batch`'s arguments: the batch's rows, the rank and the
    number of processes."""
    n = _rows(batch)
    world = check.positive_int("world_size", world_size, owner="shard_batch")
    rank = check.int_in_range("rank", rank, 0, world - 1, owner="shard_batch")
    if even and n % world:  # (even=False: shards that differ by a row)
        raise ValueError(f"batch: {n} rows does not divide across {world} processes")
    return n, rank, world


def _check_n_batches(n_batches, batches, name: str) -> None:
    """``n_batches`` batches must exist in the list ``batches``."""
    if isinstance(batches, list | tuple) and isinstance(n_batches, int):
        if n_batches > (held := len(batches)):
            raise ValueError(
                f"{name}={n_batches} batches asked for, but the list holds "
                f"{held}: ask for at most {held}, or pass a function step "
                "-> batch"
            )


def _check_evaluate(model, batches, n_batches) -> int:
    """:func:`evaluate`'s arguments; the number of batches to take."""
    check.instance("model", model, nn.Module, what="a torch.nn.Module")
    if n_batches is None:
        if callable(batches) or not isinstance(batches, list | tuple) or not batches:
            raise ValueError("evaluate takes a non-empty list, or with n_batches")
        n_batches = len(batches)
    check.positive_int("n_batches", n_batches, owner="evaluate")
    if not callable(batches):
        _check_n_batches(n_batches, batches, "n_batches")
    return n_batches


# From chapters/08-1-training.md, section "The training loop".
def model_loss(
    model: nn.Module, batch: Batch, *, label_smoothing: float = 0.0
) -> torch.Tensor:
    """:func:`cross_entropy` of ``model``'s logits on ``batch`` and its
    ``targets``.

    Encoder-decoder batches (with ``decoder_inputs``) call
    ``model(inputs, decoder_inputs, mask, decoder_mask)``; the others
    ``model(inputs, mask)``.
    """
    needed = {"inputs", "targets"}
    if not isinstance(batch, Mapping) or not needed <= set(batch):
        raise ValueError(
            f"a batch is a dict with 'inputs' and 'targets': {batch!r:.30}"
        )
    inputs, mask = batch["inputs"], batch.get("mask")
    if "decoder_inputs" in batch:
        logits = model(inputs, batch["decoder_inputs"], mask, batch.get("decoder_mask"))
    else:
        logits = model(inputs, mask)
    return cross_entropy(logits, batch["targets"], label_smoothing=label_smoothing)


def _n_targets(batch: Batch) -> int:
    """How many targets a batch's mean loss is over (``IGNORE_INDEX`` left
    out), its weight in a larger batch; rows when it has no ``targets``.
    Counted where batches are made, on the CPU: no device sync."""
    targets = batch.get("targets")
    return _rows(batch) if targets is None else int((targets != IGNORE_INDEX).sum())


def shard_batch(
    batch: Batch, rank: int, world_size: int, *, even: bool = True
) -> Batch:
    """Process ``rank``'s rows (contiguous) of a batch shared by
    ``world_size``.

    With ``even=False`` the shards may differ by one row (some may be
    empty): :func:`train` and :func:`evaluate` weight each by its number of
    targets.
    """
    n, rank, world = _check_shard(batch, rank, world_size, even)
    return {k: v[n * rank // world : n * (rank + 1) // world] for k, v in batch.items()}


def _micro_batches(batch: Batch, n_micro: int) -> list[Batch]:
    n = _rows(batch)
    if n % n_micro:
        raise ValueError(f"{n} rows per process do not split into grad_accum={n_micro}")
    return [shard_batch(batch, i, n_micro) for i in range(n_micro)]


def _to_device(batch: Batch, device: torch.device) -> Batch:
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


def _distributed() -> tuple[int, int]:
    """``(rank, world_size)`` of this process; ``(0, 1)`` when running
    alone."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


@torch.no_grad()
def evaluate(
    model: nn.Module,
    batches: Callable[[int], Batch] | list[Batch],
    *,
    n_batches: int | None = None,
    loss_fn: Callable[[nn.Module, Batch], torch.Tensor] = model_loss,
    precision: Precision | None = None,
) -> float:
    """Mean loss per target over ``n_batches`` batches (all of a list by
    default), in eval mode.

    Each batch's mean loss weighs its number of targets (``IGNORE_INDEX``
    left out; its rows when it has no ``targets``), so batches of any sizes
    give the mean over all their targets. Under DDP each process takes its
    shard of every batch (the shards may differ by a row, or be empty),
    weighted the same way, so the result equals one process's.
    """
    n_batches = _check_evaluate(model, batches, n_batches)
    device = next(model.parameters()).device
    precision = precision or get_precision(device)
    rank, world = _distributed()
    was_training = model.training
    model.eval()
    # (the loss summed over the targets, the number of targets)
    totals = torch.zeros(2, device=device)
    for i in range(n_batches):
        whole = batches(i) if callable(batches) else batches[i]
        shard = shard_batch(whole, rank, world, even=False)
        # none: an empty shard, or every target ignored
        if n_targets := _n_targets(shard):
            with autocast(device, precision):
                loss = loss_fn(model, _to_device(shard, device)).float()
            totals[0] += loss * n_targets
            totals[1] += n_targets
    if world > 1:
        dist.all_reduce(totals)
    model.train(was_training)
    loss_sum, n_targets = totals.tolist()
    if not n_targets:
        raise ValueError("evaluate: no targets in the batches (all ignored)")
    return loss_sum / n_targets


# From chapters/08-1-training.md, section "The training loop".
def _check_train(model, batches, optimizer, loss_fn, o: dict[str, Any]) -> None:
    """:func:`train`'s arguments ``o``, checked once at its front door."""
    check.instance("model", model, nn.Module, what="a torch.nn.Module")
    check.instance("optimizer", optimizer, torch.optim.Optimizer, what="an optimizer")
    if not callable(batches) or not callable(loss_fn):
        raise TypeError("batches (step -> batch) and loss_fn must be callable")
    for name in ("n_steps", "grad_accum", "log_every", "keep_checkpoints"):
        check.positive_int(name, o[name], owner="train")
    for name in ("eval_every", "checkpoint_every"):
        check.int_at_least(name, o[name], 0, owner="train")
    check.booleans(
        resume=o["resume"],
        compile=o["compile"],
        strict_config=o["strict_config"],
        keep_best=o["keep_best"],
        owner="train",
    )
    if o["keep_best"] and not o["eval_every"]:
        raise ValueError("keep_best needs eval_every: the best of what?")
    _check_scheduler(o["scheduler"], optimizer, saving=o["checkpoint_dir"])
    _check_max_norm(math.inf if o["max_grad_norm"] is None else o["max_grad_norm"])
    saving = o["checkpoint_every"] or o["resume"]
    if saving and o["checkpoint_dir"] is None:
        raise ValueError("checkpoint_every and resume need a checkpoint_dir")
    no_list = callable(o["eval_batches"]) or o["eval_batches"] is None
    if o["eval_every"] and no_list and o["eval_iters"] is None:
        raise ValueError("eval_every needs eval_batches (a list, or with eval_iters)")
    if o["eval_every"] and not no_list:
        _check_n_batches(o["eval_iters"], o["eval_batches"], "eval_iters")


def _check_scheduler(scheduler, optimizer, saving) -> None:
    """A scheduler ``train`` can step (and save, with a checkpoint folder):
    a learning-rate scheduler of ``optimizer``, not a schedule function."""
    if scheduler is None:
        return
    needed = ("step", "state_dict", "load_state_dict") if saving else ("step",)
    lacking = [m for m in needed if not callable(getattr(scheduler, m, None))]
    if lacking:
        hint = " (a schedule: wrap it, make_scheduler(optimizer, schedule))"
        raise TypeError(
            f"scheduler must be a learning-rate scheduler with "
            f"{', '.join(m + '()' for m in needed)}; a "
            f"{type(scheduler).__name__} has no {', '.join(lacking)}"
            + hint
            * callable(scheduler)
        )
    if getattr(scheduler, "optimizer", optimizer) is not optimizer:
        raise ValueError(
            "scheduler drives another optimizer than the one train steps: "
            "build it with make_scheduler(optimizer, schedule)"
        )


def _check_step_batch(whole, step: int, world: int) -> int:
    """The batch ``batches(step)`` returned: a dict with a row for every
    process (its type only: no tensor is read); its rows."""
    if not isinstance(whole, Mapping):
        raise TypeError(
            f"batches({step}) returned {type(whole).__name__}: a batch "
            "is a dict with 'inputs' and 'targets'"
        )
    if (n_rows := _rows(whole)) < world:
        raise ValueError(f"a batch of {n_rows} rows cannot feed {world} processes")
    return n_rows


# From chapters/08-1-training.md, section "The training loop".
def _resume(directory: Path, **objects: Any) -> tuple[dict | None, Path | None]:
    """Load the newest intact checkpoint of ``directory`` into ``objects``;
    a damaged one, or a ``step-*.pt`` that lib.training did not write, is
    skipped with a warning. ``(None, None)`` when there is none."""
    errors = []
    for _, path in reversed(_saved_checkpoints(directory)):
        try:
            return load_checkpoint(path, **objects), path
        except CheckpointError as err:
            if not err.damaged:
                raise
            warnings.warn(f"resuming from an older checkpoint: {err}", stacklevel=3)
            errors.append(str(err))
    if errors:
        raise CheckpointError(f"no intact checkpoint in {directory}: {errors}")
    return None, None


def _saved_best(
    checkpoint_dir: Path | None, model: nn.Module, step: int
) -> dict[str, torch.Tensor]:
    """The weights of ``checkpoint_dir/best.pt`` (step ``step``), for a
    resumed ``keep_best`` run, as a CPU copy; ``model`` is not changed."""
    path = None if checkpoint_dir is None else checkpoint_dir / "best.pt"
    if path is None or not path.is_file():
        raise CheckpointError(
            f"the resumed history's best weights (step {step}) are not in "
            f"{path}: resume with keep_best=False, or restore the file"
        )
    holder = copy.deepcopy(unwrap_model(model)).cpu()
    found = load_checkpoint(path, model=holder, restore_rng=False)["step"]
    if found != step:
        raise CheckpointError(f"{path} is step {found}, the history's {step}")
    return holder.state_dict()


def _prune(directory: Path, keep: int, upto: int) -> None:
    """Delete all but the ``keep`` newest ``step-*.pt`` checkpoints of steps
    up to ``upto`` (the one just written). Those of later steps are not this
    run's (another run's, or a file lib.training did not write): they stay,
    and cannot push this run's own out."""
    saved = [(s, p) for s, p in _saved_checkpoints(directory) if s <= upto]
    for _, old in saved[:-keep]:  # keep >= 1 (train checks it)
        old.unlink(missing_ok=True)


# From chapters/08-1-training.md, section "The training loop".
@dataclass
class TrainHistory:
    """What a run records: per logged step the loss, learning rate and
    gradient norm (``steps`` counts finished optimiser steps), the
    evaluations, tokens and time."""

    steps: list[int] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    lrs: list[float] = field(default_factory=list)
    grad_norms: list[float] = field(default_factory=list)
    eval_steps: list[int] = field(default_factory=list)
    eval_losses: list[float] = field(default_factory=list)
    # wall seconds from the start of this call of train (compilation and
    # evaluations included; a resumed run counts from its resumption)
    eval_seconds: list[float] = field(default_factory=list)
    tokens: int = 0
    train_seconds: float = 0.0
    # with keep_best: the evaluation with the lowest held-out loss so far
    # (0 and None before the first), the weights train hands back
    best_step: int = 0
    best_eval_loss: float | None = None

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.train_seconds if self.train_seconds > 0 else 0.0


class NonFiniteLossError(FloatingPointError):
    """The loss (or the gradient norm) became NaN or infinite; it reached
    neither the weights nor a checkpoint. ``step`` counts optimiser steps
    from 1; ``batch_index``, from 0, is the ``i`` of the ``batches(i)`` that
    held the bad batch (``step - 1``)."""

    def __init__(self, step, values, checkpoint: Path | None, found_at: int):
        """The first non-finite ``step`` and its ``values`` (loss, gradient
        norm), the last good ``checkpoint`` (or None) and ``found_at``, the
        step that read it."""
        self.step, self.checkpoint = int(step), checkpoint
        self.batch_index = self.step - 1
        loss, norm = values.tolist()
        bad_loss = not math.isfinite(loss)
        what, self.value = ("loss", loss) if bad_loss else ("gradient norm", norm)
        step, where = self.step, f"the last good checkpoint is {checkpoint}"
        applied = "the run stopped before updating the weights"
        # found at a later read: that step and those after it were zeroed
        if found_at != step:
            applied = (
                f"found at step {found_at}: the gradients of step {step} "
                "and after were zeroed, so no non-finite value reached "
                "the weights"
            )
        super().__init__(
            f"the {what} is {self.value} at step {step}; {applied}, and "
            f"{where if checkpoint else 'there is no checkpoint'}. Step "
            f"{step}'s batch is batches({self.batch_index}) (steps count "
            "from 1, batches from 0). Lower the learning rate, clip "
            "gradients, or check the data."
        )


def tokens_in(batch: Batch) -> int:
    """The tokens a batch feeds the model: its inputs, and a decoder's
    inputs too (what throughput and FLOP estimates count)."""
    return sum(batch[k].numel() for k in ("inputs", "decoder_inputs") if k in batch)


def train(
    model: nn.Module,
    batches: Callable[[int], Batch],
    *,
    optimizer: torch.optim.Optimizer,
    n_steps: int,
    scheduler: Any = None,
    loss_fn: Callable[[nn.Module, Batch], torch.Tensor] = model_loss,
    grad_accum: int = 1,
    max_grad_norm: float | None = 1.0,
    precision: Precision | None = None,
    eval_batches: Callable[[int], Batch] | list[Batch] | None = None,
    eval_every: int = 0,
    eval_iters: int | None = None,
    checkpoint_dir: str | os.PathLike | None = None,
    checkpoint_every: int = 0,
    keep_checkpoints: int = 2,
    resume: bool = False,
    strict_config: bool = True,
    compile: bool = False,
    log_every: int = 1,
    progress: bool | None = None,
    keep_best: bool = False,
    tokenizer: Any = None,
) -> TrainHistory:
    """Train ``model`` (already on its device) for steps ``0 .. n_steps-1``.

    ``batches(step)`` gives the whole (global) batch of a step, on the CPU;
    under DDP (a process group started by
    :func:`lib.efficiency.distributed_setup`) each
    process trains on its :func:`shard_batch` (shards may differ by a row).
    The loss of a step is the mean over all its targets, whatever the
    processes and ``grad_accum`` micro-batches: ``loss_fn`` returns the mean
    over its batch's targets, weighted here by their share. ``precision``
    defaults to ``get_precision``: bf16 or fp16 autocast (fp16 with a
    ``GradScaler``) on a GPU, fp32 on a CPU. Gradients are clipped to
    ``max_grad_norm`` (None: not clipped). ``scheduler``: a learning-rate
    scheduler of ``optimizer`` (:func:`make_scheduler`), stepped after each
    optimiser step. ``resume=True`` continues from the newest intact
    checkpoint in ``checkpoint_dir``, if any, with this call's settings
    (:func:`load_checkpoint`; ``strict_config=False`` resumes a model whose
    configuration differs in a field that changes what the weights mean).
    The loss is read every
    ``log_every`` steps, and before an evaluation or a checkpoint.
    ``progress``: a tqdm bar (default: in the colab and full profiles).
    ``tokenizer``: written into every checkpoint (``best.pt`` too), so that
    :func:`lib.model_file.load_model` and :func:`load_checkpoint` give it
    back.
    ``keep_best=True`` (with ``eval_every``) hands back the weights of the
    evaluation with the lowest held-out loss, not the last step's; the
    history says which (``best_step``, ``best_eval_loss``), and with a
    ``checkpoint_dir`` they are saved there as ``best.pt`` too (a model file
    that :func:`lib.model_file.load_model` reads), which a resumed run
    reloads. Raises :class:`NonFiniteLossError` on a NaN or infinite loss or
    gradient norm.
    """
    _check_train(model, batches, optimizer, loss_fn, dict(locals()))
    device = next(model.parameters()).device
    precision = precision or get_precision(device)
    scaler = torch.amp.GradScaler(device.type) if precision.use_grad_scaler else None
    history, start, last_checkpoint = TrainHistory(), 0, None
    rank, world = _distributed()
    objects = dict(model=model, optimizer=optimizer, scheduler=scheduler, scaler=scaler)
    if checkpoint_dir is not None:
        checkpoint_dir = Path(checkpoint_dir)
        if rank == 0 and checkpoint_dir.is_dir():
            # the temporaries of a save killed inside torch.save
            remove_stale_temporaries(checkpoint_dir)
    if resume:
        found = _resume(
            checkpoint_dir, map_location=device, strict_config=strict_config, **objects
        )
        state, last_checkpoint = found
        if state is not None:
            start = state["step"]
            history = TrainHistory(**state["extra"].get("history", {}))
    best_weights = None  # a CPU copy: the GPU keeps room for training
    if keep_best and history.best_step:
        best_weights = _saved_best(checkpoint_dir, model, history.best_step)
    device_ids = [device.index] if device.type == "cuda" else None
    ddp = DistributedDataParallel(model, device_ids) if world > 1 else None
    net = ddp if ddp is not None else model
    net = torch.compile(net) if compile else net
    show = (get_profile() != "smoke" if progress is None else progress) and rank == 0
    model.train()
    steps = range(start, n_steps)
    bar = tqdm(
        steps, "train", n_steps, initial=start, disable=not show, dynamic_ncols=True
    )
    # Finiteness is tracked on the device, read only when the loss is read
    # anyway.
    healthy = torch.ones((), dtype=torch.bool, device=device)
    # the first bad step (0: none yet), and its (loss, gradient norm)
    first_bad = torch.zeros((), dtype=torch.long, device=device)
    bad_values = torch.zeros(2, device=device)
    loop_began = time.perf_counter()
    for step in bar:
        began = time.perf_counter()
        whole = batches(step)
        _check_step_batch(whole, step, world)
        n_targets = max(_n_targets(whole), 1)
        parts = _micro_batches(shard_batch(whole, rank, world, even=False), grad_accum)
        loss_sum = torch.zeros((), device=device)
        for i, micro in enumerate(parts):
            # DDP averages the gradients after the last micro-batch
            synced = ddp is None or i == len(parts) - 1
            share = _n_targets(micro) / n_targets  # of the step's targets
            with contextlib.nullcontext() if synced else ddp.no_sync():
                with autocast(device, precision):
                    mean = loss_fn(net, _to_device(micro, device))
                # DDP divides the gradients' sum by world
                loss = mean * share * world
                if scaler is not None:
                    loss = scaler.scale(loss)
                loss.backward()
            loss_sum += mean.detach().float() * share
        if world > 1:  # the step's loss: every process gets the sum
            dist.all_reduce(loss_sum)
        if scaler is not None:  # clip the true gradients, not scaled ones
            scaler.unscale_(optimizer)
        norm = clip_grad_norm(model.parameters(), max_grad_norm or math.inf)
        finite = torch.isfinite(loss_sum) & (
            torch.isfinite(norm) | (scaler is not None)
        )
        turned_bad = healthy & ~finite
        first_bad = torch.where(turned_bad, step + 1, first_bad)
        bad_values = torch.where(turned_bad, torch.stack([loss_sum, norm]), bad_values)
        healthy &= finite
        done = step + 1
        due_eval = eval_every and (done % eval_every == 0 or done == n_steps)
        due_save = checkpoint_every and (
            done % checkpoint_every == 0 or done == n_steps
        )
        logged = step % log_every == 0 or step == n_steps - 1
        if logged or due_eval or due_save:  # a read: stop before the update
            if not healthy.item():
                raise NonFiniteLossError(first_bad, bad_values, last_checkpoint, done)
            loss_value, norm_value = loss_sum.item(), float(norm)
        # no read, no sync: a non-finite step (and all after it) adds
        # nothing through its gradients (AdamW's momentum and weight decay
        # still move the weights until the next read stops the run)
        else:
            for p in model.parameters():
                if p.grad is not None:
                    p.grad.nan_to_num_(0.0, 0.0, 0.0).mul_(healthy)
        lr = optimizer.param_groups[0]["lr"]
        if scaler is not None:
            # skipped if the scaled gradients overflowed
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if scheduler is not None:
            scheduler.step()
        history.tokens += tokens_in(whole)
        if logged:
            history.steps.append(done)
            history.losses.append(loss_value)
            history.lrs.append(lr)
            history.grad_norms.append(norm_value)
            bar.set_postfix(loss=f"{loss_value:.3f}", lr=f"{lr:.2e}", refresh=False)
        history.train_seconds += time.perf_counter() - began
        if due_eval:
            kw = dict(n_batches=eval_iters, loss_fn=loss_fn, precision=precision)
            eval_loss = evaluate(model, eval_batches, **kw)
            history.eval_losses.append(eval_loss)
            history.eval_steps.append(done)
            history.eval_seconds.append(time.perf_counter() - loop_began)
            model.train()
            best = history.best_eval_loss
            if keep_best and (best is None or eval_loss < best):
                history.best_step, history.best_eval_loss = done, eval_loss
                best_weights = {
                    k: v.detach().to("cpu", copy=True)
                    for k, v in model.state_dict().items()
                }
                if checkpoint_dir is not None and rank == 0:
                    save_checkpoint(
                        checkpoint_dir / "best.pt",
                        model=model,
                        step=done,
                        tokenizer=tokenizer,
                    )
        if due_save:
            # the model's configuration is in its model file
            extra = dict(history=asdict(history), data_position=done)
            last_checkpoint = checkpoint_dir / f"step-{done:08d}.pt"
            if rank == 0:
                save_checkpoint(
                    last_checkpoint,
                    step=done,
                    extra=extra,
                    tokenizer=tokenizer,
                    **objects,
                )
                _prune(checkpoint_dir, keep_checkpoints, done)
            if world > 1:
                dist.barrier()
    bar.close()
    if best_weights is not None:
        model.load_state_dict(best_weights)
    return history
