# This file is generated from chapters/08-training.md by tools/tangle.py. Do not edit it by hand:
# edit the chapter's cells tagged "export", then run `python tools/tangle.py`.
"""Training (chapter 8 of the course): from a loss to three trained model families.

* Loss: :func:`cross_entropy` (from logits, with an ignore index and label smoothing).
* Optimiser: :func:`adamw_step` (one step written out), :func:`parameter_groups`
  (decay on matrices only), :func:`make_optimizer`, :func:`clip_grad_norm`.
* Schedules: :class:`NoamSchedule`, :class:`WarmupCosineSchedule`,
  :func:`make_scheduler`.
* Checkpoints: :func:`save_checkpoint` (atomic), :func:`load_checkpoint`
  (``weights_only=True``, mismatches named), :func:`latest_checkpoint`, RNG states.
* The loop: :func:`lm_batches`, :func:`model_loss`, :func:`evaluate`, :func:`train`
  (mixed precision, accumulation, clipping, evaluation, checkpoints, DDP, compile).
* Memory and speed: :func:`enable_activation_checkpointing`,
  :func:`training_flops_per_token`, :func:`peak_flops`.
* Runs: :func:`char_gpt_run`, :func:`bert_run`, :func:`t5_run`, their cost
  (:func:`run_flops`, :func:`estimate_run_seconds`, :func:`gpu_seconds`), and
  :func:`main` for ``python -m lib.training`` or ``torchrun -m lib.training --``.

A batch is a dict of tensors whose first axis is ``batch``: ``inputs`` ``(batch seq)``,
``targets`` (``IGNORE_INDEX`` where there is no loss), optionally ``mask``
``(batch seq)`` (True for real tokens) and, for an encoder-decoder, ``decoder_inputs``.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import math
import os
import random
import shlex
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from einops import rearrange, reduce
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.nn.utils.rnn import pad_sequence
from torch.utils.checkpoint import checkpoint as checkpoint_call
from tqdm import tqdm

from lib import _checks as check
from lib.datasets import load_gutenberg, load_tatoeba_pairs, load_tiny_shakespeare
from lib.generation import beam_search, generate
from lib.models import (
    BERT,
    GPT,
    T5,
    TransformerBlock,
    TransformerConfig,
    count_parameters,
)
from lib.objectives import (
    IGNORE_INDEX,
    ObjectiveBatch,
    causal_lm_batch,
    masked_lm_batch,
)
from lib.utils import (
    PROFILES,
    Precision,
    autocast,
    get_device,
    get_precision,
    get_profile,
    git_commit,
)

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
    "save_checkpoint",
    "load_checkpoint",
    "latest_checkpoint",
    "Batch",
    "as_batch",
    "lm_batches",
    "lm_eval_batches",
    "shard_batch",
    "model_loss",
    "evaluate",
    "TrainHistory",
    "NonFiniteLossError",
    "train",
    "unwrap_model",
    "enable_activation_checkpointing",
    "disable_activation_checkpointing",
    "training_flops_per_token",
    "peak_flops",
    "distributed_setup",
    "CharVocabulary",
    "SequenceClassifier",
    "split_pairs_by_source",
    "RUN_SIZES",
    "char_gpt_run",
    "bert_run",
    "t5_run",
    "run_flops",
    "gpu_seconds",
    "estimate_run_seconds",
    "main",
]


def cross_entropy(
    logits: torch.Tensor,
    targets: torch.Tensor,
    *,
    ignore_index: int = IGNORE_INDEX,
    label_smoothing: float = 0.0,
) -> torch.Tensor:
    """Mean cross-entropy of ``targets`` under ``softmax(logits)``, computed in float32.

    Shapes: ``logits`` ``(... vocab)``, ``targets`` ``(...)`` integer ids; positions
    whose target is ``ignore_index`` do not count. With ``label_smoothing`` ε the target
    is ``(1-ε)·one_hot + ε/vocab`` (PyTorch's convention). A batch in which every target
    is ignored has loss 0 (PyTorch returns NaN), so it cannot stop a run.
    """
    if not isinstance(logits, torch.Tensor) or not logits.is_floating_point():
        raise TypeError(f"logits must be a floating-point tensor, got {logits!r:.60}")
    integer_types = (torch.int64, torch.int32)
    if not isinstance(targets, torch.Tensor) or targets.dtype not in integer_types:
        raise TypeError(f"targets must be an int64 tensor of ids, got {targets!r:.60}")
    if tuple(targets.shape) != tuple(logits.shape[:-1]):
        raise ValueError(
            f"targets {tuple(targets.shape)} must have the shape of logits "
            f"{tuple(logits.shape)} without its last (vocab) axis"
        )
    if isinstance(label_smoothing, bool) or not 0.0 <= label_smoothing < 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1), got {label_smoothing!r}")
    vocab = logits.shape[-1]
    keep = targets != ignore_index
    if not torch.compiler.is_compiling() and keep.any():
        low, high = (int(v) for v in torch.aminmax(targets[keep]))
        if low < 0 or high >= vocab:
            allowed = f"0..{vocab - 1} or {ignore_index}"
            raise ValueError(f"targets must be in {allowed}, got {low}..{high}")
    logits = logits.float()
    log_probs = logits - torch.logsumexp(logits, dim=-1, keepdim=True)
    safe_targets = targets.masked_fill(~keep, 0).unsqueeze(-1)
    per_position = -log_probs.gather(-1, safe_targets).squeeze(-1)
    if label_smoothing > 0.0:
        uniform = -reduce(log_probs, "... vocab -> ...", "mean")
        eps = label_smoothing
        per_position = (1.0 - eps) * per_position + eps * uniform
    n_kept = keep.sum().clamp(min=1)
    return (per_position * keep).sum() / n_kept


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
    """One AdamW update, as ``torch.optim.AdamW`` makes it; nothing changes in place.

    ``step`` counts from 1. Shapes: all four tensors alike; returns the new
    ``(param, exp_avg, exp_avg_sq)``.
    """
    if isinstance(step, bool) or not isinstance(step, int) or step < 1:
        raise ValueError(f"step counts from 1, got {step!r}")
    beta1, beta2 = betas
    param = param * (1.0 - lr * weight_decay)  # decoupled: the moments never see it
    exp_avg = beta1 * exp_avg + (1.0 - beta1) * grad
    exp_avg_sq = beta2 * exp_avg_sq + (1.0 - beta2) * grad * grad
    m_hat = exp_avg / (1.0 - beta1**step)
    v_hat = exp_avg_sq / (1.0 - beta2**step)
    return param - lr * m_hat / (v_hat.sqrt() + eps), exp_avg, exp_avg_sq


def parameter_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Two optimiser groups: linear layers' weight matrices (decayed) and the rest.

    The rest, with ``weight_decay=0``: biases, norm gains, embeddings and position
    tables (and a head tied to the embedding). Frozen parameters are left out.
    """
    matrices = {id(m.weight) for m in model.modules() if isinstance(m, nn.Linear)}
    decay, no_decay = [], []
    for p in model.parameters():  # each parameter once, even when tied
        if p.requires_grad:
            (decay if id(p) in matrices else no_decay).append(p)
    return [
        {"params": decay, "weight_decay": float(weight_decay)},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def make_optimizer(
    model: nn.Module,
    lr: float,
    *,
    weight_decay: float = 0.1,
    betas: tuple[float, float] = (0.9, 0.98),
    eps: float = 1e-9,
    fused: bool | None = None,
) -> torch.optim.AdamW:
    """AdamW over :func:`parameter_groups`; ``fused`` defaults to True on CUDA."""
    groups = parameter_groups(model, weight_decay)
    if fused is None:
        fused = all(p.is_cuda for g in groups for p in g["params"]) or None
    return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, fused=fused)


def clip_grad_norm(parameters: Iterable[torch.Tensor], max_norm: float) -> torch.Tensor:
    """Scale all gradients by ``min(1, max_norm / global_norm)`` in place.

    Returns the global 2-norm before clipping (float32), as
    ``torch.nn.utils.clip_grad_norm_`` does; ``max_norm=math.inf`` only measures it.
    """
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


@dataclass(frozen=True)
class NoamSchedule:
    """``d_model^-0.5 · min(n^-0.5, n · warmup^-1.5)`` at optimiser step
    ``n = step + 1``.

    A multiplier of the base learning rate (``LambdaLR`` counts ``step`` from 0).
    """

    d_model: int
    warmup: int

    def __post_init__(self) -> None:
        check.positive_int("d_model", self.d_model)
        check.positive_int("warmup", self.warmup)

    def __call__(self, step: int) -> float:
        n = step + 1
        return self.d_model**-0.5 * min(n**-0.5, n * self.warmup**-1.5)


@dataclass(frozen=True)
class WarmupCosineSchedule:
    """Linear warm-up to 1 over ``warmup`` steps, then cosine decay to ``min_ratio``
    at ``total`` steps (and ``min_ratio`` after). A multiplier of the base rate."""

    warmup: int
    total: int
    min_ratio: float = 0.1

    def __post_init__(self) -> None:
        check.positive_int("total", self.total)
        if isinstance(self.warmup, bool) or not 0 <= self.warmup <= self.total:
            message = f"warmup must be in 0..total={self.total}, got {self.warmup!r}"
            raise ValueError(message)
        if not 0.0 <= self.min_ratio <= 1.0:
            raise ValueError(f"min_ratio must be in [0, 1], got {self.min_ratio!r}")

    def __call__(self, step: int) -> float:
        if step < self.warmup:
            return (step + 1) / self.warmup
        progress = min(1.0, (step - self.warmup) / max(1, self.total - self.warmup))
        cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
        return self.min_ratio + (1.0 - self.min_ratio) * cosine


def make_scheduler(
    optimizer: torch.optim.Optimizer, schedule: Callable[[int], float]
) -> torch.optim.lr_scheduler.LambdaLR:
    """A ``LambdaLR`` that multiplies each group's base rate by ``schedule(step)``."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)


class CheckpointError(RuntimeError):
    """A checkpoint cannot be used: unreadable, or saved from a different model."""


def rng_states() -> dict[str, Any]:
    """The state of every random number generator: Python, NumPy, torch (CPU, CUDA)."""
    _, keys, position, has_gauss, cached = np.random.get_state()
    return {
        "python": random.getstate(),
        "numpy": {
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "position": int(position),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def set_rng_states(states: Mapping[str, Any]) -> None:
    """Restore the generators from :func:`rng_states`."""
    random.setstate(states["python"])
    numpy_state = states["numpy"]
    np.random.set_state(
        (
            "MT19937",
            numpy_state["keys"].numpy().astype(np.uint32),
            numpy_state["position"],
            numpy_state["has_gauss"],
            numpy_state["cached_gaussian"],
        )
    )
    torch.set_rng_state(states["torch"].cpu())
    if states["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in states["cuda"]])


def unwrap_model(model: nn.Module) -> nn.Module:
    """The plain module inside ``torch.compile`` and ``DistributedDataParallel``."""
    while True:
        if hasattr(model, "_orig_mod"):  # torch.compile
            model = model._orig_mod
        elif isinstance(model, DistributedDataParallel):
            model = model.module
        else:
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
) -> Path:
    """Write a checkpoint atomically: a temporary file in the same folder, then rename.

    Holds the model, optimiser, scheduler and scaler states, ``step`` (the next step to
    run, which is also the position in the data), every RNG state and ``extra`` (plain
    values and tensors only, so that ``weights_only`` loading accepts it).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {
        "format": "lib.training/1",
        "step": int(step),
        "model": unwrap_model(model).state_dict(),
        "optimizer": None if optimizer is None else optimizer.state_dict(),
        "scheduler": None if scheduler is None else scheduler.state_dict(),
        "scaler": None if scaler is None else scaler.state_dict(),
        "rng": rng_states(),
        "extra": dict(extra or {}),
    }
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        torch.save(state, temporary)
        with open(temporary, "rb") as written:
            os.fsync(written.fileno())  # on disk before the name points at it
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)
    return path


def _check_compatible(
    model: nn.Module,
    saved: Mapping[str, torch.Tensor],
    path: Path,
) -> None:
    own = model.state_dict()
    problems = []
    missing = [k for k in own if k not in saved]
    unexpected = [k for k in saved if k not in own]
    shapes = []
    for k in own:
        if k in saved and tuple(own[k].shape) != tuple(saved[k].shape):
            theirs, ours = tuple(saved[k].shape), tuple(own[k].shape)
            shapes.append(f"{k} {theirs} in the checkpoint, {ours} in the model")
    for what, items in (("missing keys", missing), ("unexpected keys", unexpected)):
        if items:
            more = f" (and {len(items) - 5} more)" if len(items) > 5 else ""
            problems.append(f"{what}: {', '.join(items[:5])}{more}")
    if shapes:
        more = f" (and {len(shapes) - 5} more)" if len(shapes) > 5 else ""
        problems.append(f"shape mismatches: {'; '.join(shapes[:5])}{more}")
    if problems:
        raise CheckpointError(
            f"{path} was saved from a model of another configuration: "
            + " | ".join(problems)
            + ". Build the model with the checkpoint's configuration (train() "
            "stores it under extra['config'])."
        )


def load_checkpoint(
    path: str | os.PathLike,
    *,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any = None,
    scaler: torch.amp.GradScaler | None = None,
    map_location: str | torch.device = "cpu",
    restore_rng: bool = True,
) -> dict[str, Any]:
    """Load a checkpoint of :func:`save_checkpoint` into the given objects (in place).

    Loads with ``torch.load(weights_only=True)``. Raises :class:`CheckpointError`
    naming the problem: an unreadable (truncated, corrupted) file, with the other
    checkpoints of its folder; or a model of another configuration, with the
    mismatched keys and shapes.
    Returns the whole state (``state["step"]``, ``state["extra"]``, ...).
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"no checkpoint at {path}")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as err:
        others = sorted(p.name for p in path.parent.glob("*.pt") if p != path)
        hint = f" Other checkpoints in {path.parent}: {', '.join(others)}."
        raise CheckpointError(
            f"{path} is not a readable checkpoint (truncated or corrupted?): "
            f"{type(err).__name__}: {str(err)[:200]}.{hint if others else ''}"
        ) from err
    if not isinstance(state, dict) or state.get("format") != "lib.training/1":
        raise CheckpointError(f"{path} is not a checkpoint written by lib.training")
    target = unwrap_model(model)
    _check_compatible(target, state["model"], path)
    target.load_state_dict(state["model"])
    parts = {"optimizer": optimizer, "scheduler": scheduler, "scaler": scaler}
    for name, obj in parts.items():
        if obj is not None:
            if state[name] is None:
                raise CheckpointError(f"{path} holds no {name} state to resume from")
            obj.load_state_dict(state[name])
    if restore_rng:
        set_rng_states(state["rng"])
    return state


def latest_checkpoint(directory: str | os.PathLike) -> Path | None:
    """The checkpoint ``step-*.pt`` with the highest step in ``directory``, or None."""
    found = _checkpoints(directory)
    return found[-1][1] if found else None


def _checkpoints(directory: str | os.PathLike) -> list[tuple[int, Path]]:
    """``(step, path)`` of every ``step-*.pt`` in ``directory``, oldest first."""
    found = []
    for p in Path(directory).glob("step-*.pt"):
        digits = p.stem.removeprefix("step-")
        if digits.isdigit():
            found.append((int(digits), p))
    return sorted(found)


Batch = dict[str, torch.Tensor]


def as_batch(
    batch: ObjectiveBatch | Mapping[str, torch.Tensor],
    **more: torch.Tensor,
) -> Batch:
    """The tensors of an ``ObjectiveBatch`` (or a dict) as a dict, with ``more``."""
    if isinstance(batch, ObjectiveBatch):
        items = {f.name: getattr(batch, f.name) for f in fields(batch)}
    else:
        items = dict(batch)
    return {k: v for k, v in {**items, **more}.items() if v is not None}


def _step_generator(seed: int, step: int) -> torch.Generator:
    """A generator for one step's batch: its draws depend on (seed, step) only."""
    return torch.Generator().manual_seed(seed * 1_000_003 + step)


def _token_stream(tokens: torch.Tensor | list[int], seq_len: int) -> torch.Tensor:
    tokens = torch.as_tensor(tokens, dtype=torch.long)
    if tokens.dim() != 1:
        shape = tuple(tokens.shape)
        raise ValueError(f"tokens must be one stream (n,), got shape {shape}")
    check.positive_int("seq_len", seq_len)
    if len(tokens) < seq_len + 1:
        raise ValueError(
            f"the data holds {len(tokens)} tokens, fewer than one window of "
            f"seq_len + 1 = {seq_len + 1} (a context and the token after it); use a "
            "shorter seq_len or more text"
        )
    return tokens


def lm_batches(
    tokens: torch.Tensor | list[int],
    batch_size: int,
    seq_len: int,
    *,
    seed: int = 0,
    objective: Callable[[torch.Tensor, torch.Generator], Any] | None = None,
) -> Callable[[int], Batch]:
    """``step -> batch`` of ``batch_size`` random windows of ``seq_len + 1`` tokens.

    ``objective(windows, generator)`` turns the windows ``(batch seq_len+1)`` into a
    batch (an ``ObjectiveBatch`` or a dict); the default, ``causal_lm_batch``, gives
    ``inputs`` and ``targets`` ``(batch seq_len)``. The windows and the objective's
    random choices depend on ``(seed, step)`` only.
    """
    tokens = _token_stream(tokens, seq_len)
    check.positive_int("batch_size", batch_size)
    offsets = torch.arange(seq_len + 1)

    def batch_at(step: int) -> Batch:
        generator = _step_generator(seed, step)
        n_starts = len(tokens) - seq_len
        starts = torch.randint(0, n_starts, (batch_size,), generator=generator)
        windows = tokens[rearrange(starts, "batch -> batch 1") + offsets]
        if objective is None:
            return as_batch(causal_lm_batch(windows))
        return as_batch(objective(windows, generator))

    return batch_at


def lm_eval_batches(
    tokens: torch.Tensor | list[int],
    batch_size: int,
    seq_len: int,
    *,
    seed: int = 0,
    objective: Callable[[torch.Tensor, torch.Generator], Any] | None = None,
) -> list[Batch]:
    """The whole stream as consecutive windows (each token predicted once), in batches:
    what a final, honest evaluation uses. Arguments as :func:`lm_batches`."""
    tokens = _token_stream(tokens, seq_len)
    check.positive_int("batch_size", batch_size)
    n_windows = (len(tokens) - 1) // seq_len
    starts = torch.arange(n_windows) * seq_len
    windows = tokens[rearrange(starts, "w -> w 1") + torch.arange(seq_len + 1)]
    batches = []
    for i, chunk in enumerate(windows.split(batch_size)):
        made = (
            causal_lm_batch(chunk)
            if objective is None
            else objective(chunk, _step_generator(seed, i))
        )
        batches.append(as_batch(made))
    return batches


def model_loss(
    model: nn.Module,
    batch: Batch,
    *,
    label_smoothing: float = 0.0,
) -> torch.Tensor:
    """:func:`cross_entropy` of ``model``'s logits on ``batch`` and its ``targets``.

    Encoder-decoder batches (with ``decoder_inputs``) call
    ``model(inputs, decoder_inputs, mask, decoder_mask)``; the others
    ``model(inputs, mask)``.
    """
    if "decoder_inputs" in batch:
        logits = model(
            batch["inputs"],
            batch["decoder_inputs"],
            batch.get("mask"),
            batch.get("decoder_mask"),
        )
    else:
        logits = model(batch["inputs"], batch.get("mask"))
    return cross_entropy(logits, batch["targets"], label_smoothing=label_smoothing)


def _rows(batch: Batch) -> int:
    sizes = {v.shape[0] for v in batch.values()}
    if len(sizes) != 1:
        shapes = {k: tuple(v.shape) for k, v in batch.items()}
        message = f"a batch's tensors must share their first axis (batch), got {shapes}"
        raise ValueError(message)
    return sizes.pop()


def shard_batch(batch: Batch, rank: int, world_size: int) -> Batch:
    """Process ``rank``'s rows (contiguous) of a batch shared by ``world_size``."""
    n = _rows(batch)
    if n % world_size:
        raise ValueError(
            f"a batch of {n} rows does not divide across {world_size} processes; "
            "each must get as many rows (DDP averages their gradients with equal "
            f"weight): use a batch size that is a multiple of {world_size}"
        )
    per = n // world_size
    return {k: v[rank * per : (rank + 1) * per] for k, v in batch.items()}


def _micro_batches(batch: Batch, n_micro: int) -> list[Batch]:
    n = _rows(batch)
    if n % n_micro:
        raise ValueError(
            f"a batch of {n} rows (per process) does not split into "
            f"grad_accum={n_micro} equal micro-batches; make the batch size a "
            "multiple of grad_accum"
        )
    return [shard_batch(batch, i, n_micro) for i in range(n_micro)]


def _to_device(batch: Batch, device: torch.device) -> Batch:
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


def _distributed() -> tuple[int, int]:
    """``(rank, world_size)`` of this process; ``(0, 1)`` when running alone."""
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
    """Mean loss over ``n_batches`` batches (all of a list by default), in eval mode.

    Under DDP each process takes its shard of every batch and the means are averaged.
    """
    device = next(model.parameters()).device
    precision = precision or get_precision(device)
    if n_batches is None:
        if callable(batches):
            raise ValueError("evaluate needs n_batches when batches is a function")
        n_batches = len(batches)
    rank, world = _distributed()
    was_training = model.training
    model.eval()
    total = torch.zeros((), device=device)
    for i in range(n_batches):
        batch = batches(i) if callable(batches) else batches[i]
        batch = _to_device(shard_batch(batch, rank, world), device)
        with autocast(device, precision):
            total += loss_fn(model, batch).float()
    if world > 1:
        dist.all_reduce(total)
    model.train(was_training)
    return total.item() / (n_batches * world)


@dataclass
class TrainHistory:
    """What a run records: per logged step the loss, learning rate and gradient norm
    (``steps`` counts finished optimiser steps), the evaluations, tokens and time."""

    steps: list[int] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    lrs: list[float] = field(default_factory=list)
    grad_norms: list[float] = field(default_factory=list)
    eval_steps: list[int] = field(default_factory=list)
    eval_losses: list[float] = field(default_factory=list)
    tokens: int = 0
    train_seconds: float = 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.train_seconds if self.train_seconds > 0 else 0.0


class NonFiniteLossError(FloatingPointError):
    """The loss (or the gradient norm) became NaN or infinite; no update was applied."""

    def __init__(self, step: int, what: str, value: float, checkpoint: Path | None):
        self.step, self.value, self.checkpoint = step, value, checkpoint
        where = f"the last good checkpoint is {checkpoint}"
        super().__init__(
            f"the {what} is {value} at step {step}; the run stopped before updating "
            f"the weights, and {where if checkpoint else 'there is no checkpoint'}. "
            "Lower the learning rate, clip gradients, or check the data."
        )


def _tokens_in(batch: Batch) -> int:
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
    compile: bool = False,
    log_every: int = 1,
    progress: bool | None = None,
) -> TrainHistory:
    """Train ``model`` (already on its device) for steps ``0 .. n_steps-1``.

    ``batches(step)`` gives the whole (global) batch of a step; under DDP (a process
    group started by :func:`distributed_setup`) each process trains on its
    :func:`shard_batch` and gradients are averaged. ``precision`` defaults to
    ``get_precision``: bf16 or fp16 autocast (fp16 with a ``GradScaler``) on a GPU, fp32
    on a CPU. Gradients are clipped to ``max_grad_norm`` (None: not clipped).
    ``resume=True`` continues from the latest checkpoint in ``checkpoint_dir``, if any.
    The loss is read (and checked) every ``log_every`` steps. ``progress``: a tqdm bar
    (default: in the colab and full profiles, not in smoke).
    Raises :class:`NonFiniteLossError` on a NaN or infinite loss or gradient norm.
    """
    check.positive_int("n_steps", n_steps)
    check.positive_int("grad_accum", grad_accum)
    check.positive_int("log_every", log_every)
    device = next(model.parameters()).device
    precision = precision or get_precision(device)
    scaler = torch.amp.GradScaler(device.type) if precision.use_grad_scaler else None
    history, start, last_checkpoint = TrainHistory(), 0, None
    if checkpoint_dir is not None and resume:
        found = latest_checkpoint(checkpoint_dir)
        if found is not None:
            state = load_checkpoint(
                found,
                model=model,
                optimizer=optimizer,
                scheduler=scheduler,
                scaler=scaler,
                map_location=device,
            )
            start, last_checkpoint = state["step"], found
            history = TrainHistory(**state["extra"].get("history", {}))
    rank, world = _distributed()
    ddp = None
    if world > 1:
        ddp = DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None
        )
    net = ddp if ddp is not None else model
    if compile:
        net = torch.compile(net)
    config = getattr(unwrap_model(model), "cfg", None)
    show = get_profile() != "smoke" if progress is None else progress
    model.train()
    bar = tqdm(
        range(start, n_steps),
        initial=start,
        total=n_steps,
        disable=not show or rank != 0,
        dynamic_ncols=True,
        desc="train",
    )
    for step in bar:
        began = time.perf_counter()
        batch = shard_batch(batches(step), rank, world)
        micro_batches = _micro_batches(batch, grad_accum)
        loss_sum = torch.zeros((), device=device)
        for i, micro in enumerate(micro_batches):
            last = i == len(micro_batches) - 1
            synced = ddp is None or last  # DDP averages once, after the last one
            with contextlib.nullcontext() if synced else ddp.no_sync():
                with autocast(device, precision):
                    loss = loss_fn(net, _to_device(micro, device)) / grad_accum
                (scaler.scale(loss) if scaler is not None else loss).backward()
            loss_sum += loss.detach().float()
        if world > 1:
            dist.all_reduce(loss_sum)
            loss_sum /= world
        if scaler is not None:
            scaler.unscale_(optimizer)  # clip the true gradients, not the scaled ones
        norm = clip_grad_norm(model.parameters(), max_grad_norm or math.inf)
        logged = step % log_every == 0 or step == n_steps - 1
        if logged:
            loss_value, norm_value = loss_sum.item(), float(norm)
            if not math.isfinite(loss_value):
                raise NonFiniteLossError(step + 1, "loss", loss_value, last_checkpoint)
            if scaler is None and not math.isfinite(norm_value):
                what = "gradient norm"
                raise NonFiniteLossError(step + 1, what, norm_value, last_checkpoint)
        lr = optimizer.param_groups[0]["lr"]
        if scaler is not None:
            scaler.step(optimizer)  # skipped if the scaled gradients overflowed
            scaler.update()
        else:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if scheduler is not None:
            scheduler.step()
        done = step + 1
        history.tokens += _tokens_in(batch) * world
        if logged:
            history.steps.append(done)
            history.losses.append(loss_value)
            history.lrs.append(lr)
            history.grad_norms.append(norm_value)
            bar.set_postfix(loss=f"{loss_value:.3f}", lr=f"{lr:.2e}", refresh=False)
        history.train_seconds += time.perf_counter() - began
        due = eval_every and (done % eval_every == 0 or done == n_steps)
        if eval_batches is not None and due:
            eval_loss = evaluate(
                model,
                eval_batches,
                n_batches=eval_iters,
                loss_fn=loss_fn,
                precision=precision,
            )
            history.eval_losses.append(eval_loss)
            history.eval_steps.append(done)
            model.train()
        if (
            checkpoint_dir is not None
            and checkpoint_every
            and (done % checkpoint_every == 0 or done == n_steps)
        ):
            extra = {"history": asdict(history), "data_position": done}
            if config is not None:
                extra["config"] = asdict(config)
            if rank == 0:
                last_checkpoint = save_checkpoint(
                    Path(checkpoint_dir) / f"step-{done:08d}.pt",
                    model=model,
                    step=done,
                    optimizer=optimizer,
                    scheduler=scheduler,
                    scaler=scaler,
                    extra=extra,
                )
                _prune(Path(checkpoint_dir), keep_checkpoints)
            if world > 1:
                dist.barrier()
    bar.close()
    return history


def _prune(directory: Path, keep: int) -> None:
    """Delete all but the ``keep`` newest ``step-*.pt`` checkpoints."""
    found = _checkpoints(directory)
    for _, old in found[: max(0, len(found) - keep)]:
        old.unlink(missing_ok=True)


def _checkpointed_block_forward(self: TransformerBlock, x: torch.Tensor, *args, **kw):
    plain = type(self).forward
    if kw.get("use_cache") or not torch.is_grad_enabled():
        return plain(self, x, *args, **kw)  # generation, evaluation: nothing to save
    return checkpoint_call(plain, self, x, *args, use_reentrant=False, **kw)


def _blocks(model: nn.Module) -> list[TransformerBlock]:
    modules = unwrap_model(model).modules()
    blocks = [m for m in modules if isinstance(m, TransformerBlock)]
    if not blocks:
        name = type(model).__name__
        raise ValueError(f"{name} has no TransformerBlock to checkpoint")
    return blocks


def enable_activation_checkpointing(model: nn.Module) -> int:
    """Recompute every ``TransformerBlock`` in the backward pass instead of storing
    its activations (``torch.utils.checkpoint``, non-reentrant). Returns the number
    of blocks."""
    blocks = _blocks(model)
    for block in blocks:
        block.forward = _checkpointed_block_forward.__get__(block)  # a bound method
    return len(blocks)


def disable_activation_checkpointing(model: nn.Module) -> int:
    """Undo :func:`enable_activation_checkpointing`; returns the number of blocks."""
    blocks = _blocks(model)
    for block in blocks:
        vars(block).pop("forward", None)
    return len(blocks)


# Dense bf16/fp16 tensor-core peaks (FLOP/s), NVIDIA's data sheets; matched in order.
_PEAK_FLOPS = (
    ("H100 PCIe", 756e12),
    ("H100", 989e12),
    ("H200", 989e12),
    ("A100", 312e12),
    ("L40S", 362e12),
    ("L4", 121e12),
    ("A10", 125e12),
    ("V100", 125e12),
    ("T4", 65e12),
    ("RTX 4090", 165e12),
)


def training_flops_per_token(model: nn.Module, seq_len: int) -> float:
    """Training FLOPs per token: ``6·N`` for the parameters (forward 2, backward 4) plus
    ``12·L·d·T`` for attention (PaLM's appendix B); position tables do no products."""
    model = unwrap_model(model)
    cfg = model.cfg
    n_params = count_parameters(model)
    named = model.named_parameters()
    n_params -= sum(p.numel() for name, p in named if "positions" in name.split("."))
    n_layers = cfg.n_layers + (cfg.decoder_layers if isinstance(model, T5) else 0)
    return 6.0 * n_params + 12.0 * n_layers * cfg.n_heads * cfg.head_size * seq_len


def peak_flops(device: torch.device | str | None = None) -> float | None:
    """The GPU's dense 16-bit peak in FLOP/s; None on a CPU or an unknown GPU."""
    device = torch.device(device) if device is not None else get_device()
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((flops for key, flops in _PEAK_FLOPS if key in name), None)


def distributed_setup(backend: str | None = None) -> tuple[int, int, torch.device]:
    """Join the process group that ``torchrun`` describes in the environment, if any.

    Returns ``(rank, world_size, device)``: ``(0, 1, get_device())`` without torchrun;
    under torchrun, CUDA device ``LOCAL_RANK`` with NCCL, or the CPU with gloo.
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return 0, 1, get_device()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available() and backend in (None, "nccl"):
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device, backend = torch.device("cpu"), backend or "gloo"
    if not dist.is_initialized():
        dist.init_process_group(backend)
    return dist.get_rank(), dist.get_world_size(), device


class CharVocabulary:
    """The characters of a text, numbered after some special tokens.

    ``vocab["<pad>"]`` is a token's id; ``encode(text)`` and ``decode(ids)`` convert
    (``decode`` drops special tokens unless ``skip_specials=False``).
    """

    def __init__(self, text: str, specials: Iterable[str] = ()) -> None:
        self.specials = tuple(specials)
        self.tokens = [*self.specials, *sorted(set(text) - set(self.specials))]
        self.ids = {token: i for i, token in enumerate(self.tokens)}

    @property
    def vocab_size(self) -> int:
        return len(self.tokens)

    def __getitem__(self, token: str) -> int:
        if token not in self.ids:
            raise KeyError(f"{token!r} is not in the vocabulary ({self.specials=})")
        return self.ids[token]

    def encode(self, text: str) -> list[int]:
        try:
            return [self.ids[c] for c in text]
        except KeyError as err:
            character = err.args[0]
            raise ValueError(f"{character!r} is not in the vocabulary") from None

    def decode(self, ids: Iterable[int], *, skip_specials: bool = True) -> str:
        n_special = len(self.specials) if skip_specials else 0
        return "".join(self.tokens[i] for i in ids if i >= n_special)


class SequenceClassifier(nn.Module):
    """BERT's embeddings and encoder with a linear head on the mean of the outputs.

    ``forward(ids, mask=None)``: ``ids`` ``(batch seq)``, ``mask`` ``(batch seq)``
    True for real tokens -> logits ``(batch n_classes)``. The MLM head is not used.
    """

    def __init__(self, bert: BERT, n_classes: int, dropout: float = 0.1) -> None:
        super().__init__()
        self.cfg = bert.cfg
        self.embed, self.encoder = bert.embed, bert.encoder
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(
            bert.cfg.d_model, check.positive_int("n_classes", n_classes)
        )
        nn.init.normal_(self.head.weight, std=0.02)
        nn.init.zeros_(self.head.bias)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor | None = None):
        hidden = self.encoder(self.embed(ids), mask)  # (batch seq d_model)
        if mask is None:
            pooled = reduce(hidden, "batch seq d_model -> batch d_model", "mean")
        else:
            weights = rearrange(mask.to(hidden.dtype), "batch seq -> batch seq 1")
            pooled = (hidden * weights).sum(1) / weights.sum(1).clamp(min=1.0)
        return self.head(self.dropout(pooled))


def split_pairs_by_source(
    pairs: list[tuple[str, str]], test_fraction: float, seed: int = 0
) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """Split ``(source, target)`` pairs so that no source sentence is in both parts.

    All translations of one source go to the same side; ``test_fraction`` of the
    distinct sources (in a seeded random order) go to the test part.
    """
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction!r}")
    sources = sorted({source for source, _ in pairs})
    random.Random(seed).shuffle(sources)
    test_sources = set(sources[: max(1, round(test_fraction * len(sources)))])
    train_part = [p for p in pairs if p[0] not in test_sources]
    test_part = [p for p in pairs if p[0] in test_sources]
    return train_part, test_part


RUN_SIZES: dict[str, dict[str, dict[str, Any]]] = {
    "gpt": {
        "smoke": dict(d_model=64, n_heads=4, n_layers=2, seq_len=64, batch_size=16,
                      n_steps=200, lr=3e-3, warmup=20, dropout=0.0, eval_every=50,
                      eval_iters=2),
        "colab": dict(d_model=384, n_heads=6, n_layers=6, seq_len=256, batch_size=128,
                      n_steps=600, lr=2e-3, warmup=100, dropout=0.1, eval_every=200,
                      eval_iters=10),
        "full": dict(d_model=384, n_heads=6, n_layers=6, seq_len=256, batch_size=128,
                     n_steps=1500, lr=2e-3, warmup=100, dropout=0.1, eval_every=500,
                     eval_iters=20),
    },
    "bert": {
        "smoke": dict(d_model=64, n_heads=4, n_layers=2, seq_len=64, batch_size=16,
                      n_steps=150, lr=2e-3, warmup=15, finetune_steps=80,
                      finetune_lr=1e-3, test_per_book=16, dropout=0.0, eval_every=50,
                      eval_iters=2),
        "colab": dict(d_model=256, n_heads=4, n_layers=4, seq_len=128, batch_size=128,
                      n_steps=2000, lr=1e-3, warmup=200, finetune_steps=300,
                      finetune_lr=3e-4, test_per_book=200, dropout=0.1, eval_every=500,
                      eval_iters=10),
        "full": dict(d_model=256, n_heads=4, n_layers=4, seq_len=128, batch_size=128,
                     n_steps=4000, lr=1e-3, warmup=200, finetune_steps=600,
                     finetune_lr=3e-4, test_per_book=200, dropout=0.1, eval_every=500,
                     eval_iters=10),
    },
    "t5": {
        "smoke": dict(d_model=64, n_heads=4, n_layers=2, batch_size=32, n_steps=250,
                      lr=3e-3, warmup=25, dropout=0.0, test_fraction=0.1, beam_size=4,
                      eval_every=125, label_smoothing=0.1),
        "colab": dict(d_model=256, n_heads=4, n_layers=3, batch_size=128, n_steps=1500,
                      lr=1e-3, warmup=200, dropout=0.1, test_fraction=0.1, beam_size=4,
                      eval_every=500, label_smoothing=0.1),
        "full": dict(d_model=256, n_heads=4, n_layers=3, batch_size=128, n_steps=3000,
                     lr=1e-3, warmup=200, dropout=0.1, test_fraction=0.1, beam_size=4,
                     eval_every=500, label_smoothing=0.1),
    },
}  # fmt: skip


def _sizes(run: str, profile: str | None, n_steps: int | None) -> dict[str, Any]:
    profile = profile or get_profile()
    if profile not in PROFILES:
        raise ValueError(f"profile must be one of {PROFILES}, got {profile!r}")
    if run not in RUN_SIZES:
        raise ValueError(f"run must be one of {tuple(RUN_SIZES)}, got {run!r}")
    sizes = {**RUN_SIZES[run][profile], "profile": profile}
    if n_steps is not None:  # for BERT, both pre-training and fine-tuning
        sizes["n_steps"] = check.positive_int("n_steps", n_steps)
        if "finetune_steps" in sizes:
            sizes["finetune_steps"] = n_steps
        sizes["warmup"] = min(sizes["warmup"], n_steps)
    return sizes


def _run_config(
    run: str, sizes: Mapping[str, Any], vocab_size: int
) -> TransformerConfig:
    """The ``TransformerConfig`` of a run's model at these sizes."""
    common = dict(
        vocab_size=vocab_size,
        d_model=sizes["d_model"],
        n_heads=sizes["n_heads"],
        n_layers=sizes["n_layers"],
        dropout=sizes["dropout"],
    )
    if run == "gpt":
        return TransformerConfig(**common, max_len=sizes["seq_len"])
    if run == "bert":
        return TransformerConfig(
            **common, max_len=sizes["seq_len"], embedding_norm=True
        )
    return TransformerConfig(  # T5
        **common,
        n_decoder_layers=sizes["n_layers"],
        positions="t5",
        norm="rmsnorm",
        activation="relu",
        bias=False,
        attn_scale=1.0,
        max_len=128,
    )


def _curves(history: TrainHistory) -> dict[str, Any]:
    return {
        "train": {"step": history.steps, "loss": history.losses, "lr": history.lrs},
        "eval": {"step": history.eval_steps, "loss": history.eval_losses},
    }


def _speed(model: nn.Module, history: TrainHistory, seq_len: int) -> dict[str, Any]:
    """Tokens per second; on a known GPU also the model FLOPs utilisation and memory."""
    device = next(model.parameters()).device
    speed: dict[str, Any] = {"tokens_per_second": history.tokens_per_second}
    peak = peak_flops(device)
    if peak is not None:
        flops = training_flops_per_token(model, seq_len) * history.tokens_per_second
        speed["mfu"] = flops / peak
    if device.type == "cuda":
        speed["peak_memory_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
    return speed


@torch.no_grad()
def _sample(model: GPT, decode: Callable, prompt: torch.Tensor, n_new: int, seed: int):
    was_training = model.training
    model.eval()
    generator = torch.Generator(prompt.device).manual_seed(seed)
    ids = generate(model, prompt, n_new, temperature=0.8, generator=generator)
    model.train(was_training)
    return decode(ids[0].tolist())


def char_gpt_run(
    profile: str | None = None,
    *,
    device: torch.device | str | None = None,
    compile: bool = False,
    progress: bool | None = None,
    seed: int = 0,
    n_steps: int | None = None,
) -> dict[str, Any]:
    """A character-level GPT on Tiny Shakespeare: 90 % to train, the last 10 % held
    out."""
    sizes = _sizes("gpt", profile, n_steps)
    seq_len, batch_size = sizes["seq_len"], sizes["batch_size"]
    device = torch.device(device) if device is not None else get_device()
    torch.manual_seed(seed)
    text = load_tiny_shakespeare()
    vocab = CharVocabulary(text)
    ids = torch.tensor(vocab.encode(text))
    split = int(0.9 * len(ids))
    train_ids, val_ids = ids[:split], ids[split:]
    cfg = _run_config("gpt", sizes, vocab.vocab_size)
    model = GPT(cfg).to(device)
    prompt = torch.tensor([vocab.encode("\n")], device=device)
    n_new = seq_len - 1  # learned positions: no further than the context
    before = _sample(model, vocab.decode, prompt, n_new, seed)
    optimizer = make_optimizer(model, sizes["lr"], betas=(0.9, 0.99), eps=1e-8)
    schedule = WarmupCosineSchedule(sizes["warmup"], sizes["n_steps"], min_ratio=0.1)
    history = train(
        model,
        lm_batches(train_ids, batch_size, seq_len, seed=seed),
        optimizer=optimizer,
        scheduler=make_scheduler(optimizer, schedule),
        n_steps=sizes["n_steps"],
        eval_batches=lm_batches(val_ids, batch_size, seq_len, seed=seed + 1),
        eval_every=sizes["eval_every"],
        eval_iters=sizes["eval_iters"],
        compile=compile,
        progress=progress,
    )
    val_loss = evaluate(model, lm_eval_batches(val_ids, 4 * batch_size, seq_len))
    return {
        "run": "gpt",
        "sizes": sizes,
        "config": asdict(cfg),
        "parameters": count_parameters(model),
        "metrics": {
            "val_loss": val_loss,
            "train_seconds": history.train_seconds,
            **_speed(model, history, seq_len),
        },
        "curves": _curves(history),
        "examples": {
            "before": before,
            "after": _sample(model, vocab.decode, prompt, n_new, seed),
        },
    }


def _book_batches(books: list[torch.Tensor], batch_size: int, seq_len: int, seed: int):
    """``step -> batch`` of passages: a book drawn uniformly, then a window of it."""

    def batch_at(step: int) -> Batch:
        generator = _step_generator(seed, step)
        labels = torch.randint(len(books), (batch_size,), generator=generator)
        rows = []
        for label in labels.tolist():
            book = books[label]
            high = len(book) - seq_len + 1
            start = int(torch.randint(high, (1,), generator=generator))
            rows.append(book[start : start + seq_len])
        return {"inputs": torch.stack(rows), "targets": labels}

    return batch_at


def _book_test_set(books: list[torch.Tensor], per_book: int, seq_len: int, size: int):
    """``per_book`` evenly spaced passages of each (held-out) book, in batches."""
    rows, labels = [], []
    for label, ids in enumerate(books):
        starts = torch.linspace(0, len(ids) - seq_len, per_book).long()
        for start in starts.tolist():
            rows.append(ids[start : start + seq_len])
            labels.append(label)
    inputs, targets = torch.stack(rows), torch.tensor(labels)
    pieces = zip(inputs.split(size), targets.split(size))
    return [{"inputs": i, "targets": t} for i, t in pieces]


@torch.no_grad()
def _accuracy(model: nn.Module, batches: list[Batch]) -> float:
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    right = total = 0
    for batch in batches:
        batch = _to_device(batch, device)
        predicted = model(batch["inputs"], batch.get("mask")).argmax(-1)
        right += int((predicted == batch["targets"]).sum())
        total += len(batch["targets"])
    model.train(was_training)
    return right / total


def bert_run(
    profile: str | None = None,
    *,
    device: torch.device | str | None = None,
    compile: bool = False,
    progress: bool | None = None,
    seed: int = 0,
    n_steps: int | None = None,
) -> dict[str, Any]:
    """Masked-LM pre-training on six Gutenberg books, then book classification of
    held-out passages, against the same classifier trained from scratch."""
    sizes = _sizes("bert", profile, n_steps)
    device = torch.device(device) if device is not None else get_device()
    torch.manual_seed(seed)
    books = load_gutenberg()
    vocab = CharVocabulary("".join(books.values()), specials=("<pad>", "<mask>"))
    pad, mask_id = vocab["<pad>"], vocab["<mask>"]
    encoded = [torch.tensor(vocab.encode(text)) for text in books.values()]
    seen = [ids[: int(0.9 * len(ids))] for ids in encoded]
    held_out = [ids[int(0.9 * len(ids)) :] for ids in encoded]
    seq_len, batch_size = sizes["seq_len"], sizes["batch_size"]

    def mlm(windows: torch.Tensor, generator: torch.Generator) -> ObjectiveBatch:
        return masked_lm_batch(
            windows,
            mask_id=mask_id,
            vocab_size=vocab.vocab_size,
            generator=generator,
            special_ids=(pad,),
        )

    cfg = _run_config("bert", sizes, vocab.vocab_size)
    bert = BERT(cfg).to(device)
    optimizer = make_optimizer(bert, sizes["lr"], betas=(0.9, 0.98), eps=1e-9)
    pre_history = train(
        bert,
        lm_batches(torch.cat(seen), batch_size, seq_len - 1, seed=seed, objective=mlm),
        optimizer=optimizer,
        scheduler=make_scheduler(
            optimizer, WarmupCosineSchedule(sizes["warmup"], sizes["n_steps"])
        ),
        n_steps=sizes["n_steps"],
        eval_batches=lm_batches(
            torch.cat(held_out), batch_size, seq_len - 1, seed=seed + 1, objective=mlm
        ),
        eval_every=sizes["eval_every"],
        eval_iters=sizes["eval_iters"],
        compile=compile,
        progress=progress,
    )
    test_set = _book_test_set(held_out, sizes["test_per_book"], seq_len, 4 * batch_size)
    finetuned, curves = {}, {"pretraining": _curves(pre_history)}
    scratch = BERT(cfg).to(device)
    steps = sizes["finetune_steps"]
    for name, encoder in (("pretrained", bert), ("from_scratch", scratch)):
        torch.manual_seed(seed + 1)  # the same head and dropout masks for both
        classifier = SequenceClassifier(encoder, len(books), sizes["dropout"])
        classifier = classifier.to(device)
        optimizer = make_optimizer(
            classifier,
            sizes["finetune_lr"],
            betas=(0.9, 0.98),
            eps=1e-9,
        )
        schedule = WarmupCosineSchedule(steps // 10, steps)
        history = train(
            classifier,
            _book_batches(seen, batch_size, seq_len, seed + 2),
            optimizer=optimizer,
            scheduler=make_scheduler(optimizer, schedule),
            n_steps=steps,
            eval_batches=test_set,
            eval_every=max(1, steps // 4),
            compile=compile,
            progress=progress,
        )
        finetuned[name] = _accuracy(classifier, test_set)
        curves[name] = _curves(history)
    return {
        "run": "bert",
        "sizes": sizes,
        "config": asdict(cfg),
        "parameters": count_parameters(bert),
        "metrics": {
            "mlm_val_loss": pre_history.eval_losses[-1],
            "accuracy_pretrained": finetuned["pretrained"],
            "accuracy_from_scratch": finetuned["from_scratch"],
            "chance": 1 / len(books),
            "test_passages": sum(len(b["targets"]) for b in test_set),
            **_speed(bert, pre_history, seq_len),
        },
        "curves": curves,
        "examples": {"books": list(books)},
    }


def _pair_batch(sources: list[torch.Tensor], targets: list[torch.Tensor], pad: int):
    """Right-padded source and target rows; the decoder reads ``pad``, then the
    target shifted right."""
    inputs = pad_sequence(sources, batch_first=True, padding_value=pad)
    labels = pad_sequence(targets, batch_first=True, padding_value=IGNORE_INDEX)
    shifted = torch.cat([torch.full_like(labels[:, :1], pad), labels[:, :-1]], dim=1)
    decoder_inputs = shifted.masked_fill(shifted == IGNORE_INDEX, pad)
    return {
        "inputs": inputs,
        "mask": inputs != pad,
        "decoder_inputs": decoder_inputs,
        "targets": labels,
    }


@torch.no_grad()
def _translate(model: T5, sources: list[str], vocab: CharVocabulary, beam_size: int):
    """Greedy (``beam_size=1``) or beam-search translations of ``sources``."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    pad, eos = vocab["<pad>"], vocab["</s>"]
    out = []
    for start in range(0, len(sources), 256):
        texts = sources[start : start + 256]
        chunk = [torch.tensor([*vocab.encode(text), eos]) for text in texts]
        src = pad_sequence(chunk, batch_first=True, padding_value=pad).to(device)
        bound = model.bind(src, src != pad)
        prompt = torch.full((len(chunk), 1), pad, device=device)
        max_new = 2 * src.shape[1] + 10
        stop = dict(stop_ids=[eos], pad_id=pad)
        if beam_size == 1:
            ids = generate(bound, prompt, max_new, temperature=0, **stop)
        else:
            ids = beam_search(bound, prompt, max_new, beam_size=beam_size, **stop)
        for row in ids[:, 1:].tolist():
            out.append(vocab.decode(row[: row.index(eos)] if eos in row else row))
    model.train(was_training)
    return out


def _t5_data(sizes: Mapping[str, Any], seed: int):
    """``(vocab, train_pairs, test_pairs, batch_at, test_batches)`` of the T5 run:
    ``batch_at(step)`` draws training pairs, ``test_batches`` holds all test pairs."""
    pairs = load_tatoeba_pairs()
    train_pairs, test_pairs = split_pairs_by_source(pairs, sizes["test_fraction"], seed)
    vocab = CharVocabulary("".join(e + f for e, f in pairs), specials=("<pad>", "</s>"))
    pad, eos = vocab["<pad>"], vocab["</s>"]

    def encoded(pairs: list[tuple[str, str]]) -> tuple[list, list]:
        return (
            [torch.tensor([*vocab.encode(e), eos]) for e, _ in pairs],
            [torch.tensor([*vocab.encode(f), eos]) for _, f in pairs],
        )

    sources, targets = encoded(train_pairs)

    def batch_at(step: int) -> Batch:
        generator = _step_generator(seed, step)
        rows = torch.randint(len(sources), (sizes["batch_size"],), generator=generator)
        return _pair_batch([sources[i] for i in rows], [targets[i] for i in rows], pad)

    test_sources, test_targets = encoded(test_pairs)
    test_batches = [
        _pair_batch(test_sources[i : i + 256], test_targets[i : i + 256], pad)
        for i in range(0, len(test_pairs), 256)
    ]
    return vocab, train_pairs, test_pairs, batch_at, test_batches


def t5_run(
    profile: str | None = None,
    *,
    device: torch.device | str | None = None,
    compile: bool = False,
    progress: bool | None = None,
    seed: int = 0,
    n_steps: int | None = None,
) -> dict[str, Any]:
    """T5 on Tatoeba English -> French, split by English sentence; BLEU (sacrebleu) of
    greedy and beam-search translations of the held-out sentences."""
    import sacrebleu  # the chapters' extra; the standard BLEU

    sizes = _sizes("t5", profile, n_steps)
    device = torch.device(device) if device is not None else get_device()
    torch.manual_seed(seed)
    vocab, train_pairs, test_pairs, batch_at, test_batches = _t5_data(sizes, seed)
    pad = vocab["<pad>"]
    cfg = _run_config("t5", sizes, vocab.vocab_size)
    model = T5(cfg, start_id=pad).to(device)
    optimizer = make_optimizer(model, sizes["lr"], betas=(0.9, 0.98), eps=1e-9)
    smoothing = sizes["label_smoothing"]
    history = train(
        model,
        batch_at,
        optimizer=optimizer,
        scheduler=make_scheduler(
            optimizer, WarmupCosineSchedule(sizes["warmup"], sizes["n_steps"])
        ),
        n_steps=sizes["n_steps"],
        loss_fn=lambda net, batch: model_loss(net, batch, label_smoothing=smoothing),
        eval_batches=test_batches,
        eval_every=sizes["eval_every"],
        compile=compile,
        progress=progress,
    )
    references: dict[str, list[str]] = {}
    for english, french in test_pairs:
        references.setdefault(english, []).append(french)
    english = list(references)
    n_refs = max(len(r) for r in references.values())
    # sacrebleu takes one stream per reference; None where a sentence has fewer
    ref_streams = []
    for k in range(n_refs):
        ref_streams.append([r[k] if k < len(r) else None for r in references.values()])
    metrics: dict[str, Any] = {"test_loss": history.eval_losses[-1]}
    translations = {}
    for name, beam in (("greedy", 1), ("beam", sizes["beam_size"])):
        translations[name] = _translate(model, english, vocab, beam)
        bleu = sacrebleu.corpus_bleu(translations[name], ref_streams)
        metrics[f"bleu_{name}"] = bleu.score
    metrics.update(
        train_pairs=len(train_pairs),
        test_sentences=len(english),
        **_speed(model, history, 32),
    )
    examples = [
        {"english": s, "greedy": g, "beam": b, "references": references[s]}
        for s, g, b in zip(english[:8], translations["greedy"], translations["beam"])
    ]
    return {
        "run": "t5",
        "sizes": sizes,
        "config": asdict(cfg),
        "parameters": count_parameters(model),
        "metrics": metrics,
        "curves": _curves(history),
        "examples": examples,
    }


def _on_meta(make: Callable[[], nn.Module]) -> nn.Module:
    """A model built on the meta device: shapes only, no memory, no initialisation."""
    with torch.device("meta"):
        return make()


def _n_evaluations(n_steps: int, every: int) -> int:
    """How often :func:`train` evaluates: every ``every`` steps and after the last."""
    return n_steps // every + (n_steps % every != 0) if every else 0


def run_flops(run: str, profile: str | None = None) -> dict[str, float]:
    """The work of one of the three runs at a profile's sizes, counted, not run.

    Returns ``train_tokens`` (forward and backward), ``forward_tokens`` (evaluation
    only, a third of the cost), ``flops``, the sum of each model's
    :func:`training_flops_per_token` times its tokens, and ``steps``, the optimiser
    steps of every model the run trains (BERT: pre-training and both fine-tunings).
    Decoding, sampling and data preparation are not counted.
    """
    sizes = _sizes(run, profile, None)
    batch_size, n_steps = sizes["batch_size"], sizes["n_steps"]
    n_evals = _n_evaluations(n_steps, sizes["eval_every"])
    parts = []  # (model, seq_len, train_tokens, forward_tokens, optimiser steps)
    if run == "gpt":
        text = load_tiny_shakespeare()
        seq_len = sizes["seq_len"]
        cfg = _run_config(run, sizes, CharVocabulary(text).vocab_size)
        n_val = len(text) - int(0.9 * len(text))
        tokens = batch_size * seq_len
        final = (n_val - 1) // seq_len * seq_len  # lm_eval_batches's windows
        forward = n_evals * sizes["eval_iters"] * tokens + final
        gpt = _on_meta(lambda: GPT(cfg))
        parts.append((gpt, seq_len, n_steps * tokens, forward, n_steps))
    elif run == "bert":
        books = load_gutenberg()
        vocab = CharVocabulary("".join(books.values()), specials=("<pad>", "<mask>"))
        seq_len, steps = sizes["seq_len"], sizes["finetune_steps"]
        cfg = _run_config(run, sizes, vocab.vocab_size)
        bert = _on_meta(lambda: BERT(cfg))
        tokens = batch_size * seq_len
        forward = n_evals * sizes["eval_iters"] * tokens
        parts.append((bert, seq_len, n_steps * tokens, forward, n_steps))
        test_tokens = len(books) * sizes["test_per_book"] * seq_len
        ft_evals = _n_evaluations(steps, max(1, steps // 4)) + 1  # + the accuracy
        classifier = _on_meta(lambda: SequenceClassifier(bert, len(books)))
        for _ in ("pretrained", "from_scratch"):
            ft_tokens = ft_evals * test_tokens
            parts.append((classifier, seq_len, steps * tokens, ft_tokens, steps))
    else:
        vocab, _, _, batch_at, test_batches = _t5_data(sizes, 0)
        sample = range(0, n_steps, max(1, n_steps // 64))
        per_batch = sum(_tokens_in(batch_at(s)) for s in sample) / len(sample)
        seq_len = max(1, round(per_batch / (2 * batch_size)))  # per stack
        test_tokens = sum(_tokens_in(b) for b in test_batches)
        cfg = _run_config(run, sizes, vocab.vocab_size)
        model = _on_meta(lambda: T5(cfg, start_id=0))
        forward = n_evals * test_tokens
        parts.append((model, seq_len, n_steps * per_batch, forward, n_steps))
    flops = sum(
        training_flops_per_token(model, seq_len) * (train + forward / 3)
        for model, seq_len, train, forward, _ in parts
    )
    return {
        "train_tokens": float(sum(part[2] for part in parts)),
        "forward_tokens": float(sum(part[3] for part in parts)),
        "flops": flops,
        "steps": float(sum(part[4] for part in parts)),
    }


def gpu_seconds(
    flops: float,
    steps: int = 0,
    *,
    peak: float | str = "T4",
    mfu: float = 0.3,
    step_overhead: float = 0.0,
) -> float:
    """Seconds for ``flops`` at ``mfu`` of ``peak``, plus ``step_overhead`` seconds for
    each of ``steps`` optimiser steps (kernel launches, Python).

    ``peak`` is in FLOP/s, or a GPU's name as in :func:`peak_flops`'s table ("T4",
    "A100", "H100"...). The MFU and the overhead are assumptions the caller states.
    """
    if isinstance(peak, str):
        found = [flops for key, flops in _PEAK_FLOPS if key == peak]
        if not found:
            known = [key for key, _ in _PEAK_FLOPS]
            raise ValueError(f"unknown GPU {peak!r}; known: {known}, or give FLOP/s")
        peak = found[0]
    if not peak > 0:
        raise ValueError(f"peak must be positive FLOP/s, got {peak!r}")
    if not 0.0 < mfu <= 1.0:
        raise ValueError(f"mfu must be in (0, 1], got {mfu!r}")
    if not step_overhead >= 0.0:
        raise ValueError(f"step_overhead must be >= 0 seconds, got {step_overhead!r}")
    return flops / (peak * mfu) + steps * step_overhead


def estimate_run_seconds(
    run: str,
    profile: str | None = None,
    *,
    peak: float | str = "T4",
    mfu: float = 0.3,
    step_overhead: float = 0.0,
) -> float:
    """Seconds of GPU time for :func:`run_flops` by :func:`gpu_seconds`."""
    work = run_flops(run, profile)
    return gpu_seconds(
        work["flops"], work["steps"], peak=peak, mfu=mfu, step_overhead=step_overhead
    )


_RUNS: dict[str, Callable[..., dict[str, Any]]] = {
    "gpt": char_gpt_run,
    "bert": bert_run,
    "t5": t5_run,
}


def _seconds_since_process_start() -> float | None:
    """Wall-clock seconds since this process started (Linux), for 'time from start'."""
    try:
        with open("/proc/self/stat") as stat, open("/proc/uptime") as uptime:
            started_ticks = int(stat.read().rsplit(")", 1)[1].split()[19])
            seconds_up = float(uptime.read().split()[0])
            return seconds_up - started_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def _write_results(record: dict[str, Any], out: Path) -> None:
    """``metrics.json``, one CSV per curve and ``loss.png`` under ``out``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    (out / "metrics.json").write_text(json.dumps(record, indent=2, default=str) + "\n")
    curves = record["curves"]
    if "train" in curves:
        curves = {record["run"]: curves}
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    for name, curve in curves.items():
        for part in ("train", "eval"):
            columns = curve[part]
            with open(out / f"{name}_{part}.csv", "w", newline="") as f:
                writer = csv.writer(f)
                writer.writerow(list(columns))
                writer.writerows(zip(*columns.values()))
            ax.plot(
                columns["step"],
                columns["loss"],
                "-" if part == "train" else "o-",
                lw=1,
                label=f"{name} {part}",
            )
    ax.set(xlabel="step", ylabel="loss")
    ax.legend()
    fig.savefig(out / "loss.png", dpi=150, bbox_inches="tight")
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """``python -m lib.training --run gpt|bert|t5 [--profile P] [--out DIR]``, or
    ``torchrun --nproc_per_node=N -m lib.training -- --run ...`` (the ``--`` keeps
    torchrun from reading ``--run`` as its own ``--run-path``). Returns the record."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(
        prog="python -m lib.training",
        description="Train chapter 8's GPT, BERT or T5 and record the results.",
    )
    parser.add_argument("--run", choices=sorted(_RUNS), required=True)
    parser.add_argument(
        "--profile",
        choices=PROFILES,
        default=None,
        help="sizes (default: TFS_PROFILE, else smoke on a CPU, colab on a GPU older "
        "than Ampere such as a T4, full on a newer one)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="results folder (default: book/results/08-training-RUN)",
    )
    parser.add_argument("--steps", type=int, help="override the number of steps")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-compile", action="store_true", help="no torch.compile")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    began = time.time()
    rank, world, device = distributed_setup()
    result = _RUNS[args.run](
        args.profile,
        device=device,
        compile=device.type == "cuda" and not args.no_compile,
        progress=not args.quiet,
        seed=args.seed,
        n_steps=args.steps,
    )
    torchrun = f"torchrun --standalone --nproc_per_node={world} -m lib.training --"
    launcher = "python -m lib.training" if world == 1 else torchrun
    record = {
        **result,
        "command": f"{launcher} {shlex.join(argv)}",
        "wall_seconds": time.time() - began,
        "seconds_since_process_start": _seconds_since_process_start(),
        "device": str(device),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "precision": get_precision(device).name,
        "world_size": world,
        "torch": torch.__version__,
        "commit": git_commit(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
    }
    if rank == 0:
        out = args.out or Path("book") / "results" / f"08-training-{args.run}"
        _write_results(record, out)
        print(f"{args.run}: {json.dumps(result['metrics'])} -> {out}")
    if world > 1:
        dist.destroy_process_group()
    return record


# (in a notebook, __name__ is "__main__" too: do not start a run there)
if __name__ == "__main__" and "ipykernel" not in sys.modules:
    main()
