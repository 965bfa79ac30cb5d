"""Benchmark: our GPT against transformers' GPT2LMHeadModel, forward + backward.

The same configuration and the same weights (ours loaded from theirs with
``lib.hf_weights.from_reference``), fp32, on the CPU, dropout off: one training step's
compute (logits, cross-entropy, backward) on a batch of ``batch × seq`` tokens. Prints
the median tokens per second of each and the ratio ours / theirs (target ≥ 1.0); with
``--compile``, both models are also run through ``torch.compile``. Repeats alternate
between the two models, so that load from other processes falls on both alike. It never
asserts on time.

    python bench/bench_models.py [--compile] [--layers 6] [--d-model 384] [--heads 6]
        [--seq 256] [--batch 8] [--vocab 8192] [--repeats 5] [--warmup 2] [--threads 2]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F
import transformers

from lib.hf_weights import from_reference
from lib.utils import seed_everything


def _loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def _steps(models: dict, ids: torch.Tensor, repeats: int, warmup: int) -> dict:
    """Seconds per forward+backward step of each model, alternating between them."""
    targets = ids.roll(-1, dims=1)

    def step(model) -> None:
        model.zero_grad(set_to_none=True)
        out = model(ids)
        logits = out if isinstance(out, torch.Tensor) else out.logits
        _loss(logits, targets).backward()

    for _ in range(warmup):
        for model in models.values():
            step(model)
    times = {name: [] for name in models}
    for _ in range(repeats):
        for name, model in models.items():
            start = time.perf_counter()
            step(model)
            times[name].append(time.perf_counter() - start)
    return times


def _report(label: str, times: dict, tokens: int) -> None:
    rates = {name: tokens / statistics.median(t) for name, t in times.items()}
    print(f"{label}")
    for name, rate in rates.items():
        spread = max(times[name]) / min(times[name])
        print(f"  {name:<16}{rate:>10,.0f} tokens/s   (max/min step time {spread:.2f})")
    print(f"  ratio ours / theirs: {rates['ours'] / rates['theirs']:.2f}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--d-model", type=int, default=384)
    parser.add_argument("--heads", type=int, default=6)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--compile", action="store_true", help="time compiled too")
    args = parser.parse_args(argv)

    torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()
    seed_everything(0)
    config = transformers.GPT2Config(
        vocab_size=args.vocab,
        n_positions=args.seq,
        n_embd=args.d_model,
        n_layer=args.layers,
        n_head=args.heads,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    theirs = transformers.GPT2LMHeadModel(config).train()
    ours = from_reference(theirs).train()
    ids = torch.randint(0, args.vocab, (args.batch, args.seq))
    with torch.no_grad():
        difference = (ours(ids) - theirs(ids).logits).abs().max().item()
    tokens = args.batch * args.seq
    print(
        f"GPT {args.layers} layers, d_model {args.d_model}, {args.heads} heads, "
        f"vocab {args.vocab}, batch {args.batch} × seq {args.seq}; fp32, CPU, "
        f"{torch.get_num_threads()} threads; torch {torch.__version__}, "
        f"transformers {transformers.__version__} "
        f"(attention: {theirs.config._attn_implementation})"
    )
    print(f"max |Δ logit| ours vs theirs: {difference:.1e}")
    models = {"ours": ours, "theirs": theirs}
    _report("eager", _steps(models, ids, args.repeats, args.warmup), tokens)
    if args.compile:
        compiled = {name: torch.compile(model) for name, model in models.items()}
        _report("compiled", _steps(compiled, ids, args.repeats, args.warmup), tokens)


if __name__ == "__main__":
    main()
