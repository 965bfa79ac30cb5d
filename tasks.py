#!/usr/bin/env python3
"""The course's commands. Needs only Python >= 3.10 and pip.

    python3 tasks.py book     # install what the book needs, render it to _build/html/
    python3 tasks.py test     # install what the tests need, run the unit and notebook tests
    python3 tasks.py tangle   # regenerate lib/ from the chapters' export cells
    python3 tasks.py lint     # ruff: lint and format check of lib/, tests/ and the chapters
    python3 tasks.py fmt      # ruff: format lib/, tests/ and the chapters' code cells

Outside a virtual environment (or conda), the commands create ``.venv/`` here and run
inside it, so nothing is installed into the system Python. Installing is idempotent: a
second run installs nothing. On a machine without an NVIDIA GPU the CPU build of PyTorch
is installed; where a suitable torch is already present (Colab, conda), it is kept.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
MIN_TORCH = (2, 4)
CPU_TORCH = "torch==2.13.0+cpu"  # a CPU-only wheel: no CUDA packages are pulled in
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
PY_PATHS = ["lib", "tests", "tools", "bench", "scripts", "tasks.py", "conftest.py"]

if sys.version_info < (3, 10):  # noqa: UP036 - this file runs before any install
    sys.exit(f"Python >= 3.10 is needed; this is {sys.version.split()[0]}")


def say(message: str) -> None:
    print(f"[tasks] {message}", flush=True)


def run(*cmd: str | Path, env: dict[str, str] | None = None, check: bool = True) -> int:
    cmd_text = " ".join(str(c) for c in cmd)
    say(cmd_text)
    done = subprocess.run([str(c) for c in cmd], cwd=ROOT, env=env)
    if check and done.returncode != 0:
        sys.exit(f"[tasks] failed (exit {done.returncode}): {cmd_text}")
    return done.returncode


def in_managed_env() -> bool:
    """True inside a virtual environment, conda, or a hosted notebook such as Colab."""
    return (
        sys.prefix != sys.base_prefix
        or bool(os.environ.get("CONDA_PREFIX"))
        or "COLAB_RELEASE_TAG" in os.environ
    )


def venv_python() -> Path:
    return VENV / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def reexec_in_venv() -> None:
    """Create .venv if needed and run this same command inside it."""
    if not venv_python().exists():
        say(f"creating a virtual environment in {VENV}")
        if run(sys.executable, "-m", "venv", VENV, check=False) != 0:
            shutil.rmtree(VENV, ignore_errors=True)
            sys.exit(
                "[tasks] could not create .venv (on Debian/Ubuntu: apt install python3-venv). "
                "Or create and activate a virtual environment yourself, then run this again."
            )
    os.execv(str(venv_python()), [str(venv_python()), str(Path(__file__)), *sys.argv[1:]])


def pip(*args: str, check: bool = True) -> int:
    return run(sys.executable, "-m", "pip", "install", "--quiet", *args, check=check)


def torch_ok() -> bool:
    try:
        import torch
    except ImportError:
        return False
    version = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])
    return version >= MIN_TORCH


def ensure_torch() -> None:
    if torch_ok():
        return
    if shutil.which("nvidia-smi"):
        say("an NVIDIA GPU is present: installing the default (CUDA) build of PyTorch")
        pip(f"torch>={MIN_TORCH[0]}.{MIN_TORCH[1]}")
        return
    say("no NVIDIA GPU: installing a CPU-only build of PyTorch")
    if pip(CPU_TORCH, check=False) != 0:
        say(f"{CPU_TORCH} is not available here; trying PyTorch's CPU index")
        pip("torch", "--index-url", CPU_INDEX)


def ensure_installed(extra: str) -> None:
    """Install torch, then the course package with the given extra; skip if already done."""
    stamp_dir = Path(sys.prefix) / ".tfs-stamps"
    digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()[:16]
    stamp = stamp_dir / f"{extra}-{digest}-{hashlib.sha256(str(ROOT).encode()).hexdigest()[:8]}"
    if stamp.exists() and torch_ok():
        return
    ensure_torch()
    pip("-e", f".[{extra}]")
    stamp_dir.mkdir(exist_ok=True)
    stamp.touch()


def cpu_count() -> int:
    return max(1, min(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1, 4))


def cmd_test(extra_args: list[str]) -> None:
    ensure_installed("test")
    workers = cpu_count()
    parallel = ["-n", str(workers)] if workers > 1 else []
    run(sys.executable, "-m", "pytest", *parallel, *extra_args)


def cmd_book(strict: bool) -> None:
    ensure_installed("book")
    env = dict(os.environ)
    env.setdefault("TFS_PROFILE", "full" if shutil.which("nvidia-smi") else "smoke")
    flags = ["-W", "-n", "--keep-going"] if strict else []
    # jupyter-book 1.x has no `python -m` entry point: call its CLI from this interpreter.
    cli = "from jupyter_book.cli.main import main; main()"
    run(sys.executable, "-c", cli, "build", ".", *flags, env=env)
    if strict:
        check_figures()
    say(f"the book is at {ROOT / '_build' / 'html' / 'index.html'}")


def check_figures() -> None:
    """Fail if a chapter page lost its figures (e.g. a non-inline matplotlib backend)."""
    missing = []
    from tools.tangle import chapter_files

    for chapter in chapter_files():
        shows = chapter.read_text(encoding="utf-8").count("plt.show()")
        page = ROOT / "_build" / "html" / "chapters" / f"{chapter.stem}.html"
        images = page.read_text(encoding="utf-8").count("<img") if page.exists() else 0
        if images < shows:
            missing.append(f"{chapter.name}: {shows} plt.show() but {images} images")
    if missing:
        sys.exit("[tasks] figures missing from the rendered book:\n  " + "\n  ".join(missing))
    say("every chapter's figures are in the rendered book")


def cmd_tangle(check: bool) -> None:
    ensure_installed("test")
    run(sys.executable, "tools/tangle.py", *(["--check"] if check else []))


def notebooks() -> list[str]:
    """Convert the chapters to ipynb under _build/notebooks so ruff can read their code."""
    from tools.tangle import chapter_files, write_notebook

    return [str(write_notebook(chapter)) for chapter in chapter_files()]


def cmd_lint() -> None:
    ensure_installed("test")
    nbs = notebooks()
    # _build is excluded in pyproject for plain `ruff check .`; name the notebooks explicitly.
    run(sys.executable, "-m", "ruff", "check", *PY_PATHS)
    run(sys.executable, "-m", "ruff", "check", *nbs)
    run(sys.executable, "-m", "ruff", "format", "--check", *PY_PATHS)
    run(sys.executable, "-m", "ruff", "format", "--check", *nbs)
    run(sys.executable, "tools/tangle.py", "--check")


def cmd_fmt() -> None:
    ensure_installed("test")
    run(sys.executable, "-m", "ruff", "format", *PY_PATHS)
    from tools.tangle import chapter_files

    chapters = [str(p) for p in chapter_files()]
    run(sys.executable, "-m", "jupytext", "--pipe", f"{sys.executable} -m ruff format -", *chapters)
    run(sys.executable, "tools/tangle.py")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    test = sub.add_parser("test", help="run the unit and notebook tests (extra args go to pytest)")
    test.add_argument("pytest_args", nargs=argparse.REMAINDER)
    book = sub.add_parser("book", help="render the book to _build/html")
    book.add_argument("--strict", action="store_true", help="treat warnings as errors (CI)")
    tangle = sub.add_parser("tangle", help="regenerate lib/ from the chapters")
    tangle.add_argument("--check", action="store_true", help="only report drift")
    sub.add_parser("lint", help="ruff lint and format check")
    sub.add_parser("fmt", help="ruff format, chapters included")
    args, unknown = parser.parse_known_args()
    if unknown and args.command != "test":
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")

    if not in_managed_env():
        reexec_in_venv()
    if args.command == "test":
        cmd_test(unknown + args.pytest_args)  # options such as -x or -q go to pytest as well
    elif args.command == "book":
        cmd_book(args.strict)
    elif args.command == "tangle":
        cmd_tangle(args.check)
    elif args.command == "lint":
        cmd_lint()
    elif args.command == "fmt":
        cmd_fmt()


if __name__ == "__main__":
    main()
