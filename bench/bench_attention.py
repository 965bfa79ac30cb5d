"""Benchmark: lib's MultiHeadAttention (SDPA backend) against torch.nn.MultiheadAttention.

Forward and backward of self-attention at batch 8, length 256, d_model 256, 8 heads, fp32, on
the best device here (CUDA, MPS, then the CPU; TFS_DEVICE forces one). Prints the median of several repeats after a
warm-up, and the ratio lib / torch; it never asserts on time.

    python bench/bench_attention.py [--repeats 20] [--batch 8] [--seq 256] [--d-model 256] [--heads 8]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from lib.attention import MultiHeadAttention
from lib.utils import get_device, seed_everything


def _time_step(module, x, run, repeats: int, warmup: int) -> list[float]:
    def step():
        module.zero_grad(set_to_none=True)
        run(module, x).sum().backward()

    for _ in range(warmup):
        step()
    times = []
    for _ in range(repeats):
        if x.device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        step()
        if x.device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return times


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    args = parser.parse_args(argv)

    seed_everything(0)
    device = get_device()
    ours = MultiHeadAttention(args.d_model, args.heads, backend="sdpa").to(device)
    theirs = torch.nn.MultiheadAttention(args.d_model, args.heads, batch_first=True).to(
        device
    )
    with torch.no_grad():  # the same weights, so both compute the same function
        ours.qkv_proj.weight.copy_(theirs.in_proj_weight)
        ours.qkv_proj.bias.copy_(theirs.in_proj_bias)
        ours.out_proj.weight.copy_(theirs.out_proj.weight)
        ours.out_proj.bias.copy_(theirs.out_proj.bias)
    x = torch.randn(
        args.batch, args.seq, args.d_model, device=device, requires_grad=True
    )

    run_ours = lambda module, x: module(x)
    run_theirs = lambda module, x: module(x, x, x, need_weights=False)[0]
    gap = (run_ours(ours, x) - run_theirs(theirs, x)).abs().max().item()

    results = {}
    # Interleave the two in rounds so that load from other processes hits both alike.
    rounds = 4
    per_round = max(1, args.repeats // rounds)
    samples = {"lib MultiHeadAttention (sdpa)": [], "torch.nn.MultiheadAttention": []}
    for _ in range(rounds):
        samples["lib MultiHeadAttention (sdpa)"] += _time_step(
            ours, x, run_ours, per_round, args.warmup
        )
        samples["torch.nn.MultiheadAttention"] += _time_step(
            theirs, x, run_theirs, per_round, args.warmup
        )
    for name, times in samples.items():
        results[name] = statistics.median(times)

    print(
        f"self-attention forward+backward, batch={args.batch}, seq={args.seq}, "
        f"d_model={args.d_model}, heads={args.heads}, fp32, device={device}, "
        f"threads={torch.get_num_threads()}, torch {torch.__version__}"
    )
    print(f"max |lib - torch| on the outputs: {gap:.1e}")
    for name, seconds in results.items():
        print(f"  {name:<32} {1e3 * seconds:8.2f} ms  (median of {len(samples[name])})")
    ratio = (
        results["lib MultiHeadAttention (sdpa)"]
        / results["torch.nn.MultiheadAttention"]
    )
    print(f"  ratio lib / torch: {ratio:.3f}  (target: <= 1.1)")


if __name__ == "__main__":
    main()
