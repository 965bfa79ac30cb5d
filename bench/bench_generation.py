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
the two), and the ratios of ours to each baseline. It never asserts on time.

    python bench/bench_generation.py [--new 512] [--prompt 16] [--repeats 5]
        [--d-model 128] [--heads 4] [--layers 4] [--vocab 512] [--threads 1]
"""

from __future__ import annotations

import argparse
import time

import torch
import transformers

from lib import _checks as check
from lib.generation import generate
from lib.hf_weights import from_reference
from lib.models import GPT
from lib.utils import seed_everything


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
    args = parser.parse_args(argv)
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
    wall = {name: float("inf") for name in runs}
    cpu = dict(wall)
    outputs = {}
    with torch.inference_mode():
        for run in runs.values():  # warm-up
            run()
        for _ in range(args.repeats):
            for name, run in runs.items():
                start_wall, start_cpu = time.perf_counter(), time.process_time()
                outputs[name] = run()
                wall[name] = min(wall[name], time.perf_counter() - start_wall)
                cpu[name] = min(cpu[name], time.process_time() - start_cpu)
    reference = outputs["HF: bare loop"]
    same = all(torch.equal(out, reference) for out in outputs.values())

    print(
        f"greedy decoding of {args.new} tokens after a {args.prompt}-token prompt; "
        f"GPT-2 shape: d_model={args.d_model}, heads={args.heads}, "
        f"layers={args.layers}, vocab={args.vocab}; fp32, CPU, "
        f"threads={torch.get_num_threads()}; torch {torch.__version__}, "
        f"transformers {transformers.__version__}; best of {args.repeats}"
    )
    print(f"same tokens in all five: {same}")
    print(f"  {'':<18}{'tokens/s (wall)':>16}{'tokens/s (CPU)':>16}")
    for name in runs:
        print(
            f"  {name:<18}{args.new / wall[name]:>16.0f}{args.new / cpu[name]:>16.0f}"
        )
    ours_wall, ours_cpu = wall["ours: generate"], cpu["ours: generate"]
    print("  ratios, ours: generate against        wall     CPU")
    for name, label, target in (
        ("ours: no cache", "ours without a cache", ">= 5"),
        ("HF: generate", "HF generate", ">= 1"),
        ("HF: bare loop", "a bare loop over HF's forward", ">= 1"),
        ("ours: bare loop", "a bare loop over our step", "~ 1"),
    ):
        print(
            f"    {label:<32}{wall[name] / ours_wall:>6.2f}x"
            f"{cpu[name] / ours_cpu:>7.2f}x  (target {target})"
        )
    if not same:
        raise SystemExit("the five decodings differ: a cache or a loader is wrong")


if __name__ == "__main__":
    main()
