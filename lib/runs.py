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
import os
import random
import shlex
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.utils.rnn import pad_sequence

from lib import _checks as check
from lib.batches import Batch, lm_batches, lm_eval_batches, step_generator
from lib.datasets import load_gutenberg, load_tatoeba_pairs, load_tiny_shakespeare
from lib.efficiency import gpu_seconds, peak_flops, training_flops_per_token
from lib.generation import generate, translate
from lib.models import (
    BERT,
    GPT,
    T5,
    SequenceClassifier,
    TransformerConfig,
    count_parameters,
)
from lib.objectives import IGNORE_INDEX, ObjectiveBatch, masked_lm_batch
from lib.tokenizer import CharTokenizer
from lib.training import (
    TrainHistory,
    WarmupCosineSchedule,
    distributed_setup,
    evaluate,
    make_optimizer,
    make_scheduler,
    model_loss,
    tokens_in,
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
    "char_gpt_val_loss",
    "char_gpt_run",
    "book_batches",
    "book_test_set",
    "classifier_accuracy",
    "bert_run",
    "pair_batch",
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
            d_model=p(smoke=64, full=256),
            n_heads=4,
            n_layers=p(smoke=2, full=4),
            seq_len=p(smoke=64, full=128),
            batch_size=p(smoke=16, full=128),
            dropout=p(smoke=0.0, full=0.1),
            n_steps=p(smoke=150, colab=2000, full=4000),
            lr=p(smoke=2e-3, full=1e-3),
            warmup=p(smoke=15, full=200),
            finetune_steps=p(smoke=80, colab=300, full=600),
            finetune_lr=p(smoke=1e-3, full=3e-4),
            test_per_book=p(smoke=16, full=200),
            eval_every=p(smoke=50, full=500),
            eval_iters=p(smoke=2, full=10),
        )
    else:
        sizes = dict(
            d_model=p(smoke=64, full=256),
            n_heads=4,
            n_layers=p(smoke=2, full=3),
            batch_size=p(smoke=32, full=128),
            dropout=p(smoke=0.0, full=0.1),
            n_steps=p(smoke=250, colab=1500, full=3000),
            lr=p(smoke=3e-3, full=1e-3),
            warmup=p(smoke=25, full=200),
            eval_every=p(smoke=125, full=500),
            test_fraction=0.1,
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
    return {**sizes, **overrides, "profile": profile}


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
            **common, max_len=sizes["seq_len"], embedding_norm=True
        )
    return TransformerConfig(  # T5
        **common,
        n_decoder_layers=sizes["n_layers"],
        positions="t5",
        norm="rmsnorm",
        activation="relu",
        bias=False,
        attn_scale=1.0,
        max_len=128,
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


def _shakespeare_ids() -> tuple[CharTokenizer, torch.Tensor, torch.Tensor]:
    """Tiny Shakespeare as ids: its tokenizer, the first 90 % (to train on)
    and the last 10 % (held out)."""
    text = load_tiny_shakespeare()
    tokenizer = CharTokenizer(text)
    ids = torch.tensor(tokenizer.encode(text))
    split = int(0.9 * len(ids))
    return tokenizer, ids[:split], ids[split:]


def char_gpt_val_loss(
    model: GPT, sizes: Mapping[str, Any], val_ids: torch.Tensor | None = None
) -> float:
    """The final held-out loss of :func:`char_gpt_run` for its ``model`` of
    ``sizes``: the mean over every character of the last 10 % (``val_ids``,
    read here by default), each predicted once, in windows of ``seq_len``
    (a shipped checkpoint is re-evaluated with it)."""
    check.instance("model", model, GPT, what="a lib.models.GPT")
    val_ids = _shakespeare_ids()[2] if val_ids is None else val_ids
    seq_len, batch_size = sizes["seq_len"], sizes["batch_size"]
    windows = lm_eval_batches(val_ids, 4 * batch_size, seq_len)
    return evaluate(model, windows)


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
) -> dict[str, Any]:
    """A character-level GPT on Tiny Shakespeare: 90 % to train, the last
    10 % held out. ``sizes`` overrides :func:`run_sizes`; with
    ``checkpoint_dir`` a checkpoint is written at each evaluation, and
    ``resume`` continues from the newest intact one."""
    began = time.perf_counter()
    sizes, device = _start(
        "gpt", profile, sizes, device, compile, progress, seed, checkpoint_dir, resume
    )
    seq_len, batch_size = sizes["seq_len"], sizes["batch_size"]
    tokenizer, train_ids, val_ids = _shakespeare_ids()
    cfg = _run_config("gpt", sizes, tokenizer.vocab_size)
    model = GPT(cfg).to(device)
    prompt = torch.tensor([tokenizer.encode("\n")], device=device)
    n_new = seq_len - 1  # learned positions: no further than the context
    before = _sample(model, tokenizer, prompt, n_new, seed)
    optimizer = make_optimizer(model, sizes["lr"], betas=(0.9, 0.99), eps=1e-8)
    schedule = WarmupCosineSchedule(sizes["warmup"], sizes["n_steps"], min_ratio=0.1)
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
        compile=compile,
        progress=progress,
        **_saving(checkpoint_dir, resume, sizes["eval_every"]),
    )
    # a dry run (lib.utils.is_dry) checks this on the first 8 windows
    final_ids = val_ids[: 8 * seq_len + 1] if is_dry() else val_ids
    val_loss = char_gpt_val_loss(model, sizes, final_ids)
    return {
        "run": "gpt",
        "config": {"sizes": sizes, "model": asdict(cfg)},
        "metrics": {
            "val_loss": val_loss,
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


# From chapters/08-3-runs.md, section "BERT: pre-training on six books, then telling them apart".
def book_batches(books: list[torch.Tensor], batch_size: int, seq_len: int, seed: int):
    """``step -> batch`` of passages: a book drawn uniformly, then a window
    of it."""

    def batch_at(step: int) -> Batch:
        generator = step_generator(seed, step)
        labels = torch.randint(len(books), (batch_size,), generator=generator)
        rows = []
        for label in labels.tolist():
            book = books[label]
            high = len(book) - seq_len + 1
            start = int(torch.randint(high, (1,), generator=generator))
            rows.append(book[start : start + seq_len])
        return {"inputs": torch.stack(rows), "targets": labels}

    return batch_at


def book_test_set(books: list[torch.Tensor], per_book: int, seq_len: int, size: int):
    """``per_book`` evenly spaced passages of each (held-out) book, in
    batches."""
    rows, labels = [], []
    for label, ids in enumerate(books):
        starts = torch.linspace(0, len(ids) - seq_len, per_book).long()
        for start in starts.tolist():
            rows.append(ids[start : start + seq_len])
            labels.append(label)
    inputs, targets = torch.stack(rows), torch.tensor(labels)
    pieces = zip(inputs.split(size), targets.split(size))
    return [{"inputs": i, "targets": t} for i, t in pieces]


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
    """Masked-LM pre-training on six Gutenberg books, then book
    classification of held-out passages, against the same classifier trained
    from scratch. Arguments as :func:`char_gpt_run`; each of the three
    stages checkpoints in its own subfolder."""
    sizes, device = _start(
        "bert", profile, sizes, device, compile, progress, seed, checkpoint_dir, resume
    )
    books = load_gutenberg()
    tokenizer = CharTokenizer("".join(books.values()))
    specials = _specials(tokenizer, "<pad>", "<mask>")
    pad, mask_id, vocab_size = (
        *specials.values(),
        tokenizer.vocab_size + len(specials),
    )
    encoded = [torch.tensor(tokenizer.encode(text)) for text in books.values()]
    seen = [ids[: int(0.9 * len(ids))] for ids in encoded]
    held_out = [ids[int(0.9 * len(ids)) :] for ids in encoded]
    seq_len, batch_size = sizes["seq_len"], sizes["batch_size"]

    def mlm(windows: torch.Tensor, generator: torch.Generator) -> ObjectiveBatch:
        return masked_lm_batch(
            windows,
            mask_id=mask_id,
            vocab_size=vocab_size,
            generator=generator,
            special_ids=(pad,),
        )

    cfg = _run_config("bert", sizes, vocab_size)
    bert = BERT(cfg).to(device)
    optimizer = make_optimizer(bert, sizes["lr"], betas=(0.9, 0.98), eps=1e-9)
    pre_history = train(
        bert,
        lm_batches(torch.cat(seen), batch_size, seq_len - 1, seed=seed, objective=mlm),
        optimizer=optimizer,
        scheduler=make_scheduler(
            optimizer, WarmupCosineSchedule(sizes["warmup"], sizes["n_steps"])
        ),
        n_steps=sizes["n_steps"],
        eval_batches=lm_batches(
            torch.cat(held_out), batch_size, seq_len - 1, seed=seed + 1, objective=mlm
        ),
        eval_every=sizes["eval_every"],
        eval_iters=sizes["eval_iters"],
        compile=compile,
        progress=progress,
        **_saving(checkpoint_dir, resume, sizes["eval_every"], "pretraining"),
    )
    test_set = book_test_set(held_out, sizes["test_per_book"], seq_len, 4 * batch_size)
    finetuned, curves = {}, _curves(pre_history, "pretraining_")
    scratch = BERT(cfg).to(device)
    steps = sizes["finetune_steps"]
    for name, encoder in (("pretrained", bert), ("from_scratch", scratch)):
        # the same head and dropout masks for both
        torch.manual_seed(seed + 1)
        classifier = SequenceClassifier(encoder, len(books), sizes["dropout"])
        classifier = classifier.to(device)
        optimizer = make_optimizer(
            classifier, sizes["finetune_lr"], betas=(0.9, 0.98), eps=1e-9
        )
        schedule = WarmupCosineSchedule(steps // 10, steps)
        every = max(1, steps // 4)
        history = train(
            classifier,
            book_batches(seen, batch_size, seq_len, seed + 2),
            optimizer=optimizer,
            scheduler=make_scheduler(optimizer, schedule),
            n_steps=steps,
            eval_batches=test_set,
            eval_every=every,
            compile=compile,
            progress=progress,
            **_saving(checkpoint_dir, resume, every, name),
        )
        finetuned[name] = classifier_accuracy(classifier, test_set)
        curves.update(_curves(history, f"{name}_"))
    return {
        "run": "bert",
        "config": {"sizes": sizes, "model": asdict(cfg)},
        "metrics": {
            "mlm_val_loss": pre_history.eval_losses[-1],
            "accuracy_pretrained": finetuned["pretrained"],
            "accuracy_from_scratch": finetuned["from_scratch"],
            "chance": 1 / len(books),
            "test_passages": sum(len(b["targets"]) for b in test_set),
            "parameters": count_parameters(bert),
            **_speed(bert, pre_history, seq_len),
        },
        "curves": curves,
        "samples": {"books": list(books)},
    }


# From chapters/08-3-runs.md, section "T5: English to French".
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


@torch.no_grad()
def _translate(model: T5, sources: list[str], tokenizer: CharTokenizer, beam_size: int):
    """Greedy (``beam_size=1``) or beam translations of ``sources``
    (:func:`lib.generation.translate`, with this run's special ids)."""
    pad, eos = _specials(tokenizer, "<pad>", "</s>").values()
    return translate(
        model,
        tokenizer,
        sources,
        pad_id=pad,
        eos_id=eos,
        beam_size=beam_size,
        chunk=256,
    )


def _t5_data(sizes: Mapping[str, Any], seed: int):
    """``(tokenizer, train_pairs, test_pairs, batch_at, test_batches)`` of
    the T5 run: ``batch_at(step)`` draws training pairs, ``test_batches``
    holds all test pairs."""
    pairs = load_tatoeba_pairs()
    train_pairs, test_pairs = split_pairs_by_source(pairs, sizes["test_fraction"], seed)
    tokenizer = CharTokenizer("".join(e + f for e, f in pairs))
    pad, eos = _specials(tokenizer, "<pad>", "</s>").values()

    def encoded(pairs: list[tuple[str, str]]) -> tuple[list, list]:
        return (
            [torch.tensor([*tokenizer.encode(e), eos]) for e, _ in pairs],
            [torch.tensor([*tokenizer.encode(f), eos]) for _, f in pairs],
        )

    sources, targets = encoded(train_pairs)

    def batch_at(step: int) -> Batch:
        generator = step_generator(seed, step)
        rows = torch.randint(len(sources), (sizes["batch_size"],), generator=generator)
        return pair_batch([sources[i] for i in rows], [targets[i] for i in rows], pad)

    test_sources, test_targets = encoded(test_pairs)
    test_batches = [
        pair_batch(test_sources[i : i + 256], test_targets[i : i + 256], pad)
        for i in range(0, len(test_pairs), 256)
    ]
    return tokenizer, train_pairs, test_pairs, batch_at, test_batches


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
    sentences. Arguments as :func:`char_gpt_run`."""
    import sacrebleu  # the chapters' extra; the standard BLEU

    sizes, device = _start(
        "t5", profile, sizes, device, compile, progress, seed, checkpoint_dir, resume
    )
    tokenizer, train_pairs, test_pairs, batch_at, test_batches = _t5_data(sizes, seed)
    pad = _specials(tokenizer, "<pad>")["<pad>"]
    cfg = _run_config("t5", sizes, tokenizer.vocab_size + 2)
    model = T5(cfg, start_id=pad).to(device)
    optimizer = make_optimizer(model, sizes["lr"], betas=(0.9, 0.98), eps=1e-9)
    smoothing = sizes["label_smoothing"]
    history = train(
        model,
        batch_at,
        optimizer=optimizer,
        scheduler=make_scheduler(
            optimizer, WarmupCosineSchedule(sizes["warmup"], sizes["n_steps"])
        ),
        n_steps=sizes["n_steps"],
        loss_fn=lambda net, batch: model_loss(net, batch, label_smoothing=smoothing),
        eval_batches=test_batches,
        eval_every=sizes["eval_every"],
        compile=compile,
        progress=progress,
        **_saving(checkpoint_dir, resume, sizes["eval_every"]),
    )
    references: dict[str, list[str]] = {}
    for english, french in test_pairs:
        references.setdefault(english, []).append(french)
    english = list(references)
    n_refs = max(len(r) for r in references.values())
    # sacrebleu takes one stream per reference; None where a sentence has
    # fewer
    ref_streams = []
    for k in range(n_refs):
        ref_streams.append([r[k] if k < len(r) else None for r in references.values()])
    metrics: dict[str, Any] = {"test_loss": history.eval_losses[-1]}
    translations = {}
    for name, beam in (("greedy", 1), ("beam", sizes["beam_size"])):
        translations[name] = _translate(model, english, tokenizer, beam)
        bleu = sacrebleu.corpus_bleu(translations[name], ref_streams)
        metrics[f"bleu_{name}"] = bleu.score
    metrics.update(
        train_pairs=len(train_pairs),
        test_sentences=len(english),
        parameters=count_parameters(model),
        **_speed(model, history, 32),
    )
    samples = [
        {"english": s, "greedy": g, "beam": b, "references": references[s]}
        for s, g, b in zip(english[:8], translations["greedy"], translations["beam"])
    ]
    return {
        "run": "t5",
        "config": {"sizes": sizes, "model": asdict(cfg)},
        "metrics": metrics,
        "curves": _curves(history),
        "samples": samples,
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
    batch_size, n_steps = sizes["batch_size"], sizes["n_steps"]
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
        books = load_gutenberg()
        n_chars = CharTokenizer("".join(books.values())).vocab_size
        seq_len, steps = sizes["seq_len"], sizes["finetune_steps"]
        cfg = _run_config(run, sizes, n_chars + 2)  # and <pad>, <mask>
        bert = _on_meta(lambda: BERT(cfg))
        tokens = batch_size * seq_len
        forward = n_evals * sizes["eval_iters"] * tokens
        parts.append((bert, seq_len, n_steps * tokens, forward, n_steps))
        test_tokens = len(books) * sizes["test_per_book"] * seq_len
        # the evaluations, and the accuracy at the end
        ft_evals = _n_evaluations(steps, max(1, steps // 4)) + 1
        classifier = _on_meta(lambda: SequenceClassifier(bert, len(books)))
        for _ in ("pretrained", "from_scratch"):
            ft_tokens = ft_evals * test_tokens
            parts.append((classifier, seq_len, steps * tokens, ft_tokens, steps))
    else:
        tokenizer, _, _, batch_at, test_batches = _t5_data(sizes, 0)
        sample = range(0, n_steps, max(1, n_steps // 64))
        sampled_tokens = sum(tokens_in(batch_at(s)) for s in sample)
        per_batch = sampled_tokens / len(sample)
        seq_len = max(1, round(per_batch / (2 * batch_size)))  # per stack
        test_tokens = sum(tokens_in(b) for b in test_batches)
        # the characters, <pad> and </s>
        cfg = _run_config(run, sizes, tokenizer.vocab_size + 2)
        model = _on_meta(lambda: T5(cfg, start_id=0))
        forward = n_evals * test_tokens
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
