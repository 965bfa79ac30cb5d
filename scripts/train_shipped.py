"""Train and package the small models the course ships, on a CPU, with its own recipes.

The models come with ``lib`` (``lib/data/checkpoints``, loaded by
:func:`lib.pretrained.load_shipped`), so that every reader, on any machine, can see a
transformer that works. Each is trained by the recipe its chapter teaches, at the CPU
size the chapter gives it (``lib.shipped.SHIPPED_SIZES``, ``lib.vit.SHIPPED_VIT_SIZES``);
this script only calls the recipe, writes the record and saves the files:

* ``char-gpt-shakespeare``: chapter 8's character GPT, trained by ``python -m lib.runs``
  (which writes its record), packaged from its best checkpoint by ``char-gpt``;
* ``bert-gutenberg-mlm`` and ``bert-gutenberg-books``: :func:`lib.runs.bert_run`, the
  masked LM on six Gutenberg books and the classifier that names a passage's book;
* ``t5-tatoeba-en-fr``: :func:`lib.runs.t5_run`, English to French;
* ``vit-mnist``: chapter 10's :func:`lib.vit.train_image_classifier` on MNIST.

    python -m lib.runs --run gpt --profile smoke --name 08-training-gpt-cpu \\
        --steps 4000 --set d_model=128 --set n_heads=4 --set n_layers=4 \\
        --set seq_len=128 --set batch_size=32 --set lr=0.002 --set warmup=100 \\
        --set eval_every=500 --set eval_iters=20 --checkpoint-dir CHECKPOINT_DIR --quiet
    python scripts/train_shipped.py char-gpt --checkpoint-dir CHECKPOINT_DIR
    python scripts/train_shipped.py bert --threads 2
    python scripts/train_shipped.py t5 --threads 2
    python scripts/train_shipped.py vit-mnist

Each writes a record under ``book/results/`` (:func:`lib.utils.write_record`) and model
files of :func:`lib.pretrained.save_model`'s format (kind, configuration, weights,
tokenizer, metadata), with their sha256 in ``lib/data/checkpoints/manifest.json``.
``--dry-run`` trains tiny models for a few steps into a temporary folder (the tests run
it). ``evaluate`` re-measures the shipped files as they are, with no training, on their
recipes' held-out data, and writes the numbers into each record and manifest entry (it
refuses a tree with uncommitted changes unless ``--allow-dirty``; the record keeps its
training's command, commit and time in ``extra["training"]``; the files keep their
bytes). ``intervals`` prints each file's held-out number with its 95 % interval.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from lib.datasets import load_tiny_shakespeare, mnist_split  # noqa: E402
from lib.models import GPT, TransformerConfig  # noqa: E402
from lib.pretrained import (  # noqa: E402
    CHECKPOINTS,
    MANIFEST,
    load_shipped,
    save_shipped,
    shipped_names,
)
from lib.runs import (  # noqa: E402
    BERT_SPECIALS,
    bert_run,
    run_sizes,
    t5_bleu,
    t5_run,
    tatoeba_split,
)
from lib.shipped import SHIPPED_SIZES, bert_held_out, char_gpt_held_out  # noqa: E402
from lib.tokenizer import CharTokenizer  # noqa: E402
from lib.training import load_checkpoint  # noqa: E402
from lib.utils import (  # noqa: E402
    git_commit,
    read_record,
    relative_command,
    set_threads,
    write_record,
)
from lib.vit import (  # noqa: E402
    SHIPPED_VIT_SIZES,
    ViT,
    mnist_vit_held_out,
    mnist_vit_sizes,
    train_image_classifier,
)

RESULTS = ROOT / "book" / "results"
RECORDS = {
    "vit-mnist": "10-vit-mnist-cpu",
    "t5": "08-training-t5-cpu",
    "bert": "08-training-bert-cpu",
    "char-gpt": "08-training-gpt-cpu",
}
# each kind's headline held-out number, the one `intervals` gives an interval for
HEADLINE = {
    "gpt": "val_loss",
    "bert": "mlm_gain",
    "classifier": "accuracy_pretrained",
    "t5": "bleu_beam",
    "vit": "val_accuracy",
}
# the number of held-out windows, tokens, passages, sentences or images behind it
COUNTS = ("windows", "masked_tokens", "test_passages", "test_sentences", "val_images")
# what a re-evaluated record keeps of its training, in extra["training"]
TRAINING_KEYS = ("command", "commit", "date", "wall_seconds", "device", "torch")
# a dry run: tiny sizes, a few steps
DRY = {
    "bert": dict(
        n_steps=4, warmup=2, finetune_steps=3, vocab_size=300, eval_every=2,
        eval_iters=1, mlm_test_batches=1, test_per_book=4, labelled_per_book=4,
    ),
    "t5": dict(
        n_steps=4, warmup=2, vocab_size=300, eval_every=2, max_train_pairs=2000,
        eval_pairs=40, bleu_sentences=20, d_model=32, d_ff=64, n_layers=1,
    ),
    "vit-mnist": dict(steps=4, d_model=32, n_layers=1),
}  # fmt: skip


def this_command() -> str:
    """The command that started this script, as a record and the manifest name it."""
    return f"python scripts/train_shipped.py {shlex.join(sys.argv[1:])}"


def _relative(path: Path) -> str:
    """``path`` from the repository's root when it is inside it (records move with it)."""
    path = path.resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def _ship(model, name, out: Path, directory: Path, **about) -> None:
    save_shipped(
        model, name, record=_relative(out / "metrics.json"), command=this_command(),
        directory=directory, **about,
    )  # fmt: skip


def _record(out: Path, began: float, result: dict, **extra) -> None:
    write_record(
        out, name=out.name, command=this_command(), wall_seconds=time.time() - began,
        metrics=result["metrics"], curves=result["curves"], config=result["config"],
        samples=result.get("samples"), extra=extra, device="cpu",
    )  # fmt: skip


def train_bert(args, out: Path, directory: Path) -> dict:
    """Both BERTs by lib.runs.bert_run at the shipped sizes."""
    began = time.time()
    sizes = SHIPPED_SIZES["bert"] | (DRY["bert"] if args.dry_run else {})
    result = bert_run(
        "smoke", sizes=sizes, seed=args.seed, progress=not args.quiet,
        checkpoint_dir=args.checkpoint_dir, resume=args.resume,
    )  # fmt: skip
    result["metrics"]["threads"] = torch.get_num_threads()
    _record(out, began, result, seed=args.seed, recipe="lib.runs.bert_run")
    tokenizer, metrics = result["tokenizer"], result["metrics"]
    pad, mask_id = (tokenizer.special_tokens[t] for t in BERT_SPECIALS)
    seq_len, passage = (
        result["config"]["sizes"][k] for k in ("seq_len", "passage_len")
    )
    mlm = {k: metrics[k] for k in metrics if k.startswith(("mlm_test", "unigram"))}
    _ship(
        result["models"]["mlm"], "bert-gutenberg-mlm", out, directory,
        tokenizer=tokenizer, metrics=mlm,
        inputs=dict(pad_id=pad, mask_id=mask_id, max_len=seq_len),
    )  # fmt: skip
    _ship(
        result["models"]["classifier"], "bert-gutenberg-books", out, directory,
        tokenizer=tokenizer,
        metrics={k: v for k, v in metrics.items() if k.startswith(("accuracy", "test"))},
        inputs=dict(labels=result["samples"]["books"], pad_id=pad,
                    passage=f"{passage} tokens"),
    )  # fmt: skip
    return metrics


def train_t5(args, out: Path, directory: Path) -> dict:
    """The translator by lib.runs.t5_run at the shipped sizes."""
    began = time.time()
    sizes = SHIPPED_SIZES["t5"] | (DRY["t5"] if args.dry_run else {})
    result = t5_run(
        "smoke", sizes=sizes, seed=args.seed, progress=not args.quiet,
        checkpoint_dir=args.checkpoint_dir, resume=args.resume,
    )  # fmt: skip
    sizes, tokenizer = result["config"]["sizes"], result["tokenizer"]
    result["metrics"] |= dict(
        steps=sizes["n_steps"], vocab_size=tokenizer.vocab_size,
        threads=torch.get_num_threads(),
    )  # fmt: skip
    _record(
        out, began, result, seed=args.seed, recipe="lib.runs.t5_run",
        test_fraction=sizes["test_fraction"], max_tokens=sizes["max_tokens"],
    )  # fmt: skip
    _ship(
        result["models"]["t5"], "t5-tatoeba-en-fr", out, directory, tokenizer=tokenizer,
        metrics=result["metrics"],
        inputs=dict(
            source="English text; ids = tokenizer.encode(text) + [</s>], padded with "
            "<pad>, which also starts the decoder",
            pad_id=tokenizer.special_tokens["<pad>"],
            eos_id=tokenizer.special_tokens["</s>"],
        ),
    )  # fmt: skip
    return result["metrics"]


def train_vit(args, out: Path, directory: Path) -> dict:
    """The MNIST ViT by lib.vit.train_image_classifier at the shipped sizes."""
    began = time.time()
    sizes = SHIPPED_VIT_SIZES | (DRY["vit-mnist"] if args.dry_run else {})
    cfg, budget = mnist_vit_sizes("smoke", **sizes)
    torch.manual_seed(args.seed)
    model = ViT(cfg)
    run = train_image_classifier(
        model, *mnist_split(), n_evals=10, progress=not args.quiet, **budget
    )
    mean, std = run["mean"], run["std"]
    metrics = mnist_vit_held_out(model, mean, std) | dict(
        parameters=sum(p.numel() for p in model.parameters()),
        train_seconds=run["seconds"], steps=budget["steps"],
        threads=torch.get_num_threads(),
    )  # fmt: skip
    steps, losses = zip(*run["evals"])
    curves = {
        "train": dict(step=list(range(1, len(run["losses"]) + 1)), loss=run["losses"]),
        "validation": dict(step=list(steps), loss=list(losses)),
    }
    result = dict(metrics=metrics, curves=curves, config=cfg)
    _record(out, began, result, **budget, mean=mean, std=std, seed=args.seed)
    pixels = "in [0, 1] (lib.datasets.load_mnist's uint8 / 255), then (x - mean) / std"
    inputs = dict(pixels=pixels, mean=mean, std=std)  # what a user does to an image
    _ship(model, "vit-mnist", out, directory, metrics=metrics, inputs=inputs)
    return metrics


def package_char_gpt(args, out: Path, directory: Path) -> dict:
    """Package chapter 8's char-GPT run: its best weights (``best.pt``, which train's
    keep_best writes) or else its last checkpoint, with its record."""
    record = read_record(args.record)
    sizes, model = (
        record["config"]["sizes"],
        GPT(TransformerConfig(**record["config"]["model"])),
    )
    folder = Path(args.checkpoint_dir)
    source = folder / "best.pt"
    if not source.is_file():  # a run from before keep_best: its last step
        source = sorted(folder.glob("step-*.pt"))[-1]
        step = load_checkpoint(source, model=model, restore_rng=False)["step"]
        if step != sizes["n_steps"]:
            raise SystemExit(f"{source} is step {step}, the run had {sizes['n_steps']}")
    else:
        load_checkpoint(source, model=model, restore_rng=False)
    tokenizer = CharTokenizer(load_tiny_shakespeare())
    if tokenizer.vocab_size != model.cfg.vocab_size:
        raise SystemExit("the tokenizer does not match the run's vocabulary")
    metrics = {
        k: record["metrics"][k] for k in ("val_loss", "parameters", "train_seconds")
    }
    metrics["steps"] = sizes["n_steps"]
    save_shipped(
        model, "char-gpt-shakespeare", tokenizer=tokenizer, metrics=metrics,
        record=_relative(Path(args.record) / "metrics.json"),
        command=_training(record)["command"], directory=directory,
    )  # fmt: skip
    return metrics


def held_out(shipped, record: dict) -> dict:
    """A shipped file's held-out numbers, re-measured by its recipe's own measure."""
    kind, sizes = shipped.entry["kind"], record["config"].get("sizes")
    if kind == "gpt":
        return char_gpt_held_out(shipped.model, sizes)
    if kind in ("bert", "classifier"):
        return bert_held_out(
            shipped.model, shipped.tokenizer, sizes, record["extra"]["seed"]
        )
    if kind == "t5":
        if sizes is None:  # trained before the recipe moved into lib.runs
            fraction = record["extra"]["test_fraction"]
            sizes = run_sizes(
                "t5", "smoke", **SHIPPED_SIZES["t5"], test_fraction=fraction
            )
        scores = t5_bleu(
            shipped.model,
            shipped.tokenizer,
            tatoeba_split(sizes["test_fraction"])[1],
            sizes,
        )
        del scores["translations"]
        return scores
    return mnist_vit_held_out(
        shipped.model, *(shipped.entry["inputs"][k] for k in ("mean", "std"))
    )


def _training(record: dict) -> dict:
    """The training's command, commit, date, wall time and environment: the record's
    own, or, once it has been re-evaluated, those it kept in ``extra["training"]``."""
    kept = record["extra"].get("training") or {k: record[k] for k in TRAINING_KEYS}
    return {**kept, "command": relative_command(kept["command"])}


def evaluate_shipped(args, argv: list[str]) -> dict:
    """Re-measure each file of ``args.directory``'s manifest as it is and write its
    held-out numbers into its record and manifest entry (the file keeps its bytes)."""
    commit = git_commit()  # once: the records written below change the tree
    if not args.allow_dirty and (commit.endswith("-dirty") or commit == "unknown"):
        raise SystemExit(
            f"the checkout is at {commit}: commit first (or --allow-dirty)"
        )
    directory, results, names = Path(args.directory), {}, shipped_names(args.directory)
    if unknown := sorted(set(args.only or ()) - set(names)):
        raise SystemExit(f"--only {unknown}: no such checkpoint; shipped: {names}")
    for name in args.only or names:
        shipped = load_shipped(name, directory=directory)  # sha256 checked
        record_path = ROOT / shipped.entry["record"]
        record, began = read_record(record_path), time.time()
        new = results[name] = held_out(shipped, record)
        for key, value in new.items():
            print(f"{name}: {key} {record['metrics'].get(key)} -> {value}")
        write_record(
            record_path.parent, name=record["name"], wall_seconds=time.time() - began,
            command=f"python scripts/train_shipped.py {shlex.join(argv)}",
            metrics={**record["metrics"], **new}, curves=record["curves"],
            config=record["config"], samples=record["samples"],
            extra={**record["extra"], "training": _training(record)},
            device="cpu", commit=commit, profile=record["profile"],  # the training's
        )  # fmt: skip
        # the numbers go into the manifest only: a re-saved float16 file's bytes can differ
        path = directory / MANIFEST
        manifest = json.loads(path.read_text(encoding="utf-8"))
        manifest[name]["metrics"] = {**shipped.entry["metrics"], **new}
        text = json.dumps(manifest, indent=2, sort_keys=True, ensure_ascii=False)
        path.write_text(text + "\n", encoding="utf-8")
        load_shipped(name, directory=directory)  # the file still has its sha256
    return results


def intervals(directory: Path = CHECKPOINTS) -> dict:
    """Each shipped file's headline held-out number with its 95 % interval, measured
    from the file (the T5's from its manifest entry, as ``evaluate`` measured it:
    translating 1,480 sentences takes minutes on a CPU)."""
    results = {}
    for name in shipped_names(directory):
        shipped = load_shipped(name, directory=directory)
        kind, key = shipped.entry["kind"], HEADLINE[shipped.entry["kind"]]
        if kind == "t5":
            m = shipped.entry["metrics"]
        else:
            m = held_out(shipped, read_record(ROOT / shipped.entry["record"]))
        n = next(m[k] for k in COUNTS if k in m)
        low, high = m[f"{key}_low"], m[f"{key}_high"]
        results[name] = dict(metric=key, value=m[key], low=low, high=high, n=n)
        print(f"{name}: {key} {m[key]:.4f}, 95 % interval {low:.4f}-{high:.4f} ({n:,})")
    return results


def main(argv: list[str] | None = None) -> dict:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="model", required=True)
    trainers = {
        "bert": sub.add_parser("bert", help="the BERTs (lib.runs.bert_run)"),
        "t5": sub.add_parser("t5", help="the translator (lib.runs.t5_run)"),
        "vit-mnist": sub.add_parser("vit-mnist", help="the MNIST ViT (chapter 10)"),
        "char-gpt": sub.add_parser("char-gpt", help="package chapter 8's char-GPT run"),
    }
    trainers["char-gpt"].add_argument("--checkpoint-dir", type=Path, required=True)
    default = RESULTS / RECORDS["char-gpt"]
    trainers["char-gpt"].add_argument("--record", type=Path, default=default)
    for name in ("bert", "t5"):
        trainers[name].add_argument("--checkpoint-dir", type=Path, help="checkpoints")
        trainers[name].add_argument("--resume", action="store_true", help="from them")
    for each in trainers.values():
        each.add_argument("--seed", type=int, default=0)
        each.add_argument("--threads", type=int, default=0, help="CPU threads (0: all)")
        each.add_argument("--quiet", action="store_true")
        each.add_argument("--dry-run", action="store_true", help="tiny, into --scratch")
        each.add_argument(
            "--scratch", type=Path, help="the dry run's folder (a new one)"
        )
    again = sub.add_parser("evaluate", help="re-measure the shipped files, as they are")
    again.add_argument("--directory", type=Path, default=CHECKPOINTS)
    again.add_argument("--only", nargs="+", metavar="NAME", help="these (default: all)")
    again.add_argument("--allow-dirty", action="store_true", help="record a dirty tree")
    sub.add_parser("intervals", help="held-out numbers with 95 %% intervals")
    args = parser.parse_args(argv)
    if args.model == "evaluate":
        return evaluate_shipped(args, argv)
    if args.model == "intervals":
        return intervals()
    set_threads(args.threads or os.cpu_count() or 1)  # every core, not smoke's one
    out, directory = RESULTS / RECORDS[args.model], CHECKPOINTS
    if args.dry_run:
        scratch = args.scratch or Path(tempfile.mkdtemp(prefix="shipped-"))
        out, directory = scratch / out.name, scratch / "checkpoints"
    train = {"bert": train_bert, "t5": train_t5, "vit-mnist": train_vit}
    metrics = train.get(args.model, package_char_gpt)(args, out, directory)
    print(f"{args.model}: {metrics} -> {out}")
    return metrics


if __name__ == "__main__":
    main()
