# This file is generated from chapters/08-2-efficiency.md by tools/tangle.py. Do not edit it by hand:
# edit the chapter's cells tagged "export", then run `python tools/tangle.py`.
# From chapters/08-2-efficiency.md, section "Memory: activation checkpointing".
"""Memory and speed of training (chapter 8 of the course).

* Memory: :func:`enable_activation_checkpointing` (recompute each
  ``TransformerBlock`` in the backward pass),
  :func:`disable_activation_checkpointing`.
* Speed: :func:`training_flops_per_token` (``6·N`` plus attention),
  :func:`peak_flops` (a GPU's dense 16-bit peak), :func:`gpu_seconds` (time
  at an MFU).
* Several GPUs: :func:`distributed_setup` (join the process group that
  ``torchrun`` describes).
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.checkpoint import checkpoint as checkpoint_call

from lib import _checks as check
from lib.models import T5, TransformerBlock, count_parameters
from lib.training import unwrap_model
from lib.utils import get_device

# The public names: every top-level name the export cells define (tools/tangle.py).
__all__ = [
    "enable_activation_checkpointing",
    "disable_activation_checkpointing",
    "training_flops_per_token",
    "peak_flops",
    "gpu_seconds",
    "distributed_setup",
]


# From chapters/08-2-efficiency.md, section "Memory: activation checkpointing".
def _check_has_blocks(model: nn.Module, blocks: list) -> None:
    if not blocks:
        raise ValueError(f"{type(model).__name__}: no TransformerBlock to checkpoint")


# From chapters/08-2-efficiency.md, section "Memory: activation checkpointing".
def _recomputing_block_forward(self: TransformerBlock, x: torch.Tensor, *args, **kw):
    plain = type(self).forward
    # generation, evaluation: nothing to save for a backward pass
    if kw.get("use_cache") or not torch.is_grad_enabled():
        return plain(self, x, *args, **kw)
    return checkpoint_call(plain, self, x, *args, use_reentrant=False, **kw)


def _blocks(model: nn.Module) -> list[TransformerBlock]:
    modules = unwrap_model(model).modules()
    blocks = [m for m in modules if isinstance(m, TransformerBlock)]
    _check_has_blocks(model, blocks)
    return blocks


def enable_activation_checkpointing(model: nn.Module) -> int:
    """Recompute every ``TransformerBlock`` in the backward pass instead of
    storing its activations (``torch.utils.checkpoint``, non-reentrant).
    Returns the number of blocks."""
    blocks = _blocks(model)
    for block in blocks:  # a method bound to each block
        block.forward = _recomputing_block_forward.__get__(block)
    return len(blocks)


def disable_activation_checkpointing(model: nn.Module) -> int:
    """Undo :func:`enable_activation_checkpointing`; returns the number of
    blocks."""
    blocks = _blocks(model)
    for block in blocks:
        vars(block).pop("forward", None)
    return len(blocks)


# From chapters/08-2-efficiency.md, section "Speed: compilation, fused kernels, and how busy the GPU is".
def _check_gpu_seconds(
    flops: float, steps: int, peak: float | str, mfu: float, step_overhead: float
) -> None:
    """``gpu_seconds``'s arguments, each error naming the one that is
    wrong."""
    known = dict(_PEAK_FLOPS)
    if isinstance(peak, str) and peak not in known:
        raise ValueError(f"unknown GPU {peak!r}; known: {list(known)} (or FLOP/s)")
    amounts = dict(flops=flops, steps=steps, step_overhead=step_overhead)
    for name, value in amounts.items():
        check.finite_float(name, value, low=0.0, owner="gpu_seconds")
    peak = known[peak] if isinstance(peak, str) else peak
    if not peak > 0:
        raise ValueError(f"peak must be positive FLOP/s, got {peak!r}")
    if not 0.0 < mfu <= 1.0:
        raise ValueError(f"mfu must be in (0, 1], got {mfu!r}")


# From chapters/08-2-efficiency.md, section "Speed: compilation, fused kernels, and how busy the GPU is".
# Dense bf16/fp16 tensor-core peaks (FLOP/s), NVIDIA's data sheets; matched
# in order.
_PEAK_FLOPS = (
    ("H100 PCIe", 756e12),
    ("H100", 989e12),
    ("H200", 989e12),
    ("A100", 312e12),
    ("L40S", 362e12),
    ("L40", 181e12),  # before "L4", which it contains
    ("L4", 121e12),
    ("A10", 125e12),
    ("V100", 125e12),
    ("T4", 65e12),
    ("RTX 4090", 165e12),
)


def training_flops_per_token(model: nn.Module, seq_len: int) -> float:
    """Training FLOPs per token: ``6·N`` for the parameters (forward 2,
    backward 4) plus ``12·L·d·T`` for attention (PaLM's appendix B);
    position tables do no products. For an encoder-decoder (T5) every
    token is charged to both stacks, about twice the true count when
    sources and targets are alike; an untied token embedding is charged
    too, though a lookup does no products."""
    check.positive_int("seq_len", seq_len, owner="training_flops_per_token")
    model = unwrap_model(model)
    cfg = model.cfg
    n_params = count_parameters(model)
    named = model.named_parameters()
    n_params -= sum(p.numel() for name, p in named if "positions" in name.split("."))
    n_layers = cfg.n_layers + (cfg.decoder_layers if isinstance(model, T5) else 0)
    return 6.0 * n_params + 12.0 * n_layers * cfg.n_heads * cfg.head_size * seq_len


def peak_flops(device: torch.device | str | None = None) -> float | None:
    """The GPU's dense 16-bit peak in FLOP/s; None on a CPU or an unknown
    GPU."""
    device = torch.device(device) if device is not None else get_device()
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((flops for key, flops in _PEAK_FLOPS if key in name), None)


def gpu_seconds(
    flops: float,
    steps: int = 0,
    *,
    peak: float | str = "T4",
    mfu: float = 0.3,
    step_overhead: float = 0.0,
) -> float:
    """Seconds for ``flops`` at ``mfu`` of ``peak``, plus ``step_overhead``
    seconds for each of ``steps`` optimiser steps (kernel launches, Python).

    ``peak`` is in FLOP/s, or a GPU's name as in :func:`peak_flops`'s table
    ("T4", "A100", "H100"...). The MFU and the overhead are assumptions the
    caller states.
    """
    _check_gpu_seconds(flops, steps, peak, mfu, step_overhead)
    if isinstance(peak, str):
        peak = dict(_PEAK_FLOPS)[peak]
    return flops / (peak * mfu) + steps * step_overhead


# From chapters/08-2-efficiency.md, section "Several GPUs: data parallelism".
def _environment_int(name: str, default: int, *, low: int) -> int:
    """The whole number ``low`` or more in the environment variable
    ``name`` (``default`` when it is unset), or an error naming it."""
    value = os.environ.get(name)
    if value is None:
        return default
    try:
        number = int(value.strip())
    except ValueError:
        number = None
    if number is None or number < low:
        raise ValueError(
            f"the environment variable {name}={value!r} must be a whole "
            f"number >= {low} (torchrun sets it; unset it to run one "
            "process)"
        )
    return number


# From chapters/08-2-efficiency.md, section "Several GPUs: data parallelism".
def distributed_setup(backend: str | None = None) -> tuple[int, int, torch.device]:
    """Join the process group that ``torchrun`` describes in the
    environment, if any.

    Returns ``(rank, world_size, device)``: ``(0, 1, get_device())`` without
    torchrun; under torchrun, CUDA device ``LOCAL_RANK`` with NCCL, or the
    CPU with gloo.
    """
    check.one_of("backend", backend, (None, "nccl", "gloo"), owner="distributed_setup")
    world = _environment_int("WORLD_SIZE", 1, low=1)
    if world == 1:
        return 0, 1, get_device()
    local_rank = _environment_int("LOCAL_RANK", 0, low=0)
    if torch.cuda.is_available() and backend in (None, "nccl"):
        device, backend = torch.device("cuda", local_rank), "nccl"
        torch.cuda.set_device(device)
    else:
        device, backend = torch.device("cpu"), backend or "gloo"
    if not dist.is_initialized():
        dist.init_process_group(backend)
    return dist.get_rank(), dist.get_world_size(), device
