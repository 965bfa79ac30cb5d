"""Benchmark: chapter 8's training step for the character GPT (sizes from
``lib.runs.run_sizes``), with and without activation checkpointing and ``torch.compile``,
and with PyTorch's default AdamW (not fused) in place of ``make_optimizer``'s fused one.

For each configuration prints milliseconds per optimiser step (median after a warm-up),
tokens per second, the model FLOPs utilisation on a GPU that ``lib.efficiency.peak_flops``
knows, and the peak memory on CUDA; then the ratios against the eager run without
checkpointing. The step timed is ``lib.training.train``'s own (not a copy of it): one call
of ``train`` runs the warm-up and the timed steps, and the time of a step is the time
between two calls of its ``batches`` (the device synchronised at each), so it holds all
``train`` does in a step (autocast from ``lib.utils.get_precision``, our cross-entropy,
clipping, fused AdamW on a GPU, the finiteness checks) and the loss is read only at the
end. It never asserts on time.

    python bench/bench_training.py [--profile smoke|colab|full] [--steps 10]
        [--warmup 3] [--compile] [--threads N]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from lib.efficiency import (
    enable_activation_checkpointing,
    peak_flops,
    training_flops_per_token,
)
from lib.models import GPT, TransformerConfig
from lib.runs import run_sizes
from lib.training import make_optimizer, train
from lib.utils import PROFILES, get_device, get_precision, get_profile, seed_everything


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(
    cfg,
    sizes,
    device,
    *,
    checkpointing: bool,
    compiled: bool,
    steps: int,
    warmup: int,
    fused: bool | None = None,
):
    seed_everything(0)
    model = GPT(cfg).to(device)
    if checkpointing:
        enable_activation_checkpointing(model)
    optimizer = make_optimizer(
        model, sizes["lr"], betas=(0.9, 0.99), eps=1e-8, fused=fused
    )
    ids = torch.randint(0, cfg.vocab_size, (sizes["batch_size"], sizes["seq_len"] + 1))
    batch = {"inputs": ids[:, :-1], "targets": ids[:, 1:]}  # on the CPU, as train takes
    n_steps = warmup + steps
    began: list[float] = []  # when each step began: when train asked for its batch

    def batches(step: int) -> dict:
        _sync(device)  # the previous step's work is done
        if step == warmup and device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        began.append(time.perf_counter())
        return batch

    train(
        model,
        batches,
        optimizer=optimizer,
        n_steps=n_steps,
        compile=compiled,
        log_every=n_steps,  # the loss is read at the last step only
        progress=False,
    )
    _sync(device)
    began.append(time.perf_counter())
    times = [
        after - before for before, after in zip(began[warmup:], began[warmup + 1 :])
    ]
    seconds = statistics.median(times)
    tokens_per_second = sizes["batch_size"] * sizes["seq_len"] / seconds
    result = {"ms": 1000 * seconds, "tokens_per_second": tokens_per_second}
    peak = peak_flops(device)
    if peak is not None:
        flops = training_flops_per_token(model, sizes["seq_len"]) * tokens_per_second
        result["mfu"] = flops / peak
    if device.type == "cuda":
        result["peak_memory_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", choices=PROFILES, default=None)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument(
        "--compile", action="store_true", help="also time torch.compile"
    )
    parser.add_argument("--threads", type=int, default=None, help="CPU threads")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    profile = args.profile or get_profile()
    sizes = run_sizes("gpt", profile)
    device = get_device()
    cfg = TransformerConfig(
        vocab_size=65,
        d_model=sizes["d_model"],
        n_heads=sizes["n_heads"],
        n_layers=sizes["n_layers"],
        max_len=sizes["seq_len"],
        dropout=sizes["dropout"],
    )
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(
        f"character GPT, {profile} sizes ({sizes['n_layers']} layers, {sizes['d_model']} "
        f"wide, batch {sizes['batch_size']} x {sizes['seq_len']}), {name}, "
        f"{get_precision(device).name}, torch {torch.__version__}"
    )
    baseline = None
    # (compiled, checkpointing, fused); fused=False: PyTorch's default AdamW
    compiles = (False, True) if args.compile else (False,)
    runs = [(c, ckpt, None) for c in compiles for ckpt in (False, True)]
    for compiled, checkpointing, fused in [*runs, (False, False, False)]:
        result = measure(
            cfg,
            sizes,
            device,
            checkpointing=checkpointing,
            compiled=compiled,
            steps=args.steps,
            warmup=args.warmup,
            fused=fused,
        )
        baseline = baseline or result
        label = f"{'compiled' if compiled else 'eager':>8}, checkpointing {checkpointing!s:>5}"
        label += ", AdamW not fused" if fused is False else ""
        line = f"{label}: {result['ms']:8.1f} ms/step  {result['tokens_per_second']:>10,.0f} tok/s"
        line += f"  x{baseline['ms'] / result['ms']:.2f} speed"
        if "mfu" in result:
            line += f"  MFU {100 * result['mfu']:.1f}%"
        if "peak_memory_gib" in result:
            ratio = result["peak_memory_gib"] / baseline["peak_memory_gib"]
            line += f"  peak {result['peak_memory_gib']:.2f} GiB (x{ratio:.2f})"
        print(line)


if __name__ == "__main__":
    main()
