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
    python3 tasks.py pages    # the built book on a phone and a laptop, in Chromium
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
import sysconfig
import textwrap
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


def shown(path: Path) -> str:
    """A path as a message gives it: relative to the checkout where it lies inside."""
    return str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)


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


def venv_python(venv: Path = VENV) -> Path:
    return venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


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


# pip's own output is hundreds of lines (or, under --quiet, minutes of silence). `pip`
# below shows instead what it installs, then one progress line every few seconds (packages
# collected and downloaded, then installed) read from pip's normal output, and writes that
# output whole to _build/logs/pip-<what>.log.
PIP_LOGS = ROOT / "_build" / "logs"
PROGRESS_EVERY = 10.0  # seconds between two progress lines of a long install
# A first install's minutes, rounded up: on 2 cores with a local mirror of PyPI torch took
# 17 s and the test extra after it 41 s (95 packages, 330 MB), the notebooks extra 3.5 min
# on a busy machine; a slow connection takes longer, an update of an installed one seconds.
INSTALL_MINUTES = {"chapters": 2, "test": 2, "book": 3, "notebooks": 4, "pages": 1}


class PipProgress:
    """Counts what ``pip install`` reports, one line of its output at a time."""

    COLLECT = re.compile(r"^(?:Collecting|Processing|Obtaining) ")
    DOWNLOAD = re.compile(r"^\s*Downloading \S+ \(([\d.]+) ([kMG]B)\)")
    SATISFIED = re.compile(r"^Requirement already satisfied: ")
    INSTALLING = re.compile(r"^Installing collected packages: (.+)")
    DONE = re.compile(r"^Successfully installed (.+)")

    def __init__(self) -> None:
        self.collected = self.downloaded = self.satisfied = 0
        self.megabytes = 0.0
        self.warnings = 0
        self.installing: list[str] = []
        self.installed: list[str] = []

    def feed(self, line: str) -> str | None:
        """Count one line; return what to show at once (the start of the installation, an
        error), else None."""
        if self.COLLECT.match(line):
            self.collected += 1
        elif match := self.DOWNLOAD.match(line):
            self.downloaded += 1
            unit = {"kB": 1e-3, "MB": 1.0, "GB": 1e3}[match.group(2)]
            self.megabytes += float(match.group(1)) * unit
        elif self.SATISFIED.match(line):
            self.satisfied += 1
        elif match := self.INSTALLING.match(line):
            self.installing = match.group(1).strip().split(", ")
            names = ", ".join(self.installing[:6])
            more = len(self.installing) - 6
            return f"installing {len(self.installing)}: {names}" + (
                f" and {more} more" if more > 0 else ""
            )
        elif match := self.DONE.match(line):
            self.installed = match.group(1).split()
        elif line.startswith("ERROR:"):
            return line.rstrip()
        elif line.startswith("WARNING:"):
            self.warnings += 1
        return None

    def status(self, seconds: float) -> str:
        """The progress line: what pip is at, ``seconds`` after it started."""
        if self.installing:
            return f"{seconds:.0f} s: still installing {len(self.installing)} packages"
        return (
            f"{seconds:.0f} s: {self.collected} collected ({self.downloaded} downloaded, "
            f"{self.megabytes:.0f} MB), {self.satisfied} already installed"
        )

    def summary(self, seconds: float) -> str:
        done = f"{len(self.installed)} installed" if self.installed else "nothing new"
        warned = (
            f"; its {self.warnings} warnings are in the log" if self.warnings else ""
        )
        return f"{done} in {seconds:.0f} s{warned}"


def start_merged(
    cmd: list[str], env: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    """Start ``cmd`` in the project's root with stderr merged into a text stdout pipe
    (undecodable bytes replaced), for the commands whose output tasks.py reads line by
    line: pip's installs and the book build."""
    return subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        encoding="utf-8",
        errors="replace",
    )


def pip(
    *args: str | Path,
    log: str,
    python: str | Path | None = None,
    check: bool = True,
) -> int:
    """``pip install *args`` with ``python`` (this one by default), reporting progress in a
    few lines; pip's whole output goes to ``_build/logs/pip-<log>.log``, and its last
    lines are shown when it fails."""
    import collections
    import queue
    import threading

    cmd = [str(python or sys.executable), "-m", "pip", "install"]
    cmd += ["--progress-bar", "off", *map(str, args)]
    PIP_LOGS.mkdir(parents=True, exist_ok=True)
    log_file = PIP_LOGS / f"pip-{log}.log"
    say(f"pip install {' '.join(map(str, args))}  (log: {shown(log_file)})")
    progress, tail = PipProgress(), collections.deque(maxlen=30)
    lines: queue.Queue[str | None] = queue.Queue()
    start = last = time.monotonic()
    with open(log_file, "w", encoding="utf-8") as out:
        out.write(" ".join(cmd) + "\n")
        proc = start_merged(cmd)

        def read() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                lines.put(line)
            lines.put(None)

        threading.Thread(target=read, daemon=True).start()
        while True:
            try:
                line = lines.get(timeout=1.0)
            except queue.Empty:
                line = ""
            if line is None:
                break
            now = time.monotonic()
            news = None
            if line:
                out.write(line)
                tail.append(line.rstrip())
                news = progress.feed(line)
            if news or now - last >= PROGRESS_EVERY:
                print(f"[tasks]   {news or progress.status(now - start)}", flush=True)
                last = now
        code = proc.wait()
    seconds = time.monotonic() - start
    if code == 0:
        say(f"  {progress.summary(seconds)}")
        return code
    print("\n".join(tail), flush=True)
    if check:
        sys.exit(f"[tasks] pip failed (exit {code}); its whole output: {log_file}")
    return code


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
    kind = (
        "the default build, with CUDA: several GB"
        if has_gpu
        else "a CPU-only build: about 200 MB to download, 750 MB on disk"
    )
    say(f"installing PyTorch, {kind} (a few minutes on a first install)")
    pip(*args, log="torch")


def project_requirements(extra: str | None = None) -> list[str]:
    """The requirements of the package (``extra=None``) or of one of its extras, with the
    extras an extra includes expanded and those whose environment marker rules this
    machine out left out, read from pyproject.toml (without tomllib: Python 3.10 lacks it)."""
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    name = re.search(r'^name = "([^"]+)"', text, re.MULTILINE)

    def array(key: str) -> list[str]:
        block = re.search(rf"^{re.escape(key)} = \[(.*?)^\]", text, re.MULTILINE | re.S)
        if block is None or name is None:
            sys.exit(f"[tasks] pyproject.toml: no {key} = [...] list")
        # the quoted strings, not what a comment quotes
        return [s for s in re.findall(r'"([^"]*)"|#[^\n]*', block.group(1)) if s]

    found: list[str] = []
    for req in array(extra or "dependencies"):
        included = re.fullmatch(rf"{re.escape(name.group(1))}\[(\w+)\]", req)
        if included:
            more = project_requirements(included.group(1))
            found += [r for r in more if r not in found]
        elif marker_holds(req.partition(";")[2]) and req not in found:
            found.append(req)
    return found


def marker_holds(marker: str) -> bool:
    """Whether an environment marker of the kind pyproject.toml uses (``platform_system ==
    'Linux' and platform_machine == 'x86_64'``) holds here; any other marker counts as
    holding, and so does none."""
    values = {
        "platform_system": platform.system(),
        "platform_machine": platform.machine(),
        "sys_platform": sys.platform,
    }
    if " or " in marker:
        return True
    for clause in filter(str.strip, marker.split(" and ")):
        test = re.fullmatch(r"\s*(\w+)\s*(==|!=)\s*['\"]([^'\"]*)['\"]\s*", clause)
        if test and test.group(1) in values:
            if (values[test.group(1)] == test.group(3)) != (test.group(2) == "=="):
                return False
    return True


def requirement_name(requirement: str) -> str:
    return re.split(r"[\s<>=!~;\[]", requirement, maxsplit=1)[0]


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
    names = [requirement_name(r) for r in project_requirements()]
    names += [requirement_name(r) for r in project_requirements(extra)]
    minutes = INSTALL_MINUTES.get(extra, 3)
    say(
        f"installing the `{extra}` extra into {sys.prefix} (a first install: about "
        f"{minutes} minutes; an update of an installed one: seconds):"
    )
    listed = ", ".join(n for n in dict.fromkeys(names) if n != "torch")
    wrapped = textwrap.wrap(f"{listed}, and what they need", 80, break_on_hyphens=False)
    for line in wrapped:
        print(f"[tasks]   {line}", flush=True)
    pip("-e", f".[{extra}]", log=extra)
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
    proc = start_merged(cmd, env)
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


def maths_problem(html: str) -> str | None:
    """Why a built page's maths would not render offline, or None: MathJax loaded from
    anywhere but the book's own copy, or a page with maths that loads none (a page
    without maths, such as one of only code and prose, needs none)."""
    scripts = re.findall(r'<script[^>]*src="([^"]*mathjax[^"]*)"', html, re.I)
    if any(not s.startswith("../_static/mathjax/") for s in scripts):
        return f"MathJax from {scripts}"
    has_maths = re.search(r'class="math[" ]', html) is not None
    if has_maths and not scripts:
        return "maths, but MathJax from nowhere"
    if not html:
        return "no page"
    return None


def check_offline_maths() -> None:
    """Fail if a chapter page loads MathJax from anywhere but the book's own copy."""
    wrong = []
    mathjax = ROOT / "_build" / "html" / "_static" / "mathjax" / "tex-chtml.js"
    if not mathjax.exists():
        wrong.append(f"{mathjax.relative_to(ROOT)} is missing")
    for chapter in toc_chapters():
        page = ROOT / "_build" / "html" / "chapters" / f"{chapter.stem}.html"
        html = page.read_text(encoding="utf-8") if page.exists() else ""
        problem = maths_problem(html)
        if problem:
            wrong.append(f"{chapter.name}: {problem}")
    if wrong:
        sys.exit("[tasks] maths would not render offline:\n  " + "\n  ".join(wrong))
    say("every chapter page with maths loads the book's own copy of MathJax (offline)")


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
    notebooks. (jupyterlab-myst, in the ``notebooks`` extra, renders the MyST directives
    and maths of their Markdown cells; a ``{cite}`` shows its bare key and a ``{numref}``
    to a figure made by code does not resolve: the lab has no bibliography or build.)"""
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
COMPAT_DIR = ROOT / "_build" / "compat"
COMPAT_STAMP = ".tfs-complete"


def transformers_versions() -> dict[str, str]:
    """``{"lowest": "transformers==4.46.*", "newest": "transformers"}``: the lowest release
    line the ``chapters`` extra admits, and the newest (the one this environment has)."""
    spec = next(
        (
            re.match(r"transformers>=([\d.]+)", r)
            for r in project_requirements("chapters")
            if r.startswith("transformers>=")
        ),
        None,
    )
    if spec is None:
        sys.exit(
            "[tasks] pyproject.toml: the chapters extra has no transformers>=X range"
        )
    major_minor = ".".join(spec.group(1).split(".")[:2])
    return {"lowest": f"transformers=={major_minor}.*", "newest": "transformers"}


def site_dirs() -> list[str]:
    """This environment's site-packages (purelib, and platlib where it differs)."""
    paths = sysconfig.get_paths()
    return list(dict.fromkeys([paths["purelib"], paths["platlib"]]))


def compat_key(requirement: str) -> str:
    """What a compat environment is built from, hashed: its requirement, the Python that
    runs it, and the environment it borrows the rest from."""
    parts = [requirement, platform.python_version(), sys.executable, *site_dirs()]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:12]


def compat_env(name: str, requirement: str) -> Path:
    """A virtual environment with ``requirement`` and only what it needs that this one
    lacks or has in another version: ``_build/compat/<name>-<key>``, built once and reused
    while its key (``compat_key``) holds; a stale or half-built one is removed.

    It borrows everything else from this environment through a ``.pth`` file that adds
    this one's site-packages after its own: torch, numpy, pytest and the editable ``lib``
    are this environment's (no copy shadows them), and pip, run with its Python, sees them
    installed and adds only transformers 4.x, its tokenizers and its huggingface_hub.
    (pip, not a faster installer such as uv: uv would not see the borrowed packages and
    would install all of transformers' dependencies, numpy among them, into the compat
    environment, shadowing this one's; with pip the first build takes about 15 s.)"""
    target = COMPAT_DIR / f"{name}-{compat_key(requirement)}"
    stamp = target / COMPAT_STAMP
    if stamp.exists() and stamp.read_text(encoding="utf-8") == requirement:
        return target
    # the directory holds the current environment only
    for old in COMPAT_DIR.glob("*") if COMPAT_DIR.exists() else []:
        shutil.rmtree(old, ignore_errors=True)
    say(f"building {shown(target)} for {requirement} (once; about 15 s)")
    run(sys.executable, "-m", "venv", "--without-pip", target)
    python = venv_python(target)
    ask = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    own = subprocess.run(
        [str(python), "-c", ask],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    borrowed = "; ".join(f"site.addsitedir({p!r})" for p in site_dirs())
    (Path(own) / "_tfs_borrow.pth").write_text(f"import site; {borrowed}\n")
    pip(requirement, log=f"compat-{name}", python=python)
    stamp.write_text(requirement, encoding="utf-8")
    return target


def cmd_compat(which: list[str], pytest_args: list[str]) -> None:
    """Run the equivalence tests under the lowest supported and the newest transformers.

    The newest is the one this environment has (the ``test`` extra installs the newest
    release into a new environment; ``pip install -U transformers`` updates an older one).
    The lowest runs in ``compat_env``'s cached environment, with this one's torch."""
    versions = transformers_versions()
    if unknown := sorted(set(which) - set(versions)):
        sys.exit(f"[tasks] compat: {unknown} unknown; choose from {sorted(versions)}")
    ensure_installed("test")
    start = time.monotonic()
    workers = cpu_count()
    parallel = ["-n", str(workers)] if workers > 1 else []
    for name in which or list(versions):
        if name == "newest":
            python, where = Path(sys.executable), f"this environment, {sys.prefix}"
        else:
            env_dir = compat_env(name, versions[name])
            python, where = venv_python(env_dir), shown(env_dir)
        probe = "import transformers, torch; print(transformers.__version__, torch.__file__)"
        version, torch_file = subprocess.run(
            [str(python), "-c", probe],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        if not any(Path(torch_file).is_relative_to(d) for d in site_dirs()):
            sys.exit(f"[tasks] compat: {where} has a torch of its own ({torch_file})")
        say(f"equivalence tests under transformers {version} ({name}: {where})")
        run(python, "-m", "pytest", "-q", *parallel, *COMPAT_TESTS, *pytest_args)
    say(f"compat finished in {time.monotonic() - start:.0f} s")


def dry_report(report: Path, profile: str) -> list[str]:
    """One line per chapter from the junit report of a dry run:
    ``[dry] chapters/07-4-decoding (colab): passed in 21 s``."""
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
        lines.append(f"[dry] chapters/{stem} ({profile}): {outcome} in {seconds:.0f} s")
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
    # one torch thread per chapter: the colab and full profiles keep torch's default
    # pool, which on a CPU shared with the other worker makes small ops many times
    # slower (chapter 7's decoding: 26 s with two threads, 1.5 s with one)
    env.setdefault("TFS_THREADS", "1")
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
    """Measure the book ``tasks.py book`` built in Chromium, as a phone (390 px) and a
    laptop (1280 px) show it (tools/page_overflow.py): pages wider than the screen, blocks
    that scroll, display equations cut off, the size of the figures' text. The browser is
    the system's Chromium, driven by Playwright (the ``pages`` extra)."""
    from tools.page_overflow import CHROMIUM_NAMES

    if not any(shutil.which(name) for name in CHROMIUM_NAMES) and not any(
        arg == "--chromium" or arg.startswith("--chromium=") for arg in extra
    ):
        sys.exit(
            "[tasks] pages needs Chromium, and none is on the PATH: install it "
            "(Debian/Ubuntu: sudo apt install chromium), or name one with "
            "--chromium PATH"
        )
    ensure_installed("pages")
    run(sys.executable, "tools/page_overflow.py", *extra)


def cmd_tangle(check: bool) -> None:
    ensure_installed("test")
    run(sys.executable, "tools/tangle.py", *(["--check"] if check else []))


def cmd_notebooks(check: bool) -> None:
    ensure_installed("test")
    run(sys.executable, "tools/notebooks.py", *(["--check"] if check else []))


def notebooks() -> list[str]:
    """Convert the chapters to ipynb under _build/notebooks-lint so ruff can read their
    code (not _build/notebooks, where the tests leave the executed chapters that the
    book renders)."""
    from tools.tangle import chapter_files, write_notebook

    folder = ROOT / "_build" / "notebooks-lint"
    return [str(write_notebook(chapter, folder)) for chapter in chapter_files()]


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


def cmd_fmt(only: list[str] | None = None) -> None:
    """Format lib/, tests/ and the chapters (only those named in ``only``,
    if given, so that one author's run leaves other open chapters alone)."""
    ensure_installed("test")
    run(sys.executable, "-m", "ruff", "format", *PY_PATHS)
    from tools.tangle import CHAPTER_WIDTH, chapter_files

    chapters = only or [str(p) for p in chapter_files()]
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
        help="measure the built book in Chromium at 390 and 1280 px: pages wider than "
        "the screen, equations cut off, figure text (after `book`; extra args go to "
        "tools/page_overflow.py)",
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
        "extra",
        choices=["test", "book", "notebooks", "chapters", "pages"],
        default="test",
    )
    sub.add_parser("lint", help="ruff lint and format check")
    fmt = sub.add_parser("fmt", help="ruff format, chapters included")
    fmt.add_argument("chapters", nargs="*", help="only these chapters' cells")
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
        cmd_fmt(args.chapters)


if __name__ == "__main__":
    main()
