# This file is generated from chapters/10-2-training.md by tools/tangle.py. Do not edit it by hand:
# edit the chapter's cells tagged "export", then run `python tools/tangle.py`.
# From chapters/10-2-training.md, section "10.2 Training the ViT, and what it learned".
"""Training a Vision Transformer, and what it learns (chapter 10 of the
course, page 10.2).

* :func:`random_translate` (augmentation); :func:`image_batches` and
  :func:`classification_loss`, which train an image classifier with chapter
  8's :func:`lib.training.train`; :func:`predict_images` and
  :func:`train_image_classifier`, the training itself.
* :func:`vit_run`: the MNIST recipe, whose result has the shape of chapter
  8's recipes; :func:`mnist_vit_sizes` and :data:`SHIPPED_VIT_SIZES` (the
  shipped ``vit-mnist``'s), :func:`mnist_vit_held_out` (its measure) and
  :func:`mnist_vit_files`.
* :func:`confusion_matrix`; :func:`mean_attention_distance` (how far, in
  pixels, each head looks).
* On import it registers the run ``vit-mnist`` and the measure of the model
  kind ``"vit"`` with :mod:`lib.shipped` (``scripts/train_shipped.py``).

Axis names as in :mod:`lib.vit`: ``batch``, ``channels``, ``height``,
``width``; ``tokens`` (the CLS token, then the patches), ``heads``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.nn.functional as F
from einops import einsum, rearrange, reduce
from torch import nn

from lib import _checks as check
from lib.datasets import mnist_split
from lib.models import count_parameters
from lib.runs import wilson_interval
from lib.shipped import HeldOut, ShippedRun, register_held_out, register_shipped_run
from lib.training import (
    WarmupCosineSchedule,
    cross_entropy,
    evaluate,
    make_optimizer,
    make_scheduler,
    train,
)
from lib.utils import autocast, get_device, get_precision, pick
from lib.vit import ViT, ViTConfig

# The public names: every top-level name the export cells define (tools/tangle.py).
__all__ = [
    "random_translate",
    "image_batches",
    "classification_loss",
    "predict_images",
    "train_image_classifier",
    "mnist_vit_held_out",
    "SHIPPED_VIT_SIZES",
    "mnist_vit_sizes",
    "vit_run",
    "mnist_vit_files",
    "confusion_matrix",
    "mean_attention_distance",
]


# From chapters/10-2-training.md, section "Training on MNIST".
def random_translate(
    images: torch.Tensor, max_shift: int, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Shift each image by its own random offset in
    ``-max_shift..max_shift`` pixels, vertically and horizontally, filling
    the uncovered border with zeros.

    ``images`` ``(batch channels height width)`` -> the same shape.
    ``generator`` (on the CPU) makes the shifts reproducible.
    ``max_shift=0`` returns ``images`` itself.
    """
    check.tensor("images", images, "batch c h w", floating=True)
    check.int_at_least("max_shift", max_shift, 0)
    if max_shift == 0:
        return images
    batch, _, height, width = images.shape
    padded = F.pad(images, (max_shift,) * 4)  # zeros around every side
    offsets = torch.randint(0, 2 * max_shift + 1, (2, batch), generator=generator)
    device = images.device
    offsets = offsets.to(device)
    # the rows (batch height) and columns (batch width) each image keeps
    rows = offsets[0, :, None] + torch.arange(height, device=device)
    cols = offsets[1, :, None] + torch.arange(width, device=device)
    index = torch.arange(batch, device=device)[:, None, None]
    # (batch height width channels): advanced indexing puts channels last
    moved = padded[index, :, rows[:, :, None], cols[:, None, :]]
    return rearrange(moved, "b h w c -> b c h w")


# From chapters/10-2-training.md, section "Training on MNIST".
def image_batches(
    images: torch.Tensor,
    labels: torch.Tensor,
    batch_size: int,
    *,
    max_shift: int = 0,
    flip: bool = False,
    mean: float = 0.0,
    std: float = 1.0,
    seed: int = 0,
) -> Callable[[int], dict[str, torch.Tensor]]:
    """``step -> {"images", "labels"}``: the batches
    :func:`lib.training.train` takes.

    ``images`` ``(n channels height width)`` (uint8 pixels, or floats in [0,
    1]) and ``labels`` ``(n,)`` stay on their device. Each step draws
    ``batch_size`` of them at random, shifts them by up to ``max_shift``
    pixels (:func:`random_translate`), mirrors each with probability 1/2
    when ``flip``, and returns ``(x - mean) / std``. The draws depend on
    ``(seed, step)`` only.
    """
    check.tensor("images", images, "n c h w")
    check.tensor("labels", labels, "n", integer=True, n=images.shape[0])
    check.positive_ints(batch_size=batch_size, n_images=images.shape[0])
    check.int_at_least("max_shift", max_shift, 0)
    check.boolean("flip", flip)
    mean = check.finite_float("mean", mean)
    std = check.finite_float("std", std, low=0.0, low_open=True)

    def batch_at(step: int) -> dict[str, torch.Tensor]:
        generator = torch.Generator().manual_seed(seed * 1_000_003 + step)
        index = torch.randint(len(images), (batch_size,), generator=generator)
        x = images[index.to(images.device)]
        x = x.float() / 255 if x.dtype == torch.uint8 else x
        x = random_translate(x, max_shift, generator)
        if flip:
            mirror = torch.rand(batch_size, generator=generator) < 0.5
            x = torch.where(mirror.to(x.device)[:, None, None, None], x.flip(-1), x)
        return {"images": (x - mean) / std, "labels": labels[index.to(labels.device)]}

    return batch_at


def classification_loss(
    model: nn.Module, batch: Mapping[str, torch.Tensor]
) -> torch.Tensor:
    """Cross-entropy of ``model(batch["images"])`` against
    ``batch["labels"]``: the ``loss_fn`` of :func:`lib.training.train` for
    image classifiers."""
    return cross_entropy(model(batch["images"]), batch["labels"])


# From chapters/10-2-training.md, section "Training on MNIST".
@torch.no_grad()
def predict_images(
    model: nn.Module, x: torch.Tensor, mean: float, std: float, batch_size: int = 1000
) -> torch.Tensor:
    """Predicted classes of the images ``x`` (batch channels height width)
    in [0, 1], normalised with ``mean`` and ``std``, on the model's device
    in its precision (:func:`lib.utils.get_precision`)."""
    device = next(model.parameters()).device
    precision = get_precision(device)
    was_training = model.training
    model.eval()
    out = []
    for start in range(0, len(x), batch_size):
        chunk = (x[start : start + batch_size].to(device) - mean) / std
        with autocast(device, precision):
            out.append(model(chunk).argmax(-1).cpu())
    model.train(was_training)
    return torch.cat(out)


def train_image_classifier(
    model: nn.Module,
    train_x: torch.Tensor,
    train_y: torch.Tensor,
    val_x: torch.Tensor,
    val_y: torch.Tensor,
    *,
    steps: int,
    batch_size: int,
    lr: float,
    max_shift: int,
    n_evals: int = 5,
    eval_iters: int | None = None,
    progress: bool | None = None,
) -> dict:
    """Train ``model`` (already on its device) on the images ``train_x`` in
    [0, 1] and their labels, normalised with the training images' mean and
    std: AdamW (weight decay 0.05 on the linear layers' matrices), a linear
    warm-up over the first tenth of the steps, a cosine decay to zero,
    gradients clipped to norm 1, random shifts of up to ``max_shift``
    pixels. ``n_evals`` evaluations of the validation loss (``eval_iters``
    of its batches of 500; None: all). Returns the ``losses``, the
    evaluations ``evals`` (step, loss), the training ``seconds``, the
    validation ``accuracy`` and ``predictions``, and the ``mean`` and
    ``std``."""
    device = next(model.parameters()).device
    mean, std = train_x.mean().item(), train_x.std().item()
    val_batches = [
        {"images": (x - mean) / std, "labels": y}
        for x, y in zip(val_x.to(device).split(500), val_y.to(device).split(500))
    ]
    optimizer = make_optimizer(
        model, lr, weight_decay=0.05, betas=(0.9, 0.999), eps=1e-8
    )
    schedule = WarmupCosineSchedule(max(1, steps // 10), steps, min_ratio=0.0)
    batches = image_batches(
        train_x.to(device),
        train_y.to(device),
        batch_size,
        max_shift=max_shift,
        mean=mean,
        std=std,
    )
    history = train(
        model,
        batches,
        optimizer=optimizer,
        scheduler=make_scheduler(optimizer, schedule),
        n_steps=steps,
        loss_fn=classification_loss,
        eval_batches=val_batches,
        eval_every=max(1, steps // n_evals),
        eval_iters=eval_iters,
        progress=progress,
    )
    predictions = predict_images(model, val_x, mean, std)
    return dict(
        losses=history.losses,
        evals=list(zip(history.eval_steps, history.eval_losses)),
        seconds=history.train_seconds,
        accuracy=(predictions == val_y).float().mean().item(),
        predictions=predictions,
        mean=mean,
        std=std,
    )


def mnist_vit_held_out(model: nn.Module, mean: float, std: float) -> dict:
    """A trained MNIST classifier's held-out measures on the 1,000 images of
    :func:`lib.datasets.mnist_split`, normalised with ``mean`` and ``std``:
    ``val_accuracy`` with its Wilson interval and ``val_loss`` (mean
    cross-entropy per image)."""
    _, _, val_x, val_y = mnist_split()
    predictions = predict_images(model, val_x, mean, std)
    correct = int((predictions == val_y).sum())
    low, high = wilson_interval(correct, len(val_y))
    device = next(model.parameters()).device
    val = [{"images": ((val_x - mean) / std).to(device), "labels": val_y.to(device)}]
    return dict(
        val_accuracy=correct / len(val_y),
        val_accuracy_low=low,
        val_accuracy_high=high,
        val_loss=evaluate(model, val, loss_fn=classification_loss),
        val_images=len(val_y),
    )


# the CPU size of the shipped vit-mnist (lib/data/checkpoints/): sizes over
# the smoke profile's
SHIPPED_VIT_SIZES = dict(
    patch_size=7,
    d_model=96,
    n_layers=4,
    d_ff=None,
    steps=2500,
    batch_size=128,
    lr=2e-3,
    max_shift=2,
)


def mnist_vit_sizes(
    profile: str | None = None, **overrides: object
) -> tuple[ViTConfig, dict]:
    """The MNIST ViT's configuration and training budget in ``profile``
    (default: the active one), any of them overridden (a
    :class:`ViTConfig` field or ``steps``, ``batch_size``, ``lr``,
    ``max_shift``)."""

    def p(**values: object) -> object:
        return pick(**values, profile=profile)

    model = dict(
        image_size=28,
        patch_size=p(smoke=7, full=4),
        n_classes=10,
        d_model=p(smoke=64, full=128),
        n_heads=4,
        n_layers=p(smoke=2, full=6),
        d_ff=p(smoke=64, full=None),  # None: 4 · d_model
        dropout=p(smoke=0.0, full=0.1),
    )
    budget = dict(
        steps=p(smoke=500, full=3_000, dry=1),
        batch_size=p(smoke=64, full=512),
        lr=p(smoke=3e-3, full=1e-3),
        max_shift=p(smoke=0, full=2),
    )
    unknown = sorted(set(overrides) - set(model) - set(budget))
    if unknown:
        raise ValueError(f"mnist_vit_sizes: no size {unknown}")
    for key, value in overrides.items():
        (model if key in model else budget)[key] = value
    return ViTConfig(**model), budget


# From chapters/10-2-training.md, section "Training on MNIST".
def vit_run(
    profile: str | None = None,
    *,
    sizes: Mapping[str, Any] | None = None,
    seed: int = 0,
    device: torch.device | str | None = None,
    progress: bool | None = None,
    n_evals: int = 10,
    eval_iters: int | None = None,
) -> dict[str, Any]:
    """Chapter 10's recipe: a :class:`ViT` of :func:`mnist_vit_sizes`
    (``profile``, ``sizes`` over it), seeded, trained by
    :func:`train_image_classifier` on the 9,000 images of
    :func:`lib.datasets.mnist_split` (``n_evals`` evaluations of
    ``eval_iters`` batches), measured on the 1,000 held out
    (:func:`mnist_vit_held_out`). The result has the shape of chapter 8's
    (:func:`lib.runs.bert_run`): ``metrics``, ``curves`` (``train``,
    ``validation``), ``config`` (the :class:`ViTConfig`), ``samples``
    (None), ``models`` (``vit``) and ``tokenizer`` (None); besides, the
    training ``budget``, the pixel ``mean`` and ``std`` it normalised with,
    and the validation ``predictions``."""
    check.int_at_least("seed", seed, 0, owner="vit_run")
    cfg, budget = mnist_vit_sizes(profile, **dict(sizes or {}))
    device = torch.device(device) if device is not None else get_device()
    torch.manual_seed(seed)
    model = ViT(cfg).to(device)
    run = train_image_classifier(
        model,
        *mnist_split(),
        n_evals=n_evals,
        eval_iters=eval_iters,
        progress=progress,
        **budget,
    )
    mean, std = run["mean"], run["std"]
    metrics = mnist_vit_held_out(model, mean, std) | dict(
        parameters=count_parameters(model),
        train_seconds=run["seconds"],
        steps=budget["steps"],
    )
    steps, losses = zip(*run["evals"])
    train_steps = list(range(1, len(run["losses"]) + 1))
    return {
        "run": "vit",
        "config": cfg,
        "metrics": metrics,
        "curves": {
            "train": dict(step=train_steps, loss=run["losses"]),
            "validation": dict(step=list(steps), loss=list(losses)),
        },
        "samples": None,
        "models": {"vit": model},
        "tokenizer": None,
        "budget": budget,
        "mean": mean,
        "std": std,
        "predictions": run["predictions"],
    }


# From chapters/10-2-training.md, section "Training on MNIST".
def mnist_vit_files(result: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The shipped file of a :func:`vit_run` result, ``vit-mnist``, with
    what a user does to an image first (the pixel mean and std)."""
    pixels = "in [0, 1] (lib.datasets.load_mnist's uint8 / 255), then (x - mean) / std"
    inputs = dict(pixels=pixels, mean=result["mean"], std=result["std"])
    return {
        "vit-mnist": dict(
            model=result["models"]["vit"], metrics=result["metrics"], inputs=inputs
        )
    }


# python scripts/train_shipped.py vit-mnist; its evaluate and intervals
register_shipped_run(
    "vit-mnist",
    ShippedRun(
        vit_run,
        SHIPPED_VIT_SIZES,
        dict(steps=4, d_model=32, n_layers=1),
        "10-vit-mnist-cpu",
        mnist_vit_files,
        extra=lambda result: {
            **result["budget"],
            "mean": result["mean"],
            "std": result["std"],
        },
        checkpoints=False,
    ),
)
register_held_out(
    "vit",
    HeldOut(
        lambda shipped, record: mnist_vit_held_out(
            shipped.model,
            shipped.entry["inputs"]["mean"],
            shipped.entry["inputs"]["std"],
        ),
        "val_accuracy",
        "val_images",
    ),
)


# From chapters/10-2-training.md, section "Where it goes wrong: the confusion matrix".
def _check_confusion_matrix(
    predictions: object, labels: object, n_classes: int
) -> None:
    """Two 1-D integer tensors of one shape, in ``0..n_classes-1``."""
    check.positive_int("n_classes", n_classes)
    for name, t in [("predictions", predictions), ("labels", labels)]:
        if not isinstance(t, torch.Tensor) or t.dim() != 1 or t.is_floating_point():
            raise ValueError(f"{name} must be a 1-D integer tensor, got {t!r:.60}")
        check.ids_in_range(name, t, n_classes)
    if predictions.shape != labels.shape:
        raise ValueError(f"{predictions.shape=} and {labels.shape=} differ")


# From chapters/10-2-training.md, section "Where it goes wrong: the confusion matrix".
def confusion_matrix(
    predictions: torch.Tensor, labels: torch.Tensor, n_classes: int
) -> torch.Tensor:
    """Counts ``(true predicted)``: entry ``[i, j]`` is how many items of
    class ``i`` were predicted as ``j``. ``predictions`` and ``labels``:
    integer ``(batch,)`` in ``0..n_classes-1`` (empty ones give a matrix of
    zeros)."""
    _check_confusion_matrix(predictions, labels, n_classes)
    pairs = labels.long() * n_classes + predictions.long()
    counts = torch.bincount(pairs, minlength=n_classes**2)
    return rearrange(counts, "(true predicted) -> true predicted", true=n_classes)


# From chapters/10-2-training.md, section "How far attention reaches".
def _check_attention_grid(
    weights: object, grid: object, patch_size: float
) -> tuple[int, int]:
    """The grid's ``(rows, columns)``, checked, and ``weights`` of its size
    (the class token first)."""
    if not isinstance(grid, tuple | list) or len(grid) != 2:
        raise TypeError(f"grid must be (rows, columns) of patches, got {grid!r}")
    gh, gw = check.positive_ints(grid_rows=grid[0], grid_columns=grid[1])
    check.finite_float("patch_size", patch_size, low=0, low_open=True)
    tokens = 1 + gh * gw
    hint = (
        f"(batch, heads, {tokens}, {tokens}) for a {gh}×{gw} grid and the class token"
    )
    sizes = dict(q=tokens, k=tokens, hint=hint)
    check.tensor("weights", weights, "batch heads q k", floating=True, **sizes)
    return gh, gw


# From chapters/10-2-training.md, section "How far attention reaches".
def mean_attention_distance(
    weights: torch.Tensor, grid: tuple[int, int], patch_size: int = 1
) -> torch.Tensor:
    """Each head's mean attention distance, in pixels (in patches for
    ``patch_size=1``).

    ``weights`` ``(batch heads tokens tokens)`` with ``tokens = 1 +
    grid_h·grid_w`` (the class token first, ignored: each query patch's
    weights on the key patches are renormalised to sum to one). Returns
    ``(heads,)``: the distance between patch centres weighted by attention,
    averaged over query patches and the batch. A query whose weights on the
    patches are all zero counts as distance 0; NaN in ``weights`` gives NaN
    for its head (the weights are not read to check them).
    """
    gh, gw = _check_attention_grid(weights, grid, patch_size)
    rows, cols = torch.meshgrid(torch.arange(gh), torch.arange(gw), indexing="ij")
    centres = torch.stack([rows.flatten(), cols.flatten()], dim=-1)
    centres = centres.to(weights) * patch_size
    distance = torch.cdist(centres, centres)  # (q_patch k_patch), Euclidean
    patch_weights = weights[:, :, 1:, 1:]
    on_patches = patch_weights.sum(-1, keepdim=True).clamp_min(1e-12)
    patch_weights = patch_weights / on_patches
    per_query = einsum(patch_weights, distance, "b h q k, q k -> b h q")
    return reduce(per_query, "b h q -> h", "mean")
