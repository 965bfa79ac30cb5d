"""Train and package the small models the course ships, on a CPU, with its own recipes.

The models come with ``lib`` (``lib/data/checkpoints``, loaded by
:func:`lib.pretrained.load_shipped`), so that every reader, on any machine, can see a
transformer that works. Each is trained by the recipe its chapter teaches, at the CPU
size the chapter gives it; this script is a command line over ``lib.shipped``, which
knows each run (:data:`lib.shipped.SHIPPED_RUNS`: the recipe, its sizes, its record and
what each of its models needs to be shipped) and each file's measure
(:func:`lib.shipped.held_out`):

* ``char-gpt-shakespeare``: chapter 8's character GPT, trained by ``python -m lib.runs``
  (which writes its record), packaged from its best checkpoint by ``char-gpt``;
* ``bert-gutenberg-mlm`` and ``bert-gutenberg-books``: :func:`lib.runs.bert_run`, the
  masked LM on six Gutenberg books and the classifier that names a passage's book;
* ``t5-tatoeba-en-fr``: :func:`lib.runs.t5_run`, English to French;
* ``vit-mnist``: chapter 10's :func:`lib.vit_training.vit_run` on MNIST.

    python -m lib.runs --run gpt --profile smoke --name 08-training-gpt-cpu \\
        --steps 4000 --set d_model=128 --set n_heads=4 --set n_layers=4 \\
        --set seq_len=128 --set batch_size=32 --set lr=0.002 --set warmup=100 \\
        --set eval_every=500 --set eval_iters=20 --checkpoint-dir CHECKPOINT_DIR --quiet
    python scripts/train_shipped.py char-gpt --checkpoint-dir CHECKPOINT_DIR
    python scripts/train_shipped.py bert --threads 2
    python scripts/train_shipped.py t5 --threads 2
    python scripts/train_shipped.py vit-mnist

Each writes a record under ``book/results/`` (:func:`lib.utils.write_record`) and model
files of :func:`lib.model_file.save_model`'s format (kind, configuration, weights,
tokenizer, metadata), with their sha256 in ``lib/data/checkpoints/manifest.json``.
``--dry-run`` trains tiny models for a few steps into a temporary folder (the tests run
it). ``evaluate`` re-measures the shipped files as they are, with no training, on their
recipes' held-out data, and writes the numbers into each record and manifest entry
(:func:`lib.shipped.reevaluate_shipped`; it refuses a tree with uncommitted changes
unless ``--allow-dirty``; the record keeps its training's command, commit and time in
``extra["training"]``; the files keep their bytes). ``intervals`` prints each file's
held-out number with its 95 % interval (:func:`lib.shipped.held_out_interval`).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from lib.pretrained import (  # noqa: E402
    CHECKPOINTS,
    load_shipped,
    save_shipped,
    shipped_names,
)
from lib.shipped import (  # noqa: E402
    char_gpt_files,
    held_out_interval,
    reevaluate_shipped,
    shipped_runs,
    train_shipped_run,
    training_of,
)
from lib.utils import (  # noqa: E402
    git_commit,
    read_record,
    set_threads,
    write_record,
)

RESULTS = ROOT / "book" / "results"
GPT_RECORD = "08-training-gpt-cpu"  # python -m lib.runs --name 08-training-gpt-cpu


def this_command() -> str:
    """The command that started this script, as a record and the manifest name it."""
    return f"python scripts/train_shipped.py {shlex.join(sys.argv[1:])}"


def _relative(path: Path) -> str:
    """``path`` from the repository's root when it is inside it (records move with it)."""
    path = path.resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def ship(files: dict, record: Path, command: str, directory: Path) -> None:
    """Save each of ``files`` (name -> model, tokenizer, metrics, inputs) as a shipped
    model file of ``directory``, naming its run's record and command."""
    for name, file in files.items():
        save_shipped(
            name=name, record=_relative(record / "metrics.json"), command=command,
            directory=directory, **file,
        )  # fmt: skip


def train(args, out: Path, directory: Path) -> dict:
    """The shipped run ``args.model`` by its recipe at its CPU sizes: its record, then
    its files."""
    began = time.time()
    result = train_shipped_run(
        args.model, seed=args.seed, dry_run=args.dry_run, progress=not args.quiet,
        **{k: getattr(args, k) for k in ("checkpoint_dir", "resume") if hasattr(args, k)},
    )  # fmt: skip
    write_record(
        out, name=out.name, command=this_command(), wall_seconds=time.time() - began,
        metrics=result["metrics"], curves=result["curves"], config=result["config"],
        samples=result["samples"], extra=result["extra"], device="cpu",
    )  # fmt: skip
    ship(result["files"], out, this_command(), directory)
    return result["metrics"]


def package_char_gpt(args, out: Path, directory: Path) -> dict:
    """Package chapter 8's char-GPT run (``python -m lib.runs --run gpt``, its record
    and checkpoints): its best weights, or else its last checkpoint."""
    record = read_record(args.record)
    try:
        files = char_gpt_files(record, args.checkpoint_dir)
    except ValueError as err:
        raise SystemExit(str(err)) from None
    ship(files, Path(args.record), training_of(record)["command"], directory)
    return files["char-gpt-shakespeare"]["metrics"]


def evaluate_shipped(args, argv: list[str]) -> dict:
    """Re-measure each file of ``args.directory``'s manifest (or ``--only`` these) as it
    is, and write its held-out numbers into its record and manifest entry."""
    commit = git_commit()  # once: the records written below change the tree
    if not args.allow_dirty and (commit.endswith("-dirty") or commit == "unknown"):
        raise SystemExit(
            f"the checkout is at {commit}: commit first (or --allow-dirty)"
        )
    names = shipped_names(args.directory)
    if unknown := sorted(set(args.only or ()) - set(names)):
        raise SystemExit(f"--only {unknown}: no such checkpoint; shipped: {names}")
    command = f"python scripts/train_shipped.py {shlex.join(argv)}"
    return {
        name: reevaluate_shipped(
            name, commit=commit, command=command, directory=args.directory
        )
        for name in args.only or names
    }


def intervals(directory: Path = CHECKPOINTS) -> dict:
    """Each shipped file's headline held-out number with its 95 % interval, measured
    from the file (the T5's from its manifest entry, as ``evaluate`` measured it:
    translating 1,480 sentences takes minutes on a CPU)."""
    results = {}
    for name in shipped_names(directory):
        found = results[name] = held_out_interval(
            load_shipped(name, directory=directory)
        )
        key, value, low, high = (found[k] for k in ("metric", "value", "low", "high"))
        n = found["n"]
        print(f"{name}: {key} {value:.4f}, 95 % interval {low:.4f}-{high:.4f} ({n:,})")
    return results


def main(argv: list[str] | None = None) -> dict:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="model", required=True)
    runs = shipped_runs()
    trainers = {
        name: sub.add_parser(
            name, help=f"{run.recipe.__module__}.{run.recipe.__name__}"
        )
        for name, run in runs.items()
    }
    gpt = trainers["char-gpt"] = sub.add_parser(
        "char-gpt", help="package chapter 8's char-GPT run"
    )
    gpt.add_argument("--checkpoint-dir", type=Path, required=True)
    gpt.add_argument("--record", type=Path, default=RESULTS / GPT_RECORD)
    for name in (name for name, run in runs.items() if run.checkpoints):
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
    record = runs[args.model].record if args.model in runs else GPT_RECORD
    out, directory = RESULTS / record, CHECKPOINTS
    if args.dry_run:
        scratch = args.scratch or Path(tempfile.mkdtemp(prefix="shipped-"))
        out, directory = scratch / out.name, scratch / "checkpoints"
    metrics = (train if args.model in runs else package_char_gpt)(args, out, directory)
    print(f"{args.model}: {metrics} -> {out}")
    return metrics


if __name__ == "__main__":
    main()
