"""Train and package the small checkpoints the course ships, on a CPU, with its own code.

Two models come with ``lib`` (``lib/data/checkpoints``, loaded by
:func:`lib.pretrained.load_shipped`), so that every reader, on any machine, can see a
transformer that works:

* ``char-gpt-shakespeare``: chapter 8's character-level GPT on Tiny Shakespeare, trained
  by chapter 8's own command (``python -m lib.runs``, which writes its record), then
  packaged from its last checkpoint by ``char-gpt``;
* ``vit-mnist``: chapter 10's ViT on the shipped MNIST split (9,000 images to train on,
  1,000 held out, the chapter's split), trained and packaged by ``vit-mnist``.

    python -m lib.runs --run gpt --profile smoke --name 08-training-gpt-cpu \\
        --steps 4000 --set d_model=128 --set n_heads=4 --set n_layers=4 \\
        --set seq_len=128 --set batch_size=32 --set lr=0.002 --set warmup=100 \\
        --set eval_every=500 --set eval_iters=20 --checkpoint-dir CHECKPOINT_DIR --quiet
    python scripts/train_shipped.py char-gpt --checkpoint-dir CHECKPOINT_DIR
    python scripts/train_shipped.py vit-mnist --steps 2500 --patch-size 7 --d-model 96 \\
        --n-layers 4

(the shipped ViT's sizes: the script's defaults make another, larger one). Each writes
a record under ``book/results/`` (:func:`lib.utils.write_record`) and the checkpoint, a
model file of :func:`lib.pretrained.save_model`'s format (the kind, configuration,
weights, tokenizer and metadata, which :func:`lib.pretrained.load_model` reads in one
call), with its sha256 in ``lib/data/checkpoints/manifest.json``. ``--dry-run``
trains for a few steps into a temporary folder (the tests run it).

    python scripts/train_shipped.py evaluate

re-evaluates the shipped checkpoints as they are, with no training (under a minute on a
CPU): each one's held-out numbers (the GPT's loss per character,
:func:`lib.runs.char_gpt_val_loss`; the ViT's accuracy and loss on its 1,000 images),
written into its record and its manifest entry. The record then names this command and
the commit it ran on (it refuses a tree with uncommitted changes unless
``--allow-dirty``); its curves, samples and training time stay the training's, and
``extra["training"]`` keeps the training's command, commit, date and wall time. The
checkpoint files are not changed: their sha256 is checked to stay the same.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import re
import shlex
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from lib.batches import lm_batches, lm_eval_batches, step_generator  # noqa: E402
from lib.datasets import (  # noqa: E402
    load_gutenberg,
    load_mnist,
    load_tatoeba_pairs,
    load_tiny_shakespeare,
)
from lib.generation import translate  # noqa: E402
from lib.models import (  # noqa: E402
    BERT,
    GPT,
    T5,
    SequenceClassifier,
    TransformerConfig,
)
from lib.objectives import masked_lm_batch  # noqa: E402
from lib.pretrained import (  # noqa: E402
    CHECKPOINTS,
    MANIFEST,
    load_shipped,
    save_shipped,
    shipped_names,
)
from lib.runs import (  # noqa: E402
    BERT_SPECIALS,
    SHIPPED_SIZES,
    bert_data,
    bert_run,
    char_gpt_val_loss,
    classifier_accuracy,
    masked_lm_scores,
    pair_batch,
    split_pairs_by_source,
    wilson_interval,
)
from lib.tokenizer import BPETokenizer, CharTokenizer  # noqa: E402
from lib.training import (  # noqa: E402
    WarmupCosineSchedule,
    evaluate,
    load_checkpoint,
    make_optimizer,
    make_scheduler,
    model_loss,
    train,
)
from lib.utils import (  # noqa: E402
    PROFILE_ENV,
    git_commit,
    read_record,
    relative_command,
    set_threads,
    write_record,
)
from lib.vit import ViT, ViTConfig, classification_loss, image_batches  # noqa: E402

RESULTS = ROOT / "book" / "results"
GPT_RECORD = RESULTS / "08-training-gpt-cpu"
VIT_RECORD = RESULTS / "10-vit-mnist-cpu"
T5_RECORD = RESULTS / "08-training-t5-cpu"
BERT_RECORD = RESULTS / "08-training-bert-cpu"


def mnist_split(n_val: int = 1_000):
    """Chapter 10's split of the shipped MNIST images: (train_x, train_y, val_x, val_y),
    images ``(n 1 28 28)`` in [0, 1]."""
    images_u8, labels = load_mnist()
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(0))
    train_idx, val_idx = order[n_val:], order[:n_val]
    images = images_u8.float().div(255).unsqueeze(1)
    return images[train_idx], labels[train_idx], images[val_idx], labels[val_idx]


def this_command() -> str:
    """The command that started this script, as a record and the manifest name it."""
    return f"python scripts/train_shipped.py {shlex.join(sys.argv[1:])}"


def _relative(path: Path) -> str:
    """``path`` from the repository's root when it is inside it (records move with it)."""
    path = path.resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


@torch.no_grad()
def accuracy(model: torch.nn.Module, x, y, mean: float, std: float) -> float:
    model.eval()
    predictions = torch.cat([model((c - mean) / std).argmax(-1) for c in x.split(500)])
    model.train()
    return (predictions == y).float().mean().item()


def vit_held_out(model: torch.nn.Module, x, y, mean: float, std: float) -> dict:
    """The ViT's held-out numbers: ``val_accuracy`` (the share of the images ``x`` it
    labels ``y``) and ``val_loss`` (the mean cross-entropy per image)."""
    val = [{"images": (x - mean) / std, "labels": y}]
    return dict(
        val_accuracy=accuracy(model, x, y, mean, std),
        val_loss=evaluate(model, val, loss_fn=classification_loss),
    )


def train_vit(args: argparse.Namespace, out: Path, shipped_dir: Path | None) -> dict:
    train_x, train_y, val_x, val_y = mnist_split()
    mean, std = train_x.mean().item(), train_x.std().item()
    cfg = ViTConfig(
        image_size=28,
        patch_size=args.patch_size,
        n_classes=10,
        d_model=args.d_model,
        n_heads=4,
        n_layers=args.n_layers,
        dropout=args.dropout,
    )
    torch.manual_seed(args.seed)
    model = ViT(cfg)
    optimizer = make_optimizer(model, args.lr, weight_decay=0.05, betas=(0.9, 0.999))
    schedule = WarmupCosineSchedule(max(1, args.steps // 20), args.steps, min_ratio=0.0)
    batches = image_batches(
        train_x, train_y, args.batch_size, max_shift=2, mean=mean, std=std
    )
    val = [{"images": (val_x - mean) / std, "labels": val_y}]
    began = time.time()
    history = train(
        model,
        batches,
        optimizer=optimizer,
        scheduler=make_scheduler(optimizer, schedule),
        n_steps=args.steps,
        loss_fn=classification_loss,
        eval_batches=val,
        eval_every=max(1, args.steps // 10),
        progress=not args.quiet,
    )
    metrics = dict(
        **vit_held_out(model, val_x, val_y, mean, std),
        parameters=sum(p.numel() for p in model.parameters()),
        train_seconds=history.train_seconds,
        steps=args.steps,
        threads=torch.get_num_threads(),
    )
    write_record(
        out,
        name=out.name,
        command=this_command(),
        wall_seconds=time.time() - began,
        metrics=metrics,
        curves={
            "train": dict(step=list(range(1, args.steps + 1)), loss=history.losses),
            "validation": dict(step=history.eval_steps, loss=history.eval_losses),
        },
        config=cfg,
        extra=dict(
            batch_size=args.batch_size, lr=args.lr, max_shift=2, mean=mean, std=std
        ),
        device="cpu",
    )
    save_shipped(
        model,
        "vit-mnist",
        metrics=metrics,
        # what a user must do to an image before the model reads it
        inputs=dict(
            pixels="in [0, 1] (lib.datasets.load_mnist's uint8 / 255), then "
            "(x - mean) / std",
            mean=mean,
            std=std,
        ),
        record=_relative(out / "metrics.json"),
        command=this_command(),
        directory=shipped_dir or CHECKPOINTS,
    )
    print(f"vit-mnist: {metrics} -> {out}")
    return metrics


# --- the T5 translator: English -> French on the whole Tatoeba file ---------------------

T5_NAME = "t5-tatoeba-en-fr"
T5_SPECIALS = ("<pad>", "</s>")  # ids 256 and 257 of the BPE vocabulary


def tatoeba_split(test_fraction: float = 0.015, seed: int = 0):
    """The shipped T5's split of all 142,787 Tatoeba pairs: ``(train, test)``, no English
    sentence on both sides (:func:`lib.runs.split_pairs_by_source`); the test side holds
    every French translation of its English sentences, its references."""
    pairs = load_tatoeba_pairs(all_pairs=True)
    return split_pairs_by_source(pairs, test_fraction, seed)


def t5_tokenizer(train_pairs: list[tuple[str, str]], vocab_size: int) -> BPETokenizer:
    """Chapter 1's byte-level BPE, one vocabulary for both languages, learned from the
    training pairs only."""
    text = "\n".join(f"{english}\n{french}" for english, french in train_pairs)
    return BPETokenizer().train(text, vocab_size, special_tokens=T5_SPECIALS)


def t5_encode(tokenizer: BPETokenizer, text: str, max_len: int) -> torch.Tensor:
    """The ids of ``text`` and ``</s>``, cut to ``max_len`` ids."""
    eos = tokenizer.special_tokens["</s>"]
    return torch.tensor([*tokenizer.encode(text)[: max_len - 1], eos])


def length_batches(lengths: list[int], max_tokens: int, seed: int):
    """``batch_rows(step)``: the rows of the batch of ``step``. Each epoch sorts the rows
    by length (ties in a random order), cuts them into batches of at most ``max_tokens``
    padded tokens (rows times the longest row) and shuffles the batches; epochs follow
    each other, each drawn from ``(seed, epoch)``."""
    epochs: list[list[list[int]]] = []
    starts = [0]  # the first step of each epoch

    def make_epoch(epoch: int) -> list[list[int]]:
        generator = step_generator(seed, epoch)
        ties = torch.rand(len(lengths), generator=generator).tolist()
        order = sorted(range(len(lengths)), key=lambda i: (lengths[i], ties[i]))
        batches, rows, longest = [], [], 0
        for i in order:
            if rows and max(longest, lengths[i]) * (len(rows) + 1) > max_tokens:
                batches.append(rows)
                rows, longest = [], 0
            rows.append(i)
            longest = max(longest, lengths[i])
        batches.append(rows)
        shuffled = torch.randperm(len(batches), generator=generator).tolist()
        return [batches[j] for j in shuffled]

    def batch_rows(step: int) -> list[int]:
        while step >= starts[-1] + (len(epochs[-1]) if epochs else 0) or not epochs:
            if epochs:
                starts.append(starts[-1] + len(epochs[-1]))
            epochs.append(make_epoch(len(epochs)))
        epoch = max(e for e, first in enumerate(starts) if first <= step)
        return epochs[epoch][step - starts[epoch]]

    return batch_rows


def t5_bleu(model: T5, tokenizer: BPETokenizer, test_pairs, beam_size: int) -> dict:
    """sacreBLEU of the translations of the held-out English sentences, against all
    their French translations in the file (one reference stream per translation,
    ``None`` where a sentence has fewer)."""
    import sacrebleu

    references: dict[str, list[str]] = {}
    for english, french in test_pairs:
        references.setdefault(english, []).append(french)
    english = list(references)
    streams = [
        [r[k] if k < len(r) else None for r in references.values()]
        for k in range(max(map(len, references.values())))
    ]
    pad, eos = (tokenizer.special_tokens[t] for t in T5_SPECIALS)
    hypotheses = translate(
        model, tokenizer, english, pad_id=pad, eos_id=eos, beam_size=beam_size
    )
    metric = sacrebleu.BLEU()
    bleu = metric.corpus_score(hypotheses, streams)
    return dict(
        bleu=bleu.score,
        signature=str(metric.get_signature()),
        sentences=len(english),
        hypotheses=hypotheses,
        streams=streams,
        samples=[
            dict(english=e, french=h, references=references[e])
            for e, h in zip(english[:12], hypotheses[:12])
        ],
    )


def bleu_interval(
    hypotheses: list[str], streams: list[list], n_resamples: int = 300, seed: int = 0
) -> tuple[float, float]:
    """A 95 % bootstrap interval of corpus BLEU: the 2.5th and 97.5th percentiles of
    the BLEU of ``n_resamples`` resamples of the sentences, drawn with replacement."""
    import sacrebleu

    metric = sacrebleu.BLEU()
    generator = torch.Generator().manual_seed(seed)
    n = len(hypotheses)
    scores = []
    for _ in range(n_resamples):
        rows = torch.randint(n, (n,), generator=generator).tolist()
        resampled = [[stream[i] for i in rows] for stream in streams]
        scores.append(
            metric.corpus_score([hypotheses[i] for i in rows], resampled).score
        )
    low, high = torch.tensor(scores).quantile(torch.tensor([0.025, 0.975])).tolist()
    return low, high


def t5_held_out(model: T5, tokenizer: BPETokenizer, test_fraction: float) -> dict:
    """The shipped T5's held-out numbers, re-measured from the model as it is: sacreBLEU
    of beam search (4) and greedy translations of the held-out English sentences of
    :func:`tatoeba_split`, and a bootstrap 95 % interval of the beam's."""
    _, test_pairs = tatoeba_split(test_fraction)
    beam = t5_bleu(model, tokenizer, test_pairs, beam_size=4)
    greedy = t5_bleu(model, tokenizer, test_pairs, beam_size=1)
    low, high = bleu_interval(beam["hypotheses"], beam["streams"])
    return dict(
        bleu_beam=beam["bleu"],
        bleu_greedy=greedy["bleu"],
        bleu_beam_low=low,
        bleu_beam_high=high,
        test_sentences=beam["sentences"],
    )


def train_t5(args: argparse.Namespace, out: Path, shipped_dir: Path | None) -> dict:
    began = time.time()
    train_pairs, test_pairs = tatoeba_split(args.test_fraction)
    if args.dry_run:
        train_pairs = train_pairs[:: len(train_pairs) // 2000]
        test_pairs = test_pairs[:40]
    tokenizer = t5_tokenizer(train_pairs, args.vocab_size)
    pad = tokenizer.special_tokens["<pad>"]
    sources = [t5_encode(tokenizer, e, args.max_len) for e, _ in train_pairs]
    targets = [t5_encode(tokenizer, f, args.max_len) for _, f in train_pairs]
    prepared = time.time() - began
    lengths = [max(len(s), len(t)) for s, t in zip(sources, targets)]
    batch_rows = length_batches(lengths, args.max_tokens, args.seed)

    def batch_at(step: int):
        rows = batch_rows(step)
        return pair_batch([sources[i] for i in rows], [targets[i] for i in rows], pad)

    held_out = [p for p in test_pairs[: args.eval_pairs]]
    eval_batches = [
        pair_batch(
            [t5_encode(tokenizer, e, args.max_len) for e, _ in held_out[i : i + 128]],
            [t5_encode(tokenizer, f, args.max_len) for _, f in held_out[i : i + 128]],
            pad,
        )
        for i in range(0, len(held_out), 128)
    ]
    cfg = TransformerConfig(
        vocab_size=tokenizer.vocab_size,
        d_model=args.d_model,
        n_heads=args.n_heads,
        n_layers=args.n_layers,
        n_decoder_layers=args.n_layers,
        d_ff=args.d_ff,
        dropout=args.dropout,
        positions="t5",
        norm="rmsnorm",
        activation="relu",
        bias=False,
        attn_scale=1.0,
        max_len=args.max_len,
    )
    torch.manual_seed(args.seed)
    model = T5(cfg, start_id=pad)
    optimizer = make_optimizer(model, args.lr, betas=(0.9, 0.98), eps=1e-9)
    schedule = WarmupCosineSchedule(args.warmup, args.steps, min_ratio=0.05)
    history = train(
        model,
        batch_at,
        optimizer=optimizer,
        scheduler=make_scheduler(optimizer, schedule),
        n_steps=args.steps,
        loss_fn=lambda net, batch: model_loss(net, batch, label_smoothing=0.1),
        eval_batches=eval_batches,
        eval_every=max(1, args.steps // 10),
        progress=not args.quiet,
    )
    trained = time.time()
    beam = t5_bleu(model, tokenizer, test_pairs, beam_size=4)
    greedy = t5_bleu(model, tokenizer, test_pairs, beam_size=1)
    metrics = dict(
        bleu_beam=beam["bleu"],
        bleu_greedy=greedy["bleu"],
        test_sentences=beam["sentences"],
        test_pairs=len(test_pairs),
        train_pairs=len(train_pairs),
        test_loss=history.eval_losses[-1],
        parameters=sum(p.numel() for p in model.parameters()),
        vocab_size=tokenizer.vocab_size,
        train_seconds=history.train_seconds,
        prepare_seconds=prepared,
        bleu_seconds=time.time() - trained,
        steps=args.steps,
        threads=torch.get_num_threads(),
    )
    command = this_command()
    write_record(
        out,
        name=out.name,
        command=command,
        wall_seconds=time.time() - began,
        metrics=metrics,
        curves={
            "train": dict(step=list(range(1, args.steps + 1)), loss=history.losses),
            "held_out": dict(step=history.eval_steps, loss=history.eval_losses),
        },
        config=cfg,
        samples=beam["samples"],
        extra=dict(
            bleu_signature=beam["signature"],
            max_tokens=args.max_tokens,
            lr=args.lr,
            warmup=args.warmup,
            test_fraction=args.test_fraction,
            label_smoothing=0.1,
            split="lib.runs.split_pairs_by_source(load_tatoeba_pairs(all_pairs=True), "
            f"{args.test_fraction}, seed=0)",
        ),
        device="cpu",
    )
    save_shipped(
        model,
        T5_NAME,
        tokenizer=tokenizer,
        metrics=metrics,
        inputs=dict(
            source="English text; ids = tokenizer.encode(text) + [</s>], padded with "
            "<pad>, which also starts the decoder",
            pad_id=pad,
            eos_id=tokenizer.special_tokens["</s>"],
        ),
        record=_relative(out / "metrics.json"),
        command=command,
        directory=shipped_dir or CHECKPOINTS,
    )
    print(f"{T5_NAME}: {metrics} -> {out}")
    return metrics


# --- the BERTs: lib.runs.bert_run at its CPU size (SHIPPED_SIZES["bert"]) -------------

BERT_MLM_NAME = "bert-gutenberg-mlm"
BERT_BOOKS_NAME = "bert-gutenberg-books"


def bert_held_out(shipped, record: dict) -> dict:
    """A shipped BERT's held-out numbers, re-measured from the file as it is, on the
    recipe's own test data (:func:`lib.runs.bert_data` with the file's tokenizer): the
    masked LM's loss and top-1 against the unigram's, or the book classifier's accuracy
    with its Wilson interval."""
    sizes = record["config"]["sizes"]
    data = bert_data(shipped.tokenizer, sizes, record["extra"]["seed"])
    if shipped.entry["kind"] == "bert":
        return masked_lm_scores(shipped.model, data["mlm_test"], data["unigram"])
    value = classifier_accuracy(shipped.model, data["test"])
    n = sum(len(b["targets"]) for b in data["test"])
    low, high = wilson_interval(round(value * n), n)
    return dict(
        accuracy_pretrained=value, accuracy_pretrained_low=low,
        accuracy_pretrained_high=high, test_passages=n,
    )  # fmt: skip


def train_bert(args: argparse.Namespace, out: Path, shipped_dir: Path | None) -> dict:
    """Train both BERTs with lib.runs.bert_run at the shipped sizes, record the run and
    save the masked LM and the pre-trained book classifier."""
    began = time.time()
    sizes = dict(SHIPPED_SIZES["bert"])
    if args.dry_run:
        sizes |= dict(
            n_steps=4, warmup=2, finetune_steps=3, vocab_size=300, eval_every=2,
            eval_iters=1, mlm_test_batches=1, test_per_book=4, labelled_per_book=4,
        )  # fmt: skip
    result = bert_run(
        "smoke", sizes=sizes, seed=args.seed, progress=not args.quiet,
        checkpoint_dir=args.checkpoint_dir, resume=args.resume,
    )  # fmt: skip
    metrics = result["metrics"] | dict(threads=torch.get_num_threads())
    command = this_command()
    write_record(
        out, name=out.name, command=command, wall_seconds=time.time() - began,
        metrics=metrics, curves=result["curves"], config=result["config"],
        samples=result["samples"],
        extra=dict(
            seed=args.seed, recipe="lib.runs.bert_run, sizes lib.runs.SHIPPED_SIZES",
            held_out="every 5th chapter of each book (lib.runs.gutenberg_split)",
        ),
        device="cpu",
    )  # fmt: skip
    tokenizer, models = result["tokenizer"], result["models"]
    sizes = result["config"]["sizes"]
    pad, mask_id = (tokenizer.special_tokens[t] for t in BERT_SPECIALS)
    record = _relative(out / "metrics.json")
    mlm_keys = ("mlm_test_loss", "mlm_test_top1", "unigram_test_loss", "unigram_test_top1")
    save_shipped(
        models["mlm"], BERT_MLM_NAME, tokenizer=tokenizer,
        metrics={k: metrics[k] for k in mlm_keys},
        inputs=dict(pad_id=pad, mask_id=mask_id, max_len=sizes["seq_len"]),
        record=record, command=command, directory=shipped_dir or CHECKPOINTS,
    )  # fmt: skip
    save_shipped(
        models["classifier"], BERT_BOOKS_NAME, tokenizer=tokenizer,
        metrics={k: v for k, v in metrics.items() if k.startswith(("accuracy", "test"))},
        inputs=dict(labels=result["samples"]["books"], pad_id=pad,
                    passage=f"{sizes['passage_len']} tokens"),
        record=record, command=command, directory=shipped_dir or CHECKPOINTS,
    )  # fmt: skip
    print(f"bert: {metrics} -> {out}")
    return metrics


def package_char_gpt(args: argparse.Namespace, shipped_dir: Path | None) -> dict:
    """Package the last checkpoint of chapter 8's char-GPT run with its record."""
    record = read_record(args.record)
    sizes = record["config"]["sizes"]
    cfg = TransformerConfig(**record["config"]["model"])
    model = GPT(cfg)
    newest = sorted(Path(args.checkpoint_dir).glob("step-*.pt"))[-1]
    step = load_checkpoint(newest, model=model, restore_rng=False)["step"]
    if step != sizes["n_steps"]:
        raise SystemExit(f"{newest} is step {step}, the run had {sizes['n_steps']}")
    tokenizer = CharTokenizer(load_tiny_shakespeare())
    if tokenizer.vocab_size != cfg.vocab_size:
        raise SystemExit("the tokenizer does not match the run's vocabulary")
    metrics = {k: record["metrics"][k] for k in ("val_loss", "parameters")}
    metrics |= dict(train_seconds=record["metrics"]["train_seconds"], steps=step)
    save_shipped(
        model,
        "char-gpt-shakespeare",
        tokenizer=tokenizer,
        metrics=metrics,
        record=_relative(Path(args.record) / "metrics.json"),
        command=_training(record)["command"],
        directory=shipped_dir or CHECKPOINTS,
    )
    print(f"char-gpt-shakespeare: {metrics}")
    return metrics


# what a re-evaluated record keeps of its training, in extra["training"]
TRAINING_KEYS = ("command", "commit", "date", "wall_seconds", "device", "torch")


def _training(record: dict) -> dict:
    """The training's command, commit, date, wall time and environment: the record's
    own, or, once it has been re-evaluated, those it kept in ``extra["training"]``."""
    kept = record["extra"].get("training") or {k: record[k] for k in TRAINING_KEYS}
    return {**kept, "command": relative_command(kept["command"])}


def evaluate_shipped(args: argparse.Namespace, argv: list[str]) -> dict:
    """Re-evaluate each checkpoint of ``args.directory``'s manifest, as it is: write its
    held-out numbers into its record and its manifest entry, nothing else (no training;
    the checkpoint file keeps its bytes)."""
    commit = git_commit()  # once: the records written below change the tree
    if not args.allow_dirty and (commit.endswith("-dirty") or commit == "unknown"):
        raise SystemExit(
            f"the checkout is at {commit}: a record names the commit it was made "
            "from, so commit first (or pass --allow-dirty)"
        )
    command = f"python scripts/train_shipped.py {shlex.join(argv)}"
    directory = Path(args.directory)
    results = {}
    names = shipped_names(directory)
    unknown = sorted(set(args.only or ()) - set(names))
    if unknown:
        raise SystemExit(f"--only {unknown}: no such checkpoint; shipped: {names}")
    for name in args.only or names:
        shipped = load_shipped(name, directory=directory)  # sha256 checked
        entry = shipped.entry
        record_path = ROOT / entry["record"]
        record = read_record(record_path)
        began = time.time()
        if entry["kind"] == "gpt":
            sizes = record["config"]["sizes"]
            new = dict(val_loss=char_gpt_val_loss(shipped.model, sizes))
        elif entry["kind"] == "t5":
            fraction = record["extra"]["test_fraction"]
            new = t5_held_out(shipped.model, shipped.tokenizer, fraction)
        elif entry["kind"] in ("bert", "classifier"):
            new = bert_held_out(shipped, record)
        else:
            _, _, val_x, val_y = mnist_split()
            mean, std = entry["inputs"]["mean"], entry["inputs"]["std"]
            new = vit_held_out(shipped.model, val_x, val_y, mean, std)
        seconds = time.time() - began
        for key, value in new.items():
            print(f"{name}: {key} {record['metrics'].get(key)} -> {value}")
        profile = os.environ.get(PROFILE_ENV)
        os.environ[PROFILE_ENV] = record["profile"]  # the training's sizes
        try:
            write_record(
                record_path.parent,
                name=record["name"],
                command=command,
                wall_seconds=seconds,
                metrics={**record["metrics"], **new},
                curves=record["curves"],
                config=record["config"],
                samples=record["samples"],
                extra={**record["extra"], "training": _training(record)},
                device="cpu",
                commit=commit,
            )
        finally:
            if profile is None:
                os.environ.pop(PROFILE_ENV)
            else:
                os.environ[PROFILE_ENV] = profile
        # the new numbers go into the manifest only: the file is not written again
        # (a re-save of a float16 file can differ in its bytes, not its content)
        manifest_path = directory / MANIFEST
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        manifest[name]["metrics"] = {**entry["metrics"], **new}
        text = json.dumps(manifest, indent=2, sort_keys=True, ensure_ascii=False)
        manifest_path.write_text(text + "\n", encoding="utf-8")
        load_shipped(name, directory=directory)  # the file still has its sha256
        results[name] = new
    return results


def window_losses(model: torch.nn.Module, windows: list) -> torch.Tensor:
    """The mean loss of each held-out window ``(n_windows,)``, float64."""
    losses = []
    with torch.no_grad():
        for batch in windows:
            logits = model(batch["inputs"])
            per_token = torch.nn.functional.cross_entropy(
                logits.transpose(1, 2), batch["targets"], reduction="none"
            )
            losses.append(per_token.double().mean(dim=1))
    return torch.cat(losses)


def intervals(directory: Path = CHECKPOINTS) -> dict:
    """Each shipped checkpoint's held-out number with its 95 % interval, from the files
    as they are: the ViT's accuracy on its 1,000 held-out images (Wilson), the
    char-GPT's loss per character over its held-out windows (mean ± 1.96 standard
    errors, the windows taken as independent samples). The T5's BLEU and its bootstrap
    interval come from its manifest entry, as ``evaluate`` measured them from the file
    (translating its 1,480 held-out sentences takes minutes on a CPU)."""
    results = {}
    for name in shipped_names(directory):
        shipped = load_shipped(name, directory=directory)
        entry = shipped.entry
        if entry["kind"] == "bert":
            continue  # a masked LM's loss: no held-out number to put an interval on
        if entry["kind"] == "classifier":
            m = bert_held_out(shipped, read_record(ROOT / entry["record"]))
            results[name] = dict(
                metric="accuracy", value=m["accuracy_pretrained"],
                low=m["accuracy_pretrained_low"], high=m["accuracy_pretrained_high"],
                n=m["test_passages"], unit="passages (Wilson)",
            )  # fmt: skip
        elif entry["kind"] == "t5":
            m = entry["metrics"]
            results[name] = dict(
                metric="bleu_beam", value=m["bleu_beam"], low=m["bleu_beam_low"],
                high=m["bleu_beam_high"], n=m["test_sentences"],
                unit="English sentences (bootstrap)",
            )  # fmt: skip
        elif entry["kind"] == "gpt":
            sizes = read_record(ROOT / entry["record"])["config"]["sizes"]
            val_ids = load_held_out_shakespeare()
            windows = lm_eval_batches(
                val_ids, 4 * sizes["batch_size"], sizes["seq_len"]
            )
            losses = window_losses(shipped.model, windows)
            n, mean = len(losses), losses.mean().item()
            half = 1.96 * losses.std().item() / math.sqrt(n)
            results[name] = dict(
                metric="val_loss", value=mean, low=mean - half, high=mean + half,
                n=n, unit=f"windows of {sizes['seq_len']} characters",
            )  # fmt: skip
        else:
            _, _, val_x, val_y = mnist_split()
            mean, std = entry["inputs"]["mean"], entry["inputs"]["std"]
            value = accuracy(shipped.model, val_x, val_y, mean, std)
            correct = round(value * len(val_y))
            low, high = wilson_interval(correct, len(val_y))
            results[name] = dict(
                metric="val_accuracy", value=correct / len(val_y), low=low, high=high,
                n=len(val_y), unit="images",
            )  # fmt: skip
        r = results[name]
        print(
            f"{name}: {r['metric']} {r['value']:.4f}, 95 % interval "
            f"{r['low']:.4f}-{r['high']:.4f} ({r['n']:,} held-out {r['unit']})"
        )
    return results


def load_held_out_shakespeare() -> torch.Tensor:
    """The last 10 % of Tiny Shakespeare as ids: the char-GPT's held-out text."""
    text = load_tiny_shakespeare()
    ids = torch.tensor(CharTokenizer(text).encode(text))
    return ids[int(0.9 * len(ids)) :]


def main(argv: list[str] | None = None) -> dict:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="model", required=True)
    vit = sub.add_parser("vit-mnist", help="train and package the MNIST ViT")
    vit.add_argument("--steps", type=int, default=3000)
    vit.add_argument("--batch-size", type=int, default=128)
    vit.add_argument("--lr", type=float, default=2e-3)
    vit.add_argument("--patch-size", type=int, default=4)
    vit.add_argument("--d-model", type=int, default=64)
    vit.add_argument("--n-layers", type=int, default=4)
    vit.add_argument("--dropout", type=float, default=0.0)
    vit.add_argument("--seed", type=int, default=0)
    t5 = sub.add_parser("t5-tatoeba", help="train and package the English-French T5")
    t5.add_argument("--steps", type=int, default=6000)
    t5.add_argument(
        "--max-tokens", type=int, default=4096, help="padded tokens a batch"
    )
    t5.add_argument("--lr", type=float, default=1e-3)
    t5.add_argument("--warmup", type=int, default=300)
    t5.add_argument("--vocab-size", type=int, default=4000)
    t5.add_argument("--d-model", type=int, default=192)
    t5.add_argument("--d-ff", type=int, default=768)
    t5.add_argument("--n-heads", type=int, default=4)
    t5.add_argument("--n-layers", type=int, default=3)
    t5.add_argument("--dropout", type=float, default=0.1)
    t5.add_argument("--max-len", type=int, default=64)
    t5.add_argument("--test-fraction", type=float, default=0.015)
    t5.add_argument("--eval-pairs", type=int, default=512)
    t5.add_argument("--seed", type=int, default=0)
    t5.add_argument(
        "--threads", type=int, default=0, help="CPU threads (default: all cores)"
    )
    bert = sub.add_parser("bert", help="train and package the BERTs (lib.runs.bert_run)")
    bert.add_argument("--seed", type=int, default=0)
    bert.add_argument("--checkpoint-dir", type=Path, help="checkpoints of each stage")
    bert.add_argument("--resume", action="store_true", help="from --checkpoint-dir")
    bert.add_argument(
        "--threads", type=int, default=0, help="CPU threads (default: all)"
    )
    gpt = sub.add_parser("char-gpt", help="package chapter 8's char-GPT run")
    gpt.add_argument("--checkpoint-dir", type=Path, required=True)
    gpt.add_argument("--record", type=Path, default=GPT_RECORD)
    again = sub.add_parser(
        "evaluate", help="re-evaluate the shipped checkpoints, as they are"
    )
    again.add_argument(
        "--directory",
        type=Path,
        default=CHECKPOINTS,
        help="the checkpoints and their manifest (default: lib/data/checkpoints)",
    )
    again.add_argument(
        "--only", nargs="+", metavar="NAME", help="these checkpoints (default: all)"
    )
    again.add_argument(
        "--allow-dirty",
        action="store_true",
        help="record a tree with uncommitted changes (its commit ends in -dirty)",
    )
    sub.add_parser(
        "intervals",
        help="the shipped checkpoints' held-out numbers with 95 %% intervals",
    )
    for each in (vit, t5, bert, gpt):
        each.add_argument("--quiet", action="store_true")
        each.add_argument(
            "--dry-run",
            action="store_true",
            help="a few steps; the record and checkpoint go to --scratch",
        )
        each.add_argument(
            "--scratch", type=Path, help="the dry run's folder (default: a new one)"
        )
    args = parser.parse_args(argv)
    threads = getattr(args, "threads", 0) or None
    if threads is None and args.model in ("t5-tatoeba", "bert"):
        threads = (
            os.cpu_count() or 1
        )  # sized for every core, not the smoke profile's one
    set_threads(threads)
    if args.model == "evaluate":
        return evaluate_shipped(args, argv)
    if args.model == "intervals":
        return intervals()
    if args.dry_run:
        scratch = args.scratch or Path(tempfile.mkdtemp(prefix="shipped-"))
        if args.model == "vit-mnist":
            args.steps = 4
            return train_vit(args, scratch / VIT_RECORD.name, scratch / "checkpoints")
        if args.model == "t5-tatoeba":
            args.steps, args.warmup, args.vocab_size = 4, 2, 300
            return train_t5(args, scratch / T5_RECORD.name, scratch / "checkpoints")
        if args.model == "bert":
            return train_bert(args, scratch / BERT_RECORD.name, scratch / "checkpoints")
        return package_char_gpt(args, scratch / "checkpoints")
    if args.model == "vit-mnist":
        return train_vit(args, VIT_RECORD, None)
    if args.model == "t5-tatoeba":
        return train_t5(args, T5_RECORD, None)
    if args.model == "bert":
        return train_bert(args, BERT_RECORD, None)
    return package_char_gpt(args, None)


if __name__ == "__main__":
    main()
