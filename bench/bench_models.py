"""Benchmark: our GPT against transformers' GPT2LMHeadModel, forward + backward.

The same configuration and the same weights (ours loaded from theirs with
``lib.hf_weights.from_reference``), fp32, on the CPU, dropout off, in training mode: one
training step's compute (logits, cross-entropy, backward) on a batch of ``batch × seq``
tokens. Two shapes, in one run: ``short`` (6 layers, width 384, 6 heads, batch 8 × 256
tokens) and ``long`` (12 layers, width 768, 12 heads, one sequence of 1,024 tokens: GPT-2
small's body), with a vocabulary of 8,192; the shape flags instead time one shape of
their own. Each shape is timed eager and, with ``--compile``, with both models through
``torch.compile`` too.

Repeats alternate between the two models, so that load from other processes falls on
both alike. Prints the median tokens per second of each, and the ratio ours / theirs
(higher = ours faster; targets: ≥ 1.2 at ``short``, ≥ 1.0 at ``long``): the median over
the rounds of each round's ratio, in wall-clock time and in the process's CPU time (the
steadier of the two on a shared machine). The machine's load (``/proc/loadavg``) is
printed before and after each shape. ``--record`` (both shapes, ``--compile``) writes the
figures into ``book/results/07-gpt-speed/metrics.json`` (``lib.utils.write_record``),
the record that page 7.1 states. It never asserts on time.

    python bench/bench_models.py [--compile] [--repeats 5] [--warmup 2] [--threads 2]
        [--record]
    python bench/bench_models.py [--compile] [--layers 6] [--d-model 384] [--heads 6]
        [--seq 256] [--batch 8] [--vocab 8192]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import transformers

from lib.hf_weights import from_reference
from lib.utils import results_dir, seed_everything, write_record

RECORD = "07-gpt-speed"
VOCAB = 8192
SHAPES = {
    "short": dict(layers=6, d_model=384, heads=6, seq=256, batch=8),
    "long": dict(layers=12, d_model=768, heads=12, seq=1024, batch=1),
}
TARGETS = {"short": 1.2, "long": 1.0}


def load_average() -> str:
    """The first three fields of ``/proc/loadavg`` (1, 5 and 15 minutes), or "n/a"."""
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "n/a"


def _loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def _steps(models: dict, ids: torch.Tensor, repeats: int, warmup: int) -> tuple:
    """Wall-clock and CPU seconds per forward+backward step of each model, the models
    alternating."""
    targets = ids.roll(-1, dims=1)

    def step(model) -> None:
        model.zero_grad(set_to_none=True)
        out = model(ids)
        logits = out if isinstance(out, torch.Tensor) else out.logits
        _loss(logits, targets).backward()

    for _ in range(warmup):
        for model in models.values():
            step(model)
    walls = {name: [] for name in models}
    cpus = {name: [] for name in models}
    for _ in range(repeats):
        for name, model in models.items():
            wall, cpu = time.perf_counter(), time.process_time()
            step(model)
            walls[name].append(time.perf_counter() - wall)
            cpus[name].append(time.process_time() - cpu)
    return walls, cpus


def _ratio(times: dict) -> float:
    """The median over the rounds of theirs / ours (higher = ours faster)."""
    return statistics.median(b / a for a, b in zip(times["ours"], times["theirs"]))


def time_shape(shape: dict, vocab: int, args) -> dict:
    """Build both models at ``shape``, time them eager (and compiled), print the
    figures; returns this shape's metrics."""
    seed_everything(0)
    config = transformers.GPT2Config(
        vocab_size=vocab,
        n_positions=shape["seq"],
        n_embd=shape["d_model"],
        n_layer=shape["layers"],
        n_head=shape["heads"],
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    theirs = transformers.GPT2LMHeadModel(config).train()
    ours = from_reference(theirs).train()
    ids = torch.randint(0, vocab, (shape["batch"], shape["seq"]))
    with torch.no_grad():
        difference = (ours(ids) - theirs(ids).logits).abs().max().item()
    tokens = shape["batch"] * shape["seq"]
    print(
        f"GPT {shape['layers']} layers, d_model {shape['d_model']}, "
        f"{shape['heads']} heads, vocab {vocab}, batch {shape['batch']} × seq "
        f"{shape['seq']}; max |Δ logit| ours vs theirs: {difference:.1e}"
    )
    metrics = {"max_abs_logit_difference": difference}
    models = {"ours": ours, "theirs": theirs}
    modes = {"eager": models}
    if args.compile:
        modes["compiled"] = {name: torch.compile(m) for name, m in models.items()}
    for mode, timed in modes.items():
        load_before = load_average()
        walls, cpus = _steps(timed, ids, args.repeats, args.warmup)
        load_after = load_average()
        wall, cpu = _ratio(walls), _ratio(cpus)
        print(f"  {mode} (load before {load_before}, after {load_after})")
        for name, times in walls.items():
            rate = tokens / statistics.median(times)
            spread = max(times) / min(times)
            print(f"    {name:<8}{rate:>10,.0f} tokens/s   (max/min step {spread:.2f})")
        print(f"    ratio ours / theirs: {wall:.2f} wall clock, {cpu:.2f} CPU time")
        metrics |= {
            f"ratio_{mode}": round(wall, 3),
            f"ratio_{mode}_cpu": round(cpu, 3),
            f"tokens_per_s_ours_{mode}": tokens / statistics.median(walls["ours"]),
            f"tokens_per_s_theirs_{mode}": tokens / statistics.median(walls["theirs"]),
            f"load_before_{mode}": load_before,
            f"load_after_{mode}": load_after,
        }
    return metrics


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for flag in ("layers", "d-model", "heads", "seq", "batch"):
        parser.add_argument(f"--{flag}", type=int, help="time one shape of your own")
    parser.add_argument("--vocab", type=int, default=VOCAB)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--compile", action="store_true", help="time compiled too")
    parser.add_argument(
        "--record", action="store_true", help=f"write book/results/{RECORD}/"
    )
    args = parser.parse_args(argv)
    own = {k: getattr(args, k) for k in SHAPES["short"] if getattr(args, k) is not None}
    if args.record and (own or not args.compile or args.vocab != VOCAB):
        parser.error("--record times the two standard shapes, with --compile")
    shapes = {"custom": SHAPES["short"] | own} if own else SHAPES
    began = time.perf_counter()
    torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()
    print(
        f"fp32, CPU, {torch.get_num_threads()} threads; torch {torch.__version__}, "
        f"transformers {transformers.__version__}; median of {args.repeats} rounds"
    )
    metrics = {}
    for name, shape in shapes.items():
        print(f"{name}:", end=" ")
        for key, value in time_shape(shape, args.vocab, args).items():
            metrics[f"{name}_{key}"] = value
    if args.compile and not own:
        print("targets: short ≥ 1.2 eager and compiled; long ≥ 1.0")
    if args.record:
        loads = {k: metrics.pop(k) for k in list(metrics) if "load_" in k}
        path = write_record(
            results_dir() / RECORD,
            name=RECORD,
            command=" ".join(["python", *sys.argv]),
            wall_seconds=time.perf_counter() - began,
            metrics=metrics,
            config={"shapes": SHAPES, "vocab": args.vocab, "targets": TARGETS}
            | {k: getattr(args, k) for k in ("repeats", "warmup", "threads")},
            extra={
                "transformers": transformers.__version__,
                "threads": torch.get_num_threads(),
                "loads": loads,
                "cpu": _cpu_name(),
            },
            device="cpu",
        )
        print(f"recorded: {path}")


def _cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``), or "n/a"."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "n/a"


if __name__ == "__main__":
    main()
