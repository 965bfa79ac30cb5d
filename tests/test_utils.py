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

    monkeypatch.delenv("TFS_COMMIT", raising=False)
    commit = git_commit()
    assert commit == "unknown" or re.fullmatch(r"[0-9a-f]{40}(-dirty)?", commit)
    # the copier's name wins over a checkout's own (a copy may carry a stale .git)
    monkeypatch.setenv("TFS_COMMIT", "fedcba9")
    assert git_commit() == "fedcba9"

    def no_git(*args, **kwargs):
        raise FileNotFoundError("git")

    monkeypatch.setattr(subprocess, "run", no_git)
    monkeypatch.delenv("TFS_COMMIT", raising=False)
    assert git_commit() == "unknown"
    # a copy of a committed tree without its history: the copier names the commit
    monkeypatch.setenv("TFS_COMMIT", "0123abc")
    assert git_commit() == "0123abc"


# --- recorded results ------------------------------------------------------------------


def test_write_record_round_trip(tmp_path):
    import numpy as np

    curves = {
        "train": {"step": [1, 2, 3], "loss": [3.0, 2.5, 2.0], "lr": [1e-3] * 3},
        "eval": {"step": [3], "loss": [np.float32(2.25)]},
    }
    path = utils.write_record(
        tmp_path / "run",
        name="08-training-gpt",
        command="python -m lib.runs --run gpt",
        wall_seconds=12.5,
        metrics={"val_loss": torch.tensor(1.5), "steps": np.int64(3)},
        curves=curves,
        config={"d_model": 64, "out": tmp_path, "dims": (1, 2)},
        samples=["To be"],
        extra={"world_size": 2},
        device="cpu",
    )
    assert path == tmp_path / "run" / "metrics.json"
    record = utils.read_record(path.parent)  # a folder reads its metrics.json
    assert tuple(record) == utils.RECORD_KEYS and record["schema"] == 1
    assert record["metrics"] == {"val_loss": 1.5, "steps": 3}
    assert record["config"] == {"d_model": 64, "out": str(tmp_path), "dims": [1, 2]}
    assert record["curves"]["eval"] == {"step": [3], "loss": [2.25]}
    assert record["device"] == "cpu" and record["gpu"] is None
    assert (
        record["torch"] == torch.__version__ and record["commit"] == utils.git_commit()
    )
    assert record["profile"] == utils.get_profile() and record["samples"] == ["To be"]
    lines = (tmp_path / "run" / "train.csv").read_text().splitlines()
    assert lines == ["step,loss,lr", "1,3.0,0.001", "2,2.5,0.001", "3,2.0,0.001"]
    assert (tmp_path / "run" / "eval.csv").is_file()
    assert (tmp_path / "run" / "curves.png").stat().st_size > 1000


def test_relative_command_leaves_no_path_of_this_machine(tmp_path):
    import sys

    root = utils.PROJECT_ROOT
    cases = {
        # the project's paths become relative, the program its name
        f"{sys.executable} -m lib.runs --out {root}/book/results/x": (
            "python -m lib.runs --out book/results/x"
        ),
        f"/usr/bin/torchrun -m lib.runs -- --out={root}/book": (
            "torchrun -m lib.runs -- --out=book"
        ),
        # elsewhere: the option's name, as in a usage line, else PATH
        "python -m lib.runs --checkpoint-dir /work/ckpt-gpt --resume": (
            "python -m lib.runs --checkpoint-dir CHECKPOINT_DIR --resume"
        ),
        f"TFS_PROFILE=full python x.py --out={tmp_path} ~/data 'C:\\runs'": (
            "TFS_PROFILE=full python x.py --out=OUT PATH PATH"
        ),
        # nothing to rewrite: as it was, quotes and all
        'python -c "print(1 / 2)" --set lr=0.1': 'python -c "print(1 / 2)" --set lr=0.1',
    }
    for command, expected in cases.items():
        assert utils.relative_command(command) == expected, command
        assert utils.relative_command(expected) == expected
    assert [utils.looks_absolute(t) for t in ("/a", "~", "D:/x", "/", "a/b", "x:")] == [
        True,
        True,
        True,
        False,
        False,
        False,
    ]
    with pytest.raises(ValueError, match="shell command line"):
        utils.relative_command("python -c 'unclosed")
    # write_record states it so, with the commit it is given (default: git_commit())
    path = utils.write_record(
        tmp_path / "run",
        name="x",
        command=f"{sys.executable} x.py --out {tmp_path}",
        wall_seconds=1.0,
        metrics={},
        device="cpu",
        commit="0" * 40,
    )
    record = utils.read_record(path)
    assert record["command"] == "python x.py --out OUT"
    assert record["commit"] == "0" * 40


def test_write_record_refuses_what_json_cannot_hold(tmp_path):
    common = dict(name="x", command="python x.py", wall_seconds=1.0, device="cpu")
    with pytest.raises(utils.RecordError, match=r"metrics\.loss is nan"):
        utils.write_record(tmp_path, metrics={"loss": float("nan")}, **common)
    with pytest.raises(utils.RecordError, match=r"extra\.model is a Linear"):
        utils.write_record(
            tmp_path, metrics={}, extra={"model": torch.nn.Linear(1, 1)}, **common
        )
    with pytest.raises(utils.RecordError, match="keys that are not strings"):
        utils.write_record(tmp_path, metrics={1: 2.0}, **common)
    with pytest.raises(utils.RecordError, match="unequal lengths"):
        bad = {"train": {"step": [1, 2], "loss": [1.0]}}
        utils.write_record(tmp_path, metrics={}, curves=bad, **common)
    with pytest.raises(utils.RecordError, match="plain file name"):
        utils.write_record(tmp_path, metrics={}, curves={"a/b": {"x": [1]}}, **common)
    with pytest.raises(utils.RecordError, match="profile must be one of"):
        utils.write_record(tmp_path, metrics={}, profile="tpu", **common)
    assert not list(tmp_path.iterdir())  # refused before anything was written


def test_write_record_names_the_profile_of_its_runs(tmp_path, monkeypatch):
    """A record of runs made in another profile (a subprocess's, or a re-measure of an
    older training) names theirs; by default, this process's."""
    monkeypatch.setenv("TFS_PROFILE", "smoke")
    common = dict(command="python x.py", wall_seconds=1.0, metrics={}, device="cpu")
    own = utils.write_record(tmp_path / "own", name="own", **common)
    theirs = utils.write_record(
        tmp_path / "colab", name="colab", profile="colab", **common
    )
    assert utils.read_record(own)["profile"] == "smoke"
    assert utils.read_record(theirs)["profile"] == "colab"
    assert utils.get_profile() == "smoke"  # the environment is left alone


def test_read_record_names_what_does_not_fit(tmp_path):
    import json

    path = utils.write_record(
        tmp_path,
        name="x",
        command="python x.py",
        wall_seconds=1,
        metrics={},
        device="cpu",
    )
    assert utils.read_record(path)["curves"] == {}
    assert not (tmp_path / "curves.png").exists()  # no curves, no plot
    record = json.loads(path.read_text())
    for change, message in (
        ({"schema": 2}, "has schema 2; this lib reads schema 1"),
        ({"wall_time_s": 1.0}, r"unknown keys \['wall_time_s'\]"),
        ({"metrics": [1.0]}, "metrics must be"),
        ({"curves": {"train": {"step": [1], "loss": []}}}, "unequal lengths"),
    ):
        path.write_text(json.dumps({**record, **change}))
        with pytest.raises(utils.RecordError, match=message):
            utils.read_record(path)
    old = {k: v for k, v in record.items() if k != "schema"}
    path.write_text(json.dumps(old))
    with pytest.raises(utils.RecordError, match="no 'schema' key"):
        utils.read_record(path)
    path.write_text("{not json")
    with pytest.raises(utils.RecordError, match="is not valid JSON"):
        utils.read_record(path)
    with pytest.raises(utils.RecordError, match="no record at"):
        utils.read_record(tmp_path / "missing" / "metrics.json")


def test_set_threads_is_one_rule_for_every_chapter(monkeypatch):
    before = torch.get_num_threads()
    try:
        monkeypatch.delenv(utils.THREADS_ENV, raising=False)
        monkeypatch.setenv(utils.PROFILE_ENV, "smoke")
        assert utils.set_threads() == 1  # small tensors: one thread
        monkeypatch.setenv(utils.THREADS_ENV, "2")
        assert utils.set_threads() == 2  # the environment wins
        assert utils.set_threads(1) == 1  # an explicit count wins over both
        monkeypatch.setenv(utils.THREADS_ENV, "many")
        with pytest.raises(ValueError, match="TFS_THREADS='many'"):
            utils.set_threads()
        with pytest.raises(ValueError, match="threads must be an int"):
            utils.set_threads(-1)
        monkeypatch.delenv(utils.THREADS_ENV)
        monkeypatch.setenv(utils.PROFILE_ENV, "full")
        torch.set_num_threads(2)
        assert utils.set_threads() == 2  # full profile: PyTorch's count is left alone
    finally:
        torch.set_num_threads(before)


def test_every_chapter_sets_its_threads_by_the_one_rule():
    from tools.tangle import chapter_files

    for chapter in chapter_files():
        text = chapter.read_text(encoding="utf-8")
        setup = text[: text.index("```", text.index("remove-cell"))]
        assert "set_threads()" in setup, (
            f"{chapter.name}: setup cell lacks set_threads()"
        )


def test_results_dir_follows_tfs_results(monkeypatch, tmp_path):
    """Chapters that record themselves write where TFS_RESULTS says (gpu_records.py
    --out), else into this checkout's book/results."""
    from lib.utils import PROJECT_ROOT, RESULTS_ENV, results_dir

    monkeypatch.setenv(RESULTS_ENV, str(tmp_path))
    assert results_dir() == tmp_path
    monkeypatch.delenv(RESULTS_ENV)
    assert results_dir() == PROJECT_ROOT / "book" / "results"


# --- issue 32: the helpers say what they take -------------------------------------------


def test_device_helpers_take_a_torch_device_and_name_what_they_refuse():
    from lib.utils import PRECISIONS, autocast, get_device, get_precision

    assert get_device(torch.device("cpu")) == torch.device("cpu")
    assert get_precision(" CPU").dtype == torch.float32  # as get_device reads names
    with autocast("CPU", "fp32"):
        pass
    assert get_precision(torch.device("cpu")).dtype == torch.float32
    with pytest.raises(TypeError, match="get_device: prefer must be a device such as"):
        get_device(0)
    with pytest.raises(
        ValueError, match=r"get_precision: unknown device 'gpu'; device must be"
    ):
        get_precision("gpu")
    with pytest.raises(TypeError, match="get_precision: device must be .* got float"):
        get_precision(1.5)
    # autocast takes a Precision or its name
    with autocast("cpu", "fp32"):
        assert not torch.is_autocast_enabled("cpu")
    with autocast(torch.device("cpu"), "bf16"):
        assert torch.is_autocast_enabled("cpu")
    assert PRECISIONS["fp16"].use_grad_scaler and not PRECISIONS["bf16"].use_grad_scaler
    with pytest.raises(TypeError, match="autocast: precision must be .* got 'half'"):
        autocast("cpu", "half")
    with pytest.raises(
        ValueError, match="autocast: unknown device 'gpu'; device must be"
    ):
        autocast("gpu", "fp32")


@pytest.mark.parametrize("seed", [-1, 2**64])
def test_seed_everything_refuses_seeds_outside_torchs_range(seed):
    from lib.utils import seed_everything

    with pytest.raises(ValueError, match=r"seed must be an int in 0\.\.2\*\*64 - 1"):
        seed_everything(seed)
    seed_everything(2**64 - 1)  # the top of the range is fine


def test_dataset_helpers_take_paths_and_name_what_they_refuse(tmp_path):
    from lib import datasets

    shipped = datasets.data_path(datasets.TINY_SHAKESPEARE)
    assert datasets.sha256_file(shipped) == datasets.sha256_file(str(shipped))
    with pytest.raises(TypeError, match="sha256_file: path must be a path .* NoneType"):
        datasets.sha256_file(None)
    with pytest.raises(
        TypeError, match="data_path: dataset must be a lib.datasets.Dataset"
    ):
        datasets.data_path("tinyshakespeare/input.txt")
    digest = "0" * 64
    with pytest.raises(
        TypeError, match=r"url must be a str .* \(are url and dest swapped\?\)"
    ):
        datasets.download(tmp_path / "x.txt", "https://example.com/x", sha256=digest)
    with pytest.raises(
        ValueError, match="url must start with http://, https:// or file://"
    ):
        datasets.download("example.com/x.txt", tmp_path / "x.txt", sha256=digest)
    with pytest.raises(TypeError, match="download: dest must be a path"):
        datasets.download("https://example.com/x.txt", None, sha256=digest)
    with pytest.raises(TypeError, match=r"names must be a list .* \['austen-emma'\]"):
        datasets.load_gutenberg("austen-emma")
    assert list(datasets.load_gutenberg(("austen-emma",))) == ["austen-emma"]


def test_the_whole_tatoeba_file_ships_and_reads_as_pairs():
    """load_tatoeba_pairs(all_pairs=True): the shipped zip (checksummed), all 142,787
    pairs of its fra.txt as (english, french), beside the 5,000 short pairs."""
    from lib import datasets

    every = datasets.load_tatoeba_pairs(all_pairs=True)
    short = datasets.load_tatoeba_pairs()
    assert len(every) == 142_787 and len(short) == 5_000
    assert every[0] == ("Go.", "Va !")
    assert all(isinstance(e, str) and isinstance(f, str) and e and f for e, f in every)
    # the whole file runs from one word to long sentences
    assert max(len(e) for e, _ in every) > 200 > max(len(e) for e, _ in short)
    assert datasets.data_path(datasets.TATOEBA_FRA_ENG_ALL).stat().st_size == 2_951_390
    with pytest.raises(TypeError, match="all_pairs must be True or False"):
        datasets.load_tatoeba_pairs("all")


def test_import_transformers_gives_the_module_and_leaves_the_filters_as_they_were():
    import warnings

    from lib.utils import import_transformers

    pytest.importorskip("transformers")
    before = list(warnings.filters)
    transformers = import_transformers()
    assert transformers.__name__ == "transformers" and hasattr(
        transformers, "BertConfig"
    )
    assert warnings.filters == before  # the tqdm filter held for the import only


# --- issue 40, item 7: every helper names the argument of the wrong type ----------------


def test_seeds_and_threads_take_ints_of_any_kind_and_name_the_rest(monkeypatch):
    import numpy as np

    from lib.utils import seed_everything, set_threads

    before = torch.get_num_threads()
    try:
        monkeypatch.delenv(utils.THREADS_ENV, raising=False)
        assert set_threads(np.int64(1)) == 1  # was refused: a NumPy int is an int
        for bad, got in (("4", "str '4'"), (2.0, "float 2.0"), (True, "bool True")):
            with pytest.raises(
                TypeError, match=f"set_threads: threads must be an int, got {got}"
            ):
                set_threads(bad)  # was a ValueError
    finally:
        torch.set_num_threads(before)
    a = torch.rand(3, generator=seed_everything(np.int64(3)))
    assert torch.equal(a, torch.rand(3, generator=seed_everything(3)))
    for bad, got in (("1", "str '1'"), (1.0, "float 1.0"), (None, "NoneType None")):
        with pytest.raises(TypeError, match=f"seed must be an int, got {got}"):
            seed_everything(bad)
    with pytest.raises(
        TypeError, match="seed_everything: deterministic must be True or False, got str"
    ):
        seed_everything(0, deterministic="no")  # was truthy: deterministic kernels on
    assert not torch.are_deterministic_algorithms_enabled()


def test_assert_trained_needs_one_truth_value_and_a_claim(monkeypatch):
    import numpy as np

    from lib.utils import DRY_ENV, assert_trained

    monkeypatch.delenv(DRY_ENV, raising=False)
    assert_trained(torch.tensor(True), "a 0-d tensor")
    assert_trained(np.bool_(True), "a NumPy bool")
    with pytest.raises(
        TypeError, match=r"got Tensor .* of 2 values: reduce it with \.all"
    ):
        assert_trained(torch.tensor([True, False]), "x")  # was PyTorch's "ambiguous"
    for bad in (None, "False"):  # None failed as "x", "False" passed
        with pytest.raises(TypeError, match="condition must be one truth value"):
            assert_trained(bad, "x")
    with pytest.raises(TypeError, match="assert_trained: claim must be a str, got int"):
        assert_trained(True, 1)


def test_paths_commands_and_records_name_what_they_refuse(tmp_path):
    from pathlib import Path

    from lib.utils import (
        Precision,
        looks_absolute,
        read_record,
        relative_command,
        write_record,
    )

    assert looks_absolute(Path("/x")) and not looks_absolute(Path("x"))  # was False
    with pytest.raises(
        TypeError, match="looks_absolute: text must be a path .* NoneType"
    ):
        looks_absolute(None)  # was False
    with pytest.raises(
        TypeError, match="relative_command: command must be a str, got None"
    ):
        relative_command(None)  # was returned as it is
    with pytest.raises(TypeError, match="command must be a str, got list"):
        relative_command(["python", "x.py"])
    with pytest.raises(TypeError, match="relative_command: root must be a path .* int"):
        relative_command("python /x", root=1)
    record = dict(name="n", command="python x.py", wall_seconds=1.0, metrics={})
    record["commit"] = "abc"
    with pytest.raises(
        TypeError, match="write_record: out_dir must be a path .* NoneType"
    ):
        write_record(
            None, **record
        )  # was pathlib's message, after the record was built
    with pytest.raises(
        TypeError, match="write_record: device must be a device such as"
    ):
        write_record(tmp_path, **record, device=1)  # was torch.device(1): cuda:1
    with pytest.raises(
        utils.RecordError, match="extra must be a dict \\(or None\\), got str"
    ):
        write_record(tmp_path, **record, extra="")  # was written as {}
    with pytest.raises(utils.RecordError, match="curves must be a dict .* got list"):
        write_record(tmp_path, **record, curves=[])
    assert not (tmp_path / "metrics.json").exists()
    with pytest.raises(TypeError, match="read_record: path must be a path .* NoneType"):
        read_record(None)
    with pytest.raises(
        ValueError, match="Precision: dtype must be one of torch.bfloat16"
    ):
        Precision("bf16", use_grad_scaler=False)  # was a KeyError from .name
    with pytest.raises(TypeError, match="use_grad_scaler must be True or False"):
        Precision(torch.float16, use_grad_scaler="yes")
