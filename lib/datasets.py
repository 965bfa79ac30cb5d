"""Data for the chapters: files shipped with the package, and checked downloads.

Hand-written (not tangled from a chapter).

Small data ships inside ``lib/data/`` so that every chapter runs offline, on a laptop, on
Colab and in CI. Anything larger is fetched by :func:`download`, which checks a sha256
digest and says clearly what went wrong when the network is unavailable.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "DATA_DIR",
    "Dataset",
    "TINY_SHAKESPEARE",
    "DownloadError",
    "ChecksumError",
    "sha256_file",
    "data_path",
    "load_tiny_shakespeare",
    "download",
]

DATA_DIR = Path(__file__).resolve().parent / "data"


@dataclass(frozen=True)
class Dataset:
    """A file the course uses: where it lives in the package, where it came from, its licence."""

    relpath: str
    sha256: str
    url: str
    licence: str
    attribution: str


TINY_SHAKESPEARE = Dataset(
    relpath="tinyshakespeare/input.txt",
    sha256="86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed",
    url="https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt",
    licence="public domain",
    attribution="Tiny Shakespeare, from Andrej Karpathy's char-rnn (github.com/karpathy/char-rnn).",
)


class DownloadError(RuntimeError):
    """A file could not be fetched (no network, dead link, HTTP error)."""


class ChecksumError(RuntimeError):
    """A file's sha256 digest is not the one expected."""


def sha256_file(path: str | os.PathLike) -> str:
    """The hex sha256 digest of a file, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def data_path(dataset: Dataset, *, verify: bool = True) -> Path:
    """The path of a shipped data file, checked for presence and (optionally) its digest."""
    path = DATA_DIR / dataset.relpath
    if not path.is_file():
        raise FileNotFoundError(
            f"the course's data file {dataset.relpath!r} is missing from {DATA_DIR}. "
            "Reinstall the package (pip install -e .), or fetch it with "
            f"lib.datasets.download({dataset.url!r}, <path>, sha256={dataset.sha256!r})."
        )
    if verify:
        actual = sha256_file(path)
        if actual != dataset.sha256:
            raise ChecksumError(
                f"{path} has sha256 {actual}, expected {dataset.sha256}: the file is corrupt "
                "or was edited. Restore it from the repository."
            )
    return path


def load_tiny_shakespeare() -> str:
    """Tiny Shakespeare as one string (1,115,394 characters). Public domain.

    Attribution: Tiny Shakespeare, from Andrej Karpathy's char-rnn.
    """
    return data_path(TINY_SHAKESPEARE).read_text(encoding="utf-8")


def download(
    url: str,
    dest: str | os.PathLike,
    *,
    sha256: str,
    timeout: float = 30.0,
    overwrite: bool = False,
) -> Path:
    """Download ``url`` to ``dest`` and check its sha256; return ``dest``.

    An existing ``dest`` with the right digest is reused, so calling this twice costs
    nothing. The file is written to a temporary name first and moved into place only
    after the digest matched, so an interrupted download never leaves a bad file behind.

    Raises :class:`DownloadError` (with the URL and the reason) when the network is
    unreachable, and :class:`ChecksumError` when the bytes are not the expected ones.
    """
    dest = Path(dest)
    if len(sha256) != 64 or any(c not in "0123456789abcdef" for c in sha256.lower()):
        raise ValueError(f"sha256 must be 64 hex digits, got {sha256!r}")
    if dest.is_file() and not overwrite:
        if sha256_file(dest) == sha256.lower():
            return dest
        raise ChecksumError(
            f"{dest} exists but its sha256 is not {sha256}; delete it or pass overwrite=True"
        )
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=dest.parent, prefix=dest.name, suffix=".part")
    try:
        with os.fdopen(fd, "wb") as out:
            try:
                with urllib.request.urlopen(url, timeout=timeout) as response:
                    shutil.copyfileobj(response, out)
            except urllib.error.HTTPError as err:
                raise DownloadError(
                    f"could not download {url}: HTTP {err.code} {err.reason}"
                ) from None
            except (urllib.error.URLError, TimeoutError, OSError) as err:
                reason = getattr(err, "reason", err)
                raise DownloadError(
                    f"could not download {url}: {reason}. Are you offline? The chapters run "
                    "on the data shipped in lib/data; larger data needs a network connection once."
                ) from None
        actual = sha256_file(tmp_name)
        if actual != sha256.lower():
            raise ChecksumError(
                f"downloaded {url} but its sha256 is {actual}, expected {sha256}: "
                "the file changed upstream or the download was corrupted"
            )
        os.replace(tmp_name, dest)
    finally:
        if os.path.exists(tmp_name):
            os.remove(tmp_name)
    return dest
