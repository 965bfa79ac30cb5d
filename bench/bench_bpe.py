"""Benchmark of chapter 1: BPE training, lib against Hugging Face `tokenizers`.

    python bench/bench_bpe.py [--repeats 7] [--vocab-sizes 1000 8000 32000] [--record]

Trains a byte-level BPE on the full Tiny Shakespeare (1.1 MB) at each vocabulary size,
with ``lib.tokenizer.BPETokenizer.train`` (pure Python) and with the ``BpeTrainer`` of
``tokenizers`` (Rust, on all the CPUs, its default), like for like: the same text given
as one string, the same pre-tokenization (GPT-2's pattern, no prefix space), the same
256 byte symbols, the same special token and the same vocabulary size. Each time covers
everything from the text to the merges (pre-tokenization and counting included).

``tokenizers`` is also timed on the text given line by line, a different granularity
(no pre-token spans a line break, so its words and merges differ slightly), which lets
it pre-tokenize the lines in parallel; that ratio is printed for information.

The rounds interleave the trainers, so that load from other processes falls on all of
them alike; each round gives a ratio lib / tokenizers per size, and the median of the
rounds is the figure (best times are printed too). The machine's load (``/proc/loadavg``)
is printed before and after. ``--record`` writes the ratios into
``book/results/01-bpe-training/metrics.json`` (``lib.utils.write_record``), the record
that chapter 1 states. Prints figures; asserts nothing about time.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import tokenizers
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from lib.datasets import load_tiny_shakespeare
from lib.tokenizer import BPETokenizer
from lib.utils import results_dir, write_record

SPECIALS = ["<|endoftext|>"]
RECORD = "01-bpe-training"


def load_average() -> str:
    """The first three fields of ``/proc/loadavg`` (1, 5 and 15 minutes), or "n/a"."""
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "n/a"


def train_hf(texts: list[str], vocab_size: int) -> Tokenizer:
    """Byte-level BPE trained by `tokenizers` with lib's settings."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    return tok


def timed(fn):
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7, help="rounds")
    parser.add_argument(
        "--vocab-sizes", type=int, nargs="+", default=[1000, 8000, 32000]
    )
    parser.add_argument(
        "--record", action="store_true", help=f"write book/results/{RECORD}/"
    )
    args = parser.parse_args(argv)
    began = time.perf_counter()

    text = load_tiny_shakespeare()
    lines = text.splitlines(keepends=True)
    megabytes = len(text.encode("utf-8")) / 1e6
    load_before = load_average()
    print(
        f"machine: {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} CPUs; Python {platform.python_version()}, "
        f"tokenizers {tokenizers.__version__}"
    )
    print(
        f"corpus: Tiny Shakespeare, {megabytes:.2f} MB; special tokens {SPECIALS}; "
        f"{args.repeats} rounds; load before: {load_before}"
    )

    runs = {
        "lib": lambda size: BPETokenizer().train(text, size, SPECIALS),
        "tokenizers": lambda size: train_hf([text], size),
        "tokenizers, lines": lambda size: train_hf(lines, size),
    }
    for size in args.vocab_sizes:  # warm-up (imports, caches)
        for run in runs.values():
            run(min(size, 1000))
    seconds = {(name, s): [] for name in runs for s in args.vocab_sizes}
    reached = {}
    for _ in range(args.repeats):
        for size in args.vocab_sizes:
            for name, run in runs.items():
                took, tok = timed(lambda: run(size))  # noqa: B023
                seconds[name, size].append(took)
                reached[name, size] = (
                    tok.vocab_size if name == "lib" else (tok.get_vocab_size())
                )
    load_after = load_average()

    metrics = {}
    print(
        f"\n{'vocab':>7} {'reached':>15} {'lib':>7} {'tokenizers':>11} "
        f"{'ratio':>6} {'lines':>7} {'ratio':>6}"
    )
    for size in args.vocab_sizes:
        ratio = statistics.median(
            a / b for a, b in zip(seconds["lib", size], seconds["tokenizers", size])
        )
        ratio_lines = statistics.median(
            a / b
            for a, b in zip(seconds["lib", size], seconds["tokenizers, lines", size])
        )
        best = {name: min(seconds[name, size]) for name in runs}
        print(
            f"{size:>7} {reached['lib', size]:>7}/{reached['tokenizers', size]:<7} "
            f"{best['lib']:>6.3f}s {best['tokenizers']:>10.3f}s {ratio:>5.2f}x "
            f"{best['tokenizers, lines']:>6.3f}s {ratio_lines:>5.2f}x"
        )
        metrics[f"ratio_{size}"] = round(ratio, 3)
        metrics[f"ratio_lines_{size}"] = round(ratio_lines, 3)
        for name, key in (
            ("lib", "lib"),
            ("tokenizers", "hf"),
            ("tokenizers, lines", "hf_lines"),
        ):
            metrics[f"seconds_{key}_{size}"] = round(
                statistics.median(seconds[name, size]), 4
            )
    print(
        "ratio: lib / tokenizers, the median of the rounds' ratios (target <= 1); "
        "times: best of the rounds"
    )
    print(f"load after: {load_after}")

    if args.record:
        path = write_record(
            results_dir() / RECORD,
            name=RECORD,
            command=" ".join(["python", *sys.argv]),
            wall_seconds=time.perf_counter() - began,
            metrics=metrics,
            config={
                "vocab_sizes": args.vocab_sizes,
                "special_tokens": SPECIALS,
                "repeats": args.repeats,
                "corpus": "Tiny Shakespeare",
                "megabytes": round(megabytes, 3),
            },
            extra={
                "tokenizers": tokenizers.__version__,
                "load_before": load_before,
                "load_after": load_after,
                "cpus": os.cpu_count(),
                "machine": platform.processor() or platform.machine(),
                "vocab_reached": {
                    str(size): {
                        "lib": reached["lib", size],
                        "tokenizers": reached["tokenizers", size],
                    }
                    for size in args.vocab_sizes
                },
            },
            device="cpu",
        )
        print(
            f"recorded: {path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path}"
        )


if __name__ == "__main__":
    main()
