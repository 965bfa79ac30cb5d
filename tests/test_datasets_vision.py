"""The image data of chapter 10: shipped MNIST, and CIFAR-10's checked download (offline).

The CIFAR-10 tests build a tiny archive in the real format (a gzipped tar holding
``cifar-10-batches-py/data_batch_1..5`` and ``test_batch``, each a pickled dict with
``b"data"`` (n, 3072) uint8 and ``b"labels"``) and serve it from a ``file://`` URL: they
never touch the network.
"""

from __future__ import annotations

import gzip
import io
import os
import pickle
import tarfile
import urllib.error
from pathlib import Path

import numpy as np
import pytest
import torch

from lib import datasets
from lib.datasets import (
    CIFAR10,
    ChecksumError,
    DownloadError,
    download_cifar10,
    load_cifar10,
    load_mnist,
    sha256_file,
)


# -- MNIST --------------------------------------------------------------------------------------
def test_load_mnist_returns_the_shipped_test_set():
    images, labels = load_mnist()
    assert images.shape == (10_000, 28, 28) and images.dtype == torch.uint8
    assert labels.shape == (10_000,) and labels.dtype == torch.int64
    counts = torch.bincount(labels, minlength=10).tolist()
    assert counts == [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]
    assert labels[:5].tolist() == [
        7,
        2,
        1,
        0,
        4,
    ]  # MNIST's test set starts 7, 2, 1, 0, 4
    assert images.max() == 255 and images[:, 0, 0].max() == 0  # corners are background


def test_mnist_files_carry_their_licence():
    for dataset in (datasets.MNIST_TEST_IMAGES, datasets.MNIST_TEST_LABELS):
        assert "CC BY-SA 3.0" in dataset.licence and "LeCun" in dataset.attribution
    readme = datasets.DATA_DIR / "mnist" / "README.md"
    assert "CC BY-SA 3.0" in readme.read_text(encoding="utf-8")


def test_a_corrupted_mnist_file_is_refused(tmp_path, monkeypatch):
    (tmp_path / "mnist").mkdir()
    for dataset in (datasets.MNIST_TEST_IMAGES, datasets.MNIST_TEST_LABELS):
        data = (datasets.DATA_DIR / dataset.relpath).read_bytes()
        (tmp_path / dataset.relpath).write_bytes(data)
    broken = tmp_path / datasets.MNIST_TEST_LABELS.relpath
    broken.write_bytes(broken.read_bytes()[:-10])  # truncated
    monkeypatch.setattr(datasets, "DATA_DIR", tmp_path)
    with pytest.raises(ChecksumError, match="t10k-labels-idx1-ubyte.gz"):
        load_mnist()


def _idx_file(path: Path, magic: int, dims: tuple[int, ...], payload: bytes) -> Path:
    header = magic.to_bytes(4, "big") + b"".join(d.to_bytes(4, "big") for d in dims)
    path.write_bytes(gzip.compress(header + payload))
    return path


def test_idx_reader_checks_magic_dimensions_and_length(tmp_path):
    good = _idx_file(
        tmp_path / "good.gz", 2051, (2, 28, 28), bytes(range(256)) * 6 + bytes(32)
    )
    images = datasets._read_idx(good, 2051, (28, 28))
    assert images.shape == (2, 28, 28) and images[0, 0, 5] == 5
    with pytest.raises(
        ValueError, match="bad.gz: IDX magic number 2049, expected 2051"
    ):
        datasets._read_idx(
            _idx_file(tmp_path / "bad.gz", 2049, (2,), b"\0\0"), 2051, (28, 28)
        )
    short = _idx_file(tmp_path / "short.gz", 2051, (2, 28, 28), bytes(100))
    with pytest.raises(
        ValueError, match="short.gz: 116 bytes after gunzip, expected 1584"
    ):
        datasets._read_idx(short, 2051, (28, 28))
    wrong = _idx_file(tmp_path / "wrong.gz", 2051, (1, 32, 32), bytes(1024))
    with pytest.raises(ValueError, match="wrong.gz: IDX dimensions"):
        datasets._read_idx(wrong, 2051, (28, 28))


# -- CIFAR-10: a tiny archive in the real format ----------------------------------------------------
def _batch(n: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    return {
        b"batch_label": f"batch {seed}".encode(),
        b"labels": rng.integers(0, 10, n).tolist(),
        b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
        b"filenames": [f"img{i}.png".encode() for i in range(n)],
    }


def _archive(path: Path, batches: dict[str, object]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, content in batches.items():
            raw = (
                content
                if isinstance(content, bytes)
                else pickle.dumps(content, protocol=2)
            )
            info = tarfile.TarInfo(f"cifar-10-batches-py/{name}")
            info.size = len(raw)
            tar.addfile(info, io.BytesIO(raw))
    return path


@pytest.fixture
def tiny_cifar(tmp_path):
    """A tiny CIFAR-10 archive (2 images per training batch, 3 test images) to download."""
    batches = {f"data_batch_{i}": _batch(2, i) for i in range(1, 6)}
    batches["test_batch"] = _batch(3, 0)
    batches["batches.meta"] = {
        b"label_names": [c.encode() for c in datasets.CIFAR10_CLASSES]
    }
    (tmp_path / "source").mkdir()
    source = _archive(tmp_path / "source" / CIFAR10.filename, batches)
    return source, sha256_file(source), batches


def test_download_and_load_a_cifar_archive(tmp_path, tiny_cifar):
    source, digest, batches = tiny_cifar
    root = tmp_path / "data"
    path = download_cifar10(root, url=source.as_uri(), sha256=digest)
    assert path == root / CIFAR10.filename and sha256_file(path) == digest
    (train_x, train_y), (test_x, test_y) = load_cifar10(root, sha256=digest)
    assert train_x.shape == (10, 3, 32, 32) and train_x.dtype == torch.uint8
    assert test_x.shape == (3, 3, 32, 32) and test_y.dtype == torch.int64
    first = batches["data_batch_1"][b"data"][0]
    for channel in range(3):  # each row is the red plane, then green, then blue
        plane = first[channel * 1024 : (channel + 1) * 1024].reshape(32, 32)
        assert torch.equal(train_x[0, channel], torch.from_numpy(plane))
    want_labels = [
        y for i in range(1, 6) for y in batches[f"data_batch_{i}"][b"labels"]
    ]
    assert train_y.tolist() == want_labels
    assert test_y.tolist() == batches["test_batch"][b"labels"]
    # a second call reuses the checked file and does not read the URL again
    source.unlink()
    assert download_cifar10(root, url=source.as_uri(), sha256=digest) == path


def test_a_corrupted_download_is_refused_and_nothing_is_left(tmp_path, tiny_cifar):
    source, digest, _ = tiny_cifar
    data = bytearray(source.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte
    source.write_bytes(bytes(data))
    root = tmp_path / "data"
    with pytest.raises(ChecksumError, match="cifar-10-python.tar.gz"):
        download_cifar10(root, url=source.as_uri(), sha256=digest)
    assert list(root.iterdir()) == []


def test_a_truncated_download_is_refused_and_nothing_is_left(tmp_path, tiny_cifar):
    source, digest, _ = tiny_cifar
    source.write_bytes(source.read_bytes()[:-100])
    root = tmp_path / "data"
    with pytest.raises(ChecksumError, match=r"cifar-10-python.tar.gz.*sha256"):
        download_cifar10(root, url=source.as_uri(), sha256=digest)
    assert list(root.iterdir()) == []


def test_offline_is_a_clear_error(tmp_path, monkeypatch):
    def no_network(*args, **kwargs):
        raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr(datasets.urllib.request, "urlopen", no_network)
    with pytest.raises(
        DownloadError, match=r"could not download .*offline.*load_mnist"
    ):
        download_cifar10(tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_the_real_archive_is_described_exactly():
    assert CIFAR10.url == "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
    assert CIFAR10.size == 170_498_071
    assert CIFAR10.md5 == "c58f30108f718f92721af3b95e74349a"
    assert len(CIFAR10.sha256) == 64 and len(datasets.CIFAR10_CLASSES) == 10


def test_load_cifar10_needs_the_archive_and_checks_it(tmp_path, tiny_cifar):
    with pytest.raises(FileNotFoundError, match=r"call lib.datasets.download_cifar10"):
        load_cifar10(tmp_path)
    source, digest, _ = tiny_cifar
    root = tmp_path / "data"
    download_cifar10(root, url=source.as_uri(), sha256=digest)
    with pytest.raises(
        ChecksumError, match=r"cifar-10-python.tar.gz has sha256 .* corrupt"
    ):
        load_cifar10(root)  # the real archive's digest: this tiny one does not match


def test_load_cifar10_refuses_a_pickle_that_is_not_just_arrays(tmp_path):
    class Sneaky:
        def __reduce__(self):
            return (os.system, ("echo should not run",))

    batches = {f"data_batch_{i}": _batch(1, i) for i in range(1, 6)}
    batches["test_batch"] = {b"data": Sneaky(), b"labels": [0]}
    root = tmp_path / "data"
    root.mkdir()
    archive = _archive(root / CIFAR10.filename, batches)
    with pytest.raises(
        pickle.UnpicklingError, match="test_batch: refusing to unpickle"
    ):
        load_cifar10(root, sha256=sha256_file(archive))


def test_load_cifar10_names_missing_batches(tmp_path):
    root = tmp_path / "data"
    root.mkdir()
    archive = _archive(root / CIFAR10.filename, {"data_batch_1": _batch(1, 1)})
    with pytest.raises(ValueError, match="lacks cifar-10-batches-py/data_batch_2"):
        load_cifar10(root, sha256=sha256_file(archive))
