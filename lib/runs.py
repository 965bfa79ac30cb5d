# This file is generated from chapters/08-3-runs.md by tools/tangle.py. Do not edit it by hand:
# edit the chapter's cells tagged "export", then run `python tools/tangle.py`.
# From chapters/08-3-runs.md, section "Three runs".
"""Chapter 8's three runs, trained with :mod:`lib.training` on the course's
data.

* Sizes: :func:`run_sizes`, by profile with :func:`lib.utils.pick`, any of
  them overridden.
* Runs: :func:`char_gpt_run` (Tiny Shakespeare; its final held-out loss
  :func:`char_gpt_val_loss`), :func:`bert_run` (six books, with
  :class:`lib.models.SequenceClassifier`), :func:`t5_run` (English to
  French, split by :func:`split_pairs_by_source`). Text becomes ids with
  chapter 1's ``CharTokenizer``; special tokens take the ids after its
  characters. Each run returns plain data: ``run``, ``config``,
  ``metrics``, ``curves`` and ``samples``.
* Cost: :func:`run_flops`, :func:`estimate_run_seconds`.
* :func:`main`: ``python -m lib.runs --run gpt|bert|t5``, or ``torchrun
  --standalone --nproc_per_node=N -m lib.runs -- --run ...``; the record is
  written by :func:`lib.utils.write_record`.
"""

from __future__ import annotations

import argparse
import ast
import copy
import math
import os
import random
import re
import shlex
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.utils.rnn import pad_sequence

from lib import _checks as check
from lib.batches import Batch, lm_batches, lm_eval_batches, step_generator
from lib.datasets import load_gutenberg, load_tatoeba_pairs, load_tiny_shakespeare
from lib.efficiency import (
    distributed_setup,
    gpu_seconds,
    peak_flops,
    training_flops_per_token,
)
from lib.generation import generate, translate
from lib.models import (
    BERT,
    GPT,
    T5,
    SequenceClassifier,
    TransformerConfig,
    count_parameters,
)
from lib.objectives import IGNORE_INDEX, masked_lm_batch
from lib.tokenizer import BPETokenizer, CharTokenizer
from lib.training import (
    TrainHistory,
    WarmupCosineSchedule,
    evaluate,
    make_optimizer,
    make_scheduler,
    model_loss,
    train,
)
from lib.utils import (
    PROFILE_ENV,
    PROFILES,
    get_device,
    get_precision,
    get_profile,
    is_dry,
    pick,
    write_record,
)

# The public names: every top-level name the export cells define (tools/tangle.py).
__all__ = [
    "RUNS",
    "NANOGPT_VAL_LOSS",
    "run_sizes",
    "seconds_to_loss",
    "split_pairs_by_source",
    "shakespeare_ids",
    "char_gpt_val_loss",
    "RecipeChange",
    "char_gpt_run",
    "char_ngram_losses",
    "CHAPTER_HEADING",
    "BERT_SPECIALS",
    "book_chapters",
    "unwrap_paragraphs",
    "gutenberg_split",
    "book_passages",
    "labelled_batches",
    "classifier_accuracy",
    "naive_bayes_accuracy",
    "wilson_interval",
    "unigram_log_probs",
    "masked_lm_scores",
    "bert_mlm_objective",
    "bert_tokenizer",
    "bert_data",
    "bert_run",
    "T5_SPECIALS",
    "pair_batch",
    "tatoeba_split",
    "t5_tokenizer",
    "t5_encode",
    "length_batches",
    "t5_data",
    "bleu_references",
    "corpus_bleu",
    "bleu_interval",
    "t5_bleu",
    "t5_run",
    "run_flops",
    "estimate_run_seconds",
    "main",
]


# From chapters/08-3-runs.md, section "Three runs".
RUNS = ("gpt", "bert", "t5")
# the best held-out loss nanoGPT's README reports for its shakespeare_char
# configuration (our full GPT's size): the character GPT's target
NANOGPT_VAL_LOSS = 1.47


def run_sizes(run: str, profile: str | None = None, **overrides: Any) -> dict[str, Any]:
    """The sizes of one of :data:`RUNS` in ``profile`` (default: the active
    one), with ``overrides``. Overriding ``n_steps`` alone cuts the warm-up
    to fit and, for BERT, gives the fine-tunings as many steps (a quick
    run)."""
    check.one_of("run", run, RUNS, owner="run_sizes")
    profile = get_profile() if profile is None else profile
    check.one_of("profile", profile, PROFILES, owner="run_sizes")

    def p(**values: Any) -> Any:
        """This profile's value (colab defaults to full)."""
        return pick(**values, profile=profile)

    if run == "gpt":
        sizes = dict(
            d_model=p(smoke=64, full=384),
            n_heads=p(smoke=4, full=6),
            n_layers=p(smoke=2, full=6),
            seq_len=p(smoke=64, full=256),
            batch_size=p(smoke=16, full=128),
            dropout=p(smoke=0.0, full=0.1),
            n_steps=p(smoke=200, colab=600, full=1500),
            lr=p(smoke=3e-3, full=2e-3),
            warmup=p(smoke=20, full=100),
            eval_every=p(smoke=50, colab=200, full=500),
            eval_iters=p(smoke=2, colab=10, full=20),
        )
    elif run == "bert":
        sizes = dict(
            vocab_size=p(smoke=512, full=4000),
            d_model=p(smoke=64, full=256),
            n_heads=4,
            n_layers=p(smoke=2, full=4),
            seq_len=p(smoke=64, full=128),
            batch_size=p(smoke=16, full=128),
            dropout=p(smoke=0.0, full=0.1),
            n_steps=p(smoke=150, colab=2000, full=4000),
            lr=p(smoke=2e-3, full=1e-3),
            warmup=p(smoke=15, full=200),
            eval_every=p(smoke=50, full=250),
            eval_iters=p(smoke=2, full=10),
            mlm_test_batches=p(smoke=2, full=20),
            # few labels: pre-training has to carry the classifier
            labelled_per_book=32,
            passage_len=64,
            finetune_steps=p(smoke=60, full=300),
            finetune_lr=p(smoke=1e-3, full=3e-4),
            test_per_book=p(smoke=16, full=200),
        )
    else:
        sizes = dict(
            vocab_size=p(smoke=500, full=4000),
            d_model=p(smoke=64, full=256),
            d_ff=p(smoke=256, full=1024),
            n_heads=4,
            n_layers=p(smoke=2, full=3),
            max_len=64,
            # batches of pairs of similar length, this many padded tokens
            # (colab: a T4's budget, the CPU recipe's batches)
            max_tokens=p(smoke=1024, colab=4096, full=16384),
            dropout=p(smoke=0.0, full=0.1),
            n_steps=p(smoke=250, colab=1000, full=3000),
            lr=p(smoke=3e-3, full=1e-3),
            warmup=p(smoke=25, full=300),
            eval_every=p(smoke=125, full=300),
            eval_pairs=p(smoke=256, full=512),
            test_fraction=0.015,
            # 0: all of them
            max_train_pairs=p(smoke=20_000, full=0),
            bleu_sentences=p(smoke=100, full=0),
            beam_size=4,
            label_smoothing=0.1,
        )
    unknown = sorted(set(overrides) - set(sizes))
    if unknown:
        raise ValueError(
            f"run_sizes: no size {unknown} in {run!r}; known: {sorted(sizes)}"
        )
    for key, value in overrides.items():
        if isinstance(sizes[key], int):
            check.int_at_least(key, value, 0, owner="run_sizes")
        else:
            check.finite_float(key, value, low=0.0, owner="run_sizes")
    if "n_steps" in overrides:
        sizes["warmup"] = min(sizes["warmup"], overrides["n_steps"])
        if run == "bert":
            sizes["finetune_steps"] = overrides["n_steps"]
    sizes = {**sizes, **overrides, "profile": profile}
    if run == "bert" and sizes["passage_len"] > sizes["seq_len"]:
        raise ValueError(
            f"run_sizes: passage_len={sizes['passage_len']} is longer than "
            f"the model's seq_len={sizes['seq_len']}"
        )
    return sizes


def _start(
    run, profile, sizes, device, compile, progress, seed, checkpoint_dir, resume
):
    """A run's front door: its sizes and device, checked arguments, seeded
    torch."""
    check.booleans(compile=compile, resume=resume, owner=f"{run} run")
    check.one_of("progress", progress, (None, True, False), owner=f"{run} run")
    check.int_at_least("seed", seed, 0, owner=f"{run} run")
    if resume and checkpoint_dir is None:
        raise ValueError(f"{run} run: resume needs a checkpoint_dir to resume from")
    sizes = run_sizes(run, profile, **dict(sizes or {}))
    torch.manual_seed(seed)
    device = torch.device(device) if device is not None else get_device()
    return sizes, device


def _saving(
    checkpoint_dir, resume: bool, every: int, stage: str = ""
) -> dict[str, Any]:
    """:func:`train`'s checkpoint arguments for one stage of a run (none
    without a folder): a checkpoint at each evaluation, in
    ``checkpoint_dir/stage``."""
    if checkpoint_dir is None:
        return {}
    folder = Path(checkpoint_dir) / stage
    return dict(checkpoint_dir=folder, checkpoint_every=every, resume=resume)


def _run_config(
    run: str, sizes: Mapping[str, Any], vocab_size: int
) -> TransformerConfig:
    """The ``TransformerConfig`` of a run's model at these sizes."""
    common = dict(
        vocab_size=vocab_size,
        d_model=sizes["d_model"],
        n_heads=sizes["n_heads"],
        n_layers=sizes["n_layers"],
        dropout=sizes["dropout"],
    )
    if run == "gpt":
        return TransformerConfig(**common, max_len=sizes["seq_len"])
    if run == "bert":
        return TransformerConfig(
            **common, max_len=sizes["seq_len"], embedding_norm=True, positions="rope"
        )
    return TransformerConfig(  # T5
        **common,
        n_decoder_layers=sizes["n_layers"],
        d_ff=sizes["d_ff"],
        positions="t5",
        norm="rmsnorm",
        activation="relu",
        bias=False,
        attn_scale=1.0,
        max_len=sizes["max_len"],
    )


def _curves(history: TrainHistory, prefix: str = "") -> dict[str, Any]:
    """A history's curves as a record holds them: ``{name: {column:
    [values]}}``."""
    held_out = {"step": history.eval_steps, "loss": history.eval_losses}
    # a run resumed from a checkpoint of an older lib has no times for its
    # first evaluations: then no column of times
    if len(history.eval_seconds) == len(history.eval_steps):
        held_out["seconds"] = history.eval_seconds
    return {
        f"{prefix}train": {
            "step": history.steps,
            "loss": history.losses,
            "lr": history.lrs,
        },
        f"{prefix}eval": held_out,
    }


def seconds_to_loss(
    history: TrainHistory, target: float, since: float = 0.0
) -> float | None:
    """Wall seconds at the first evaluation whose held-out loss is at most
    ``target`` (None if none is), counted from ``since`` seconds before
    :func:`train` began: compilation and evaluations included."""
    if len(history.eval_seconds) != len(history.eval_losses):
        return None  # resumed from an older lib's checkpoint: times unknown
    for loss, seconds in zip(history.eval_losses, history.eval_seconds):
        if loss <= target:
            return since + seconds
    return None


def _speed(model: nn.Module, history: TrainHistory, seq_len: int) -> dict[str, Any]:
    """Tokens per second; on a known GPU also the model FLOPs utilisation
    and memory."""
    device = next(model.parameters()).device
    speed: dict[str, Any] = {"tokens_per_second": history.tokens_per_second}
    peak = peak_flops(device)
    if peak is not None:
        flops = training_flops_per_token(model, seq_len) * history.tokens_per_second
        # tokens_per_second counts the tokens of every process: under DDP
        # they ran on world_size GPUs
        world = dist.get_world_size() if dist.is_initialized() else 1
        speed["mfu"] = flops / (peak * world)
    if device.type == "cuda":
        speed["peak_memory_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
    return speed


def _specials(tokenizer: CharTokenizer, *names: str) -> dict[str, int]:
    """Ids for special tokens, after the tokenizer's characters
    (``vocab_size`` of a model is then ``tokenizer.vocab_size +
    len(names)``)."""
    return {name: tokenizer.vocab_size + i for i, name in enumerate(names)}


def _decode(tokenizer: CharTokenizer, ids: list[int]) -> str:
    """The text of ``ids`` with the special tokens (ids past the characters)
    left out."""
    return tokenizer.decode([i for i in ids if i < tokenizer.vocab_size])


# From chapters/08-3-runs.md, section "Three runs".
def split_pairs_by_source(
    pairs: list[tuple[str, str]], test_fraction: float, seed: int = 0
) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """Split ``(source, target)`` pairs so that no source sentence is in
    both parts.

    All translations of one source go to the same side; ``test_fraction`` of
    the distinct sources (in a seeded random order) go to the test part.
    """
    if not isinstance(pairs, list) or not pairs:
        raise ValueError(
            f"pairs must be a non-empty list of (source, target), got {pairs!r:.60}"
        )
    bad = next(
        (
            p
            for p in pairs
            if not (
                isinstance(p, tuple | list)
                and len(p) == 2
                and all(isinstance(t, str) for t in p)
            )
        ),
        None,
    )
    if bad is not None:
        raise TypeError(
            f"pairs must hold (source, target) pairs of strings, got {bad!r:.60}"
        )
    if isinstance(test_fraction, bool) or not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction!r}")
    check.integer("seed", seed, owner="split_pairs_by_source")
    sources = sorted({source for source, _ in pairs})
    random.Random(seed).shuffle(sources)
    test_sources = set(sources[: max(1, round(test_fraction * len(sources)))])
    train_part = [p for p in pairs if p[0] not in test_sources]
    test_part = [p for p in pairs if p[0] in test_sources]
    return train_part, test_part


# From chapters/08-3-runs.md, section "A character-level GPT on Tiny Shakespeare".
@torch.no_grad()
def _sample(model: GPT, tokenizer: CharTokenizer, prompt, n_new: int, seed: int) -> str:
    was_training = model.training
    model.eval()
    generator = torch.Generator(prompt.device).manual_seed(seed)
    ids = generate(model, prompt, n_new, temperature=0.8, generator=generator)
    model.train(was_training)
    return tokenizer.decode(ids[0].tolist())


def shakespeare_ids() -> tuple[CharTokenizer, torch.Tensor, torch.Tensor]:
    """Tiny Shakespeare as ids: its tokenizer, the first 90 % (to train on)
    and the last 10 % (held out)."""
    text = load_tiny_shakespeare()
    tokenizer = CharTokenizer(text)
    ids = torch.tensor(tokenizer.encode(text))
    split = int(0.9 * len(ids))
    return tokenizer, ids[:split], ids[split:]


def _cosine(warmup: int, n_steps: int) -> WarmupCosineSchedule:
    """The recipes' schedule: warm-up, then cosine to a tenth."""
    return WarmupCosineSchedule(warmup, n_steps, min_ratio=0.1)


def char_gpt_val_loss(
    model: GPT, sizes: Mapping[str, Any], val_ids: torch.Tensor | None = None
) -> float:
    """The final held-out loss of :func:`char_gpt_run` for its ``model`` of
    ``sizes``: the mean over every character of the last 10 % (``val_ids``,
    read here by default), each predicted once, in windows of ``seq_len``
    (a shipped checkpoint is re-evaluated with it)."""
    check.instance("model", model, GPT, what="a lib.models.GPT")
    val_ids = shakespeare_ids()[2] if val_ids is None else val_ids
    seq_len, batch_size = sizes["seq_len"], sizes["batch_size"]
    windows = lm_eval_batches(val_ids, 4 * batch_size, seq_len)
    return evaluate(model, windows)


@dataclass(frozen=True)
class RecipeChange:
    """One change to a recipe (a row of page 8.5's ledger): configuration
    fields (``model``), and an ``optimizer(model, lr)``, a
    ``schedule(warmup, n_steps)`` or a ``loss_fn`` for :func:`train` in
    place of the recipe's (None keeps the recipe's)."""

    name: str = "baseline"
    model: Mapping[str, Any] = field(default_factory=dict)
    optimizer: Callable[..., torch.optim.Optimizer] | None = None
    schedule: Callable[[int, int], Any] | None = None
    loss_fn: Callable[..., torch.Tensor] | None = None


def char_gpt_run(
    profile: str | None = None,
    *,
    device: torch.device | str | None = None,
    compile: bool = False,
    progress: bool | None = None,
    seed: int = 0,
    sizes: Mapping[str, Any] | None = None,
    checkpoint_dir: str | os.PathLike | None = None,
    resume: bool = False,
    change: RecipeChange | None = None,
) -> dict[str, Any]:
    """A character-level GPT on Tiny Shakespeare: 90 % to train (its last
    5 % the validation slice that picks the kept weights), the last 10 %
    held out. ``sizes`` overrides :func:`run_sizes`; ``change`` replaces a
    part of the recipe; with ``checkpoint_dir`` a checkpoint is written at
    each evaluation, and ``resume`` continues from the newest intact one."""
    began = time.perf_counter()
    sizes, device = _start(
        "gpt", profile, sizes, device, compile, progress, seed, checkpoint_dir, resume
    )
    seq_len, batch_size = sizes["seq_len"], sizes["batch_size"]
    tokenizer, train_ids, test_ids = shakespeare_ids()
    split = int(0.95 * len(train_ids))  # the validation slice: the last 5 %
    train_ids, val_ids = train_ids[:split], train_ids[split:]
    measure_test = change is None  # a ledger's row: validation slice only
    change = change or RecipeChange()
    cfg = _run_config("gpt", sizes, tokenizer.vocab_size)
    cfg = replace(cfg, **change.model)
    model = GPT(cfg).to(device)
    prompt = torch.tensor([tokenizer.encode("\n")], device=device)
    n_new = seq_len - 1  # learned positions: no further than the context
    before = _sample(model, tokenizer, prompt, n_new, seed)
    if change.optimizer is None:
        optimizer = make_optimizer(model, sizes["lr"], betas=(0.9, 0.99), eps=1e-8)
    else:
        optimizer = change.optimizer(model, sizes["lr"])
    schedule = (change.schedule or _cosine)(sizes["warmup"], sizes["n_steps"])
    before_training = time.perf_counter() - began
    history = train(
        model,
        lm_batches(train_ids, batch_size, seq_len, seed=seed),
        optimizer=optimizer,
        scheduler=make_scheduler(optimizer, schedule),
        n_steps=sizes["n_steps"],
        eval_batches=lm_batches(val_ids, batch_size, seq_len, seed=seed + 1),
        eval_every=sizes["eval_every"],
        eval_iters=sizes["eval_iters"],
        keep_best=True,
        compile=compile,
        progress=progress,
        **_saving(checkpoint_dir, resume, sizes["eval_every"]),
        **({"loss_fn": change.loss_fn} if change.loss_fn else {}),
    )
    # the best evaluation's weights, measured on the whole held-out tenth
    # (not for a ledger's row, scored on the validation slice alone) and
    # validation slice; a dry run (lib.utils.is_dry) on 8 windows of each
    cut = slice(0, 8 * seq_len + 1 if is_dry() else None)
    return {
        "run": "gpt",
        "change": change.name,
        "config": {"sizes": sizes, "model": asdict(cfg)},
        "metrics": {
            "val_loss": char_gpt_val_loss(model, sizes, test_ids[cut])
            if measure_test
            else None,
            "validation_loss": char_gpt_val_loss(model, sizes, val_ids[cut]),
            # the evaluation whose weights the run keeps, and the last one
            "best_step": history.best_step,
            "best_eval_loss": history.best_eval_loss,
            "last_eval_loss": history.eval_losses[-1],
            "parameters": count_parameters(model),
            "train_seconds": history.train_seconds,
            # nanoGPT's shakespeare_char reaches this held-out loss
            "target_val_loss": NANOGPT_VAL_LOSS,
            # from this call (data, model and compilation included); a
            # resumed run's history holds another process's times: none
            "seconds_to_target": None
            if resume
            else seconds_to_loss(history, NANOGPT_VAL_LOSS, before_training),
            **_speed(model, history, seq_len),
        },
        "curves": _curves(history),
        "samples": {
            "before": before,
            "after": _sample(model, tokenizer, prompt, n_new, seed),
        },
    }


# From chapters/08-3-runs.md, section "A character-level GPT on Tiny Shakespeare".
def char_ngram_losses(
    train_ids: torch.Tensor,
    val_ids: torch.Tensor,
    vocab_size: int,
    max_order: int = 5,
    prior: float = 1.0,
) -> dict[int, float]:
    """``{n: loss}``: the held-out loss per character (nats) of n-gram
    models of ``train_ids``, ``n = 1 .. max_order``. Each order's
    probability is its counts smoothed towards the order below, ``(N(h c) +
    prior * P_{n-1}(c | h')) / (N(h) + prior)``; the unigram's towards
    uniform. Every order predicts the same characters of ``val_ids`` (from
    the ``max_order``-th on)."""
    check.int_at_least("max_order", max_order, 1)
    if vocab_size**max_order >= 2**62:
        raise ValueError(f"{max_order}-grams of {vocab_size} ids overflow")
    train_ids, val_ids = train_ids.long(), val_ids.long()

    def keys(ids: torch.Tensor, length: int, end: int) -> torch.Tensor:
        """A number for each window of ``length`` ids ending at positions
        ``length - 1 .. end - 1`` (a window is its ids in base
        ``vocab_size``)."""
        key = torch.zeros(end - length + 1, dtype=torch.long)
        for i in range(length):
            key = key * vocab_size + ids[i : end - length + 1 + i]
        return key

    def counts(train_keys: torch.Tensor, wanted: torch.Tensor):
        """How often each of ``wanted`` occurs among ``train_keys``."""
        found, number = torch.unique(train_keys, return_counts=True)
        at = torch.searchsorted(found, wanted).clamp(max=len(found) - 1)
        hit = found[at] == wanted
        return torch.where(hit, number[at], 0).double()

    n_train, n_val = len(train_ids), len(val_ids)
    probability = torch.full(
        (n_val - max_order + 1,), 1.0 / vocab_size, dtype=torch.float64
    )
    losses = {}
    for order in range(1, max_order + 1):
        # windows of the held-out text that end at the predicted characters
        skip = max_order - order
        pairs = counts(
            keys(train_ids, order, n_train), keys(val_ids, order, n_val)[skip:]
        )
        if order == 1:
            contexts = torch.full_like(pairs, float(n_train))
        else:
            # a context counts as often as a character follows it
            contexts = counts(
                keys(train_ids[:-1], order - 1, n_train - 1),
                keys(val_ids[:-1], order - 1, n_val - 1)[skip:],
            )
        probability = (pairs + prior * probability) / (contexts + prior)
        losses[order] = float(-probability.log().mean())
    return losses


# From chapters/08-3-runs.md, section "BERT: pre-training on six books, then naming the book of a passage".
# a chapter's first line: "CHAPTER I", "Chapter 1", "CHAPTER 1. Loomings.",
# or, in The Wisdom of Father Brown, a story's "I. The Absence of Mr Glass"
CHAPTER_HEADING = re.compile(
    r"^(?:(?i:chapter) [0-9IVXLCivxlc]+\b|[IVXLC]+\. [A-Z])", re.M
)
BERT_SPECIALS = ("<pad>", "<mask>")


def book_chapters(text: str) -> list[str]:
    """The chapters of a book, each from its heading to the next (the title
    and any preface before the first heading left out)."""
    starts = [m.start() for m in CHAPTER_HEADING.finditer(text)]
    return [text[a:b] for a, b in zip(starts, [*starts[1:], len(text)])]


def unwrap_paragraphs(text: str) -> str:
    """One line per paragraph: the hard-wrapped lines of each paragraph
    (paragraphs are separated by blank lines) joined by spaces."""
    paragraphs = re.split(r"\n\s*\n", text)
    lines = (" ".join(p.split()) for p in paragraphs)
    return "\n".join(line for line in lines if line)


def gutenberg_split(held_out_every: int = 5) -> tuple[list[str], list[str], list[str]]:
    """``(names, train_texts, held_out_texts)`` of the six shipped books,
    unwrapped: every ``held_out_every``-th chapter of each book (the 5th,
    10th, ...) is held out, the others are for training."""
    check.int_at_least("held_out_every", held_out_every, 2)
    names, seen, held = [], [], []
    for name, text in load_gutenberg().items():
        chapters = [unwrap_paragraphs(c) for c in book_chapters(text)]
        numbered = list(enumerate(chapters, start=1))
        names.append(name)
        seen.append("\n".join(c for i, c in numbered if i % held_out_every))
        held.append("\n".join(c for i, c in numbered if not i % held_out_every))
    return names, seen, held


def book_passages(
    books: list[torch.Tensor], per_book: int, seq_len: int, size: int
) -> list[Batch]:
    """``per_book`` evenly spaced passages of ``seq_len`` ids from each
    book, labelled with its index, in batches of ``size`` rows."""
    rows, labels = [], []
    for label, ids in enumerate(books):
        starts = torch.linspace(0, len(ids) - seq_len, per_book).long()
        for start in starts.tolist():
            rows.append(ids[start : start + seq_len])
            labels.append(label)
    inputs, targets = torch.stack(rows), torch.tensor(labels)
    pieces = zip(inputs.split(size), targets.split(size))
    return [{"inputs": i, "targets": t} for i, t in pieces]


def labelled_batches(passages: Batch, batch_size: int, seed: int):
    """``step -> batch``: ``batch_size`` rows drawn at random from the few
    labelled ``passages`` (with replacement)."""

    def batch_at(step: int) -> Batch:
        generator = step_generator(seed, step)
        n = len(passages["targets"])
        rows = torch.randint(n, (batch_size,), generator=generator)
        return {key: value[rows] for key, value in passages.items()}

    return batch_at


@torch.no_grad()
def classifier_accuracy(model: nn.Module, batches: list[Batch]) -> float:
    """The share of the rows of ``batches`` (``inputs``, ``targets``) whose
    class ``model`` scores highest, in eval mode."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    right = total = 0
    for batch in batches:
        batch = {k: v.to(device) for k, v in batch.items()}
        predicted = model(batch["inputs"], batch.get("mask")).argmax(-1)
        right += int((predicted == batch["targets"]).sum())
        total += len(batch["targets"])
    model.train(was_training)
    return right / total


def naive_bayes_accuracy(
    labelled: Batch, test_set: list[Batch], n_classes: int, vocab_size: int
) -> float:
    """The bag-of-words baseline: multinomial naive Bayes over the token
    counts of the ``labelled`` passages (add-one smoothing, equal priors),
    scored on ``test_set``."""
    counts = torch.ones(n_classes, vocab_size)
    for row, label in zip(labelled["inputs"], labelled["targets"]):
        counts[label] += torch.bincount(row, minlength=vocab_size)
    log_p = (counts / counts.sum(-1, keepdim=True)).log()
    right = total = 0
    for batch in test_set:
        bags = torch.stack(
            [torch.bincount(r, minlength=vocab_size) for r in batch["inputs"]]
        )
        predicted = (bags.float() @ log_p.T).argmax(-1)
        right += int((predicted == batch["targets"]).sum())
        total += len(batch["targets"])
    return right / total


def wilson_interval(correct: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of an accuracy of ``correct`` out of
    ``n`` (95 % for ``z = 1.96``), which stays inside [0, 1]."""
    check.positive_int("n", n)
    share = correct / n
    centre = (share + z**2 / (2 * n)) / (1 + z**2 / n)
    half = z * math.sqrt(share * (1 - share) / n + z**2 / (4 * n**2))
    return centre - half / (1 + z**2 / n), centre + half / (1 + z**2 / n)


def unigram_log_probs(ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """The baseline that knows only how often each token occurs: the log
    frequency of each id in ``ids`` (add-one smoothing), shape
    ``(vocab)``."""
    counts = torch.bincount(ids, minlength=vocab_size).double() + 1.0
    return (counts / counts.sum()).log().float()


@torch.no_grad()
def masked_lm_scores(
    model: nn.Module, batches: list[Batch], unigram: torch.Tensor, mask_id: int
) -> dict[str, float]:
    """At the masked positions of masked-LM ``batches`` (``targets`` not
    ``IGNORE_INDEX`` and the input ``mask_id``: the 80 % of the chosen
    tokens that BERT's corruption hides; where it keeps or swaps the token
    the input gives the answer away, or misleads): the mean loss in nats and
    the top-1 accuracy of
    ``model`` and of the ``unigram`` log-probabilities, their number, and
    how far the model's loss lies below the unigram's (``mlm_gain``) with a
    95 % interval (± 1.96 standard errors, the positions taken as
    independent)."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    losses, unigram_losses, right, unigram_right = [], [], [], []
    for batch in batches:
        logits = model(batch["inputs"].to(device)).float().cpu()
        hidden = batch["targets"] != IGNORE_INDEX
        chosen = hidden & (batch["inputs"] == mask_id)
        targets = batch["targets"][chosen]
        log_p = logits[chosen].log_softmax(-1)
        losses.append(-log_p.gather(-1, targets[:, None])[:, 0].double())
        right.append(log_p.argmax(-1) == targets)
        unigram_losses.append(-unigram[targets].double())
        unigram_right.append(targets == unigram.argmax())
    model.train(was_training)
    loss, unigram_loss = torch.cat(losses), torch.cat(unigram_losses)
    gain = unigram_loss - loss  # per position
    half = 1.96 * float(gain.std()) / math.sqrt(len(gain))
    return {
        "mlm_test_loss": float(loss.mean()),
        "mlm_test_top1": float(torch.cat(right).double().mean()),
        "unigram_test_loss": float(unigram_loss.mean()),
        "unigram_test_top1": float(torch.cat(unigram_right).double().mean()),
        "masked_tokens": len(gain),
        "mlm_gain": float(gain.mean()),
        "mlm_gain_low": float(gain.mean()) - half,
        "mlm_gain_high": float(gain.mean()) + half,
    }


def bert_mlm_objective(tokenizer: BPETokenizer):
    """BERT's masked-LM corruption for :func:`lm_batches` with this
    tokenizer's ``<pad>`` and ``<mask>`` (the pad id never chosen)."""
    pad, mask_id = (tokenizer.special_tokens[t] for t in BERT_SPECIALS)

    def mlm(windows: torch.Tensor, generator: torch.Generator):
        return masked_lm_batch(
            windows,
            mask_id=mask_id,
            vocab_size=tokenizer.vocab_size,
            generator=generator,
            special_ids=(pad,),
        )

    return mlm


def bert_tokenizer(sizes: Mapping[str, Any]) -> BPETokenizer:
    """The BERT recipe's byte-level BPE of ``sizes["vocab_size"]`` tokens
    (``<pad>`` and ``<mask>`` among them), trained on the training
    chapters."""
    _, seen_texts, _ = gutenberg_split()
    return BPETokenizer().train(
        "\n".join(seen_texts), sizes["vocab_size"], special_tokens=BERT_SPECIALS
    )


def bert_data(
    tokenizer: BPETokenizer, sizes: Mapping[str, Any], seed: int
) -> dict[str, Any]:
    """What the BERT recipe trains and measures on, in ``tokenizer``'s ids:
    masked-LM windows of the training chapters (``train_windows``), of a
    validation slice, the last 5 % of each book's training chapters
    (``eval_windows``, which pick the best step) and of the held-out
    chapters (``mlm_test``, which measure it), the ``unigram`` of the
    training windows' text, the few ``labelled`` passages and the ``test``
    passages, and the books' ``names``."""
    names, seen_texts, held_texts = gutenberg_split()
    seen = [torch.tensor(tokenizer.encode(t)) for t in seen_texts]
    held_out = [torch.tensor(tokenizer.encode(t)) for t in held_texts]
    cuts = [int(0.95 * len(book)) for book in seen]
    trained = [book[:cut] for book, cut in zip(seen, cuts)]
    validation = [book[cut:] for book, cut in zip(seen, cuts)]
    mlm = bert_mlm_objective(tokenizer)

    def windows(books: list[torch.Tensor], seed: int):
        return lm_batches(
            torch.cat(books),
            sizes["batch_size"],
            sizes["seq_len"] - 1,
            seed=seed,
            objective=mlm,
        )

    test_windows = windows(held_out, seed + 2)
    passage, batch_size = sizes["passage_len"], sizes["batch_size"]
    return {
        "names": names,
        "mask_id": tokenizer.special_tokens["<mask>"],
        "train_windows": windows(trained, seed),
        "eval_windows": windows(validation, seed + 1),
        "mlm_test": [test_windows(i) for i in range(sizes["mlm_test_batches"])],
        "unigram": unigram_log_probs(torch.cat(trained), tokenizer.vocab_size),
        "labelled": book_passages(seen, sizes["labelled_per_book"], passage, 10**9)[0],
        "test": book_passages(
            held_out, sizes["test_per_book"], passage, 4 * batch_size
        ),
    }


def bert_run(
    profile: str | None = None,
    *,
    device: torch.device | str | None = None,
    compile: bool = False,
    progress: bool | None = None,
    seed: int = 0,
    sizes: Mapping[str, Any] | None = None,
    checkpoint_dir: str | os.PathLike | None = None,
    resume: bool = False,
) -> dict[str, Any]:
    """Masked-LM pre-training on six Gutenberg books (against a unigram
    model), then naming the book of held-out passages from a few labelled
    ones (against the same classifier from scratch, a bag of words and
    chance). Arguments as :func:`char_gpt_run`; each of the three stages
    checkpoints in its own subfolder. Besides plain data the result holds
    ``models`` (the masked LM and the pre-trained classifier) and their
    ``tokenizer``."""
    sizes, device = _start(
        "bert", profile, sizes, device, compile, progress, seed, checkpoint_dir, resume
    )
    tokenizer = bert_tokenizer(sizes)
    data = bert_data(tokenizer, sizes, seed)
    names, labelled, test_set = (data["names"], data["labelled"], data["test"])
    cfg = _run_config("bert", sizes, tokenizer.vocab_size)
    bert = BERT(cfg).to(device)
    optimizer = make_optimizer(bert, sizes["lr"], betas=(0.9, 0.98), eps=1e-9)
    pre_history = train(
        bert,
        data["train_windows"],
        optimizer=optimizer,
        scheduler=make_scheduler(
            optimizer, WarmupCosineSchedule(sizes["warmup"], sizes["n_steps"])
        ),
        n_steps=sizes["n_steps"],
        eval_batches=data["eval_windows"],
        eval_every=sizes["eval_every"],
        eval_iters=sizes["eval_iters"],
        keep_best=True,
        compile=compile,
        progress=progress,
        **_saving(checkpoint_dir, resume, sizes["eval_every"], "pretraining"),
    )
    mlm_scores = masked_lm_scores(
        bert, data["mlm_test"], data["unigram"], data["mask_id"]
    )
    mlm_model = copy.deepcopy(bert)  # fine-tuning changes the encoder
    n_test = sum(len(b["targets"]) for b in test_set)
    accuracy = {
        "bag_of_words": naive_bayes_accuracy(
            labelled, test_set, len(names), tokenizer.vocab_size
        )
    }
    batch_size = sizes["batch_size"]
    classifiers, curves = {}, _curves(pre_history, "pretraining_")
    train_seconds = pre_history.train_seconds
    scratch = BERT(cfg).to(device)
    steps = sizes["finetune_steps"]
    for name, encoder in (("pretrained", bert), ("from_scratch", scratch)):
        # the same head and dropout masks for both
        torch.manual_seed(seed + 1)
        classifier = SequenceClassifier(encoder, len(names), sizes["dropout"])
        classifier = classifier.to(device)
        optimizer = make_optimizer(
            classifier, sizes["finetune_lr"], betas=(0.9, 0.98), eps=1e-9
        )
        schedule = WarmupCosineSchedule(steps // 10, steps)
        every = max(1, steps // 4)
        history = train(
            classifier,
            labelled_batches(labelled, batch_size, seed + 2),
            optimizer=optimizer,
            scheduler=make_scheduler(optimizer, schedule),
            n_steps=steps,
            eval_batches=test_set,
            eval_every=every,
            compile=compile,
            progress=progress,
            **_saving(checkpoint_dir, resume, every, name),
        )
        accuracy[name] = classifier_accuracy(classifier, test_set)
        classifiers[name] = classifier
        train_seconds += history.train_seconds
        curves.update(_curves(history, f"{name}_"))
    metrics: dict[str, Any] = {
        "mlm_val_loss": pre_history.best_eval_loss,
        "mlm_best_step": pre_history.best_step,
        **mlm_scores,
    }
    for name, value in accuracy.items():
        low, high = wilson_interval(round(value * n_test), n_test)
        metrics[f"accuracy_{name}"] = value
        metrics[f"accuracy_{name}_low"] = low
        metrics[f"accuracy_{name}_high"] = high
    metrics |= {
        "chance": 1 / len(names),
        "labelled_passages": len(labelled["targets"]),
        "test_passages": n_test,
        "parameters": count_parameters(bert),
        "train_seconds": train_seconds,
        **_speed(bert, pre_history, sizes["seq_len"]),
    }
    return {
        "run": "bert",
        "config": {"sizes": sizes, "model": asdict(cfg)},
        "metrics": metrics,
        "curves": curves,
        "samples": {"books": names},
        "models": {"mlm": mlm_model, "classifier": classifiers["pretrained"]},
        "tokenizer": tokenizer,
    }


# From chapters/08-3-runs.md, section "T5: English to French".
T5_SPECIALS = ("<pad>", "</s>")


def pair_batch(sources: list[torch.Tensor], targets: list[torch.Tensor], pad: int):
    """Right-padded source and target rows; the decoder reads ``pad``, then
    the target shifted right."""
    inputs = pad_sequence(sources, batch_first=True, padding_value=pad)
    labels = pad_sequence(targets, batch_first=True, padding_value=IGNORE_INDEX)
    shifted = torch.cat([torch.full_like(labels[:, :1], pad), labels[:, :-1]], dim=1)
    decoder_inputs = shifted.masked_fill(shifted == IGNORE_INDEX, pad)
    return {
        "inputs": inputs,
        "mask": inputs != pad,
        "decoder_inputs": decoder_inputs,
        "targets": labels,
    }


def tatoeba_split(
    test_fraction: float, seed: int = 0
) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """``(train, test)`` of all 142,787 Tatoeba pairs, no English sentence
    on both sides (:func:`split_pairs_by_source`); the test side holds every
    French translation of its English sentences, its references."""
    pairs = load_tatoeba_pairs(all_pairs=True)
    return split_pairs_by_source(pairs, test_fraction, seed)


def t5_tokenizer(train_pairs: list[tuple[str, str]], vocab_size: int) -> BPETokenizer:
    """Chapter 1's byte-level BPE, one vocabulary for both languages,
    learned from the training pairs only (``<pad>`` and ``</s>`` among its
    ``vocab_size`` tokens)."""
    text = "\n".join(f"{english}\n{french}" for english, french in train_pairs)
    return BPETokenizer().train(text, vocab_size, special_tokens=T5_SPECIALS)


def t5_encode(tokenizer: BPETokenizer, text: str, max_len: int):
    """The ids of ``text`` and ``</s>``, cut to ``max_len`` ids."""
    eos = tokenizer.special_tokens["</s>"]
    return torch.tensor([*tokenizer.encode(text)[: max_len - 1], eos])


def length_batches(lengths: list[int], max_tokens: int, seed: int):
    """``batch_rows(step)``: the rows of the batch of ``step``. Each epoch
    sorts the rows by length (ties in a random order), cuts them into
    batches of at most ``max_tokens`` padded tokens (rows times the longest
    row) and shuffles the batches; each epoch is drawn from ``(seed,
    epoch)``."""
    epochs: list[list[list[int]]] = []
    starts = [0]  # the first step of each epoch

    def make_epoch(epoch: int) -> list[list[int]]:
        generator = step_generator(seed, epoch)
        ties = torch.rand(len(lengths), generator=generator).tolist()
        order = sorted(range(len(lengths)), key=lambda i: (lengths[i], ties[i]))
        batches, rows, longest = [], [], 0
        for i in order:
            wider = max(longest, lengths[i])
            if rows and wider * (len(rows) + 1) > max_tokens:
                batches.append(rows)
                rows, longest = [], 0
            rows.append(i)
            longest = max(longest, lengths[i])
        batches.append(rows)
        shuffled = torch.randperm(len(batches), generator=generator)
        return [batches[j] for j in shuffled.tolist()]

    def batch_rows(step: int) -> list[int]:
        while not epochs or step >= starts[-1] + len(epochs[-1]):
            if epochs:
                starts.append(starts[-1] + len(epochs[-1]))
            epochs.append(make_epoch(len(epochs)))
        epoch = max(e for e, first in enumerate(starts) if first <= step)
        return epochs[epoch][step - starts[epoch]]

    return batch_rows


def t5_data(sizes: Mapping[str, Any], seed: int) -> dict[str, Any]:
    """What the T5 recipe trains and measures on: the ``tokenizer``, the
    ``train_pairs`` (``max_train_pairs`` evenly spaced ones of the split's,
    0: all) and ``test_pairs``, ``batch_at(step)`` (pairs of similar length,
    at most ``max_tokens`` padded tokens a batch) and ``eval_batches``:
    about ``eval_pairs`` validation pairs, split off the training side by
    English sentence, on which ``keep_best`` chooses (the test pairs choose
    nothing)."""
    train_pairs, test_pairs = tatoeba_split(sizes["test_fraction"], seed)
    share = min(0.5, sizes["eval_pairs"] / len(train_pairs))
    train_pairs, val_pairs = split_pairs_by_source(train_pairs, share, seed)
    if sizes["max_train_pairs"]:
        every = max(1, len(train_pairs) // sizes["max_train_pairs"])
        train_pairs = train_pairs[::every][: sizes["max_train_pairs"]]
    tokenizer = t5_tokenizer(train_pairs, sizes["vocab_size"])
    pad, max_len = tokenizer.special_tokens["<pad>"], sizes["max_len"]

    def encoded(pairs: list[tuple[str, str]]) -> tuple[list, list]:
        return (
            [t5_encode(tokenizer, e, max_len) for e, _ in pairs],
            [t5_encode(tokenizer, f, max_len) for _, f in pairs],
        )

    sources, targets = encoded(train_pairs)
    lengths = [max(len(s), len(t)) for s, t in zip(sources, targets)]
    batch_rows = length_batches(lengths, sizes["max_tokens"], seed)

    def batch_at(step: int) -> Batch:
        rows = batch_rows(step)
        return pair_batch([sources[i] for i in rows], [targets[i] for i in rows], pad)

    held_sources, held_targets = encoded(val_pairs)
    eval_batches = [
        pair_batch(held_sources[i : i + 128], held_targets[i : i + 128], pad)
        for i in range(0, len(held_sources), 128)
    ]
    return {
        "tokenizer": tokenizer,
        "train_pairs": train_pairs,
        "test_pairs": test_pairs,
        "batch_at": batch_at,
        "eval_batches": eval_batches,
    }


def bleu_references(
    test_pairs: list[tuple[str, str]], n_sentences: int = 0
) -> tuple[list[str], list[list[str | None]]]:
    """``(english, streams)``: the held-out English sentences (the first
    ``n_sentences``; 0: all) and their French references as sacrebleu
    takes them, one stream per reference, None where a sentence has
    fewer."""
    references: dict[str, list[str]] = {}
    for english, french in test_pairs:
        references.setdefault(english, []).append(french)
    english = list(references)[: n_sentences or None]
    width = max(len(references[e]) for e in english)
    streams = [
        [references[e][k] if k < len(references[e]) else None for e in english]
        for k in range(width)
    ]
    return english, streams


def corpus_bleu(hypotheses: list[str], streams: list[list]) -> float:
    """sacrebleu's corpus BLEU (0 to 100) of ``hypotheses``."""
    import sacrebleu  # the chapters' extra; the standard BLEU

    return sacrebleu.BLEU().corpus_score(hypotheses, streams).score


def bleu_interval(
    hypotheses: list[str], streams: list[list], n_resamples: int = 300, seed: int = 0
) -> tuple[float, float]:
    """A 95 % bootstrap interval of corpus BLEU: the 2.5th and 97.5th
    percentiles of the BLEU of ``n_resamples`` resamples of the sentences,
    drawn with replacement."""
    generator = torch.Generator().manual_seed(seed)
    n, scores = len(hypotheses), []
    for _ in range(n_resamples):
        rows = torch.randint(n, (n,), generator=generator).tolist()
        resampled = [[stream[i] for i in rows] for stream in streams]
        picked = [hypotheses[i] for i in rows]
        scores.append(corpus_bleu(picked, resampled))
    quantiles = torch.tensor([0.025, 0.975], dtype=torch.float64)
    low, high = torch.tensor(scores, dtype=torch.float64).quantile(quantiles).tolist()
    return low, high


def t5_bleu(
    model: T5,
    tokenizer: BPETokenizer,
    test_pairs: list[tuple[str, str]],
    sizes: Mapping[str, Any],
) -> dict[str, Any]:
    """The T5 recipe's held-out measures, from the model as it is: the BLEU
    of greedy and beam-search translations of the held-out English
    sentences (the first ``bleu_sentences``; 0: all), a bootstrap interval
    of the beam's, and the baseline that copies the English sentence
    unchanged; ``translations`` holds what was scored."""
    english, streams = bleu_references(test_pairs, sizes["bleu_sentences"])
    specials = dict(
        pad_id=tokenizer.special_tokens["<pad>"],
        eos_id=tokenizer.special_tokens["</s>"],
    )
    translations = {
        name: translate(
            model, tokenizer, english, beam_size=beam, chunk=256, **specials
        )
        for name, beam in (("greedy", 1), ("beam", sizes["beam_size"]))
    }
    low, high = bleu_interval(translations["beam"], streams)
    return {
        "bleu_greedy": corpus_bleu(translations["greedy"], streams),
        "bleu_beam": corpus_bleu(translations["beam"], streams),
        "bleu_beam_low": low,
        "bleu_beam_high": high,
        "bleu_copy_source": corpus_bleu(english, streams),
        "test_sentences": len(english),
        "translations": {
            "english": english,
            "references": [
                [stream[i] for stream in streams if stream[i] is not None]
                for i in range(len(english))
            ],
            **translations,
        },
    }


def t5_run(
    profile: str | None = None,
    *,
    device: torch.device | str | None = None,
    compile: bool = False,
    progress: bool | None = None,
    seed: int = 0,
    sizes: Mapping[str, Any] | None = None,
    checkpoint_dir: str | os.PathLike | None = None,
    resume: bool = False,
) -> dict[str, Any]:
    """T5 on Tatoeba English -> French, split by English sentence; BLEU
    (sacrebleu) of greedy and beam-search translations of the held-out
    sentences, against copying the source. Arguments as
    :func:`char_gpt_run`. Besides plain data the result holds ``models``
    (the T5) and its ``tokenizer``."""
    sizes, device = _start(
        "t5", profile, sizes, device, compile, progress, seed, checkpoint_dir, resume
    )
    data = t5_data(sizes, seed)
    tokenizer = data["tokenizer"]
    cfg = _run_config("t5", sizes, tokenizer.vocab_size)
    model = T5(cfg, start_id=tokenizer.special_tokens["<pad>"]).to(device)
    optimizer = make_optimizer(model, sizes["lr"], betas=(0.9, 0.98), eps=1e-9)
    smoothing = sizes["label_smoothing"]
    schedule = WarmupCosineSchedule(sizes["warmup"], sizes["n_steps"], min_ratio=0.05)
    history = train(
        model,
        data["batch_at"],
        optimizer=optimizer,
        scheduler=make_scheduler(optimizer, schedule),
        n_steps=sizes["n_steps"],
        loss_fn=lambda net, batch: model_loss(net, batch, label_smoothing=smoothing),
        eval_batches=data["eval_batches"],
        eval_every=sizes["eval_every"],
        keep_best=True,
        compile=compile,
        progress=progress,
        **_saving(checkpoint_dir, resume, sizes["eval_every"]),
    )
    scores = t5_bleu(model, tokenizer, data["test_pairs"], sizes)
    shown = scores.pop("translations")
    metrics: dict[str, Any] = {
        # on the validation pairs, not the test's
        "best_eval_loss": history.best_eval_loss,
        "best_step": history.best_step,
        "last_eval_loss": history.eval_losses[-1],
        **scores,
        "train_pairs": len(data["train_pairs"]),
        "test_pairs": len(data["test_pairs"]),
        "parameters": count_parameters(model),
        "train_seconds": history.train_seconds,
        # about the padded length of a sentence in BPE tokens
        **_speed(model, history, 16),
    }
    keys = ("english", "greedy", "beam", "references")
    samples = [
        dict(zip(keys, sample)) for sample in zip(*(shown[k][:12] for k in keys))
    ]
    return {
        "run": "t5",
        "config": {"sizes": sizes, "model": asdict(cfg)},
        "metrics": metrics,
        "curves": _curves(history),
        "samples": samples,
        "models": {"t5": model},
        "tokenizer": tokenizer,
    }


# From chapters/08-3-runs.md, section "What the runs cost, and the three profiles".
def _on_meta(make: Callable[[], nn.Module]) -> nn.Module:
    """A model built on the meta device: shapes only, no memory, no
    initialisation."""
    with torch.device("meta"):
        return make()


def _n_evaluations(n_steps: int, every: int) -> int:
    """How often :func:`train` evaluates: every ``every`` steps and after
    the last."""
    return n_steps // every + (n_steps % every != 0) if every else 0


def run_flops(run: str, profile: str | None = None) -> dict[str, float]:
    """The work of one of the three runs at a profile's sizes, counted, not
    run.

    Returns ``train_tokens`` (forward and backward), ``forward_tokens``
    (evaluation only, a third of the cost), ``flops``, the sum of each
    model's :func:`lib.efficiency.training_flops_per_token` times its
    tokens, and ``steps``, the optimiser steps of every model the run trains
    (BERT: pre-training and both fine-tunings). Decoding, sampling and data
    preparation are not counted.
    """
    sizes = run_sizes(run, profile)
    batch_size, n_steps = sizes.get("batch_size"), sizes["n_steps"]
    n_evals = _n_evaluations(n_steps, sizes["eval_every"])
    # (model, seq_len, train_tokens, forward_tokens, optimiser steps)
    parts = []
    if run == "gpt":
        text = load_tiny_shakespeare()
        seq_len = sizes["seq_len"]
        cfg = _run_config(run, sizes, CharTokenizer(text).vocab_size)
        n_val = len(text) - int(0.9 * len(text))
        tokens = batch_size * seq_len
        # the tokens of lm_eval_batches's windows
        final = (n_val - 1) // seq_len * seq_len
        forward = n_evals * sizes["eval_iters"] * tokens + final
        gpt = _on_meta(lambda: GPT(cfg))
        parts.append((gpt, seq_len, n_steps * tokens, forward, n_steps))
    elif run == "bert":
        n_books = len(load_gutenberg())
        seq_len, steps = sizes["seq_len"], sizes["finetune_steps"]
        cfg = _run_config(run, sizes, sizes["vocab_size"])
        bert = _on_meta(lambda: BERT(cfg))
        tokens = batch_size * seq_len
        # the evaluations, then the final test of the masked LM
        n_forward = n_evals * sizes["eval_iters"] + sizes["mlm_test_batches"]
        parts.append((bert, seq_len, n_steps * tokens, n_forward * tokens, n_steps))
        passage = sizes["passage_len"]
        test_tokens = n_books * sizes["test_per_book"] * passage
        # the evaluations, and the accuracy at the end
        ft_evals = _n_evaluations(steps, max(1, steps // 4)) + 1
        classifier = _on_meta(lambda: SequenceClassifier(bert, n_books))
        for _ in ("pretrained", "from_scratch"):
            ft_tokens = ft_evals * test_tokens
            parts.append(
                (classifier, passage, steps * batch_size * passage, ft_tokens, steps)
            )
    else:
        # batches by length hold about max_tokens padded tokens a stack,
        # sentences of about 16 BPE tokens once padded
        seq_len = 16
        cfg = _run_config(run, sizes, sizes["vocab_size"])
        model = _on_meta(lambda: T5(cfg, start_id=0))
        per_batch = 2 * sizes["max_tokens"]
        forward = n_evals * sizes["eval_pairs"] * 2 * seq_len
        parts.append((model, seq_len, n_steps * per_batch, forward, n_steps))
    flops = sum(
        training_flops_per_token(model, seq_len) * (train + forward / 3)
        for model, seq_len, train, forward, _ in parts
    )
    return {
        "train_tokens": float(sum(part[2] for part in parts)),
        "forward_tokens": float(sum(part[3] for part in parts)),
        "flops": flops,
        "steps": float(sum(part[4] for part in parts)),
    }


def estimate_run_seconds(
    run: str,
    profile: str | None = None,
    *,
    peak: float | str = "T4",
    mfu: float = 0.3,
    step_overhead: float = 0.0,
) -> float:
    """Seconds of GPU time for :func:`run_flops`, by
    :func:`lib.efficiency.gpu_seconds`."""
    work = run_flops(run, profile)
    return gpu_seconds(
        work["flops"], work["steps"], peak=peak, mfu=mfu, step_overhead=step_overhead
    )


# From chapters/08-3-runs.md, section "Full runs on a GPU".
_RUN_FUNCTIONS: dict[str, Callable[..., dict[str, Any]]] = {
    "gpt": char_gpt_run,
    "bert": bert_run,
    "t5": t5_run,
}


def _seconds_since_process_start() -> float | None:
    """Wall-clock seconds since this process started (Linux), for 'time from
    start'."""
    try:
        with open("/proc/self/stat") as stat, open("/proc/uptime") as uptime:
            started_ticks = int(stat.read().rsplit(")", 1)[1].split()[19])
            seconds_up = float(uptime.read().split()[0])
            return seconds_up - started_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def _setting(text: str) -> tuple[str, Any]:
    """``"batch_size=6"`` -> ``("batch_size", 6)``: a size and a number."""
    key, _, value = text.partition("=")
    try:
        number = ast.literal_eval(value)
    except (ValueError, SyntaxError):
        number = None
    if not key or not isinstance(number, int | float) or isinstance(number, bool):
        raise argparse.ArgumentTypeError(f"--set takes KEY=NUMBER, got {text!r}")
    return key, number


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """``python -m lib.runs --run gpt|bert|t5 [--profile P] [--out DIR]
    ...``, or ``torchrun --standalone --nproc_per_node=N -m lib.runs --
    --run ...`` (the ``--`` keeps torchrun from reading ``--run`` as its own
    ``--run-path``). Writes the record with :func:`lib.utils.write_record`
    and returns the run's result."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(
        prog="python -m lib.runs",
        description=("Train chapter 8's GPT, BERT or T5 and record the results."),
    )
    parser.add_argument("--run", choices=RUNS, required=True)
    parser.add_argument(
        "--profile",
        choices=PROFILES,
        default=None,
        help=(
            "sizes (default: TFS_PROFILE, else smoke on a CPU, colab on a "
            "GPU older than Ampere such as a T4, full on a newer one)"
        ),
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="results folder (default: book/results/NAME)",
    )
    parser.add_argument(
        "--name", default=None, help="the record's name (default: 08-training-RUN)"
    )
    parser.add_argument("--steps", type=int, help="override the number of steps")
    parser.add_argument(
        "--set",
        type=_setting,
        action="append",
        default=[],
        metavar="KEY=NUMBER",
        help=("override one of run_sizes' values (repeatable): --set batch_size=6"),
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--checkpoint-dir",
        type=Path,
        default=None,
        help="write a checkpoint at each evaluation there",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help=("continue from the newest intact checkpoint in --checkpoint-dir"),
    )
    parser.add_argument("--no-compile", action="store_true", help="no torch.compile")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    # the process's profile, which the record states too
    if args.profile is not None:
        os.environ[PROFILE_ENV] = args.profile
    if args.resume and args.checkpoint_dir is None:
        parser.error("--resume needs --checkpoint-dir")
    overrides = dict(args.set)
    if args.steps is not None:
        overrides["n_steps"] = args.steps
    began = time.time()
    launched = _seconds_since_process_start()  # imports included
    rank, world, device = distributed_setup()
    result = _RUN_FUNCTIONS[args.run](
        args.profile,
        device=device,
        compile=device.type == "cuda" and not args.no_compile,
        progress=not args.quiet,
        seed=args.seed,
        sizes=overrides,
        checkpoint_dir=args.checkpoint_dir,
        resume=args.resume,
    )
    torchrun = f"torchrun --standalone --nproc_per_node={world} -m lib.runs --"
    launcher = "python -m lib.runs" if world == 1 else torchrun
    metrics = result["metrics"]
    if metrics.get("seconds_to_target") is not None and launched is not None:
        # the run counted from its own call: add the process's start-up
        metrics["seconds_to_target_from_launch"] = (
            launched + metrics["seconds_to_target"]
        )
    if rank == 0:
        name = args.name or f"08-training-{args.run}"
        out = args.out or Path("book") / "results" / name
        since_start = _seconds_since_process_start()
        write_record(
            out,
            name=name,
            command=f"{launcher} {shlex.join(argv)}",
            wall_seconds=time.time() - began,
            metrics=result["metrics"],
            curves=result["curves"],
            config=result["config"],
            samples=result["samples"],
            extra={
                "world_size": world,
                "precision": get_precision(device).name,
                "seconds_since_process_start": since_start,
            },
            device=device,
        )
        print(f"{args.run}: {result['metrics']} -> {out}")
    if world > 1:
        dist.destroy_process_group()
    return result


# (in a notebook, __name__ is "__main__" too: do not start a run there)
if __name__ == "__main__" and "ipykernel" not in sys.modules:
    main()
