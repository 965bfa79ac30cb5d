"""Shared helpers for every chapter: run profile, device, precision, seeding, plotting style.

Hand-written (not tangled from a chapter): these are the course's plumbing, not its subject.

The run profile
---------------
Every notebook runs in one of three profiles:

* ``smoke``: small sizes that run on a laptop CPU in well under a minute per chapter.
  This is what the tests and the book build use.
* ``colab``: sized for Colab's free GPU, a T4 (16 GB, fp16 but no bf16, about 65 TFLOP/s
  at best): each chapter finishes in about ten minutes there. Chosen on any CUDA GPU
  older than Ampere (compute capability below 8.0).
* ``full``: the real configuration, meant for an Ampere-or-newer GPU (A100, L4, H100).

The default follows the hardware: ``smoke`` without CUDA, ``colab`` on a pre-Ampere GPU,
``full`` on a newer one. The environment variable ``TFS_PROFILE`` forces any of the three.
Notebooks read their sizes through :func:`pick`, so one line shows every value; ``colab``
defaults to the ``full`` value where the full size already fits a T4::

    n_steps = pick(smoke=50, full=5_000, colab=1_500)

The precision
-------------
:func:`get_precision` picks the autocast dtype from the hardware: bf16 on an Ampere or
newer GPU, fp16 with gradient scaling on an older one (the T4), fp32 on a CPU. The
environment variable ``TFS_PRECISION`` (``auto``, the default, ``bf16``, ``fp16`` or
``fp32``) forces a GPU's choice: ``TFS_PRECISION=fp16 TFS_PROFILE=colab`` on an H100 runs
what a Colab reader's T4 runs. A CPU keeps fp32 whatever it says, as it does on Colab.

Recorded results
----------------
Every recorded run (``book/results/<name>/``) is written by :func:`write_record` and read
by :func:`read_record`: one ``metrics.json`` of one schema (:data:`RECORD_KEYS`), one CSV
per curve and a ``curves.png``. Its command names no path of the machine that ran it
(:func:`relative_command`).
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import json
import math
import os
import platform
import random
import re
import shlex
import subprocess
import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import Any, Literal, TypeVar

import numpy as np
import torch

from lib import _checks as check

__all__ = [
    "PROFILE_ENV",
    "DEVICE_ENV",
    "Precision",
    "get_profile",
    "PROFILES",
    "is_smoke",
    "DRY_ENV",
    "is_dry",
    "pick",
    "assert_trained",
    "get_device",
    "PRECISION_ENV",
    "PRECISION_SETTINGS",
    "precision_setting",
    "get_precision",
    "autocast",
    "seed_everything",
    "THREADS_ENV",
    "set_threads",
    "set_plot_style",
    "import_transformers",
    "git_commit",
    "PROJECT_ROOT",
    "looks_absolute",
    "relative_command",
    "RECORD_SCHEMA",
    "RECORD_KEYS",
    "RecordError",
    "write_record",
    "read_record",
]

PROFILE_ENV = "TFS_PROFILE"
PRECISION_ENV = "TFS_PRECISION"
DRY_ENV = "TFS_DRY"
DEVICE_ENV = "TFS_DEVICE"
RESULTS_ENV = "TFS_RESULTS"
COMMIT_ENV = "TFS_COMMIT"
Profile = Literal["smoke", "colab", "full"]
PROFILES: tuple[Profile, ...] = ("smoke", "colab", "full")
T = TypeVar("T")
_UNSET: Any = object()


def get_profile() -> Profile:
    """Return the active run profile: ``"smoke"``, ``"colab"`` or ``"full"``.

    ``TFS_PROFILE`` wins when set. Otherwise ``smoke`` without CUDA, ``colab`` on a GPU
    older than Ampere (Colab's T4, a V100: compute capability below 8.0, no bf16), and
    ``full`` on an Ampere or newer GPU.
    """
    forced = os.environ.get(PROFILE_ENV, "").strip().lower()
    if forced:
        if forced not in PROFILES:
            raise ValueError(
                f"{PROFILE_ENV}={os.environ[PROFILE_ENV]!r} is not a profile; use "
                "'smoke' (small, CPU), 'colab' (Colab's T4 GPU) or 'full' (real sizes, "
                "a recent GPU)."
            )
        return forced  # type: ignore[return-value]
    if not torch.cuda.is_available():
        return "smoke"
    major, _ = torch.cuda.get_device_capability()
    return "full" if major >= 8 else "colab"


def is_smoke() -> bool:
    """True in the small CPU profile."""
    return get_profile() == "smoke"


def is_dry() -> bool:
    """True in a dry run (``TFS_DRY=1``): a profile's shapes on any machine, loops cut.

    A dry run executes a chapter with the sizes, lengths, tokenizers and data paths that
    its profile chooses (``TFS_PROFILE=colab TFS_DRY=1`` runs what a Colab reader runs),
    but every loop count given to :func:`pick` as ``dry=`` takes that value instead (one
    or two steps), so the colab and full profiles execute on a CPU in CI before a reader
    runs them. Claims that need the full training are reported, not asserted
    (:func:`assert_trained`).
    """
    value = os.environ.get(DRY_ENV, "").strip().lower()
    if value in ("", "0", "false", "no"):
        return False
    if value in ("1", "true", "yes"):
        return True
    raise ValueError(f"{DRY_ENV}={os.environ[DRY_ENV]!r}: use 1 (a dry run) or 0")


def pick(
    *,
    smoke: T,
    full: T,
    colab: T = _UNSET,
    dry: T = _UNSET,
    profile: str | None = None,
) -> T:
    """Choose a value by run profile: ``pick(smoke=64, full=1024, colab=512)``.

    Without ``colab=``, the ``colab`` profile takes the ``full`` value. ``dry=`` marks
    a loop count (steps, repetitions, a sweep): a dry run (:func:`is_dry`) takes it in
    place of the profile's value; sizes and shapes have no ``dry=`` and keep their
    profile's value in a dry run too. ``profile`` names the profile to choose for (to
    size another profile's run, say for an estimate); by default the active one,
    :func:`get_profile`, and then a dry run's ``dry=`` applies.
    """
    if profile is None:
        profile = get_profile()
        if dry is not _UNSET and is_dry():
            return dry
    elif profile not in PROFILES:
        raise ValueError(f"profile must be one of {PROFILES}, got {profile!r}")
    if profile == "smoke":
        return smoke
    if profile == "colab" and colab is not _UNSET:
        return colab
    return full


def assert_trained(condition: bool, claim: str) -> None:
    """Assert a claim that holds only after the profile's whole training run.

    In a dry run the loops were cut to a step or two, so the claim is printed as not
    checked instead of asserted; in every real run it is asserted, with ``claim`` as the
    message when it fails.
    """
    owner = "assert_trained"
    check.string("claim", claim, nonempty=True, owner=owner)
    # a tensor or an array of several values has no one truth value
    values = condition.numel() if torch.is_tensor(condition) else np.size(condition)
    if condition is None or isinstance(condition, str) or values != 1:
        got = f"{type(condition).__name__} {str(condition)[:60]!r}"
        got += f" of {values} values: reduce it with .all() or .any()" * (values != 1)
        raise TypeError(
            f"{owner}: condition must be one truth value (a bool, or a tensor or array "
            f"of one value), got {got}"
        )
    if is_dry():
        print(f"[dry run] not checked (training was cut short): {claim}")
        return
    if not condition:
        raise AssertionError(claim)


def _device_name(name: str, value: Any, owner: str) -> str:
    """``value`` (a device name such as ``"cuda:0"``, or a ``torch.device``) as its name;
    anything else refused, naming ``name`` and what it takes."""
    takes = "a device such as 'cpu', 'cuda', 'cuda:0' or 'mps', or a torch.device"
    if isinstance(value, torch.device):
        return str(value)
    if not isinstance(value, str):
        raise TypeError(f"{owner}: {name} must be {takes}, got {type(value).__name__}")
    device = value.strip().lower()
    try:
        torch.device(device)
    except RuntimeError:
        raise ValueError(
            f"{owner}: unknown device {value!r}; {name} must be {takes}"
        ) from None
    return device


def get_device(prefer: str | torch.device | None = None) -> torch.device:
    """The best available device: CUDA, then Apple's MPS, then the CPU.

    ``prefer`` (a name such as ``"cuda:1"``, or a ``torch.device``; or the environment
    variable ``TFS_DEVICE``) forces one, with a clear error if it is not available on
    this machine.
    """
    if prefer is not None:
        prefer = _device_name("prefer", prefer, "get_device")
    wanted = (prefer or os.environ.get(DEVICE_ENV, "")).strip().lower()
    if wanted:
        kind = wanted.split(":")[0]
        if kind == "cuda" and not torch.cuda.is_available():
            raise RuntimeError(
                f"device {wanted!r} was asked for, but CUDA is not available here"
            )
        if kind == "mps" and not _mps_available():
            raise RuntimeError(
                f"device {wanted!r} was asked for, but MPS is not available here"
            )
        if kind not in ("cuda", "mps", "cpu"):
            raise ValueError(f"unknown device {wanted!r}; use 'cuda', 'mps' or 'cpu'")
        return torch.device(wanted)
    if torch.cuda.is_available():
        return torch.device("cuda")
    if _mps_available():
        return torch.device("mps")
    return torch.device("cpu")


def _mps_available() -> bool:
    backend = getattr(torch.backends, "mps", None)
    return bool(backend is not None and backend.is_available())


@dataclass(frozen=True)
class Precision:
    """How to run the forward pass: the autocast dtype and whether gradients need scaling.

    ``dtype`` is the dtype of autocast regions (``torch.float32`` means no autocast).
    fp16 has a narrow exponent range, so small gradients underflow unless the loss is
    scaled first; bf16 has fp32's range and needs no scaling.
    """

    dtype: torch.dtype
    use_grad_scaler: bool

    def __post_init__(self) -> None:
        dtypes = (torch.bfloat16, torch.float16, torch.float32)
        check.one_of("dtype", self.dtype, dtypes, owner="Precision")
        check.boolean("use_grad_scaler", self.use_grad_scaler, owner="Precision")

    @property
    def name(self) -> str:
        return {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}[
            self.dtype
        ]


# "auto" follows the hardware (get_precision); the others force a GPU's precision
PRECISION_SETTINGS = ("auto", "bf16", "fp16", "fp32")


def precision_setting() -> str:
    """The precision that ``TFS_PRECISION`` asks for: ``"auto"`` (the default, when it is
    unset or empty), ``"bf16"``, ``"fp16"`` or ``"fp32"``; anything else is an error."""
    forced = os.environ.get(PRECISION_ENV, "").strip().lower()
    if not forced:
        return "auto"
    if forced not in PRECISION_SETTINGS:
        raise ValueError(
            f"{PRECISION_ENV}={os.environ[PRECISION_ENV]!r} is not a precision; use "
            "'auto' (the hardware's choice), 'bf16', 'fp16' (with gradient scaling) or "
            "'fp32'."
        )
    return forced


def _gpu_name(device: torch.device) -> str:
    """The GPU's name for an error message, without failing where it cannot be read."""
    try:
        return torch.cuda.get_device_name(device)
    except (AssertionError, RuntimeError):  # no CUDA build, no driver
        return f"this GPU ({device})"


def get_precision(device: torch.device | str | None = None) -> Precision:
    """The fastest safe precision on ``device``.

    * CUDA with bf16 support (Ampere and newer): bf16, no scaler.
    * Older CUDA GPUs (Colab's T4, V100): fp16 with a gradient scaler. Asking a T4 for
      bf16 "works" through slow emulation or fails, a frequent complaint about courses
      that hard-code it.
    * CPU and MPS: fp32, the accurate and predictable choice for small runs.

    ``TFS_PRECISION`` (:func:`precision_setting`) forces a CUDA GPU's choice:

    * ``fp16``: fp16 with a gradient scaler even where bf16 exists, so that a reader on
      an H100 runs what a T4 must run (``TFS_PROFILE=colab TFS_PRECISION=fp16``);
    * ``bf16``: bf16, and a ``RuntimeError`` naming the GPU where it has no bf16;
    * ``fp32``: no autocast;
    * ``auto`` (the default): the hardware's choice above.

    On a CPU or MPS it changes nothing: fp32, with a warning when it asks for fp16 or
    bf16. A Colab reader's CPU work runs in fp32 too, and fp16 autocast on a CPU is
    slow and not what the chapters run there; falling back (rather than failing) lets a
    page that forces fp16 for its GPU also run its CPU parts. An unknown value is a
    ``ValueError`` on any device.
    """
    forced = precision_setting()  # checked first, so a bad value fails on a CPU too
    if device is None:
        device = get_device()
    device = torch.device(_device_name("device", device, "get_precision"))
    if device.type != "cuda":
        if forced in ("bf16", "fp16"):
            warnings.warn(
                f"{PRECISION_ENV}={forced} applies to CUDA GPUs only: on {device.type} "
                "get_precision keeps fp32 (as a Colab reader's CPU does)",
                stacklevel=2,
            )
        return PRECISIONS["fp32"]
    has_bf16 = torch.cuda.is_bf16_supported(including_emulation=False)
    if forced == "bf16" and not has_bf16:
        raise RuntimeError(
            f"{PRECISION_ENV}=bf16, but {_gpu_name(device)} has no bfloat16 support "
            "(it needs compute capability 8.0, Ampere, or newer); use "
            f"{PRECISION_ENV}=fp16 (float16 with gradient scaling) or auto"
        )
    if forced == "fp32":
        return PRECISIONS["fp32"]
    if forced == "fp16" or not has_bf16:
        return PRECISIONS["fp16"]
    return PRECISIONS["bf16"]


PRECISIONS = {
    "bf16": Precision(torch.bfloat16, use_grad_scaler=False),
    "fp16": Precision(torch.float16, use_grad_scaler=True),
    "fp32": Precision(torch.float32, use_grad_scaler=False),
}


def autocast(device: torch.device | str, precision: Precision | str):
    """A context manager for mixed precision; a no-op for fp32. ``precision`` is a
    :class:`Precision` (:func:`get_precision` picks one) or its name: ``"bf16"``,
    ``"fp16"`` or ``"fp32"``."""
    device = torch.device(_device_name("device", device, "autocast"))
    if isinstance(precision, str) and precision in PRECISIONS:
        precision = PRECISIONS[precision]
    if not isinstance(precision, Precision):
        raise TypeError(
            "autocast: precision must be a lib.utils.Precision (get_precision(device)) "
            f"or one of {', '.join(map(repr, PRECISIONS))}, got {precision!r}"
        )
    if precision.dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=precision.dtype)


THREADS_ENV = "TFS_THREADS"


def set_threads(n: int | None = None) -> int:
    """The chapters' one rule for PyTorch's CPU threads; returns the count set.

    ``n``, else ``TFS_THREADS``, else one thread in the smoke profile and PyTorch's
    default otherwise. The smoke profile's tensors are small: one thread computes them
    as fast as a pool, whose synchronisation costs more than the arithmetic, and stays
    fast when the machine's cores are shared (a pool of threads on two busy cores slowed
    chapters 7 and 10 down 7-16 times). Every chapter's setup cell calls it.
    """
    if n is None and os.environ.get(THREADS_ENV, "").strip():
        try:
            n = int(os.environ[THREADS_ENV])
        except ValueError:
            raise ValueError(
                f"{THREADS_ENV}={os.environ[THREADS_ENV]!r} is not a number of threads"
            ) from None
    if n is None:
        n = pick(smoke=1, full=0)  # 0: leave PyTorch's default
    hint = "0 leaves PyTorch's default"
    n = check.int_at_least("threads", n, 0, owner="set_threads", hint=hint)
    if n:
        torch.set_num_threads(n)
    return torch.get_num_threads()


def seed_everything(seed: int = 0, *, deterministic: bool = False) -> torch.Generator:
    """Seed Python, NumPy and PyTorch (all devices) and return a seeded CPU generator.

    With ``deterministic=True``, also ask PyTorch for deterministic kernels (slower;
    some operations then raise instead of running nondeterministically).
    """
    seed = check.integer("seed", seed, owner="seed_everything")  # NumPy's too
    check.boolean("deterministic", deterministic, owner="seed_everything")
    if not 0 <= seed < 2**64:  # the range torch.manual_seed takes
        raise ValueError(f"seed must be an int in 0..2**64 - 1, got {seed}")
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    if deterministic:
        torch.use_deterministic_algorithms(True)
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    return torch.Generator().manual_seed(seed)


def import_transformers() -> Any:
    """Hugging Face ``transformers``, imported (once) without tqdm's warning that the
    notebook lacks ipywidgets: the pages that compare with ``transformers`` call it in their
    hidden setup cell, since the warning names the path of the file that imported tqdm, a
    path of the machine that builds the book (the progress bars work without widgets)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="IProgress not found")
        import transformers
    return transformers


def set_plot_style() -> None:
    """One plotting style for the whole book: readable in HTML, light and dark themes.

    No label is under 10 pt: drawn at 110 dpi, that is 15 px in the image. A phone
    shows a figure at no less than 3/5 of its own width (``book/_static/custom.css``), so
    a label is at least 9 px there unless a figure sets a smaller size itself;
    ``tools/page_overflow.py`` measures it.
    """
    import matplotlib as mpl

    mpl.rcParams.update(
        {
            "figure.figsize": (6.4, 3.6),
            "figure.dpi": 110,
            "savefig.dpi": 150,
            "axes.grid": True,
            "grid.alpha": 0.3,
            "axes.spines.top": False,
            "axes.spines.right": False,
            "axes.titlesize": 11,
            "axes.labelsize": 10,
            "xtick.labelsize": 10,
            "ytick.labelsize": 10,
            "legend.fontsize": 10,
            "legend.frameon": False,
            "figure.facecolor": "white",
            "image.cmap": "viridis",
        }
    )


def git_commit() -> str:
    """The commit of the course's checkout, for recorded results.

    The full hash, with ``-dirty`` appended when the working tree has uncommitted changes.
    ``TFS_COMMIT``, when set, comes first: whoever copied a committed tree to another
    machine (a rented GPU) names its commit, after checking the copy, since the copy
    may have no history or, as seen on one such machine, a stale ``.git`` of an older
    commit under which the copied files read as uncommitted changes. Outside a git
    checkout (an installed ``lib``) or without git, and with no ``TFS_COMMIT``:
    ``"unknown"``.
    """
    named = os.environ.get(COMMIT_ENV, "").strip()
    if named:
        return named
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

    def git(*args: str) -> str:
        done = subprocess.run(
            ["git", *args],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        )
        return done.stdout.strip()

    try:
        commit, changes = git("rev-parse", "HEAD"), git("status", "--porcelain")
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return commit + ("-dirty" if changes else "")


#: The course's checkout: the paths of a recorded command are written relative to it.
PROJECT_ROOT = Path(__file__).resolve().parent.parent

# a path that names a place on one machine: from its root (a lone "/" is a
# division), its home or a drive
_ABSOLUTE = re.compile(r"/(?!\s|$)|~|[A-Za-z]:[\\/]")
_PYTHON = re.compile(r"python[0-9.]*(\.exe)?")
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")


def _path(name: str, value: Any, owner: str) -> Path:
    """``value`` (a ``str`` or ``os.PathLike``) as a ``Path``; anything else refused."""
    if not isinstance(value, str | os.PathLike):
        got = type(value).__name__
        raise TypeError(f"{owner}: {name} must be a path (a str or Path), got {got}")
    return Path(value)


def looks_absolute(text: str | os.PathLike) -> bool:
    """Whether ``text`` (a str, or a path) reads as an absolute path on some machine: it
    starts with ``/`` (and is more than ``/``), ``~`` or a drive letter (``C:\\``,
    ``C:/``)."""
    text = os.fspath(_path("text", text, "looks_absolute"))
    return _ABSOLUTE.match(text) is not None


def relative_command(command: str, root: str | os.PathLike = PROJECT_ROOT) -> str:
    """``command`` with no path of this machine in it, as records and manifests state it.

    Each word that is an absolute path (:func:`looks_absolute`; also the value of
    ``--option=/...`` or ``NAME=/...``) is rewritten:

    * the program (the first word after any ``NAME=value``) becomes its name, as it is
      found on the PATH, and any Python interpreter ``python``
      (``/opt/venv/bin/python3.11 -m lib.runs`` -> ``python -m lib.runs``);
    * a path inside ``root`` (the project) becomes relative to it
      (``/home/me/course/book/results/x`` -> ``book/results/x``);
    * any other path, which says nothing on another machine, is replaced by a
      placeholder in capitals, as in a usage line: the option's name
      (``--checkpoint-dir /scratch/run`` -> ``--checkpoint-dir CHECKPOINT_DIR``), else
      ``PATH``. Run from the project, the command still works: that folder is made in it.

    A command with nothing to rewrite is returned as it is.
    """
    owner = "relative_command"
    check.string("command", command, owner=owner, hint="a shell command line")
    try:
        words = shlex.split(command)
    except ValueError as err:
        raise ValueError(
            f"command must be a shell command line ({err}): {command!r}"
        ) from None
    root = _path("root", root, owner).resolve()
    program = next((i for i, w in enumerate(words) if not _ASSIGNMENT.match(w)), None)

    def rewritten(path: str, i: int, option: str) -> str:
        if i == program:
            name = re.split(r"[\\/]", path.rstrip("\\/"))[-1]
            return "python" if _PYTHON.fullmatch(name) else name
        where = Path(os.path.expanduser(path))
        if where.is_absolute() and where.resolve().is_relative_to(root):
            return where.resolve().relative_to(root).as_posix()
        return option.lstrip("-").replace("-", "_").upper() or "PATH"

    new = []
    for i, word in enumerate(words):
        before = words[i - 1] if i else ""
        option = before if before.startswith("-") and "=" not in before else ""
        if looks_absolute(word):
            word = rewritten(word, i, option)
        elif re.match(r"(-[^=]+|[A-Za-z_][A-Za-z0-9_]*)=", word):
            name, value = word.split("=", 1)
            if looks_absolute(value):
                word = f"{name}={rewritten(value, -1, name)}"
        new.append(word)
    return command if new == words else shlex.join(new)


# --- recorded results -----------------------------------------------------------------


def results_dir() -> Path:
    """The folder of recorded runs a chapter writes into and shows: ``TFS_RESULTS`` when
    set (``scripts/gpu_records.py --out`` sets it), else this checkout's ``book/results``
    (which an installed ``lib`` may lack: check ``is_dir()`` before reading)."""
    chosen = os.environ.get(RESULTS_ENV, "").strip()
    if chosen:
        return Path(chosen).expanduser()
    return Path(__file__).resolve().parent.parent / "book" / "results"


RECORD_SCHEMA = 1
#: The top-level keys of every ``metrics.json``, in the order they are written.
RECORD_KEYS = (
    "schema",
    "name",
    "command",
    "wall_seconds",
    "date",
    "commit",
    "device",
    "gpu",
    "torch",
    "triton",
    "python",
    "profile",
    "config",
    "metrics",
    "curves",
    "samples",
    "extra",
)
_FILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


class RecordError(ValueError):
    """A record that cannot be written (a value JSON cannot hold) or read (bad schema)."""


def _plain(value: Any, where: str) -> Any:
    """``value`` as plain JSON data: NumPy and 0-d torch scalars become numbers, tensors
    and arrays lists, tuples lists, paths and dtypes strings, dataclasses dicts.
    Non-finite floats, keys that are not strings and other objects are refused, naming
    ``where`` they are."""
    if isinstance(value, torch.Tensor | np.ndarray | np.generic):
        value = value.tolist()
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    elif isinstance(value, PurePath | torch.dtype | torch.device):
        value = str(value)
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise RecordError(f"{where} is {value}: a record holds finite numbers only")
        return value
    if isinstance(value, Mapping):
        bad = [k for k in value if not isinstance(k, str)]
        if bad:
            raise RecordError(f"{where} has keys that are not strings: {bad[:3]!r}")
        return {k: _plain(v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v, f"{where}[{i}]") for i, v in enumerate(value)]
    raise RecordError(
        f"{where} is a {type(value).__name__} ({value!r:.60}), which a JSON record "
        "cannot hold: give numbers, strings, lists or dicts"
    )


def _check_curves(curves: Any, where: str) -> None:
    if not isinstance(curves, dict):
        raise RecordError(f"{where} must be a dict {{curve: {{column: [values]}}}}")
    for name, columns in curves.items():
        if not _FILE_NAME.fullmatch(name):
            raise RecordError(f"{where}: curve name {name!r} must be a plain file name")
        if not isinstance(columns, dict) or not columns:
            raise RecordError(f"{where}.{name} must be a non-empty dict of columns")
        lengths = {}
        for column, values in columns.items():
            if not isinstance(values, list):
                raise RecordError(f"{where}.{name}.{column} must be a list of values")
            lengths[column] = len(values)
        if len(set(lengths.values())) > 1:
            raise RecordError(f"{where}.{name}: columns of unequal lengths {lengths}")


def _plot_curves(curves: Mapping[str, Mapping[str, list]], path: Path) -> None:
    """``loss`` (else every column) against ``step`` (else the first column), one line
    per curve. Uses matplotlib's Figure directly: no pyplot, no change of backend."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.4, 3.6))
    ax = fig.subplots()
    for name, columns in curves.items():
        x_name = "step" if "step" in columns else next(iter(columns))
        ys = ["loss"] if "loss" in columns else [c for c in columns if c != x_name]
        for y in ys:
            style = "o-" if len(columns[x_name]) < 30 else "-"
            ax.plot(columns[x_name], columns[y], style, lw=1, label=f"{name} {y}")
    ax.set(xlabel="step")
    ax.legend()
    fig.savefig(path, dpi=150, bbox_inches="tight")


def write_record(
    out_dir: str | os.PathLike,
    *,
    name: str,
    command: str,
    wall_seconds: float,
    metrics: Mapping[str, Any],
    curves: Mapping[str, Mapping[str, Any]] | None = None,
    config: Any = None,
    samples: Any = None,
    extra: Mapping[str, Any] | None = None,
    device: torch.device | str | None = None,
    commit: str | None = None,
    profile: str | None = None,
) -> Path:
    """Write ``out_dir/metrics.json`` (keys :data:`RECORD_KEYS`, ``schema`` 1) and, when
    there are ``curves`` ``{curve: {column: [values]}}``, one ``<curve>.csv`` each and
    ``curves.png``. Returns the path of ``metrics.json``.

    The environment (date, commit, device, GPU, torch, Triton, Python, profile) is filled
    in; ``profile`` defaults to this process's (:func:`get_profile`), and a record of runs
    made in another profile (re-measured, or run by a subprocess) names theirs;
    ``commit`` defaults to :func:`git_commit` now (a process that writes several
    records reads it once, before it writes the first). ``command`` is written by
    :func:`relative_command`: no path of this machine. Values are made plain JSON (NumPy
    and torch numbers, tensors, tuples, paths); NaN, infinities and other objects are
    refused with a :class:`RecordError` naming the key, before anything is written.
    """
    out = _path("out_dir", out_dir, "write_record")
    if not isinstance(name, str) or not name:
        raise RecordError(f"name must be a non-empty string, got {name!r}")
    if not isinstance(command, str) or not command.strip():
        raise RecordError(
            f"command must be the command line as a string, got {command!r}"
        )
    if not isinstance(metrics, Mapping):
        raise RecordError(f"metrics must be a dict, got {type(metrics).__name__}")
    if profile is not None and profile not in PROFILES:
        raise RecordError(f"profile must be one of {PROFILES}, got {profile!r}")
    for key, value in (("curves", curves), ("extra", extra)):
        if not (value is None or isinstance(value, Mapping)):
            got = type(value).__name__
            raise RecordError(f"{key} must be a dict (or None), got {got}")
    if device is None:
        device = get_device()
    device = torch.device(_device_name("device", device, "write_record"))
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    on_gpu = device.type == "cuda" and torch.cuda.is_available()
    record = {
        "schema": RECORD_SCHEMA,
        "name": name,
        "command": relative_command(command),
        "wall_seconds": wall_seconds,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "commit": git_commit() if commit is None else commit,
        "device": str(device),
        "gpu": torch.cuda.get_device_name(device) if on_gpu else None,
        "torch": torch.__version__,
        "triton": triton_version,
        "python": platform.python_version(),
        "profile": get_profile() if profile is None else profile,
        "config": config,
        "metrics": metrics,
        "curves": curves or {},
        "samples": samples,
        "extra": extra or {},
    }
    record = {key: _plain(value, key) for key, value in record.items()}
    _validate_record(record, "the record")
    out.mkdir(parents=True, exist_ok=True)
    path = out / "metrics.json"
    path.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    for curve, columns in record["curves"].items():
        with open(out / f"{curve}.csv", "w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f)
            writer.writerow(list(columns))
            writer.writerows(zip(*columns.values()))
    if record["curves"]:
        _plot_curves(record["curves"], out / "curves.png")
    return path


def _validate_record(record: Any, where: str) -> None:
    if not isinstance(record, dict):
        raise RecordError(f"{where} is not a JSON object")
    if record.get("schema") != RECORD_SCHEMA:
        got = record.get("schema", "no 'schema' key")
        raise RecordError(f"{where} has schema {got!r}; this lib reads schema 1")
    if set(record) != set(RECORD_KEYS):
        missing = [k for k in RECORD_KEYS if k not in record]
        unknown = [k for k in record if k not in RECORD_KEYS]
        raise RecordError(f"{where}: missing keys {missing}, unknown keys {unknown}")
    types = {
        "name": str,
        "command": str,
        "date": str,
        "commit": str,
        "device": str,
        "torch": str,
        "python": str,
        "profile": str,
        "metrics": dict,
        "extra": dict,
        "gpu": str | None,
        "triton": str | None,
        "wall_seconds": int | float,
    }
    for key, expected in types.items():
        value = record[key]
        if not isinstance(value, expected) or isinstance(value, bool):
            raise RecordError(
                f"{where}: {key} must be {expected}, got {type(value).__name__}"
            )
    if not record["wall_seconds"] >= 0:
        raise RecordError(
            f"{where}: wall_seconds must be >= 0, got {record['wall_seconds']}"
        )
    _check_curves(record["curves"], f"{where}: curves")


def read_record(path: str | os.PathLike) -> dict[str, Any]:
    """The record at ``path`` (a ``metrics.json``, or its folder), checked against the
    schema of :func:`write_record`; a :class:`RecordError` says what does not fit."""
    path = _path("path", path, "read_record")
    if path.is_dir():
        path = path / "metrics.json"
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RecordError(f"no record at {path}") from None
    except json.JSONDecodeError as err:
        raise RecordError(f"{path} is not valid JSON: {err}") from None
    _validate_record(record, str(path))
    return record
