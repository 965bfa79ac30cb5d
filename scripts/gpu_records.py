#!/usr/bin/env python3
"""Make the course's recorded GPU results (book/results/), one step or all of them.

Run on a machine with an NVIDIA GPU, from the repository root, after `pip install -e
".[test]"`:

    python scripts/gpu_records.py all --budget-s 540   # every step below, in this order
    python scripts/gpu_records.py all --budget-s 520 --together bert,t5,notebooks
                                               # colab, flash, gpt, vit one at a time,
                                               #  then bert, t5 and the chapters at once
    python scripts/gpu_records.py colab        # 1. the Colab reader's path: every page
                                               #  dry, then the pages that train timed,
                                               #  colab profile in fp16 (as on a T4)
    python scripts/gpu_records.py flash        # 2. chapter 9's kernel benchmark
    python scripts/gpu_records.py gpt          # 3. chapter 8's char-GPT (full profile)
    python scripts/gpu_records.py vit          # 4. chapter 10's ViT (full profile)
    python scripts/gpu_records.py bert         # 5. chapter 8's BERT (full profile)
    python scripts/gpu_records.py t5           # 6. chapter 8's T5 (full profile)
    python scripts/gpu_records.py notebooks    # 7. every chapter, full profile, timed
    python scripts/gpu_records.py throughput   # (not in `all`) our GPT against
                                               #  GPT2LMHeadModel, eager and compiled
    python scripts/gpu_records.py training     # gpt, bert and t5
    python scripts/gpu_records.py all --steps flash,gpt   # a subset, in that order
    python scripts/gpu_records.py all --dry-run           # every step on the CPU, tiny

`all` runs the steps in order of value, so that a short GPU window spends itself on the
most wanted records first. Each step writes its record as soon as it completes (the
colab and notebooks steps after each page, with `complete: false` until the last one),
so a run cut short keeps what it finished. Records go under `--out` (default
book/results/) as <name>/metrics.json in the one schema of lib.utils.write_record (the
metrics, the wall time, the GPU, the torch and Triton versions, the commit and the exact
command), so that `python scripts/rerun_record.py book/results/<name>/metrics.json`
repeats it. The ViT step runs page 10.2 (`chapters/10-2-training.md`), which trains the
ViT by the recipe that `scripts/train_shipped.py vit-mnist` runs too
(`lib.vit_training.vit_run`) and writes its record itself into the folder that
`TFS_RESULTS` names (`lib.utils.results_dir`): the script sets it to `--out`.

The colab step runs what a reader on Colab's free T4 runs, on whatever GPU this is:
`TFS_PROFILE=colab` and `TFS_PRECISION=fp16` (float16 autocast with gradient scaling
even where the GPU has bfloat16; lib.utils.get_precision). First every page in the dry
mode (`TFS_DRY=1`, as `python tasks.py dry --profile colab`: the colab shapes, loops
cut), all of which must pass; then the pages that train (8.3, 9 and 10) for real, one at
a time, each timed. The book gives a chapter about ten minutes on a T4; each page's time
is compared with that budget scaled by this GPU's dense 16-bit peak against the T4's
(lib.efficiency's table: 600 s × 65 / 989 TFLOP/s, 39 s, on an H100 SXM). Its record,
`colab-profile-fp16-<gpu>`, holds each page's outcome and seconds, both budgets and
whether the page kept within the scaled one; a page over it is named in the summary
line.

The char-GPT step evaluates every 100 steps, so that its record says when (seconds from
the launch of its process, compilation included) the held-out loss first reached
nanoGPT's 1.47.

`--together STEPS` runs those steps at the same time, after the others, to fit a short
GPU window: their records say so (`extra.shared_gpu_with`), since their times were
measured on a shared GPU. `--notebook-jobs N` runs N chapters at a time in the notebooks
step and in the colab step's dry pages (each chapter's own time is still recorded; the
colab step's timed pages always run alone), and the notebooks step reuses chapter 10's
run from the vit step of the same session instead of running it twice.

`--budget-s S` is a deadline for the whole script, counted from its start: each step's
subprocess gets the time that is left and its process group is terminated (then killed)
at the deadline; a step that would start with under 2 s left (MIN_START_S) is skipped
and writes nothing. After each step the script prints one line, `[gpu_records] <step>:
ok in 84.2 s -> <record>` (or `timed out after ...`, `failed (...) after ...`,
`skipped: budget spent`), and at the end one total line.

`--dry-run` runs the same steps on the CPU (CUDA hidden) at smoke sizes, with
TFS_PROFILE=smoke: lib.runs with two steps, the benchmark's CPU path at tiny sizes under
TRITON_INTERPRET=1 (its correctness checks and its record, no speed worth reading), one
small chapter for the notebooks step, throughput eager only and tiny; the colab step
runs that chapter dry in the colab profile's shapes and then page 9.2, the quickest
page that trains, for real at smoke sizes, in fp32 (a CPU keeps fp32 whatever
TFS_PRECISION says). Its records go to a new temporary folder unless `--out` is given,
never into book/results/ by default. One step leaves no record there, and says so:
chapter 10 records only its full profile. Without `--dry-run`, the script refuses to run
on a machine without CUDA.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "book" / "results"
STARTED = time.monotonic()  # the budget counts from here, imports included
if str(ROOT) not in sys.path:  # run as a script: lib and tools come from this checkout
    sys.path.insert(0, str(ROOT))

# in order of value
ALL = ("colab", "flash", "gpt", "vit", "bert", "t5", "notebooks")
OPTIONAL = ("throughput",)  # runs only when named
ALIASES = {"training": ("gpt", "bert", "t5")}
MIN_START_S = 2.0  # a step that would get less than this is skipped, not started
KILL_GRACE_S = 5.0  # SIGTERM, then this long, then SIGKILL
# the notebooks step's one chapter in a dry run: the quickest in the smoke profile
DRY_CHAPTER = "03-positions.md"
# The colab step: the pages whose runs the colab profile sizes for a T4 (the book: "each
# chapter in about ten minutes" there; the other pages run the same small sizes in every
# profile, in seconds), each timed alone after every page ran dry.
COLAB_TIMED_PAGES = ("08-3-runs.md", "09-2-triton.md", "10-2-training.md")
COLAB_PRECISION = "fp16"  # TFS_PRECISION: what a T4 runs, on any GPU
T4_BUDGET_S = 600.0  # a page's budget on a T4
# In a dry run (a CPU): one page dry (DRY_CHAPTER, the colab profile's shapes), and the
# quickest of the pages that train, for real at smoke sizes (about 6 and 11 s on 2
# cores); fp32, as a CPU runs fp32 whatever TFS_PRECISION asks (get_precision).
COLAB_DRY_RUN_TIMED_PAGES = ("09-2-triton.md",)
COLAB_DRY_RUN_PRECISION = "fp32"
# Two training steps, one evaluation: the smallest run that still writes every part of
# a record (curves, samples). T5 decodes its test sentences greedily, and fewer of them.
DRY_RUN_SIZES = {
    "gpt": ("eval_every=2", "eval_iters=1"),
    "bert": ("eval_every=2", "eval_iters=1"),
    "t5": ("eval_every=2", "max_train_pairs=2000", "bleu_sentences=20", "beam_size=1"),
}
# On the GPU: the char-GPT evaluates every 100 steps (not 500), so that its record says
# when its held-out loss first reached nanoGPT's 1.47 to within 100 steps.
GPU_RUN_SETTINGS = {"gpt": ("eval_every=100",)}
# The flash benchmark on the GPU: head dim 64 (the sizes; 128 doubles the time).
FLASH_GPU_OPTIONS = ("--head-dims", "64")
FLASH_DRY_OPTIONS = ("--lengths", "64", "--memory-lengths", "64", "--head-dims", "16")
FLASH_DRY_OPTIONS += ("--batch", "1", "--heads", "1")


def shown(path: Path) -> str:
    """``path`` relative to the repository when it is inside it (shorter to read)."""
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def record(
    name: str,
    metrics: dict,
    command: list[str],
    wall_s: float,
    out: Path | None = None,
    profile: str | None = None,
) -> Path:
    """Write ``out/<name>/`` (default book/results/) with lib.utils.write_record, the
    course's one schema. ``profile``: the profile its runs used, when it is not this
    process's own (the colab step's pages run in the colab profile on any GPU)."""
    from lib.utils import write_record

    path = write_record(
        (RESULTS if out is None else out) / name,
        name=name,
        command=shlex.join(command),
        wall_seconds=round(wall_s, 1),
        metrics=metrics,
        profile=profile,
    )
    print(f"wrote {shown(path)}")
    return path


class StepTimeout(Exception):
    """The deadline came while a step's subprocess ran; it was stopped."""

    def __init__(self, record: Path | None = None):
        super().__init__("timed out")
        self.record = record


class StepFailed(Exception):
    """A step ran to its end without its result: ``why`` goes in the summary line."""

    def __init__(self, why: str, record: Path | None = None):
        super().__init__(why)
        self.why = why
        self.record = record


@dataclass
class Outcome:
    """How one step went; :meth:`line` is its summary line."""

    step: str
    status: str  # "ok", "timed out", "failed (...)", "skipped: budget spent"
    seconds: float = 0.0
    record: Path | None = None
    note: str = ""

    def line(self) -> str:
        if self.status.startswith("skipped"):
            text = self.status
        elif self.status == "ok":
            text = f"ok in {self.seconds:.1f} s"
        else:
            text = f"{self.status} after {self.seconds:.1f} s"
        if self.record is not None:
            text += f" -> {shown(self.record)}"
        if self.note:
            text += f" ({self.note})"
        return f"[gpu_records] {self.step}: {text}"


@dataclass
class Session:
    """The settings every step reads, and the deadline: :meth:`run` gives each
    subprocess only the time left, and stops it there."""

    out: Path
    dry_run: bool = False
    budget_s: float | None = None
    started: float = field(default_factory=time.monotonic)
    notebook_jobs: int = 1
    # chapters already executed in the full profile by an earlier step (the vit step
    # runs chapter 10): chapter stem -> {"passed", "wall_time_s", "from_step"}
    chapters_run: dict[str, dict] = field(default_factory=dict)
    # chapters another step of this session runs (the vit step: chapter 10)
    chapters_elsewhere: set[str] = field(default_factory=set)

    @property
    def profile(self) -> str:
        return "smoke" if self.dry_run else "full"

    def remaining(self) -> float | None:
        """Seconds left before the deadline (None: no deadline)."""
        if self.budget_s is None:
            return None
        return self.budget_s - (time.monotonic() - self.started)

    def env(self, **extra: str) -> dict[str, str]:
        """The children's environment: the profile, and no GPU in a dry run."""
        # TFS_RESULTS: where a chapter that records itself (chapter 10) writes
        env = {**os.environ, "TFS_PROFILE": self.profile, "TFS_RESULTS": str(self.out)}
        env.update(extra)
        if self.dry_run:
            env["CUDA_VISIBLE_DEVICES"] = ""
        return env

    def run(
        self, command: list[str], prefix: str = "", **extra_env: str
    ) -> tuple[int, float, str]:
        """Run ``command`` from the repository root, echoing its output (each line
        after ``prefix``, to tell commands that run at once apart); return its exit
        code, seconds and output. Raises :class:`StepTimeout` at the deadline, after
        stopping the command's whole process group."""
        print(f"{prefix}$", shlex.join(command), flush=True)
        remaining = self.remaining()
        start = time.monotonic()
        process = subprocess.Popen(
            command,
            cwd=ROOT,
            env=self.env(**extra_env),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # its own process group, to stop it whole
        )
        lines: list[str] = []

        def echo() -> None:
            for line in process.stdout:
                lines.append(line)
                print(prefix + line, end="", flush=True)

        reader = threading.Thread(target=echo, daemon=True)
        reader.start()
        try:
            code = process.wait(timeout=remaining)
        except subprocess.TimeoutExpired:
            _stop(process)
            reader.join(timeout=KILL_GRACE_S)
            raise StepTimeout() from None
        reader.join(timeout=KILL_GRACE_S)
        return code, time.monotonic() - start, "".join(lines)


def _stop(process: subprocess.Popen) -> None:
    """SIGTERM to the process group this script started, then SIGKILL if it lingers."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=KILL_GRACE_S)
            return
        except subprocess.TimeoutExpired:
            continue


def _fresh_record(folder: Path, since: float) -> Path | None:
    """``folder/metrics.json`` if it was written after ``since`` (a wall-clock time)."""
    path = folder / "metrics.json"
    return path if path.is_file() and path.stat().st_mtime >= since else None


def _command_step(
    session: Session,
    command: list[str],
    folder: Path,
    no_record: str = "",
    prefix: str = "",
    **env: str,
) -> tuple[Path | None, str]:
    """Run a command that writes ``folder/metrics.json`` itself. Without that record the
    step fails, unless ``no_record`` says why none is expected (a dry run's limits)."""
    began = time.time() - 1  # file times can be coarse
    code, _, _ = session.run(command, prefix, **env)
    path = _fresh_record(folder, began)
    if code != 0:  # a record it wrote before failing still shows why
        raise StepFailed(f"exit {code}", path)
    if path is None and not no_record:
        raise StepFailed(f"no record written in {shown(folder)}")
    return path, "" if path is not None else f"no record: {no_record}"


def gpu_label() -> str:
    """A short name of the GPU for the benchmark's folder: 'NVIDIA H100 80GB HBM3' ->
    'h100', 'Tesla T4' -> 't4', 'NVIDIA A100-SXM4-80GB' -> 'a100'; 'cpu' without one."""
    import torch

    if not torch.cuda.is_available():
        return "cpu"
    words = re.split(r"[\s_-]+", torch.cuda.get_device_name().lower())
    models = [w for w in words if re.search(r"\d", w) and w not in ("nvidia", "tesla")]
    return models[0] if models else "gpu"


def step_flash(session: Session) -> tuple[Path | None, str]:
    """Chapter 9's benchmark; bench_flash.py writes its record itself. A dry run runs
    its CPU path (Triton's interpreter) at its smallest sizes: the correctness checks
    and the record, no speed worth reading."""
    folder = session.out / f"09-flash-attention-{gpu_label()}"
    command = [sys.executable, "bench/bench_flash.py", "--out", str(folder)]
    if not session.dry_run:
        return _command_step(session, [*command, *FLASH_GPU_OPTIONS], folder)
    command += FLASH_DRY_OPTIONS
    return _command_step(session, command, folder, TRITON_INTERPRET="1")


def training_step(run: str) -> Callable[[Session], tuple[Path | None, str]]:
    """Chapter 8's ``run`` by ``python -m lib.runs``, which writes its record itself."""

    def step(session: Session) -> tuple[Path | None, str]:
        folder = session.out / f"08-training-{run}"
        command = [sys.executable, "-m", "lib.runs", "--run", run]
        command += ["--profile", session.profile, "--out", str(folder), "--quiet"]
        settings = DRY_RUN_SIZES[run] if session.dry_run else GPU_RUN_SETTINGS.get(run)
        if session.dry_run:
            command += ["--steps", "2", "--no-compile"]
        for setting in settings or ():
            command += ["--set", setting]
        return _command_step(session, command, folder, prefix=f"[{run}] ")

    step.__doc__ = f"Chapter 8's {run} run (lib.runs writes its record itself)."
    return step


VIT_CHAPTER = "10-2-training.md"  # the page that trains chapter 10's ViT (vit_run)


def step_vit(session: Session) -> tuple[Path | None, str]:
    """Chapter 10's ViT on the shipped MNIST split: its page 10.2, run in the full
    profile, trains it by :func:`lib.vit_training.vit_run` and writes
    ``--out``/10-vit-mnist/metrics.json itself (``TFS_RESULTS``)."""
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    command.append(f"chapters/{VIT_CHAPTER}")
    no_record = "chapter 10 records only its full profile" if session.dry_run else ""
    began = time.time() - 1
    code, seconds, _ = session.run(command)
    session.chapters_run[Path(VIT_CHAPTER).stem] = {
        "passed": code == 0,
        "wall_time_s": round(seconds, 1),
        "from_step": "vit",
    }
    if code != 0:
        raise StepFailed(f"exit {code}")
    path = _fresh_record(session.out / "10-vit-mnist", began)
    if path is None and not no_record:
        raise StepFailed(f"no record written in {shown(session.out / '10-vit-mnist')}")
    return path, "" if path is not None else f"no record: {no_record}"


# the chapters that take longest in the full profile start first when several run at
# once, so that the step's wall time is close to the longest chapter's
SLOW_CHAPTERS_FIRST = ("08-3-runs", "07-5-pretrained", "10-2-training", "09-2-triton")


def slow_pages_first(pages: list[str]) -> list[str]:
    """``pages`` (file names in chapters/) with :data:`SLOW_CHAPTERS_FIRST` first."""
    rank = {name: i for i, name in enumerate(SLOW_CHAPTERS_FIRST)}
    return sorted(pages, key=lambda page: rank.get(Path(page).stem, len(rank)))


def run_page(
    session: Session, page: str, jobs: int = 1, **env: str
) -> tuple[bool, float]:
    """Execute ``chapters/<page>`` by nbmake (pytest) in a subprocess, with ``env`` over
    the session's environment; ``jobs`` pages run at once and share the machine's cores.
    Returns whether it passed and its seconds; raises :class:`StepTimeout` when the
    budget is spent before it starts or while it runs."""
    remaining = session.remaining()
    if remaining is not None and remaining < MIN_START_S:
        raise StepTimeout()
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    prefix = f"[{Path(page).stem[:2]}] " if jobs > 1 else ""
    threads = max(1, (os.cpu_count() or 1) // jobs)
    code, seconds, _ = session.run(
        [*command, f"chapters/{page}"], prefix, TFS_THREADS=str(threads), **env
    )
    return code == 0, seconds


def run_pages(session: Session, pages: list[str], work: Callable[[str], None]) -> bool:
    """``work(page)`` for each of ``pages``, ``session.notebook_jobs`` at a time; True
    when the deadline cut the pages short (the others still finished)."""
    cut = False
    with ThreadPoolExecutor(max_workers=session.notebook_jobs) as pool:
        for future in [pool.submit(work, page) for page in pages]:
            try:
                future.result()
            except StepTimeout:
                cut = True
    return cut


def step_notebooks(session: Session) -> tuple[Path | None, str]:
    """Every chapter executed by nbmake (full profile), each timed on its own,
    ``session.notebook_jobs`` at a time; a chapter an earlier step executed (chapter 10,
    by the vit step) is taken from it. The record is rewritten after each chapter, so a
    run cut short keeps the chapters it ran."""
    from tools.tangle import chapter_files

    chapters = [c.name for c in chapter_files()]
    if session.dry_run:
        chapters = [DRY_CHAPTER]
    own_command = [sys.executable, "scripts/gpu_records.py", "notebooks"]
    own_command += ["--dry-run"] if session.dry_run else []
    if session.notebook_jobs > 1:
        own_command += ["--notebook-jobs", str(session.notebook_jobs)]
    per_chapter: dict[str, dict] = {}
    elsewhere = session.chapters_elsewhere
    lock = threading.Lock()
    saved: list[Path] = []

    def save() -> None:
        with lock:
            metrics = {
                "chapters": {c: per_chapter[c] for c in sorted(per_chapter)},
                "all_passed": all(c["passed"] for c in per_chapter.values()),
                "complete": all(
                    Path(c).stem in per_chapter or Path(c).stem in elsewhere
                    for c in chapters
                ),
                "not_run": [
                    Path(c).stem for c in chapters if Path(c).stem not in per_chapter
                ],
                # run by another step of the session (chapter 10: the vit step)
                "run_by_another_step": sorted(elsewhere - set(per_chapter)),
                "jobs": session.notebook_jobs,
            }
            total = sum(c["wall_time_s"] for c in per_chapter.values())
            saved.append(
                record(
                    "full-profile-notebooks", metrics, own_command, total, session.out
                )
            )

    for chapter in chapters:
        earlier = session.chapters_run.get(Path(chapter).stem)
        if earlier is not None:
            per_chapter[Path(chapter).stem] = dict(earlier)
    if per_chapter:
        save()
    waiting = slow_pages_first(
        [
            c
            for c in chapters
            if Path(c).stem not in per_chapter and Path(c).stem not in elsewhere
        ]
    )
    # a chapter that records itself (10) writes here, not over a step's record
    scratch = session.out / "full-profile-notebooks" / "chapter-records"
    scratch.mkdir(parents=True, exist_ok=True)

    def run_chapter(chapter: str) -> None:
        passed, seconds = run_page(
            session, chapter, session.notebook_jobs, TFS_RESULTS=str(scratch)
        )
        with lock:
            per_chapter[Path(chapter).stem] = {
                "passed": passed,
                "wall_time_s": round(seconds, 1),
            }
        save()

    cut = run_pages(session, waiting, run_chapter)
    path = saved[-1] if saved else None
    if cut:
        raise StepTimeout(path)
    failed = [name for name, c in per_chapter.items() if not c["passed"]]
    if failed:
        raise StepFailed(f"{len(failed)} of {len(chapters)} chapters failed", path)
    return path, ""


def t4_peak_flops() -> float:
    """The T4's dense fp16 peak in FLOP/s (65e12), from lib.efficiency's table of peaks,
    which ``peak_flops`` reads for this GPU: the FLOPs ``gpu_seconds`` says a T4 does in
    one second at its whole peak."""
    from lib.efficiency import gpu_seconds

    return 1.0 / gpu_seconds(1.0, peak="T4", mfu=1.0)


def scaled_budget_s(peak: float | None) -> float | None:
    """The T4's page budget (:data:`T4_BUDGET_S`) on a GPU of dense 16-bit ``peak``
    FLOP/s: the seconds the same work takes there at the same MFU, ``600 s × T4 peak /
    peak`` (39 s on an H100 SXM); None without a peak (a CPU, a GPU the table lacks)."""
    if peak is None:
        return None
    return T4_BUDGET_S * t4_peak_flops() / peak


def step_colab(session: Session) -> tuple[Path | None, str]:
    """The Colab reader's path on this GPU, under ``TFS_PROFILE=colab`` and
    ``TFS_PRECISION=fp16`` (a T4's precision, with gradient scaling, even where bf16
    exists): every page dry (``TFS_DRY=1``: the colab shapes, loops cut),
    ``session.notebook_jobs`` at a time; then the pages that train
    (:data:`COLAB_TIMED_PAGES`) for real, one at a time, each timed against the T4's
    ten minutes scaled by this GPU's peak (:func:`scaled_budget_s`). One record,
    rewritten after each page (``complete: false`` until the last). A failed page fails
    the step; a page over its scaled budget is said in the record and the summary line.
    A dry run: one page dry, then page 9.2 for real at smoke sizes, fp32 on the CPU."""
    from lib.efficiency import peak_flops
    from tools.tangle import chapter_files

    if session.dry_run:
        dry_pages, timed_pages = [DRY_CHAPTER], list(COLAB_DRY_RUN_TIMED_PAGES)
        precision, timed_profile, peak = COLAB_DRY_RUN_PRECISION, "smoke", None
        label = "cpu"
    else:
        dry_pages = [c.name for c in chapter_files()]
        timed_pages = list(COLAB_TIMED_PAGES)
        precision, timed_profile = COLAB_PRECISION, "colab"
        peak, label = peak_flops("cuda"), gpu_label()
    name = f"colab-profile-{precision}-{label}"
    budget = scaled_budget_s(peak)
    own_command = [sys.executable, "scripts/gpu_records.py", "colab"]
    own_command += ["--dry-run"] if session.dry_run else []
    if session.notebook_jobs > 1:
        own_command += ["--notebook-jobs", str(session.notebook_jobs)]
    # pages that record themselves write here, never over book/results
    scratch = session.out / name / "chapter-records"
    scratch.mkdir(parents=True, exist_ok=True)
    common = dict(TFS_PRECISION=precision, TFS_RESULTS=str(scratch))
    ran_dry: dict[str, dict] = {}
    timed: dict[str, dict] = {}
    lock = threading.Lock()
    saved: list[Path] = []

    def save() -> None:
        with lock:
            done = [*ran_dry.values(), *timed.values()]
            within = [page["within_budget"] for page in timed.values()]
            metrics = {
                "precision": precision,
                "timed_profile": timed_profile,
                "gpu_peak_flops": peak,
                "t4_peak_flops": t4_peak_flops(),
                "t4_budget_s": T4_BUDGET_S,
                "scaled_budget_s": None if budget is None else round(budget, 1),
                # every page in the colab profile's shapes, loops cut
                "dry_pages": {p: ran_dry[p] for p in sorted(ran_dry)},
                # the pages that train, in the timed profile, each alone
                "timed_pages": {p: timed[p] for p in sorted(timed)},
                "all_passed": all(page["passed"] for page in done),
                "all_within_budget": None if None in within else all(within),
                "complete": len(ran_dry) == len(dry_pages)
                and len(timed) == len(timed_pages),
                "not_run": [
                    Path(p).stem for p in dry_pages if Path(p).stem not in ran_dry
                ]
                + [Path(p).stem for p in timed_pages if Path(p).stem not in timed],
                "jobs": session.notebook_jobs,
            }
            total = sum(page["wall_time_s"] for page in done)
            saved.append(
                record(name, metrics, own_command, total, session.out, timed_profile)
            )

    def run_dry(page: str) -> None:
        passed, seconds = run_page(
            session, page, session.notebook_jobs, TFS_PROFILE="colab", TFS_DRY="1",
            HF_HUB_OFFLINE="1", **common,
        )  # fmt: skip
        with lock:
            ran_dry[Path(page).stem] = {
                "passed": passed,
                "wall_time_s": round(seconds, 1),
            }
        save()

    cut = run_pages(session, slow_pages_first(dry_pages), run_dry)
    # then each page that trains alone: its time is the GPU's, not shared
    for page in timed_pages if not cut else ():
        try:
            passed, seconds = run_page(
                session, page, TFS_PROFILE=timed_profile, **common
            )
        except StepTimeout:
            cut = True
            break
        timed[Path(page).stem] = {
            "passed": passed,
            "wall_time_s": round(seconds, 1),
            "t4_budget_s": T4_BUDGET_S,
            "scaled_budget_s": None if budget is None else round(budget, 1),
            "within_budget": None if budget is None else seconds <= budget,
        }
        save()
    path = saved[-1] if saved else None
    if cut:
        raise StepTimeout(path)
    failed = [f"{p} (dry)" for p, page in ran_dry.items() if not page["passed"]]
    failed += [p for p, page in timed.items() if not page["passed"]]
    if failed:
        raise StepFailed(f"failed: {', '.join(failed)}", path)
    over = [
        f"{p} {page['wall_time_s']:.0f} s > {page['scaled_budget_s']:.0f} s"
        for p, page in timed.items()
        if page["within_budget"] is False
    ]
    return path, f"over the scaled budget: {'; '.join(over)}" if over else ""


def step_throughput(session: Session) -> tuple[Path | None, str]:
    """Our GPT's training step against GPT2LMHeadModel: eager, then both compiled (a dry
    run: eager only, at a tiny size)."""
    lines = {}
    total = 0.0
    tiny = ["--layers", "1", "--d-model", "32", "--heads", "2", "--seq", "16"]
    tiny += ["--batch", "2", "--vocab", "64", "--repeats", "1", "--warmup", "1"]
    modes = ("eager",) if session.dry_run else ("eager", "compiled")
    for mode in modes:
        command = [sys.executable, "bench/bench_models.py"]
        command += (["--compile"] if mode == "compiled" else []) + (
            tiny if session.dry_run else []
        )
        code, seconds, output = session.run(command)
        total += seconds
        lines[mode] = {"exit_code": code, "output": output.strip().splitlines()[-12:]}
    own_command = [sys.executable, "scripts/gpu_records.py", "throughput"]
    own_command += ["--dry-run"] if session.dry_run else []
    path = record("08-training-throughput", lines, own_command, total, session.out)
    codes = [mode["exit_code"] for mode in lines.values()]
    if any(codes):
        raise StepFailed(f"exit {max(codes)}", path)
    return path, ""


STEPS: dict[str, Callable[[Session], tuple[Path | None, str]]] = {
    "colab": step_colab,
    "flash": step_flash,
    "gpt": training_step("gpt"),
    "vit": step_vit,
    "bert": training_step("bert"),
    "t5": training_step("t5"),
    "notebooks": step_notebooks,
    "throughput": step_throughput,
}


def _run_one(name: str, session: Session, steps) -> Outcome:
    """One step, within the session's budget, as an :class:`Outcome`."""
    remaining = session.remaining()
    if remaining is not None and remaining < MIN_START_S:
        return Outcome(name, "skipped: budget spent")
    began = time.monotonic()
    try:
        path, note = steps[name](session)
        outcome = Outcome(name, "ok", record=path, note=note)
    except StepTimeout as cut:
        outcome = Outcome(name, "timed out", record=cut.record)
    except StepFailed as failed:
        outcome = Outcome(name, f"failed ({failed.why})", record=failed.record)
    outcome.seconds = time.monotonic() - began
    return outcome


def mark_shared(outcomes: list[Outcome]) -> None:
    """Add to each record of steps that ran at the same time the names of the others
    (``extra.shared_gpu_with``): their times were measured on a shared GPU."""
    import json

    from lib.utils import read_record

    names = [o.step for o in outcomes]
    for outcome in outcomes:
        if outcome.record is None or not outcome.record.is_file():
            continue
        saved = json.loads(outcome.record.read_text(encoding="utf-8"))
        saved["extra"]["shared_gpu_with"] = [n for n in names if n != outcome.step]
        outcome.record.write_text(json.dumps(saved, indent=2) + "\n", encoding="utf-8")
        read_record(outcome.record)  # still the one schema


def run_steps(
    names: list[str], session: Session, steps=None, together: tuple[str, ...] = ()
) -> list[Outcome]:
    """Run ``names`` in order within the session's budget, printing one summary line
    after each and a total line at the end; return the outcomes. The steps named in
    ``together`` run last, all at once (:func:`mark_shared` notes it in their
    records)."""
    steps = STEPS if steps is None else steps
    outcomes = []
    for name in [n for n in names if n not in together]:
        outcome = _run_one(name, session, steps)
        print(outcome.line(), flush=True)
        outcomes.append(outcome)
    at_once = [n for n in names if n in together]
    if at_once:
        print(f"== now at the same time: {', '.join(at_once)}", flush=True)
        with ThreadPoolExecutor(max_workers=len(at_once)) as pool:
            futures = [pool.submit(_run_one, n, session, steps) for n in at_once]
            shared = [future.result() for future in futures]
        if len(shared) > 1:
            mark_shared(shared)
        for outcome in shared:
            print(outcome.line() + " (at the same time as the others)", flush=True)
        outcomes += shared
    counts = {
        kind: sum(o.status.startswith(kind) for o in outcomes)
        for kind in ("ok", "timed out", "failed", "skipped")
    }
    budget = "" if session.budget_s is None else f" of a {session.budget_s:g} s budget"
    elapsed = time.monotonic() - session.started
    print(
        "[gpu_records] total: " + ", ".join(f"{n} {kind}" for kind, n in counts.items())
        + f" in {elapsed:.1f} s{budget}; records in {shown(session.out)}",
        flush=True,
    )  # fmt: skip
    return outcomes


def selected(step: str, steps_option: str | None) -> list[str]:
    """The steps to run, in the order of :data:`ALL` (then :data:`OPTIONAL`)."""
    if steps_option is None:
        wanted = set(ALL) if step == "all" else set(ALIASES.get(step, (step,)))
    else:
        wanted = set()
        for name in filter(None, steps_option.split(",")):
            if name not in STEPS and name not in ALIASES:
                raise ValueError(
                    f"--steps: no step {name!r}; known: {', '.join([*STEPS, *ALIASES])}"
                )
            wanted |= set(ALIASES.get(name, (name,)))
        if step != "all":
            raise ValueError("--steps goes with the step `all`")
    return [name for name in (*ALL, *OPTIONAL) if name in wanted]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("step", choices=[*STEPS, *ALIASES, "all"])
    parser.add_argument(
        "--steps", help="with `all`: a comma-separated subset, e.g. flash,gpt"
    )
    parser.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help="deadline for the whole script, in seconds from its start (default: none)",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="every step on the CPU at smoke sizes (records in a temporary folder)",
    )
    parser.add_argument(
        "--out", type=Path, default=None, help="records folder (default: book/results)"
    )
    parser.add_argument(
        "--together",
        default="",
        help="steps to run at the same time, after the others (e.g. bert,t5,notebooks)",
    )
    parser.add_argument(
        "--notebook-jobs",
        type=int,
        default=1,
        help="chapters run at once in the notebooks step (default 1)",
    )
    args = parser.parse_args(argv)
    try:
        names = selected(args.step, args.steps)
    except ValueError as err:
        parser.error(str(err))
    together = tuple(filter(None, args.together.split(",")))
    unknown = [name for name in together if name not in names]
    if unknown:
        parser.error(f"--together: {', '.join(unknown)} not among the steps run")
    if args.notebook_jobs < 1:
        parser.error(f"--notebook-jobs must be at least 1, got {args.notebook_jobs}")
    if args.budget_s is not None and args.budget_s <= 0:
        parser.error(f"--budget-s must be positive, got {args.budget_s}")
    if not args.dry_run:
        import torch

        if not torch.cuda.is_available():
            sys.exit(
                "no CUDA GPU here: the recorded runs are GPU runs (see the chapters "
                "for CPU ones, or --dry-run to try this script)"
            )
    if args.out is not None:
        out = args.out.resolve()
    elif args.dry_run:
        out = Path(tempfile.mkdtemp(prefix="gpu_records_dry_run_"))
    else:
        out = RESULTS
    out.mkdir(parents=True, exist_ok=True)  # chapter 10 records only into a folder
    session = Session(out, args.dry_run, args.budget_s, started=STARTED)
    if "vit" in names:  # the vit step runs chapter 10: the notebooks step does not
        session.chapters_elsewhere.add(Path(VIT_CHAPTER).stem)
    session.notebook_jobs = args.notebook_jobs
    outcomes = run_steps(names, session, together=together)
    return 0 if all(o.status == "ok" for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
