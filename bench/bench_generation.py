"""Benchmark: greedy decoding with the KV cache against recomputing the whole sequence.

A small GPT (learned positions, fp32) generates ``--new`` tokens greedily from a short
prompt, twice: with ``lib.generation.generate`` (the prompt once, then one token per
``step`` against the cache) and with a plain loop that runs the full forward pass on the
whole sequence for every new token. Both must produce the same tokens. Prints tokens per
second for each, the median of several rounds (interleaved, so that load from other
processes hits both alike), and the ratio; it never asserts on time. Target: >= 5x.

    python bench/bench_generation.py [--new 512] [--prompt 16] [--rounds 3]
        [--d-model 128] [--heads 4] [--layers 4] [--vocab 512] [--threads 0]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from lib.generation import generate
from lib.models import GPT, TransformerConfig
from lib.utils import get_device, seed_everything


def greedy_without_cache(model: GPT, prompt: torch.Tensor, n_new: int) -> torch.Tensor:
    """Greedy decoding that recomputes the full forward pass for every new token."""
    ids = prompt
    for _ in range(n_new):
        logits = model(ids)
        ids = torch.cat([ids, logits[:, -1].argmax(dim=-1, keepdim=True)], dim=1)
    return ids


def _timed(run) -> tuple[float, torch.Tensor]:
    start = time.perf_counter()
    out = run()
    if out.device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start, out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--new", type=int, default=512, help="tokens to generate")
    parser.add_argument("--prompt", type=int, default=16, help="prompt length")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=512)
    parser.add_argument(
        "--threads", type=int, default=0, help="intra-op threads (0: torch's default)"
    )
    args = parser.parse_args(argv)
    if args.threads:
        # On a CPU shared with other work, one thread is often faster for decoding's
        # many small operations: each parallel region waits for the slowest thread.
        torch.set_num_threads(args.threads)

    seed_everything(0)
    device = get_device()
    config = TransformerConfig(
        vocab_size=args.vocab,
        d_model=args.d_model,
        n_heads=args.heads,
        n_layers=args.layers,
        max_len=args.prompt + args.new,
        positions="learned",
    )
    model = GPT(config).to(device).eval()
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, args.vocab, (1, args.prompt), generator=gen).to(device)

    def cached() -> torch.Tensor:
        return generate(model, prompt, args.new, temperature=0)

    def uncached() -> torch.Tensor:
        return greedy_without_cache(model, prompt, args.new)

    runs = {
        "with the KV cache (generate)": cached,
        "without a cache (full forward)": uncached,
    }
    seconds: dict[str, list[float]] = {name: [] for name in runs}
    outputs = {}
    with torch.inference_mode():
        generate(model, prompt, 8, temperature=0)  # warm-up
        greedy_without_cache(model, prompt, 8)
        for _ in range(args.rounds):
            for name, run in runs.items():
                elapsed, outputs[name] = _timed(run)
                seconds[name].append(elapsed)
    first, second = outputs.values()
    same = torch.equal(first, second)

    n_params = sum(p.numel() for p in model.parameters())
    print(
        f"greedy decoding of {args.new} tokens after a {args.prompt}-token prompt; GPT "
        f"d_model={args.d_model}, heads={args.heads}, layers={args.layers}, "
        f"vocab={args.vocab} ({n_params / 1e6:.2f} M parameters), fp32, "
        f"device={device}, threads={torch.get_num_threads()}, torch {torch.__version__}"
    )
    print(f"same tokens with and without the cache: {same}")
    speed = {}
    for name, times in seconds.items():
        speed[name] = args.new / statistics.median(times)
        print(
            f"  {name:<32} {speed[name]:9.1f} tokens/s  "
            f"(median of {len(times)}: {statistics.median(times):.2f} s)"
        )
    cached, uncached = speed.values()
    print(f"  ratio cached / uncached: {cached / uncached:.1f}x  (target: >= 5x)")
    if not same:
        raise SystemExit("the cached and uncached tokens differ: the cache is wrong")


if __name__ == "__main__":
    main()
