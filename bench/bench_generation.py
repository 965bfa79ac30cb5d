"""Benchmark: greedy decoding, ours against recomputation and against transformers.

One GPT-2-shaped model (learned positions, fp32): a random ``GPT2LMHeadModel`` and our
``GPT`` loaded from it with ``lib.hf_weights.from_reference``, so both compute the same
function. Each generates ``--new`` tokens greedily after a ``--prompt``-token prompt, in
five ways:

* ``ours: generate``: ``lib.generation.generate(temperature=0)``, the KV cache;
* ``ours: bare loop``: a plain Python loop over ``GPT.step`` with trust on
  (``lib._checks.trusting``: no checks of the loop's own tokens) and argmax (the least a
  loop can do with our model);
* ``ours: no cache``: the full forward pass over the whole sequence for every token;
* ``HF: generate``: ``GPT2LMHeadModel.generate(do_sample=False)``;
* ``HF: bare loop``: a plain loop over the reference's cached forward
  (``past_key_values``) and argmax.

All must produce the same tokens. Prints tokens per second of each, the best of
``--repeats`` rounds (the rounds interleave the five, so that load from other processes
falls on all of them alike; the best is the run least disturbed), measured in wall-clock
time and in the process's CPU time (on a shared machine the CPU time is the steadier of
the two), and the ratios of ours to each baseline: the median over the rounds of each
round's ratio, in wall-clock and CPU time. The machine's load (``/proc/loadavg``) is
printed before and after. ``--record`` writes the figures into
``book/results/07-decoding-speed/metrics.json`` (``lib.utils.write_record``), the record
that page 7.4 states. It never asserts on time.

    python bench/bench_generation.py [--new 512] [--prompt 16] [--repeats 5]
        [--d-model 128] [--heads 4] [--layers 4] [--vocab 512] [--threads 1] [--record]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import transformers

from lib import _checks as check
from lib.generation import generate
from lib.hf_weights import from_reference
from lib.models import GPT
from lib.utils import results_dir, seed_everything, write_record

RECORD = "07-decoding-speed"
# (run, label, target) of the ratios of ours: generate against each baseline
BASELINES = (
    ("ours: no cache", "ours without a cache", ">= 8"),
    ("HF: generate", "HF generate", ">= 1"),
    ("HF: bare loop", "a bare loop over HF's forward", ">= 1.5"),
    ("ours: bare loop", "a bare loop over our step", "~ 1"),
)


def _key(name: str) -> str:
    """A run's name as a metric's: "HF: bare loop" -> "hf_bare_loop"."""
    return name.lower().replace(": ", "_").replace(" ", "_")


def load_average() -> str:
    """The first three fields of ``/proc/loadavg`` (1, 5 and 15 minutes), or "n/a"."""
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "n/a"


def greedy_without_cache(model: GPT, prompt: torch.Tensor, n_new: int) -> torch.Tensor:
    """Greedy decoding that recomputes the full forward pass for every new token."""
    ids = prompt
    for _ in range(n_new):
        logits = model(ids)
        ids = torch.cat([ids, logits[:, -1].argmax(dim=-1, keepdim=True)], dim=1)
    return ids


def bare_loop_ours(model: GPT, prompt: torch.Tensor, n_new: int) -> torch.Tensor:
    """Greedy decoding as a bare loop over our cached step."""
    logits, cache = model.step(prompt)
    tokens = [prompt]
    with check.trusting():  # the loop's own tokens: no checks
        for _ in range(n_new - 1):
            tokens.append(logits[:, -1].argmax(dim=-1, keepdim=True))
            logits, cache = model.step(tokens[-1], cache)
    tokens.append(logits[:, -1].argmax(dim=-1, keepdim=True))
    return torch.cat(tokens, dim=1)


def bare_loop_hf(model, prompt: torch.Tensor, n_new: int) -> torch.Tensor:
    """Greedy decoding as a bare loop over the reference's cached forward."""
    out = model(prompt, use_cache=True)
    tokens = [prompt]
    for _ in range(n_new - 1):
        tokens.append(out.logits[:, -1].argmax(dim=-1, keepdim=True))
        out = model(tokens[-1], past_key_values=out.past_key_values, use_cache=True)
    tokens.append(out.logits[:, -1].argmax(dim=-1, keepdim=True))
    return torch.cat(tokens, dim=1)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--new", type=int, default=512, help="tokens to generate")
    parser.add_argument("--prompt", type=int, default=16, help="prompt length")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=512)
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="intra-op threads (0: torch's default); decoding's many small operations "
        "run best on one thread of a shared CPU",
    )
    parser.add_argument(
        "--record", action="store_true", help=f"write book/results/{RECORD}/"
    )
    args = parser.parse_args(argv)
    began = time.perf_counter()
    load_before = load_average()
    if args.threads:
        torch.set_num_threads(args.threads)

    transformers.logging.set_verbosity_error()
    seed_everything(0)
    config = transformers.GPT2Config(
        vocab_size=args.vocab,
        n_positions=args.prompt + args.new,
        n_embd=args.d_model,
        n_layer=args.layers,
        n_head=args.heads,
    )
    theirs = transformers.GPT2LMHeadModel(config).eval()
    ours = from_reference(theirs)
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, args.vocab, (1, args.prompt), generator=gen)
    ones = torch.ones_like(prompt)
    runs = {
        "ours: generate": lambda: generate(ours, prompt, args.new, temperature=0),
        "ours: bare loop": lambda: bare_loop_ours(ours, prompt, args.new),
        "ours: no cache": lambda: greedy_without_cache(ours, prompt, args.new),
        "HF: generate": lambda: theirs.generate(
            prompt,
            attention_mask=ones,
            max_new_tokens=args.new,
            min_new_tokens=args.new,
            do_sample=False,
            pad_token_id=0,
        ),
        "HF: bare loop": lambda: bare_loop_hf(theirs, prompt, args.new),
    }
    walls = {name: [] for name in runs}
    cpus = {name: [] for name in runs}
    outputs = {}
    with torch.inference_mode():
        for run in runs.values():  # warm-up
            run()
        for _ in range(args.repeats):
            for name, run in runs.items():
                start_wall, start_cpu = time.perf_counter(), time.process_time()
                outputs[name] = run()
                walls[name].append(time.perf_counter() - start_wall)
                cpus[name].append(time.process_time() - start_cpu)
    load_after = load_average()
    wall = {name: min(times) for name, times in walls.items()}
    cpu = {name: min(times) for name, times in cpus.items()}
    reference = outputs["HF: bare loop"]
    same = all(torch.equal(out, reference) for out in outputs.values())

    print(
        f"greedy decoding of {args.new} tokens after a {args.prompt}-token prompt; "
        f"GPT-2 shape: d_model={args.d_model}, heads={args.heads}, "
        f"layers={args.layers}, vocab={args.vocab}; fp32, CPU, "
        f"threads={torch.get_num_threads()}; torch {torch.__version__}, "
        f"transformers {transformers.__version__}; best of {args.repeats}"
    )
    print(
        f"same tokens in all five: {same}; load before {load_before}, after {load_after}"
    )
    print(f"  {'':<18}{'tokens/s (wall)':>16}{'tokens/s (CPU)':>16}")
    for name in runs:
        print(
            f"  {name:<18}{args.new / wall[name]:>16.0f}{args.new / cpu[name]:>16.0f}"
        )
    print("  ratios, ours: generate against (median of rounds)  wall     CPU")
    metrics = {f"tokens_per_s_{_key(name)}": args.new / wall[name] for name in runs}
    for name, label, target in BASELINES:
        ratios = [
            statistics.median(
                b / a for a, b in zip(times["ours: generate"], times[name])
            )
            for times in (walls, cpus)
        ]
        print(f"    {label:<46}{ratios[0]:>6.2f}x{ratios[1]:>7.2f}x  (target {target})")
        metrics[f"ratio_{_key(name)}"] = round(ratios[0], 3)
        metrics[f"ratio_{_key(name)}_cpu"] = round(ratios[1], 3)
    if not same:
        raise SystemExit("the five decodings differ: a cache or a loader is wrong")
    if args.record:
        path = write_record(
            results_dir() / RECORD,
            name=RECORD,
            command=" ".join(["python", *sys.argv]),
            wall_seconds=time.perf_counter() - began,
            metrics=metrics,
            config={
                k.replace("_", "-"): v for k, v in vars(args).items() if k != "record"
            },
            extra={
                "transformers": transformers.__version__,
                "threads": torch.get_num_threads(),
                "load_before": load_before,
                "load_after": load_after,
                "same_tokens": same,
            },
            device="cpu",
        )
        print(f"recorded: {path}")


if __name__ == "__main__":
    main()
