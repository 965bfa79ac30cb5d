"""Benchmark of chapter 1: training and encoding with lib's BPE against Hugging Face `tokenizers`.

    python bench/bench_tokenizer.py [--repeats 3] [--vocab-size 1000]

Trains a byte-level BPE with a vocabulary of 1,000 on the full Tiny Shakespeare, once with
``lib.tokenizer.BPETokenizer`` (pure Python) and once with ``tokenizers`` (Rust, ByteLevel BPE,
the same GPT-2 pre-tokenization), in the same run, and prints the best time of each, their
ratio, and the encoding throughput of both. Prints figures; asserts nothing about time.
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from collections.abc import Callable
from typing import Any

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from lib.datasets import load_tiny_shakespeare
from lib.tokenizer import BPETokenizer, chars_per_token


def best_time(fn: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    """The shortest wall time of ``repeats`` calls of ``fn``, and the last result."""
    best, result = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result


def train_hf(texts: list[str], vocab_size: int) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(texts, trainer)
    return tok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--vocab-size", type=int, default=1000)
    args = parser.parse_args()

    text = load_tiny_shakespeare()
    megabytes = len(text.encode("utf-8")) / 1e6
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}"
    )
    print(
        f"corpus: Tiny Shakespeare, {len(text):,} characters ({megabytes:.2f} MB); "
        f"vocab_size={args.vocab_size}; best of {args.repeats}"
    )

    lib_train, lib_tok = best_time(
        lambda: BPETokenizer().train(text, args.vocab_size), args.repeats
    )
    lines = text.splitlines(keepends=True)
    hf_train, hf_tok = best_time(
        lambda: train_hf([text], args.vocab_size), args.repeats
    )
    hf_train_lines, _ = best_time(
        lambda: train_hf(lines, args.vocab_size), args.repeats
    )
    hf_best = min(hf_train, hf_train_lines)
    print("\ntraining")
    print(f"  lib.tokenizer.BPETokenizer          : {lib_train:6.2f} s")
    print(f"  tokenizers ByteLevel BPE, one string: {hf_train:6.2f} s")
    print(f"  tokenizers ByteLevel BPE, lines     : {hf_train_lines:6.2f} s")
    print(f"  ratio lib / fastest tokenizers      : {lib_train / hf_best:6.2f}x")

    def lib_encode_cold() -> list[int]:
        lib_tok._cache.clear()
        return lib_tok.encode(text)

    lib_cold, lib_ids = best_time(lib_encode_cold, args.repeats)
    lib_warm, _ = best_time(lambda: lib_tok.encode(text), args.repeats)
    hf_enc, hf_encoding = best_time(lambda: hf_tok.encode(text), args.repeats)
    hf_batch, hf_batches = best_time(lambda: hf_tok.encode_batch(lines), args.repeats)
    hf_batch_tokens = sum(len(e.ids) for e in hf_batches)
    assert lib_tok.decode(lib_ids) == text  # correctness, not timing
    print("\nencoding the full text")
    for name, seconds, n_tokens in [
        ("lib, empty word cache", lib_cold, len(lib_ids)),
        ("lib, warm word cache", lib_warm, len(lib_ids)),
        ("tokenizers, one string", hf_enc, len(hf_encoding.ids)),
        ("tokenizers, batch of lines", hf_batch, hf_batch_tokens),
    ]:
        print(
            f"  {name:<26}: {seconds:6.3f} s  {megabytes / seconds:6.2f} MB/s  "
            f"{n_tokens / seconds / 1e6:5.2f} M tokens/s  ({n_tokens:,} tokens)"
        )
    print(
        f"  characters per token: lib {chars_per_token(text, lib_ids):.3f}, "
        f"tokenizers {chars_per_token(text, hf_encoding.ids):.3f}"
    )


if __name__ == "__main__":
    main()
