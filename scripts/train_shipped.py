"""Train and package the small checkpoints the course ships, on a CPU, with its own code.

Two models come with ``lib`` (``lib/data/checkpoints``, loaded by
:func:`lib.pretrained.load_shipped`), so that every reader, on any machine, can see a
transformer that works:

* ``char-gpt-shakespeare``: chapter 8's character-level GPT on Tiny Shakespeare, trained
  by chapter 8's own command (``python -m lib.runs``, which writes its record), then
  packaged from its last checkpoint by ``char-gpt``;
* ``vit-mnist``: chapter 10's ViT on the shipped MNIST split (9,000 images to train on,
  1,000 held out, the chapter's split), trained and packaged by ``vit-mnist``.

    python -m lib.runs --run gpt --profile smoke --name 08-training-gpt-cpu \\
        --steps 4000 --set d_model=128 --set n_heads=4 --set n_layers=4 \\
        --set seq_len=128 --set batch_size=32 --set lr=0.002 --set warmup=100 \\
        --set eval_every=500 --set eval_iters=20 --checkpoint-dir RUN_DIR --quiet
    python scripts/train_shipped.py char-gpt --checkpoint-dir RUN_DIR
    python scripts/train_shipped.py vit-mnist --steps 2500 --patch-size 7 --d-model 96 \\
        --n-layers 4

(the shipped ViT's sizes: the script's defaults make another, larger one). Each writes
a record under ``book/results/`` (:func:`lib.utils.write_record`) and the checkpoint with
its sha256 in ``lib/data/checkpoints/manifest.json``. ``--dry-run``
trains for a few steps into a temporary folder (the tests run it).
"""

from __future__ import annotations

import argparse
import shlex
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from lib.datasets import load_mnist, load_tiny_shakespeare  # noqa: E402
from lib.models import GPT, TransformerConfig  # noqa: E402
from lib.pretrained import CHECKPOINTS, save_shipped  # noqa: E402
from lib.tokenizer import CharTokenizer  # noqa: E402
from lib.training import (  # noqa: E402
    WarmupCosineSchedule,
    load_checkpoint,
    make_optimizer,
    make_scheduler,
    train,
)
from lib.utils import read_record, set_threads, write_record  # noqa: E402
from lib.vit import ViT, ViTConfig, classification_loss, image_batches  # noqa: E402

RESULTS = ROOT / "book" / "results"
GPT_RECORD = RESULTS / "08-training-gpt-cpu"
VIT_RECORD = RESULTS / "10-vit-mnist-cpu"


def mnist_split(n_val: int = 1_000):
    """Chapter 10's split of the shipped MNIST images: (train_x, train_y, val_x, val_y),
    images ``(n 1 28 28)`` in [0, 1]."""
    images_u8, labels = load_mnist()
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(0))
    train_idx, val_idx = order[n_val:], order[:n_val]
    images = images_u8.float().div(255).unsqueeze(1)
    return images[train_idx], labels[train_idx], images[val_idx], labels[val_idx]


def _relative(path: Path) -> str:
    """``path`` from the repository's root when it is inside it (records move with it)."""
    path = path.resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


@torch.no_grad()
def accuracy(model: torch.nn.Module, x, y, mean: float, std: float) -> float:
    model.eval()
    predictions = torch.cat([model((c - mean) / std).argmax(-1) for c in x.split(500)])
    model.train()
    return (predictions == y).float().mean().item()


def train_vit(args: argparse.Namespace, out: Path, shipped_dir: Path | None) -> dict:
    train_x, train_y, val_x, val_y = mnist_split()
    mean, std = train_x.mean().item(), train_x.std().item()
    cfg = ViTConfig(
        image_size=28,
        patch_size=args.patch_size,
        n_classes=10,
        d_model=args.d_model,
        n_heads=4,
        n_layers=args.n_layers,
        dropout=args.dropout,
    )
    torch.manual_seed(args.seed)
    model = ViT(cfg)
    optimizer = make_optimizer(model, args.lr, weight_decay=0.05, betas=(0.9, 0.999))
    schedule = WarmupCosineSchedule(max(1, args.steps // 20), args.steps, min_ratio=0.0)
    batches = image_batches(
        train_x, train_y, args.batch_size, max_shift=2, mean=mean, std=std
    )
    val = [{"images": (val_x - mean) / std, "labels": val_y}]
    began = time.time()
    history = train(
        model,
        batches,
        optimizer=optimizer,
        scheduler=make_scheduler(optimizer, schedule),
        n_steps=args.steps,
        loss_fn=classification_loss,
        eval_batches=val,
        eval_every=max(1, args.steps // 10),
        progress=not args.quiet,
    )
    val_accuracy = accuracy(model, val_x, val_y, mean, std)
    metrics = dict(
        val_accuracy=val_accuracy,
        val_loss=history.eval_losses[-1],
        parameters=sum(p.numel() for p in model.parameters()),
        train_seconds=history.train_seconds,
        steps=args.steps,
        threads=torch.get_num_threads(),
    )
    write_record(
        out,
        name=out.name,
        command=f"python scripts/train_shipped.py {shlex.join(sys.argv[1:])}",
        wall_seconds=time.time() - began,
        metrics=metrics,
        curves={
            "train": dict(step=list(range(1, args.steps + 1)), loss=history.losses),
            "validation": dict(step=history.eval_steps, loss=history.eval_losses),
        },
        config=cfg,
        extra=dict(
            batch_size=args.batch_size, lr=args.lr, max_shift=2, mean=mean, std=std
        ),
        device="cpu",
    )
    save_shipped(
        model,
        "vit-mnist",
        metrics=metrics,
        # what a user must do to an image before the model reads it
        inputs=dict(
            pixels="in [0, 1] (lib.datasets.load_mnist's uint8 / 255), then "
            "(x - mean) / std",
            mean=mean,
            std=std,
        ),
        record=_relative(out / "metrics.json"),
        command=f"python scripts/train_shipped.py {shlex.join(sys.argv[1:])}",
        directory=shipped_dir or CHECKPOINTS,
    )
    print(f"vit-mnist: {metrics} -> {out}")
    return metrics


def package_char_gpt(args: argparse.Namespace, shipped_dir: Path | None) -> dict:
    """Package the last checkpoint of chapter 8's char-GPT run with its record."""
    record = read_record(args.record)
    sizes = record["config"]["sizes"]
    cfg = TransformerConfig(**record["config"]["model"])
    model = GPT(cfg)
    newest = sorted(Path(args.checkpoint_dir).glob("step-*.pt"))[-1]
    step = load_checkpoint(newest, model=model, restore_rng=False)["step"]
    if step != sizes["n_steps"]:
        raise SystemExit(f"{newest} is step {step}, the run had {sizes['n_steps']}")
    tokenizer = CharTokenizer(load_tiny_shakespeare())
    if tokenizer.vocab_size != cfg.vocab_size:
        raise SystemExit("the tokenizer does not match the run's vocabulary")
    metrics = {k: record["metrics"][k] for k in ("val_loss", "parameters")}
    metrics |= dict(train_seconds=record["metrics"]["train_seconds"], steps=step)
    save_shipped(
        model,
        "char-gpt-shakespeare",
        tokenizer=tokenizer,
        metrics=metrics,
        record=_relative(Path(args.record) / "metrics.json"),
        command=record["command"],
        directory=shipped_dir or CHECKPOINTS,
    )
    print(f"char-gpt-shakespeare: {metrics}")
    return metrics


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="model", required=True)
    vit = sub.add_parser("vit-mnist", help="train and package the MNIST ViT")
    vit.add_argument("--steps", type=int, default=3000)
    vit.add_argument("--batch-size", type=int, default=128)
    vit.add_argument("--lr", type=float, default=2e-3)
    vit.add_argument("--patch-size", type=int, default=4)
    vit.add_argument("--d-model", type=int, default=64)
    vit.add_argument("--n-layers", type=int, default=4)
    vit.add_argument("--dropout", type=float, default=0.0)
    vit.add_argument("--seed", type=int, default=0)
    gpt = sub.add_parser("char-gpt", help="package chapter 8's char-GPT run")
    gpt.add_argument("--checkpoint-dir", type=Path, required=True)
    gpt.add_argument("--record", type=Path, default=GPT_RECORD)
    for each in (vit, gpt):
        each.add_argument("--quiet", action="store_true")
        each.add_argument(
            "--dry-run",
            action="store_true",
            help="a few steps; the record and checkpoint go to --scratch",
        )
        each.add_argument(
            "--scratch", type=Path, help="the dry run's folder (default: a new one)"
        )
    args = parser.parse_args(argv)
    set_threads()
    if args.dry_run:
        scratch = args.scratch or Path(tempfile.mkdtemp(prefix="shipped-"))
        if args.model == "vit-mnist":
            args.steps = 4
            return train_vit(args, scratch / VIT_RECORD.name, scratch / "checkpoints")
        return package_char_gpt(args, scratch / "checkpoints")
    if args.model == "vit-mnist":
        return train_vit(args, VIT_RECORD, None)
    return package_char_gpt(args, None)


if __name__ == "__main__":
    main()
