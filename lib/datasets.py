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


def _path(name: str, value: object, owner: str) -> Path:
    """``value`` (a ``str`` or ``os.PathLike``) as a ``Path``; anything else refused."""
    if not isinstance(value, str | os.PathLike):
        raise TypeError(
            f"{owner}: {name} must be a path (a str or pathlib.Path), "
            f"got {type(value).__name__}"
        )
    return Path(value)


def sha256_file(path: str | os.PathLike) -> str:
    """The hex sha256 digest of a file, read in 1 MiB blocks."""
    path = _path("path", path, "sha256_file")
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def data_path(dataset: Dataset, *, verify: bool = True) -> Path:
    """The path of a shipped data file, checked for presence and (optionally) its digest."""
    if not isinstance(dataset, Dataset):
        raise TypeError(
            "data_path: dataset must be a lib.datasets.Dataset, such as "
            "TINY_SHAKESPEARE or GUTENBERG_BOOKS['austen-emma'], "
            f"got {type(dataset).__name__} {dataset!r:.60}"
        )
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
    if not isinstance(url, str):
        raise TypeError(
            f"download: url must be a str (an http:// or https:// address), got "
            f"{type(url).__name__}{' (are url and dest swapped?)' * isinstance(url, Path)}"
        )
    if not url.startswith(("http://", "https://", "file://")):
        raise ValueError(
            f"download: url must start with http://, https:// or file://, got {url!r}"
        )
    dest = _path("dest", dest, "download")
    if not isinstance(sha256, str):
        raise TypeError(f"download: sha256 must be a str, got {type(sha256).__name__}")
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


# --- Chapter 8 (training): the Gutenberg books and the Tatoeba sentence pairs ---------------

__all__ += [
    "GUTENBERG_BOOKS",
    "TATOEBA_ENG_FRA",
    "TATOEBA_FRA_ENG_ALL",
    "load_gutenberg",
    "load_tatoeba_pairs",
]

_GUTENBERG_LICENCE = "public domain"
_GUTENBERG_ATTRIBUTION = (
    "Texts from Project Gutenberg (https://www.gutenberg.org), as selected in the NLTK "
    "Gutenberg corpus."
)
_GUTENBERG_URL = (  # the NLTK repository's copy, at the commit the files were taken from
    "https://raw.githubusercontent.com/nltk/nltk/4dc39fbf6965509f7b74316eff239bd110a03b49/"
    "nltk_data/corpora/gutenberg/{name}.txt"
)

GUTENBERG_BOOKS: dict[str, Dataset] = {
    name: Dataset(
        relpath=f"gutenberg/{name}.txt",
        sha256=digest,
        url=_GUTENBERG_URL.format(name=name),
        licence=_GUTENBERG_LICENCE,
        attribution=_GUTENBERG_ATTRIBUTION,
    )
    for name, digest in {
        "austen-emma": "71b0923d75fcf2f1faa897b22da8de8e2476d7478a2b22388eb58a3420e00215",
        "austen-persuasion": "cec097657cbfeb62aafe178973f514fa07ab66a5e28ea025ebd5d51ca870e40f",
        "austen-sense": "57b169c7cfa502896dee25bd66616f61cc1d21084caf31f015176ee46fda9718",
        "chesterton-brown": "67027976205b4b30e367c704807f56c8ffac3e8ea6037d993e57ab1fe28447ec",
        "chesterton-thursday": "8b431a2a8db84089cd6f83fa66610c3b12c04114609df6e90137c0c58f2c5493",
        "melville-moby_dick": "dc2466ee3c2e6e2ea1f86233d142e4b5578fdc1d6f0ca657bee7572202a980c7",
    }.items()
}

TATOEBA_ENG_FRA = Dataset(
    relpath="tatoeba/eng-fra.txt",
    sha256="d952b56a181da5270b7bb4ded3f3bbe61e67a9b1de0e0fbc1d46438c71fb55a7",
    url="https://www.manythings.org/anki/fra-eng.zip",
    licence="CC BY 2.0 FR (https://creativecommons.org/licenses/by/2.0/fr/)",
    attribution=(
        "Sentence pairs from the Tatoeba Project (https://tatoeba.org), via "
        "www.manythings.org/anki; licensed CC BY 2.0 FR. The third column of each line "
        "credits the sentences' authors."
    ),
)

TATOEBA_FRA_ENG_ALL = Dataset(
    relpath="tatoeba/fra-eng.zip",
    sha256="16c4f7d0df9e7c5e6c54cdb0447f3f4a18a55052ff5e2e0b27dd4a06c0e49d04",
    # manythings.org's own file has grown since (three columns); this is its
    # 2017-09-29 version, as kept in genimind/seq2seq
    url="https://github.com/genimind/seq2seq/raw/4f3f8eb/fra-eng.zip",
    licence="CC BY 2.0 FR (https://creativecommons.org/licenses/by/2.0/fr/)",
    attribution=(
        "Sentence pairs from the Tatoeba Project (https://tatoeba.org), via "
        "www.manythings.org/anki (its file of 2017-09-29); licensed CC BY 2.0 FR. Each "
        "sentence's author is credited on tatoeba.org."
    ),
)


def load_gutenberg(names: list[str] | tuple[str, ...] | None = None) -> dict[str, str]:
    """Six public-domain books from Project Gutenberg: ``{name: text}``, in a fixed order.

    ``names`` picks some of ``GUTENBERG_BOOKS`` (all by default). Line endings are
    normalised to ``"\\n"`` (Moby Dick ships with CRLF); the first line names the book.
    Attribution: texts from Project Gutenberg, as selected in the NLTK Gutenberg corpus.
    """
    if isinstance(names, str) or not isinstance(names, list | tuple | type(None)):
        hint = f"; for one book write [{names!r}]" if isinstance(names, str) else ""
        raise TypeError(
            "load_gutenberg: names must be a list of book names (or None for all), "
            f"got {type(names).__name__}{hint}"
        )
    chosen = list(GUTENBERG_BOOKS) if names is None else list(names)
    unknown = [n for n in chosen if n not in GUTENBERG_BOOKS]
    if unknown:
        raise ValueError(
            f"unknown book(s) {unknown}; known: {', '.join(GUTENBERG_BOOKS)}"
        )
    return {
        name: data_path(GUTENBERG_BOOKS[name])
        .read_text(encoding="utf-8")
        .replace("\r\n", "\n")
        for name in chosen
    }


def load_tatoeba_pairs(all_pairs: bool = False) -> list[tuple[str, str]]:
    """English-French sentence pairs from Tatoeba, as ``(english, french)``.

    By default 5,000 short pairs: the first 5,000 (shortest) lines of manythings.org's
    ``fra.txt`` (``TATOEBA_ENG_FRA``), each pair's authors in the file's third column.
    With ``all_pairs=True``, the whole file of 2017-09-29 (``TATOEBA_FRA_ENG_ALL``,
    shipped zipped): 142,787 pairs, from one word to long sentences, as the shipped T5
    translator learned from. An English sentence may appear with several French
    translations. Licence CC BY 2.0 FR; attribution: the Tatoeba Project
    (https://tatoeba.org), via www.manythings.org/anki.
    """
    if not isinstance(all_pairs, bool):
        raise TypeError(
            f"load_tatoeba_pairs: all_pairs must be True or False, got {all_pairs!r:.60}"
        )
    if all_pairs:
        import zipfile

        with zipfile.ZipFile(data_path(TATOEBA_FRA_ENG_ALL)) as archive:
            text = archive.read("fra.txt").decode("utf-8")
    else:
        text = data_path(TATOEBA_ENG_FRA).read_text(encoding="utf-8")
    pairs = []
    for number, line in enumerate(text.splitlines(), start=1):
        fields = line.split("\t")
        if len(fields) < 2:
            source = TATOEBA_FRA_ENG_ALL if all_pairs else TATOEBA_ENG_FRA
            raise ValueError(f"{source.relpath}, line {number}: expected tab-separated")
        pairs.append((fields[0], fields[1]))
    return pairs


# --- Chapter 10 (ViT): MNIST (shipped) and CIFAR-10 (downloaded) ---------------------------

__all__ += [
    "MNIST_TEST_IMAGES",
    "MNIST_TEST_LABELS",
    "RemoteFile",
    "CIFAR10",
    "CIFAR10_CLASSES",
    "load_mnist",
    "mnist_split",
    "download_cifar10",
    "load_cifar10",
]

_MNIST_LICENCE = "CC BY-SA 3.0 (https://creativecommons.org/licenses/by-sa/3.0/)"
_MNIST_ATTRIBUTION = (
    "MNIST database of handwritten digits, Y. LeCun, C. Cortes, C. J. C. Burges "
    "(http://yann.lecun.com/exdb/mnist/), CC BY-SA 3.0."
)

MNIST_TEST_IMAGES = Dataset(
    relpath="mnist/t10k-images-idx3-ubyte.gz",
    sha256="8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6",
    url="https://ossci-datasets.s3.amazonaws.com/mnist/t10k-images-idx3-ubyte.gz",
    licence=_MNIST_LICENCE,
    attribution=_MNIST_ATTRIBUTION,
)

MNIST_TEST_LABELS = Dataset(
    relpath="mnist/t10k-labels-idx1-ubyte.gz",
    sha256="f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6",
    url="https://ossci-datasets.s3.amazonaws.com/mnist/t10k-labels-idx1-ubyte.gz",
    licence=_MNIST_LICENCE,
    attribution=_MNIST_ATTRIBUTION,
)


def _read_idx(path: Path, magic: int, shape_tail: tuple[int, ...]):
    """The array in a gzipped IDX file (big-endian header, then unsigned bytes) as uint8.

    ``magic`` is 2049 for a vector of labels, 2051 for a stack of images; ``shape_tail``
    the expected sizes after the first axis (``(28, 28)`` for MNIST's images).
    """
    import gzip

    import numpy as np
    import torch

    with gzip.open(path, "rb") as f:
        raw = f.read()
    n_dims = len(shape_tail) + 1
    header = 4 + 4 * n_dims
    found = int.from_bytes(raw[:4], "big") if len(raw) >= 4 else None
    if found != magic:
        raise ValueError(f"{path.name}: IDX magic number {found}, expected {magic}")
    if len(raw) < header:
        raise ValueError(f"{path.name}: truncated IDX header ({len(raw)} bytes)")
    dims = tuple(
        int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(n_dims)
    )
    if dims[1:] != shape_tail:
        raise ValueError(
            f"{path.name}: IDX dimensions {dims}, expected (n, *{shape_tail})"
        )
    expected = header + int(np.prod(dims))
    if len(raw) != expected:
        raise ValueError(
            f"{path.name}: {len(raw)} bytes after gunzip, expected {expected}"
        )
    array = np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(dims)
    return torch.from_numpy(array.copy())


def load_mnist():
    """The shipped MNIST images and labels: 10,000 handwritten digits (MNIST's test set).

    Returns ``(images, labels)``: ``images`` a ``torch.uint8`` tensor ``(10000, 28, 28)``
    (0 = background, 255 = ink), ``labels`` a ``torch.int64`` tensor ``(10000,)`` of digits
    0..9. Both files are checked against their sha256 first. The course splits them into
    training and validation sets itself (chapter 10).

    Licence CC BY-SA 3.0; attribution: MNIST database of handwritten digits, Y. LeCun,
    C. Cortes, C. J. C. Burges (http://yann.lecun.com/exdb/mnist/).
    """
    images = _read_idx(data_path(MNIST_TEST_IMAGES), 2051, (28, 28))
    labels = _read_idx(data_path(MNIST_TEST_LABELS), 2049, ()).long()
    if images.shape[0] != labels.shape[0]:
        raise ValueError(
            f"MNIST: {images.shape[0]} images but {labels.shape[0]} labels"
        )
    return images, labels


def mnist_split(n_val: int = 1_000):
    """The course's split of the shipped MNIST images (chapter 10, the shipped ViT and
    chapter 8's linear baseline): ``(train_x, train_y, val_x, val_y)``, the images
    ``(n 1 28 28)`` float32 in [0, 1]. ``n_val`` images drawn at random (seed 0) are held
    out; the other ``10000 - n_val`` are for training."""
    if not isinstance(n_val, int) or isinstance(n_val, bool) or not 0 < n_val < 10_000:
        raise ValueError(f"mnist_split: n_val must be an int in 1..9999, got {n_val!r}")
    import torch

    images_u8, labels = load_mnist()
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(0))
    train_idx, val_idx = order[n_val:], order[:n_val]
    images = images_u8.float().div(255).unsqueeze(1)
    return images[train_idx], labels[train_idx], images[val_idx], labels[val_idx]


@dataclass(frozen=True)
class RemoteFile:
    """A file too large to ship: where to fetch it, its size and digests, its licence."""

    url: str
    filename: str
    size: int
    sha256: str
    md5: str
    licence: str
    attribution: str


CIFAR10 = RemoteFile(
    url="https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz",
    filename="cifar-10-python.tar.gz",
    size=170_498_071,
    sha256="6d958be074577803d12ecdefd02955f39262c83c16fe9348329d7fe0b5c001ce",
    md5="c58f30108f718f92721af3b95e74349a",  # as published on the dataset's page
    licence="no explicit licence; the authors ask that Krizhevsky (2009) be cited",
    attribution=(
        "CIFAR-10, from A. Krizhevsky, Learning Multiple Layers of Features from Tiny "
        "Images, 2009 (https://www.cs.toronto.edu/~kriz/cifar.html)."
    ),
)

CIFAR10_CLASSES = (
    "airplane",
    "automobile",
    "bird",
    "cat",
    "deer",
    "dog",
    "frog",
    "horse",
    "ship",
    "truck",
)


def download_cifar10(
    root: str | os.PathLike,
    *,
    url: str = CIFAR10.url,
    sha256: str = CIFAR10.sha256,
    timeout: float = 60.0,
) -> Path:
    """Download CIFAR-10's python archive (170,498,071 bytes) into ``root``; return its path.

    The sha256 is checked before the file is moved into place, so a corrupted or truncated
    download raises :class:`ChecksumError` and leaves nothing behind; an archive already in
    ``root`` with the right digest is reused. Offline, :class:`DownloadError` says so (the
    course's chapters never need this file: they train on the shipped MNIST).
    ``url``/``sha256`` exist for tests and mirrors.
    """
    dest = Path(root) / CIFAR10.filename
    try:
        return download(url, dest, sha256=sha256, timeout=timeout)
    except DownloadError as err:
        raise DownloadError(
            f"{err} CIFAR-10 is optional: lib.datasets.load_mnist() works offline."
        ) from None


def _unpickle_arrays(raw: bytes, name: str) -> dict:
    """Unpickle one CIFAR-10 batch, refusing anything but NumPy arrays, lists and bytes.

    A pickle can run arbitrary code; the archive's digest was checked already, and this
    unpickler also refuses every global except the few that rebuild an array.
    """
    import codecs
    import io
    import pickle

    import numpy as np

    try:
        from numpy._core.multiarray import _reconstruct
    except ImportError:  # NumPy < 2
        from numpy.core.multiarray import _reconstruct

    allowed = {
        ("numpy.core.multiarray", "_reconstruct"): _reconstruct,
        ("numpy._core.multiarray", "_reconstruct"): _reconstruct,
        ("numpy", "ndarray"): np.ndarray,
        ("numpy", "dtype"): np.dtype,
        ("_codecs", "encode"): codecs.encode,
    }

    class ArraysOnly(pickle.Unpickler):
        def find_class(self, module: str, attr: str):
            if (module, attr) in allowed:
                return allowed[(module, attr)]
            raise pickle.UnpicklingError(
                f"{name}: refusing to unpickle {module}.{attr}; a CIFAR-10 batch holds "
                "only arrays, lists and bytes"
            )

    batch = ArraysOnly(io.BytesIO(raw), encoding="bytes").load()
    if not isinstance(batch, dict):
        raise ValueError(f"{name}: expected a dict, got {type(batch).__name__}")
    return batch


def _cifar_batch(batch: dict, name: str):
    """``(images (n 3 32 32) uint8, labels (n,) int64)`` from one unpickled batch."""
    import numpy as np
    import torch

    data, labels = batch.get(b"data"), batch.get(b"labels")
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2:
        raise ValueError(f"{name}: b'data' must be a uint8 array (n, 3072)")
    if data.shape[1] != 3 * 32 * 32 or labels is None or len(labels) != data.shape[0]:
        raise ValueError(
            f"{name}: data {data.shape} and {0 if labels is None else len(labels)} labels "
            "do not make n images of 3x32x32 with one label each"
        )
    images = torch.from_numpy(
        data.reshape(-1, 3, 32, 32).copy()
    )  # rows are R, G, B planes
    return images, torch.as_tensor(np.asarray(labels), dtype=torch.int64)


def load_cifar10(root: str | os.PathLike, *, sha256: str = CIFAR10.sha256):
    """CIFAR-10 from the archive that :func:`download_cifar10` put in ``root``.

    Returns ``((train_images, train_labels), (test_images, test_labels))``: images
    ``torch.uint8`` ``(n 3 32 32)`` (50,000 and 10,000 of them), labels ``torch.int64``
    ``(n,)`` indexing :data:`CIFAR10_CLASSES`. The archive's sha256 is checked first and
    the batches are read straight from it (nothing is extracted to disk).
    """
    import tarfile

    import torch

    path = Path(root) / CIFAR10.filename
    if not path.is_file():
        raise FileNotFoundError(
            f"no CIFAR-10 archive at {path}: call lib.datasets.download_cifar10({str(root)!r}) "
            f"first (needs a network connection once, {CIFAR10.size:,} bytes)"
        )
    actual = sha256_file(path)
    if actual != sha256.lower():
        raise ChecksumError(
            f"{path} has sha256 {actual}, expected {sha256}: the archive is corrupt or "
            "truncated; delete it and call download_cifar10 again"
        )
    folder = "cifar-10-batches-py/"
    wanted = [f"{folder}data_batch_{i}" for i in range(1, 6)] + [f"{folder}test_batch"]
    batches = {}
    with tarfile.open(path, "r:gz") as tar:
        for member in tar:
            if member.name in wanted and member.isfile():
                raw = tar.extractfile(member).read()
                batches[member.name] = _cifar_batch(
                    _unpickle_arrays(raw, member.name), member.name
                )
    missing = [name for name in wanted if name not in batches]
    if missing:
        raise ValueError(
            f"{path.name} lacks {', '.join(missing)}: not CIFAR-10's python archive"
        )

    def joined(names: list[str]):
        images, labels = zip(*(batches[name] for name in names))
        return torch.cat(images), torch.cat(labels)

    return joined(wanted[:5]), joined(wanted[5:])
