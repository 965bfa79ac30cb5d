"""The shared helpers: profile, device, precision, seeding, data."""

from __future__ import annotations

import hashlib

import pytest
import torch

from lib import datasets, utils


def test_profile_is_forced_by_the_environment(monkeypatch):
    monkeypatch.setenv(utils.PROFILE_ENV, "full")
    assert utils.get_profile() == "full"
    assert utils.pick(smoke=1, full=2) == 2
    monkeypatch.setenv(utils.PROFILE_ENV, "smoke")
    assert utils.is_smoke()
    assert utils.pick(smoke=1, full=2) == 1


def test_colab_profile_takes_its_own_value_or_the_full_one(monkeypatch):
    monkeypatch.setenv(utils.PROFILE_ENV, "colab")
    assert utils.get_profile() == "colab" and not utils.is_smoke()
    assert utils.pick(smoke=1, full=2, colab=3) == 3
    assert utils.pick(smoke=1, full=2) == 2  # no colab value: the full one
    monkeypatch.setenv(utils.PROFILE_ENV, "full")
    assert utils.pick(smoke=1, full=2, colab=3) == 2
    monkeypatch.setenv(utils.PROFILE_ENV, "smoke")
    assert utils.pick(smoke=1, full=2, colab=3) == 1
    # profile= sizes another profile's run, whatever the active one is
    assert utils.pick(smoke=1, full=2, colab=3, profile="colab") == 3
    assert utils.pick(smoke=1, full=2, profile="colab") == 2
    with pytest.raises(ValueError, match="profile must be one of"):
        utils.pick(smoke=1, full=2, profile="fast")


def test_profile_defaults_to_the_hardware(monkeypatch):
    monkeypatch.delenv(utils.PROFILE_ENV, raising=False)
    if not torch.cuda.is_available():
        assert utils.get_profile() == "smoke"
    # A GPU's generation decides between colab and full: a T4 is 7.5, an A100 8.0.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for capability, profile in [((7, 5), "colab"), ((7, 0), "colab"), ((8, 0), "full")]:
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda c=capability: c)
        assert utils.get_profile() == profile, capability


def test_bad_profile_is_a_clear_error(monkeypatch):
    monkeypatch.setenv(utils.PROFILE_ENV, "fast")
    with pytest.raises(ValueError, match="'fast' is not a profile.*'colab'"):
        utils.get_profile()


def test_device_and_precision_on_cpu(monkeypatch):
    monkeypatch.setenv(utils.DEVICE_ENV, "cpu")
    device = utils.get_device()
    assert device.type == "cpu"
    precision = utils.get_precision(device)
    assert precision.dtype == torch.float32 and not precision.use_grad_scaler
    assert precision.name == "fp32"


def test_asking_for_a_missing_device_is_a_clear_error():
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="CUDA is not available"):
            utils.get_device("cuda")
    with pytest.raises(ValueError, match="unknown device"):
        utils.get_device("tpu")


def test_seeding_makes_runs_repeatable():
    utils.seed_everything(123)
    a = torch.randn(5)
    utils.seed_everything(123)
    b = torch.randn(5)
    assert torch.equal(a, b)
    with pytest.raises(TypeError, match="seed must be an int"):
        utils.seed_everything("1")  # type: ignore[arg-type]


def test_tiny_shakespeare_ships_with_the_package():
    text = datasets.load_tiny_shakespeare()
    assert len(text) == 1_115_394
    assert text.startswith("First Citizen:")


def test_download_reuses_a_good_file_and_rejects_a_bad_one(tmp_path):
    payload = b"hello, transformer\n"
    digest = hashlib.sha256(payload).hexdigest()
    dest = tmp_path / "hello.txt"
    source = tmp_path / "source.txt"
    source.write_bytes(payload)
    assert datasets.download(source.as_uri(), dest, sha256=digest) == dest
    assert dest.read_bytes() == payload
    # Second call: the file is there with the right digest, nothing is fetched.
    source.unlink()
    assert datasets.download(source.as_uri(), dest, sha256=digest) == dest
    # Wrong digest: the download is refused and nothing is left behind.
    other = tmp_path / "other.txt"
    source.write_bytes(b"something else")
    with pytest.raises(datasets.ChecksumError, match="expected"):
        datasets.download(source.as_uri(), other, sha256=digest)
    assert not other.exists()
    assert list(tmp_path.glob("*.part")) == []


def test_download_offline_is_a_clear_error(tmp_path):
    missing = (tmp_path / "nowhere.txt").as_uri()
    with pytest.raises(datasets.DownloadError, match="could not download"):
        datasets.download(missing, tmp_path / "x.txt", sha256="0" * 64)
    with pytest.raises(ValueError, match="64 hex digits"):
        datasets.download(missing, tmp_path / "x.txt", sha256="abc")


def test_git_commit_names_this_checkout_or_says_unknown(monkeypatch):
    import re
    import subprocess

    from lib.utils import git_commit

    commit = git_commit()
    assert commit == "unknown" or re.fullmatch(r"[0-9a-f]{40}(-dirty)?", commit)

    def no_git(*args, **kwargs):
        raise FileNotFoundError("git")

    monkeypatch.setattr(subprocess, "run", no_git)
    assert git_commit() == "unknown"
