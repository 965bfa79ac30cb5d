#!/usr/bin/env python3
"""The course's commands. Needs only Python >= 3.10 and pip.

    python3 tasks.py book     # install what the book needs, render it to _build/html/
    python3 tasks.py test     # install what the tests need, run the unit and notebook tests
    python3 tasks.py lab      # install JupyterLab + Jupytext, open the chapters as notebooks
    python3 tasks.py tangle   # regenerate lib/ from the chapters' export cells
    python3 tasks.py notebooks  # regenerate notebooks/ (the Colab notebooks) and their links
    python3 tasks.py compat   # the transformers comparisons under its lowest and newest versions
    python3 tasks.py dry      # every chapter in the colab profile's shapes, loops cut (CPU)
    python3 tasks.py install test  # only install what a command needs (CI's first phase)
    python3 tasks.py pages    # code blocks wider than the column, in headless Chromium
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
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
MIN_TORCH = (2, 4)
TESTED_TORCH = "torch==2.13.0"  # the version the course is tested with
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
    os.execv(
        str(venv_python()), [str(venv_python()), str(Path(__file__)), *sys.argv[1:]]
    )


def pip(*args: str, check: bool = True) -> int:
    return run(sys.executable, "-m", "pip", "install", "--quiet", *args, check=check)


def torch_ok() -> bool:
    try:
        import torch
    except ImportError:
        return False
    version = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])
    return version >= MIN_TORCH


def is_cuda_build(requires_dist: list[str]) -> bool:
    """True when a torch wheel's requirements pull NVIDIA's CUDA packages (on Linux,
    PyPI's default torch does: several GB of ``nvidia-*`` wheels)."""
    return any(re.match(r"\s*(nvidia-|cuda-)", req) for req in requires_dist)


def plan_torch_install(
    *,
    has_nvidia_gpu: bool,
    system: str,
    candidate: Callable[[str, str | None], list[str] | None],
    cpu_index_reachable: Callable[[], bool],
) -> list[str]:
    """The pip arguments that install a suitable torch, decided without installing.

    ``candidate(requirement, index_url)`` asks pip which wheel it would take (a dry run,
    no download of the wheel itself where the index serves its metadata) and returns
    that wheel's ``Requires-Dist``, or ``None`` when the index has no match. The order:

    1. an NVIDIA GPU: the default build (CUDA) from the configured index;
    2. not Linux (macOS, Windows): the default build, which is CPU-only there;
    3. Linux without a GPU: the configured index's newest torch if it is a CPU build
       (a mirror of CPU wheels), else the course's tested version from that index if
       that one is (this machine's case: ``torch==2.13.0`` is a local CPU wheel), else
       PyTorch's CPU index if it answers;
    4. otherwise a clear error: no CUDA build is downloaded behind the user's back.
    """
    floor = f"torch>={MIN_TORCH[0]}.{MIN_TORCH[1]}"
    if has_nvidia_gpu or system != "Linux":
        return [floor]
    for requirement in (floor, TESTED_TORCH):
        requires = candidate(requirement, None)
        if requires is not None and not is_cuda_build(requires):
            return [requirement]
    if cpu_index_reachable():
        return [floor, "--index-url", CPU_INDEX]
    raise SystemExit(
        "[tasks] no CPU-only build of PyTorch is available: the configured package index "
        f"offers only CUDA builds of torch and {CPU_INDEX} does not answer. Install a "
        "CPU build yourself (pip install torch --index-url "
        f"{CPU_INDEX}, or a wheel file), or set TFS_TORCH=cuda to accept the CUDA build "
        "(several GB), then run this again."
    )


def pip_candidate(requirement: str, index_url: str | None) -> list[str] | None:
    """What ``pip install requirement`` would take, as its ``Requires-Dist`` (dry run)."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--quiet"]
        cmd += ["--no-deps", "--ignore-installed", "--report", str(report), requirement]
        if index_url:
            cmd += ["--index-url", index_url]
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        if done.returncode != 0 or not report.exists():
            return None
        installs = json.loads(report.read_text(encoding="utf-8")).get("install", [])
    if not installs:
        return None
    return list(installs[0].get("metadata", {}).get("requires_dist", []) or [])


def url_answers(url: str, timeout: float = 5.0) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=timeout):
            return True
    except Exception:
        return False


def ensure_torch() -> None:
    if torch_ok():
        return
    has_gpu = shutil.which("nvidia-smi") is not None
    if os.environ.get("TFS_TORCH") == "cuda":
        has_gpu = True
    args = plan_torch_install(
        has_nvidia_gpu=has_gpu,
        system=platform.system(),
        candidate=pip_candidate,
        cpu_index_reachable=lambda: url_answers(CPU_INDEX + "/torch/"),
    )
    kind = "the default (CUDA) build" if has_gpu else "a CPU-only build"
    say(f"installing {kind} of PyTorch: pip install {' '.join(args)}")
    pip(*args)


def ensure_installed(extra: str) -> None:
    """Install torch, then the course package with the given extra; skip if already done."""
    stamp_dir = Path(sys.prefix) / ".tfs-stamps"
    digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()[:16]
    stamp = (
        stamp_dir
        / f"{extra}-{digest}-{hashlib.sha256(str(ROOT).encode()).hexdigest()[:8]}"
    )
    if stamp.exists() and torch_ok():
        return
    ensure_torch()
    pip("-e", f".[{extra}]")
    stamp_dir.mkdir(exist_ok=True)
    stamp.touch()


def cpu_count() -> int:
    return max(
        1,
        min(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1, 4),
    )


def cmd_test(extra_args: list[str]) -> None:
    ensure_installed("test")
    workers = cpu_count()
    parallel = ["-n", str(workers)] if workers > 1 else []
    run(sys.executable, "-m", "pytest", *parallel, *extra_args)


# Lines of the build's output that say nothing to a reader. The kernels that execute the
# chapters log a warning about TCP transport on start (ipykernel, when no CurveZMQ keys are
# provisioned; the kernels listen on localhost only); Sphinx and its extensions log their
# status and configuration, which `-q` keeps out but `--verbose` shows.
BUILD_NOISE = re.compile(
    r"\[IPKernelApp\] WARNING \| Kernel is running over TCP without encryption"
)
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def echo_build(cmd: list[str], env: dict[str, str]) -> int:
    """Run the book build, echoing its output without colour codes or known noise."""
    say(" ".join(cmd))
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        encoding="utf-8",
        errors="replace",
    )
    assert proc.stdout is not None
    hidden = 0
    for line in proc.stdout:
        line = ANSI.sub("", line)
        if BUILD_NOISE.search(line):
            hidden += 1
            continue
        print(line, end="", flush=True)
    if hidden:
        say(f"({hidden} kernel start-up notices about TCP transport left out)")
    return proc.wait()


def active_profile() -> str:
    """The run profile, by lib.utils.get_profile's one rule (``TFS_PROFILE``, else by the
    hardware: smoke without CUDA, colab on a pre-Ampere GPU, full on a newer one); an
    unknown ``TFS_PROFILE`` stops here, before anything is built or started."""
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "from lib.utils import get_profile; print(get_profile())",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["unknown error"])[-1]
        sys.exit(f"[tasks] {last.removeprefix('ValueError: ')}")
    return done.stdout.strip()


def cmd_book(strict: bool, verbose: bool = False) -> None:
    ensure_installed("book")
    env = dict(os.environ)
    env["TFS_PROFILE"] = active_profile()
    env["NO_COLOR"] = "1"  # Sphinx, and the tools that honour https://no-color.org
    env.pop("FORCE_COLOR", None)
    flags = ["-W", "-n", "--keep-going"] if strict else []
    if not verbose:
        flags.append(
            "-q"
        )  # Sphinx's -q: warnings and errors only, no status or config lines
    # jupyter-book 1.x has no `python -m` entry point: call its CLI from this interpreter,
    # with Sphinx's colour codes switched off (jupyter-book does not do it for a pipe).
    cli = "from sphinx.util.console import nocolor; nocolor(); from jupyter_book.cli.main import main; main()"
    # chapters that `tasks.py test` executed since their last change (and lib's) are
    # rendered from those outputs: CI executes each chapter once (tools/book_cache.py)
    from tools.book_cache import prime

    for name, what in prime(env["TFS_PROFILE"]).items():
        say(f"{name}: {what}")
    say(
        f"rendering the book in the {env['TFS_PROFILE']} profile: a chapter that neither "
        "the tests nor an earlier build executed since its last change is executed now "
        "(one line each, with its time)"
    )
    start = time.monotonic()
    code = echo_build([sys.executable, "-c", cli, "build", ".", *flags], env)
    if code != 0:
        sys.exit(
            f"[tasks] the book build failed (exit {code}); the messages above say why"
        )
    if strict:
        check_figures()
        check_colab_buttons()
        check_offline_maths()
    checked = "no warnings, " if strict else ""
    say(
        f"built in {time.monotonic() - start:.0f} s, {checked}at {ROOT / '_build/html/index.html'}"
    )


def toc_chapters() -> list[Path]:
    """The chapters that ``_toc.yml`` lists, in its order."""
    toc = (ROOT / "_toc.yml").read_text(encoding="utf-8")
    files = re.findall(r"^\s*-?\s*file:\s*(chapters/[^\s#]+)", toc, re.MULTILINE)
    return [ROOT / (f if f.endswith(".md") else f + ".md") for f in files]


def check_figures() -> None:
    """Fail if a chapter page lost its figures (e.g. a non-inline matplotlib backend)."""
    missing = []
    for chapter in toc_chapters():
        shows = chapter.read_text(encoding="utf-8").count("plt.show()")
        page = ROOT / "_build" / "html" / "chapters" / f"{chapter.stem}.html"
        images = page.read_text(encoding="utf-8").count("<img") if page.exists() else 0
        if images < shows:
            missing.append(f"{chapter.name}: {shows} plt.show() but {images} images")
    if missing:
        sys.exit(
            "[tasks] figures missing from the rendered book:\n  " + "\n  ".join(missing)
        )
    say("every chapter's figures are in the rendered book")


def check_offline_maths() -> None:
    """Fail if a chapter page loads MathJax from anywhere but the book's own copy."""
    wrong = []
    mathjax = ROOT / "_build" / "html" / "_static" / "mathjax" / "tex-chtml.js"
    if not mathjax.exists():
        wrong.append(f"{mathjax.relative_to(ROOT)} is missing")
    for chapter in toc_chapters():
        page = ROOT / "_build" / "html" / "chapters" / f"{chapter.stem}.html"
        html = page.read_text(encoding="utf-8") if page.exists() else ""
        scripts = re.findall(r'<script[^>]*src="([^"]*mathjax[^"]*)"', html, re.I)
        if not scripts or any(not s.startswith("../_static/mathjax/") for s in scripts):
            wrong.append(f"{chapter.name}: MathJax from {scripts or 'nowhere'}")
    if wrong:
        sys.exit("[tasks] maths would not render offline:\n  " + "\n  ".join(wrong))
    say("every chapter page loads the book's own copy of MathJax (maths works offline)")


def check_colab_buttons() -> None:
    """Fail if a chapter page's Colab button does not open its committed notebook."""
    from tools.notebooks import colab_url

    wrong = []
    for chapter in toc_chapters():
        notebook = chapter.stem + ".ipynb"
        page = ROOT / "_build" / "html" / "chapters" / f"{chapter.stem}.html"
        html = page.read_text(encoding="utf-8") if page.exists() else ""
        if not (ROOT / "notebooks" / notebook).exists():
            wrong.append(f"{chapter.name}: notebooks/{notebook} is missing")
        elif f'href="{colab_url(notebook)}"' not in html:
            wrong.append(f"{chapter.name}: no Colab button to notebooks/{notebook}")
    if wrong:
        sys.exit("[tasks] Colab buttons:\n  " + "\n  ".join(wrong))
    say("every chapter page's Colab button opens its notebook in notebooks/")


LAB_CONFIG = ROOT / "_build" / "jupyter-config"


def write_lab_config(config_dir: Path = LAB_CONFIG) -> Path:
    """JupyterLab settings of this project: Markdown and MyST files open as Jupytext
    notebooks. (jupyterlab-myst, in the ``notebooks`` extra, renders the MyST roles and
    directives of their Markdown cells: ``{cite}``, ``{numref}``, ``{figure}``, maths.)"""
    overrides = config_dir / "labconfig" / "default_setting_overrides.json"
    overrides.parent.mkdir(parents=True, exist_ok=True)
    viewers = {"markdown": "Jupytext Notebook", "myst": "Jupytext Notebook"}
    overrides.write_text(
        json.dumps(
            {"@jupyterlab/docmanager-extension:plugin": {"defaultViewers": viewers}}
        ),
        encoding="utf-8",
    )
    return overrides


def cmd_lab(lab_args: list[str]) -> None:
    """Open JupyterLab on the chapters; Jupytext makes each ``.md`` open as a notebook.

    The default viewer of Markdown and MyST files is set to Jupytext's notebook in a config
    directory of this project (``_build/jupyter-config``, put on ``JUPYTER_CONFIG_PATH``), not
    in ``~/.jupyter``: a setting of your own in JupyterLab still wins.
    """
    ensure_installed("notebooks")
    write_lab_config()
    env = dict(os.environ)
    env["JUPYTER_CONFIG_PATH"] = os.pathsep.join(
        p for p in (str(LAB_CONFIG), os.environ.get("JUPYTER_CONFIG_PATH", "")) if p
    )
    env["TFS_PROFILE"] = active_profile()
    say(
        "opening JupyterLab in chapters/: a chapter opens as a notebook (your outputs stay in "
        "the browser; the .md keeps only the code and prose). Ctrl+C stops it."
    )
    if hasattr(os, "geteuid") and os.geteuid() == 0:  # containers and hosted machines
        lab_args = ["--allow-root", *lab_args]
    try:
        code = run(
            sys.executable,
            "-m",
            "jupyter",
            "lab",
            f"--ServerApp.root_dir={ROOT / 'chapters'}",
            *lab_args,
            env=env,
            check=False,
        )
    except KeyboardInterrupt:
        code = 0
    sys.exit(code)


# The tests that compare our models with transformers' reference models (chapters 7, 10).
COMPAT_TESTS = [
    "tests/test_hf_weights.py",
    "tests/test_vit.py",
    "tests/test_pretrained.py",
]


def transformers_versions() -> dict[str, str]:
    """``{"lowest": "transformers==4.46.*", "newest": "transformers"}``: the lowest release
    line the ``chapters`` extra admits, and the newest release (pip's choice)."""
    spec = re.search(
        r'"transformers>=([\d.]+)[^"]*"', (ROOT / "pyproject.toml").read_text()
    )
    if spec is None:
        sys.exit(
            "[tasks] pyproject.toml: the chapters extra has no transformers>=X range"
        )
    major_minor = ".".join(spec.group(1).split(".")[:2])
    return {"lowest": f"transformers=={major_minor}.*", "newest": "transformers"}


def cmd_compat(which: list[str], pytest_args: list[str]) -> None:
    """Run the equivalence tests under the lowest supported and the newest transformers.

    Each version is installed with its own dependencies (tokenizers, huggingface_hub, ...)
    into ``_build/compat/<name>`` and put first on ``PYTHONPATH``, so the project's
    environment keeps its own copy."""
    versions = transformers_versions()
    if unknown := sorted(set(which) - set(versions)):
        sys.exit(f"[tasks] compat: {unknown} unknown; choose from {sorted(versions)}")
    ensure_installed("test")
    for name in which or list(versions):
        target = ROOT / "_build" / "compat" / name
        stamp = target / ".installed"
        if not stamp.exists() or stamp.read_text() != versions[name]:
            shutil.rmtree(target, ignore_errors=True)
            pip("--target", str(target), "--upgrade", versions[name])
            stamp.write_text(versions[name])
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(target), str(ROOT), env.get("PYTHONPATH", "")) if p
        )
        version = subprocess.run(
            [
                sys.executable,
                "-c",
                "import transformers; print(transformers.__version__)",
            ],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        say(f"equivalence tests under transformers {version} ({name})")
        run(sys.executable, "-m", "pytest", "-q", *COMPAT_TESTS, *pytest_args, env=env)


def dry_report(report: Path, profile: str) -> list[str]:
    """One line per chapter from the junit report of a dry run:
    ``[dry] chapters/07-families (colab): passed in 41 s``."""
    import xml.etree.ElementTree as ET

    lines = []
    for case in ET.parse(report).getroot().iter("testcase"):
        name = case.get("name", "")
        stem = Path(name.split("::")[0]).stem or name
        outcome = "passed"
        for tag in ("failure", "error"):
            if case.find(tag) is not None:
                outcome = "FAILED"
        if case.find("skipped") is not None:
            outcome = "skipped"
        seconds = float(case.get("time", 0.0))
        lines.append(
            f"[dry] chapters/{stem} ({profile}): {outcome} in {seconds:.0f} s"
        )
    return sorted(lines)


def cmd_dry(profile: str, chapters: list[str], pytest_args: list[str]) -> None:
    """Execute chapters in a GPU profile's shapes on this machine, with loops cut short.

    ``TFS_PROFILE=<profile> TFS_DRY=1``: every ``pick`` returns that profile's sizes,
    lengths and data, except the loop counts marked ``dry=``, which run one or two steps.
    What a Colab (or an H100) reader runs is executed here first. Offline: the stand-ins
    of the pretrained weights are used, as in the tests."""
    ensure_installed("test")
    env = dict(os.environ)
    env.update(TFS_PROFILE=profile, TFS_DRY="1", HF_HUB_OFFLINE="1")
    targets = chapters or [str(p.relative_to(ROOT)) for p in toc_chapters()]
    report = ROOT / "_build" / f"dry-{profile}.xml"
    report.parent.mkdir(exist_ok=True)
    workers = cpu_count()
    parallel = ["-n", str(workers)] if workers > 1 and len(targets) > 1 else []
    say(f"dry run of {len(targets)} chapter(s) in the {profile} profile's shapes")
    code = run(
        sys.executable,
        "-m",
        "pytest",
        "-q",
        *parallel,
        f"--junitxml={report}",
        *targets,
        *pytest_args,
        env=env,
        check=False,
    )
    if report.exists():
        for line in dry_report(report, profile):
            print(line, flush=True)
    if code != 0:
        sys.exit(f"[tasks] the {profile} dry run failed (exit {code})")


def cmd_pages(extra: list[str]) -> None:
    """Count code and output blocks wider than the column, in headless Chromium at the
    widths readers use (tools/page_overflow.py), on the book ``tasks.py book`` built."""
    ensure_installed("test")
    run(sys.executable, "tools/page_overflow.py", *extra)


def cmd_tangle(check: bool) -> None:
    ensure_installed("test")
    run(sys.executable, "tools/tangle.py", *(["--check"] if check else []))


def cmd_notebooks(check: bool) -> None:
    ensure_installed("test")
    run(sys.executable, "tools/notebooks.py", *(["--check"] if check else []))


def notebooks() -> list[str]:
    """Convert the chapters to ipynb under _build/notebooks so ruff can read their code."""
    from tools.tangle import chapter_files, write_notebook

    return [str(write_notebook(chapter)) for chapter in chapter_files()]


def cmd_lint() -> None:
    ensure_installed("test")
    from tools.tangle import CHAPTER_WIDTH

    nbs = notebooks()
    # _build is excluded in pyproject for plain `ruff check .`; name the notebooks explicitly.
    run(sys.executable, "-m", "ruff", "check", *PY_PATHS)
    run(sys.executable, "-m", "ruff", "check", *nbs, "notebooks")
    run(sys.executable, "-m", "ruff", "format", "--check", *PY_PATHS)
    run(
        sys.executable,
        "-m",
        "ruff",
        "format",
        "--check",
        *CHAPTER_WIDTH,
        *nbs,
        "notebooks",
    )
    # every line of chapter code fits the book's column, strings, comments and
    # docstrings included, which the formatter leaves as long as they are
    run(sys.executable, "-m", "ruff", "check", "--select", "E501", *CHAPTER_WIDTH, *nbs)
    run(sys.executable, "tools/tangle.py", "--check")
    run(sys.executable, "tools/notebooks.py", "--check")
    workflows = sorted(str(p) for p in (ROOT / ".github" / "workflows").glob("*.yml"))
    run(
        sys.executable,
        "-m",
        "check_jsonschema",
        "--builtin-schema",
        "vendor.github-workflows",
        *workflows,
    )


def cmd_fmt() -> None:
    ensure_installed("test")
    run(sys.executable, "-m", "ruff", "format", *PY_PATHS)
    from tools.tangle import CHAPTER_WIDTH, chapter_files

    chapters = [str(p) for p in chapter_files()]
    run(
        sys.executable,
        "-m",
        "jupytext",
        "--pipe",
        f"{sys.executable} -m ruff format {' '.join(CHAPTER_WIDTH)} -",
        *chapters,
    )
    run(sys.executable, "tools/tangle.py")
    run(sys.executable, "tools/notebooks.py")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    test = sub.add_parser(
        "test", help="run the unit and notebook tests (extra args go to pytest)"
    )
    test.add_argument("pytest_args", nargs=argparse.REMAINDER)
    book = sub.add_parser("book", help="render the book to _build/html")
    book.add_argument(
        "--strict", action="store_true", help="treat warnings as errors (CI)"
    )
    book.add_argument(
        "--verbose",
        action="store_true",
        help="show Sphinx's status output (progress, parser settings)",
    )
    lab = sub.add_parser("lab", help="open the chapters as notebooks in JupyterLab")
    lab.add_argument("lab_args", nargs=argparse.REMAINDER, help="passed to jupyter lab")
    tangle = sub.add_parser("tangle", help="regenerate lib/ from the chapters")
    tangle.add_argument("--check", action="store_true", help="only report drift")
    notebooks = sub.add_parser(
        "notebooks", help="regenerate notebooks/ (Colab) from the chapters"
    )
    notebooks.add_argument("--check", action="store_true", help="only report drift")
    compat = sub.add_parser(
        "compat",
        help="the tests against transformers under its lowest supported and newest versions",
    )
    compat.add_argument("which", nargs="*", help="lowest, newest (default: both)")
    sub.add_parser(
        "pages",
        help="count code blocks wider than the book's column, in headless Chromium "
        "(after `book`; extra args go to tools/page_overflow.py)",
    )
    dry = sub.add_parser(
        "dry",
        help="execute the chapters in a GPU profile's shapes on this machine, loops "
        "cut to a step or two (extra args go to pytest)",
    )
    dry.add_argument("chapters", nargs="*", help="chapter files (default: all)")
    dry.add_argument("--profile", choices=["colab", "full"], default="colab")
    install = sub.add_parser(
        "install", help="only install what a command needs (an extra: test, book, ...)"
    )
    install.add_argument(
        "extra", choices=["test", "book", "notebooks", "chapters"], default="test"
    )
    sub.add_parser("lint", help="ruff lint and format check")
    sub.add_parser("fmt", help="ruff format, chapters included")
    args, unknown = parser.parse_known_args()
    if unknown and args.command not in ("test", "lab", "compat", "pages", "dry"):
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")

    if not in_managed_env():
        reexec_in_venv()
    if args.command == "test":
        cmd_test(
            unknown + args.pytest_args
        )  # options such as -x or -q go to pytest as well
    elif args.command == "book":
        cmd_book(args.strict, args.verbose)
    elif args.command == "lab":
        cmd_lab(unknown + args.lab_args)
    elif args.command == "pages":
        cmd_pages(unknown)
    elif args.command == "compat":
        cmd_compat(args.which, unknown)
    elif args.command == "install":
        ensure_installed(args.extra)
    elif args.command == "dry":
        cmd_dry(args.profile, args.chapters, unknown)
    elif args.command == "tangle":
        cmd_tangle(args.check)
    elif args.command == "notebooks":
        cmd_notebooks(args.check)
    elif args.command == "lint":
        cmd_lint()
    elif args.command == "fmt":
        cmd_fmt()


if __name__ == "__main__":
    main()
