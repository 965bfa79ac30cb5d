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
"""

from __future__ import annotations

import contextlib
import os
import random
import subprocess
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import numpy as np
import torch

__all__ = [
    "PROFILE_ENV",
    "DEVICE_ENV",
    "Precision",
    "get_profile",
    "PROFILES",
    "is_smoke",
    "pick",
    "get_device",
    "get_precision",
    "autocast",
    "seed_everything",
    "set_plot_style",
    "git_commit",
]

PROFILE_ENV = "TFS_PROFILE"
DEVICE_ENV = "TFS_DEVICE"
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


def pick(*, smoke: T, full: T, colab: T = _UNSET, profile: str | None = None) -> T:
    """Choose a value by run profile: ``pick(smoke=64, full=1024, colab=512)``.

    Without ``colab=``, the ``colab`` profile takes the ``full`` value. ``profile``
    names the profile to choose for (to size another profile's run, say for an
    estimate); by default the active one, :func:`get_profile`.
    """
    if profile is None:
        profile = get_profile()
    elif profile not in PROFILES:
        raise ValueError(f"profile must be one of {PROFILES}, got {profile!r}")
    if profile == "smoke":
        return smoke
    if profile == "colab" and colab is not _UNSET:
        return colab
    return full


def get_device(prefer: str | None = None) -> torch.device:
    """The best available device: CUDA, then Apple's MPS, then the CPU.

    ``prefer`` (or the environment variable ``TFS_DEVICE``) forces one, with a clear
    error if it is not available on this machine.
    """
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

    @property
    def name(self) -> str:
        return {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}[
            self.dtype
        ]


def get_precision(device: torch.device | str | None = None) -> Precision:
    """The fastest safe precision on ``device``.

    * CUDA with bf16 support (Ampere and newer): bf16, no scaler.
    * Older CUDA GPUs (Colab's T4, V100): fp16 with a gradient scaler. Asking a T4 for
      bf16 "works" through slow emulation or fails, a frequent complaint about courses
      that hard-code it.
    * CPU and MPS: fp32, the accurate and predictable choice for small runs.
    """
    device = torch.device(device) if device is not None else get_device()
    if device.type == "cuda":
        if torch.cuda.is_bf16_supported(including_emulation=False):
            return Precision(torch.bfloat16, use_grad_scaler=False)
        return Precision(torch.float16, use_grad_scaler=True)
    return Precision(torch.float32, use_grad_scaler=False)


def autocast(device: torch.device | str, precision: Precision):
    """A context manager for mixed precision; a no-op for fp32."""
    device = torch.device(device)
    if precision.dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=precision.dtype)


def seed_everything(seed: int = 0, *, deterministic: bool = False) -> torch.Generator:
    """Seed Python, NumPy and PyTorch (all devices) and return a seeded CPU generator.

    With ``deterministic=True``, also ask PyTorch for deterministic kernels (slower;
    some operations then raise instead of running nondeterministically).
    """
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    if deterministic:
        torch.use_deterministic_algorithms(True)
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    return torch.Generator().manual_seed(seed)


def set_plot_style() -> None:
    """One plotting style for the whole book: readable in HTML, light and dark themes."""
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
            "legend.fontsize": 9,
            "legend.frameon": False,
            "figure.facecolor": "white",
            "image.cmap": "viridis",
        }
    )


def git_commit() -> str:
    """The commit of the course's checkout, for recorded results.

    The full hash, with ``-dirty`` appended when the working tree has uncommitted changes;
    ``"unknown"`` outside a git checkout (an installed ``lib``) or without git.
    """
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
