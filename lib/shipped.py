# This file is generated from chapters/08-4-shipped.md by tools/tangle.py. Do not edit it by hand:
# edit the chapter's cells tagged "export", then run `python tools/tangle.py`.
# From chapters/08-4-shipped.md, section "The recipes at the size of a CPU".
"""The models the course ships (``lib/data/checkpoints/``), as chapter 8's
recipes at the size of a CPU (page 8.4).

* :data:`SHIPPED_SIZES`: the sizes of :func:`lib.runs.bert_run` and
  :func:`lib.runs.t5_run` for the shipped BERTs and translator, over the
  smoke profile's (``run_sizes(run, "smoke", **SHIPPED_SIZES[run])``).
* :func:`char_gpt_held_out`, :func:`bert_held_out`: a shipped file's
  held-out numbers with 95 % intervals, by its recipe's own measure.
* :class:`ShippedRun`, :data:`SHIPPED_RUNS`, :func:`train_shipped_run`:
  each recipe whose models ship, and what each of its models needs to be
  shipped (:func:`bert_files`, :func:`t5_files`, :func:`char_gpt_files`);
  chapter 10 registers its ViT (:func:`register_shipped_run`).
* :class:`HeldOut`, :data:`HELD_OUT`, :func:`held_out`,
  :func:`held_out_interval`, :func:`reevaluate_shipped`: a shipped file
  re-measured as it is, by its kind's measure (chapter 10 registers the
  ViT's, :func:`register_held_out`).
* :func:`linear_pixels_accuracy`: the ViT's baseline, a linear model on the
  raw pixels.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from einops import rearrange
from torch import nn

from lib import _checks as check
from lib.batches import lm_eval_batches
from lib.datasets import load_tiny_shakespeare
from lib.model_file import LoadedModel
from lib.models import GPT, SequenceClassifier, TransformerConfig
from lib.pretrained import CHECKPOINTS, MANIFEST, load_shipped
from lib.runs import (
    BERT_SPECIALS,
    bert_data,
    bert_run,
    classifier_accuracy,
    masked_lm_scores,
    run_sizes,
    shakespeare_ids,
    t5_bleu,
    t5_run,
    tatoeba_split,
    wilson_interval,
)
from lib.tokenizer import BPETokenizer, CharTokenizer
from lib.training import load_checkpoint
from lib.utils import PROJECT_ROOT, read_record, relative_command, write_record

# The public names: every top-level name the export cells define (tools/tangle.py).
__all__ = [
    "SHIPPED_SIZES",
    "char_gpt_held_out",
    "bert_held_out",
    "ShippedRun",
    "SHIPPED_RUNS",
    "REGISTERED_LATER",
    "register_shipped_run",
    "shipped_runs",
    "bert_files",
    "t5_files",
    "char_gpt_files",
    "train_shipped_run",
    "HeldOut",
    "HELD_OUT",
    "register_held_out",
    "t5_held_out",
    "shipped_record",
    "held_out",
    "held_out_interval",
    "TRAINING_KEYS",
    "training_of",
    "reevaluate_shipped",
    "linear_pixels_accuracy",
]


# the CPU recipes of the models lib ships (lib/data/checkpoints/): sizes
# over the smoke profile's, with which scripts/train_shipped.py trains them
SHIPPED_SIZES = {
    "bert": dict(
        vocab_size=4000,
        d_model=192,
        n_layers=4,
        seq_len=128,
        batch_size=32,
        dropout=0.1,
        n_steps=4000,
        lr=2e-3,
        warmup=100,
        eval_every=250,
        eval_iters=10,
        mlm_test_batches=20,
        finetune_steps=300,
        finetune_lr=3e-4,
        test_per_book=200,
    ),
    "t5": dict(
        vocab_size=4000,
        d_model=192,
        d_ff=768,
        n_layers=3,
        max_tokens=4096,
        dropout=0.1,
        n_steps=3400,
        lr=1e-3,
        warmup=300,
        eval_every=340,
        eval_pairs=512,
        max_train_pairs=0,
        bleu_sentences=0,
    ),
}


@torch.no_grad()
def char_gpt_held_out(model: GPT, sizes: Mapping[str, Any]) -> dict:
    """:func:`lib.runs.char_gpt_val_loss` with a 95 % interval:
    ``val_loss`` ± 1.96 standard errors of the held-out windows' losses (the
    windows, all of ``seq_len`` characters, taken as independent), and
    their number."""
    val_ids = shakespeare_ids()[2]
    windows = lm_eval_batches(val_ids, 4 * sizes["batch_size"], sizes["seq_len"])
    was_training = model.training
    model.eval()
    losses = []  # one per window
    for window in windows:
        log_p = model(window["inputs"]).double().log_softmax(-1)
        targets = window["targets"][..., None]  # (batch seq 1)
        losses.append(-log_p.gather(-1, targets)[..., 0].mean(-1))
    losses = torch.cat(losses)
    model.train(was_training)
    mean, half = (
        float(losses.mean()),
        1.96 * float(losses.std()) / math.sqrt(len(losses)),
    )
    return {
        "val_loss": mean,
        "val_loss_low": mean - half,
        "val_loss_high": mean + half,
        "windows": len(losses),
    }


def bert_held_out(
    model: nn.Module, tokenizer: BPETokenizer, sizes: Mapping[str, Any], seed: int = 0
) -> dict[str, Any]:
    """A trained BERT's held-out measures on the recipe's test data
    (:func:`lib.runs.bert_data` with its ``tokenizer``): a book classifier's
    accuracy with its Wilson interval, or a masked LM's
    :func:`lib.runs.masked_lm_scores`."""
    data = bert_data(tokenizer, sizes, seed)
    if not isinstance(model, SequenceClassifier):
        return masked_lm_scores(
            model, data["mlm_test"], data["unigram"], data["mask_id"]
        )
    value = classifier_accuracy(model, data["test"])
    n = sum(len(b["targets"]) for b in data["test"])
    low, high = wilson_interval(round(value * n), n)
    return {
        "accuracy_pretrained": value,
        "accuracy_pretrained_low": low,
        "accuracy_pretrained_high": high,
        "test_passages": n,
    }


# From chapters/08-4-shipped.md, section "From a recipe's result to shipped files, and back".
@dataclass(frozen=True)
class ShippedRun:
    """A recipe whose trained models ship with ``lib``, at a CPU's size.

    ``recipe(profile, *, sizes, seed, progress, device, ...)`` trains and
    returns a result of chapter 8's shape (``metrics``, ``curves``,
    ``config``, ``samples``, ``models``, ``tokenizer``); ``sizes``: its CPU
    sizes over the smoke profile's; ``dry``: what a dry run changes in them
    (tiny, a few steps); ``record``: its record's name in ``book/results/``;
    ``files(result)``: each model it ships, by file name, as the keyword
    arguments of :func:`lib.pretrained.save_shipped` (``model``,
    ``tokenizer``, ``metrics``, ``inputs``); ``metrics(result)``: numbers
    its record adds to the recipe's; ``extra(result)``: what its record
    keeps besides its seed and recipe; ``checkpoints``: whether the recipe
    takes ``checkpoint_dir`` and ``resume``.
    """

    recipe: Callable[..., dict[str, Any]]
    sizes: Mapping[str, Any]
    dry: Mapping[str, Any]
    record: str
    files: Callable[[dict[str, Any]], dict[str, dict[str, Any]]]
    metrics: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    extra: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    checkpoints: bool = True


#: The shipped runs, by name (``python scripts/train_shipped.py NAME``).
SHIPPED_RUNS: dict[str, ShippedRun] = {}
#: What later chapters register here, and the module that registers it,
#: imported when it is asked for: a run by name, a measure by model kind.
REGISTERED_LATER = {"vit-mnist": "lib.vit_training", "vit": "lib.vit_training"}


def register_shipped_run(name: str, run: ShippedRun) -> None:
    """Add (or replace) ``run`` in :data:`SHIPPED_RUNS`."""
    check.instance("run", run, ShippedRun, owner="register_shipped_run")
    SHIPPED_RUNS[check.string("name", name)] = run


def _registered(registry: dict[str, Any], name: str, what: str) -> Any:
    """``registry[name]``, importing the later module that registers it."""
    if name not in registry and name in REGISTERED_LATER:
        importlib.import_module(REGISTERED_LATER[name])
    if name not in registry:
        known = sorted({*registry, *REGISTERED_LATER})
        raise ValueError(f"no {what} {name!r}; known: {', '.join(known)}")
    return registry[name]


def shipped_runs() -> dict[str, ShippedRun]:
    """Every shipped run, those of later chapters included, by name."""
    for module in sorted(set(REGISTERED_LATER.values())):
        importlib.import_module(module)
    return dict(SHIPPED_RUNS)


def bert_files(result: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The two files of a :func:`lib.runs.bert_run` result: the masked LM
    (its test numbers, the ids of ``<pad>`` and ``<mask>``, the longest
    input) and the book classifier (its accuracies, the books' names in
    the order of its classes, the passage length it learned from)."""
    tokenizer, metrics = result["tokenizer"], result["metrics"]
    pad, mask_id = (tokenizer.special_tokens[t] for t in BERT_SPECIALS)
    sizes = result["config"]["sizes"]

    def numbers(*prefixes: str) -> dict[str, Any]:
        return {k: v for k, v in metrics.items() if k.startswith(prefixes)}

    return {
        "bert-gutenberg-mlm": dict(
            model=result["models"]["mlm"],
            tokenizer=tokenizer,
            metrics=numbers("mlm_test", "unigram"),
            inputs=dict(pad_id=pad, mask_id=mask_id, max_len=sizes["seq_len"]),
        ),
        "bert-gutenberg-books": dict(
            model=result["models"]["classifier"],
            tokenizer=tokenizer,
            metrics=numbers("accuracy", "test"),
            inputs=dict(
                labels=result["samples"]["books"],
                pad_id=pad,
                passage=f"{sizes['passage_len']} tokens",
            ),
        ),
    }


def t5_files(result: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The translator of a :func:`lib.runs.t5_run` result, with how to feed
    it English (the ids of ``<pad>`` and ``</s>``)."""
    tokenizer = result["tokenizer"]
    source = (
        "English text; ids = tokenizer.encode(text) + [</s>], padded with "
        "<pad>, which also starts the decoder"
    )
    inputs = dict(
        source=source,
        pad_id=tokenizer.special_tokens["<pad>"],
        eos_id=tokenizer.special_tokens["</s>"],
    )
    return {
        "t5-tatoeba-en-fr": dict(
            model=result["models"]["t5"],
            tokenizer=tokenizer,
            metrics=result["metrics"],
            inputs=inputs,
        )
    }


def char_gpt_files(
    record: Mapping[str, Any], checkpoint_dir: str | os.PathLike
) -> dict[str, dict[str, Any]]:
    """The shipped character GPT of a run of ``python -m lib.runs --run
    gpt`` (its ``record`` and ``checkpoint_dir``): its best weights
    (``best.pt``, which ``keep_best`` writes) or else its last step's, with
    the character tokenizer and the record's numbers."""
    sizes = record["config"]["sizes"]
    model = GPT(TransformerConfig(**record["config"]["model"]))
    source = Path(checkpoint_dir) / "best.pt"
    if not source.is_file():  # a run from before keep_best: its last step
        source = sorted(Path(checkpoint_dir).glob("step-*.pt"))[-1]
    step = load_checkpoint(source, model=model, restore_rng=False)["step"]
    if source.name != "best.pt" and step != sizes["n_steps"]:
        raise ValueError(f"{source} is step {step} of {sizes['n_steps']}")
    tokenizer = CharTokenizer(load_tiny_shakespeare())
    if tokenizer.vocab_size != model.cfg.vocab_size:
        raise ValueError("the tokenizer does not match the run's vocabulary")
    kept = ("val_loss", "parameters", "train_seconds")
    metrics = {k: record["metrics"][k] for k in kept}
    metrics["steps"] = sizes["n_steps"]
    return {
        "char-gpt-shakespeare": dict(model=model, tokenizer=tokenizer, metrics=metrics)
    }


def train_shipped_run(
    name: str,
    *,
    seed: int = 0,
    dry_run: bool = False,
    progress: bool | None = None,
    checkpoint_dir: str | os.PathLike | None = None,
    resume: bool = False,
) -> dict[str, Any]:
    """The shipped run ``name`` trained on the CPU at its sizes (a dry
    run's when ``dry_run``), seeded: its recipe's result, with the run's
    own numbers and ``threads`` in its metrics, its record's ``extra``
    (the seed, the recipe, the run's own) and the ``files`` to ship."""
    run = _registered(SHIPPED_RUNS, name, "shipped run")
    if not run.checkpoints and (checkpoint_dir is not None or resume):
        raise ValueError(f"the {name} run takes no checkpoint_dir or resume")
    saving = dict(checkpoint_dir=checkpoint_dir, resume=resume)
    result = run.recipe(
        "smoke",
        sizes={**run.sizes, **(run.dry if dry_run else {})},
        seed=seed,
        progress=progress,
        device="cpu",
        **(saving if run.checkpoints else {}),
    )
    result["metrics"] |= run.metrics(result) if run.metrics else {}
    result["metrics"]["threads"] = torch.get_num_threads()
    recipe = f"{run.recipe.__module__}.{run.recipe.__name__}"
    result["extra"] = {"seed": seed, "recipe": recipe}
    result["extra"] |= run.extra(result) if run.extra else {}
    result["files"] = run.files(result)
    return result


register_shipped_run(
    "bert",
    ShippedRun(
        bert_run,
        SHIPPED_SIZES["bert"],
        dict(n_steps=4, warmup=2, finetune_steps=3, vocab_size=300,
             eval_every=2, eval_iters=1, mlm_test_batches=1,
             test_per_book=4, labelled_per_book=4),
        "08-training-bert-cpu",
        bert_files,
    ),
)  # fmt: skip
register_shipped_run(
    "t5",
    ShippedRun(
        t5_run,
        SHIPPED_SIZES["t5"],
        dict(n_steps=4, warmup=2, vocab_size=300, eval_every=2,
             max_train_pairs=2000, eval_pairs=40, bleu_sentences=20,
             d_model=32, d_ff=64, n_layers=1),
        "08-training-t5-cpu",
        t5_files,
        metrics=lambda result: dict(
            steps=result["config"]["sizes"]["n_steps"],
            vocab_size=result["tokenizer"].vocab_size,
        ),
        extra=lambda result: {
            key: result["config"]["sizes"][key]
            for key in ("test_fraction", "max_tokens")
        },
    ),
)  # fmt: skip


# From chapters/08-4-shipped.md, section "From a recipe's result to shipped files, and back".
@dataclass(frozen=True)
class HeldOut:
    """How a shipped file of one kind is re-measured: ``measure(shipped,
    record)`` gives its held-out numbers by its recipe's own measure;
    ``headline`` names the number :func:`held_out_interval` gives an
    interval for, ``count`` how many held-out items stand behind it;
    ``slow``: measuring takes minutes on a CPU, so that
    :func:`held_out_interval` reads the manifest's numbers instead."""

    measure: Callable[[LoadedModel, Mapping[str, Any]], dict[str, Any]]
    headline: str
    count: str
    slow: bool = False


#: The measures of shipped files, by model kind (the manifest's ``kind``).
HELD_OUT: dict[str, HeldOut] = {}


def register_held_out(kind: str, held: HeldOut) -> None:
    """Add (or replace) the measure of ``kind`` in :data:`HELD_OUT`."""
    check.instance("held", held, HeldOut, owner="register_held_out")
    HELD_OUT[check.string("kind", kind)] = held


def t5_held_out(
    model: nn.Module, tokenizer: BPETokenizer, sizes: Mapping[str, Any]
) -> dict[str, Any]:
    """:func:`lib.runs.t5_bleu` on the recipe's held-out sentences
    (:func:`lib.runs.tatoeba_split`), without the translations."""
    test_pairs = tatoeba_split(sizes["test_fraction"])[1]
    scores = t5_bleu(model, tokenizer, test_pairs, sizes)
    del scores["translations"]
    return scores


def _t5_sizes(record: Mapping[str, Any]) -> dict[str, Any]:
    """A T5 record's sizes (a record from before the recipe moved into
    lib.runs has none: the shipped sizes, with its test fraction)."""
    if (sizes := record["config"].get("sizes")) is not None:
        return sizes
    fraction = record["extra"]["test_fraction"]
    return run_sizes("t5", "smoke", **SHIPPED_SIZES["t5"], test_fraction=fraction)


def shipped_record(shipped: LoadedModel) -> dict[str, Any]:
    """The record of the run that trained ``shipped`` (its manifest entry's
    ``record``, from the project's root)."""
    return read_record(PROJECT_ROOT / shipped.entry["record"])


def held_out(
    shipped: LoadedModel, record: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The held-out numbers of the shipped file, re-measured as it is by
    its kind's measure (:data:`HELD_OUT`) with its run's ``record``
    (default: :func:`shipped_record`)."""
    kind = shipped.entry["kind"]
    how = _registered(HELD_OUT, kind, "measure of the kind")
    return how.measure(shipped, record or shipped_record(shipped))


def held_out_interval(shipped: LoadedModel) -> dict[str, Any]:
    """The headline held-out number of the shipped file with its 95 %
    interval: ``metric``, ``value``, ``low``, ``high`` and ``n`` (measured
    from the file, or, for a kind slow to measure, the manifest's)."""
    how = _registered(HELD_OUT, shipped.entry["kind"], "measure of the kind")
    found = shipped.entry["metrics"] if how.slow else held_out(shipped)
    key = how.headline
    return dict(
        metric=key,
        value=found[key],
        low=found[f"{key}_low"],
        high=found[f"{key}_high"],
        n=found[how.count],
    )


#: What a re-measured record keeps of its training, in extra["training"].
TRAINING_KEYS = ("command", "commit", "date", "wall_seconds", "device", "torch")


def training_of(record: Mapping[str, Any]) -> dict[str, Any]:
    """The training's command, commit, date, wall time and environment: the
    record's own, or those it kept in ``extra["training"]`` when it was
    re-measured (the command without a path of this machine)."""
    kept = record["extra"].get("training")
    kept = kept or {key: record[key] for key in TRAINING_KEYS}
    return {**kept, "command": relative_command(kept["command"])}


def reevaluate_shipped(
    name: str, *, commit: str, command: str, directory: str | os.PathLike = CHECKPOINTS
) -> dict[str, Any]:
    """Re-measure the shipped file ``name`` as it is (:func:`held_out`) and
    write its numbers into its record (``command``, ``commit``; the
    training's kept in ``extra["training"]``) and into its manifest entry
    only: the file keeps its bytes (its sha256 is checked again). Returns
    the new numbers, and prints each change."""
    shipped = load_shipped(name, directory=directory)  # sha256 checked
    record_path = PROJECT_ROOT / shipped.entry["record"]
    record, began = read_record(record_path), time.time()
    new = held_out(shipped, record)
    for key, value in new.items():
        print(f"{name}: {key} {record['metrics'].get(key)} -> {value}")
    write_record(
        record_path.parent,
        name=record["name"],
        wall_seconds=time.time() - began,
        command=command,
        metrics={**record["metrics"], **new},
        curves=record["curves"],
        config=record["config"],
        samples=record["samples"],
        extra={**record["extra"], "training": training_of(record)},
        device="cpu",
        commit=commit,
        profile=record["profile"],  # the training's
    )
    # a re-saved float16 file's bytes can differ: the manifest only
    path = Path(directory) / MANIFEST
    manifest = json.loads(path.read_text(encoding="utf-8"))
    manifest[name]["metrics"] = {**shipped.entry["metrics"], **new}
    text = json.dumps(manifest, indent=2, sort_keys=True, ensure_ascii=False)
    path.write_text(text + "\n", encoding="utf-8")
    load_shipped(name, directory=directory)  # still its sha256
    return new


register_held_out(
    "gpt",
    HeldOut(
        lambda shipped, record: char_gpt_held_out(
            shipped.model, record["config"]["sizes"]
        ),
        "val_loss",
        "windows",
    ),
)
for _kind, _headline, _count in (
    ("bert", "mlm_gain", "masked_tokens"),
    ("classifier", "accuracy_pretrained", "test_passages"),
):
    register_held_out(
        _kind,
        HeldOut(
            lambda shipped, record: bert_held_out(
                shipped.model,
                shipped.tokenizer,
                record["config"]["sizes"],
                record["extra"]["seed"],
            ),
            _headline,
            _count,
        ),
    )
register_held_out(
    "t5",
    HeldOut(
        lambda shipped, record: t5_held_out(
            shipped.model, shipped.tokenizer, _t5_sizes(record)
        ),
        "bleu_beam",
        "test_sentences",
        slow=True,  # 1,480 sentences, by beam search: minutes on a CPU
    ),
)


# From chapters/08-4-shipped.md, section "Every run against a baseline".
def linear_pixels_accuracy(
    train_x: torch.Tensor,
    train_y: torch.Tensor,
    val_x: torch.Tensor,
    val_y: torch.Tensor,
    iterations: int = 100,
) -> float:
    """The baseline of an image classifier: multinomial logistic regression
    on the raw pixels (standardised with the training images' mean and
    std), fitted by full-batch L-BFGS; its accuracy on ``val_x``."""
    mean, std = train_x.mean(), train_x.std()
    flat = rearrange((train_x - mean) / std, "n ... -> n (...)")
    held = rearrange((val_x - mean) / std, "n ... -> n (...)")
    n_classes = int(train_y.max()) + 1
    linear = nn.Linear(flat.shape[1], n_classes)
    with torch.no_grad():  # a convex problem: start from zero
        linear.weight.zero_()
        linear.bias.zero_()
    optimizer = torch.optim.LBFGS(
        linear.parameters(), max_iter=iterations, line_search_fn="strong_wolfe"
    )

    def loss() -> torch.Tensor:
        optimizer.zero_grad()
        value = nn.functional.cross_entropy(linear(flat), train_y)
        # a little L2, so that separable classes keep finite weights
        value = value + 1e-4 * linear.weight.pow(2).sum()
        value.backward()
        return value

    optimizer.step(loss)
    with torch.no_grad():
        return float((linear(held).argmax(-1) == val_y).float().mean())
