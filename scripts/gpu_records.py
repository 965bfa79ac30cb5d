#!/usr/bin/env python3
"""Make the course's recorded GPU results (book/results/), one step or all of them.

Run on a machine with an NVIDIA GPU, from the repository root, after `pip install -e
".[test]"`:

    python scripts/gpu_records.py all          # everything below, in order
    python scripts/gpu_records.py notebooks    # every chapter in the full profile, timed
    python scripts/gpu_records.py training     # chapter 8's GPT, BERT and T5 runs
    python scripts/gpu_records.py flash        # chapter 9's kernel benchmark
    python scripts/gpu_records.py vit          # chapter 10's ViT on the shipped MNIST split
    python scripts/gpu_records.py throughput   # our GPT against GPT2LMHeadModel, eager/compiled

Each step writes under book/results/<name>/ a metrics.json of one schema
(lib.utils.write_record: the metrics, the wall time, the GPU, the torch and Triton versions,
the commit and the exact command), so that
`python scripts/rerun_record.py book/results/<name>/metrics.json` repeats it.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "book" / "results"
if str(ROOT) not in sys.path:  # run as a script: lib and tools come from this checkout
    sys.path.insert(0, str(ROOT))


def record(name: str, metrics: dict, command: list[str], wall_s: float) -> Path:
    """Write book/results/<name>/ with lib.utils.write_record, the course's one schema."""
    from lib.utils import write_record

    path = write_record(
        RESULTS / name,
        name=name,
        command=shlex.join(command),
        wall_seconds=round(wall_s, 1),
        metrics=metrics,
    )
    print(f"wrote {path.relative_to(ROOT)}")
    return path


def run(
    command: list[str], env: dict[str, str] | None = None
) -> tuple[int, float, str]:
    """Run a command from the repository root; return its exit code, seconds and output."""
    print("$", shlex.join(command), flush=True)
    start = time.perf_counter()
    done = subprocess.run(
        command,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
    )
    output = done.stdout + done.stderr
    print(output[-3000:], flush=True)
    return done.returncode, time.perf_counter() - start, output


def step_notebooks() -> None:
    """Every chapter executed in the full profile by nbmake, each timed on its own."""
    from tools.tangle import chapter_files

    per_chapter = {}
    for chapter in chapter_files():
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                   f"chapters/{chapter.name}"]  # fmt: skip
        code, seconds, _ = run(command, env={"TFS_PROFILE": "full"})
        per_chapter[chapter.stem] = {
            "passed": code == 0,
            "wall_time_s": round(seconds, 1),
        }
    total = sum(c["wall_time_s"] for c in per_chapter.values())
    record(
        "full-profile-notebooks",
        {
            "chapters": per_chapter,
            "all_passed": all(c["passed"] for c in per_chapter.values()),
        },
        [sys.executable, "scripts/gpu_records.py", "notebooks"],
        total,
    )


def step_training() -> None:
    """Chapter 8's three runs; lib.runs writes their records itself."""
    for name in ("gpt", "bert", "t5"):
        run([sys.executable, "-m", "lib.runs", "--run", name, "--profile", "full"])


def step_flash() -> None:
    """Chapter 9's benchmark; bench_flash.py writes its record itself."""
    import torch

    gpu = (
        torch.cuda.get_device_name().split()[-1].lower()
        if torch.cuda.is_available()
        else "cpu"
    )
    run(
        [
            sys.executable,
            "bench/bench_flash.py",
            "--out",
            f"book/results/09-flash-attention-{gpu}",
        ]
    )


def step_vit() -> None:
    """Chapter 10's ViT on the shipped MNIST split: the chapter, run in the full profile,
    writes book/results/10-vit-mnist/metrics.json itself."""
    run(
        [sys.executable, "-m", "pytest", "-q", "chapters/10-vit.md"],
        env={"TFS_PROFILE": "full"},
    )


def step_throughput() -> None:
    """Our GPT's training step against GPT2LMHeadModel: eager, then both compiled."""
    lines = {}
    total = 0.0
    for mode in ("eager", "compiled"):
        command = [sys.executable, "bench/bench_models.py"] + (
            ["--compile"] if mode == "compiled" else []
        )
        code, seconds, output = run(command)
        total += seconds
        lines[mode] = {"exit_code": code, "output": output.strip().splitlines()[-12:]}
    record(
        "08-training-throughput",
        lines,
        [sys.executable, "scripts/gpu_records.py", "throughput"],
        total,
    )


STEPS = {
    "notebooks": step_notebooks,
    "training": step_training,
    "flash": step_flash,
    "vit": step_vit,
    "throughput": step_throughput,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("step", choices=[*STEPS, "all"])
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        sys.exit(
            "no CUDA GPU here: the recorded runs are GPU runs (see the chapters for CPU ones)"
        )
    for name, step in STEPS.items():
        if args.step in (name, "all"):
            step()


if __name__ == "__main__":
    main()
