"""The record scripts of book/results/: re-running a record, gpu_records.py's steps,
budget and dry run, its refusal to record on a CPU."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent


def _script(name: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / name), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )


def test_rerun_record_runs_the_recorded_command(tmp_path: Path):
    marker = tmp_path / "ran.txt"
    record = tmp_path / "metrics.json"
    code = f"import os; open({str(marker)!r}, 'w').write(os.environ['TFS_MARK'])"
    command = f'TFS_MARK=yes {sys.executable} -c "{code}"'
    record.write_text(json.dumps({"metrics": {}, "command": command}), encoding="utf-8")
    shown = _script("rerun_record.py", str(record), "--print")
    assert shown.returncode == 0 and "-c" in shown.stdout and not marker.exists()
    done = _script("rerun_record.py", str(record))
    assert done.returncode == 0 and marker.read_text() == "yes"


def test_rerun_record_explains_a_bad_record(tmp_path: Path):
    missing = _script("rerun_record.py", str(tmp_path / "nope.json"))
    assert missing.returncode != 0 and "no record at" in missing.stderr
    record = tmp_path / "metrics.json"
    record.write_text(json.dumps({"metrics": {}}), encoding="utf-8")
    no_command = _script("rerun_record.py", str(record))
    assert no_command.returncode != 0 and "has no 'command'" in no_command.stderr


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="checks the message a CPU machine gets"
)
def test_gpu_records_refuse_to_run_without_a_gpu():
    done = _script("gpu_records.py", "notebooks")
    assert done.returncode != 0 and "no CUDA GPU here" in done.stderr


def test_gpu_records_write_the_one_schema(tmp_path: Path, monkeypatch):
    from lib.utils import read_record

    gpu_records = _gpu_records_module()
    monkeypatch.setattr(gpu_records, "RESULTS", tmp_path)
    monkeypatch.setattr(gpu_records, "ROOT", tmp_path)
    command = [sys.executable, "scripts/gpu_records.py", "throughput"]
    path = gpu_records.record("throughput", {"eager": {"exit_code": 0}}, command, 3.14)
    saved = read_record(path)
    assert saved["name"] == "throughput" and saved["wall_seconds"] == 3.1
    assert saved["metrics"] == {"eager": {"exit_code": 0}}
    assert saved["command"].endswith("scripts/gpu_records.py throughput")
    # the colab step's record names the profile its pages ran in, not this process's
    before = os.environ.get("TFS_PROFILE")
    path = gpu_records.record("colab", {}, command, 1.0, tmp_path, profile="colab")
    assert read_record(path)["profile"] == "colab"
    assert os.environ.get("TFS_PROFILE") == before  # and leaves the environment be


def _train_shipped_module():
    import importlib.util

    path = ROOT / "scripts" / "train_shipped.py"
    spec = importlib.util.spec_from_file_location("train_shipped", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _gpu_records_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "gpu_records", ROOT / "scripts" / "gpu_records.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _summary(stdout: str) -> dict[str, str]:
    """Step -> the rest of its `[gpu_records] step: ...` line (and `total`)."""
    lines = [line for line in stdout.splitlines() if line.startswith("[gpu_records] ")]
    return dict(line.removeprefix("[gpu_records] ").split(": ", 1) for line in lines)


def test_gpu_records_runs_in_order_within_the_budget(capsys):
    gpu_records = _gpu_records_module()
    ran = []

    def slow(session):  # in-process: spends the whole budget, then succeeds
        ran.append("slow")
        time.sleep(1.2)
        return None, ""

    def never(session):
        ran.append("never")
        return None, ""

    steps = {"slow": slow, "never": never}
    # under MIN_START_S (2 s) left at the start: nothing is started at all
    short = gpu_records.Session(Path("unused"), budget_s=1.0)
    outcomes = gpu_records.run_steps(["slow", "never"], short, steps=steps)
    assert ran == [] and {o.status for o in outcomes} == {"skipped: budget spent"}
    capsys.readouterr()
    gpu_records.MIN_START_S = 0.5  # this module object is this test's own
    session = gpu_records.Session(Path("unused"), budget_s=1.0)
    outcomes = gpu_records.run_steps(
        ["slow", "never"], session, steps={"slow": slow, "never": never}
    )
    assert ran == ["slow"]
    assert [o.status for o in outcomes] == ["ok", "skipped: budget spent"]
    summary = _summary(capsys.readouterr().out)
    assert summary["slow"].startswith("ok in 1.")
    assert summary["never"] == "skipped: budget spent"
    assert summary["total"].startswith("1 ok, 0 timed out, 0 failed, 1 skipped in ")
    assert "of a 1 s budget" in summary["total"]


def test_gpu_records_stop_a_step_at_the_deadline(tmp_path: Path, capsys):
    gpu_records = _gpu_records_module()
    pid_file = tmp_path / "pid"
    sleeper = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid()))"
    sleeper += "; time.sleep(60)"

    def stuck(session):
        session.run([sys.executable, "-c", sleeper])
        return None, ""

    def failing(session):  # a command that should write its record: exits 3
        command = [sys.executable, "-c", "raise SystemExit(3)"]
        return gpu_records._command_step(session, command, tmp_path / "none")

    def silent(session):  # exits 0 but writes no record: a failure too
        command = [sys.executable, "-c", "pass"]
        return gpu_records._command_step(session, command, tmp_path / "none")

    steps = {"stuck": stuck, "failing": failing, "silent": silent}
    session = gpu_records.Session(tmp_path, budget_s=3.0)
    began = time.monotonic()
    (stopped,) = gpu_records.run_steps(["stuck"], session, steps=steps)
    assert stopped.status == "timed out" and time.monotonic() - began < 15
    assert stopped.seconds < 15
    with pytest.raises(ProcessLookupError):  # the sleeper was stopped, not left behind
        os.kill(int(pid_file.read_text()), 0)
    assert _summary(capsys.readouterr().out)["stuck"].startswith("timed out after ")
    session = gpu_records.Session(tmp_path)  # no budget
    failed, silent = gpu_records.run_steps(["failing", "silent"], session, steps=steps)
    assert failed.status == "failed (exit 3)"
    assert silent.status == f"failed (no record written in {tmp_path / 'none'})"
    summary = _summary(capsys.readouterr().out)
    assert summary["failing"].startswith("failed (exit 3) after")
    assert summary["total"].startswith("0 ok, 0 timed out, 2 failed, 0 skipped in ")


def test_gpu_records_choose_steps_in_order_of_value():
    gpu_records = _gpu_records_module()
    assert gpu_records.selected("all", None) == [
        "colab", "flash", "gpt", "vit", "bert", "t5", "notebooks"
    ]  # fmt: skip
    assert gpu_records.selected("all", "notebooks,t5,flash") == [
        "flash",
        "t5",
        "notebooks",
    ]
    assert gpu_records.selected("training", None) == ["gpt", "bert", "t5"]
    assert gpu_records.selected("throughput", None) == ["throughput"]
    assert gpu_records.selected("all", "notebooks,colab") == ["colab", "notebooks"]
    with pytest.raises(ValueError, match="no step 'nope'"):
        gpu_records.selected("all", "gpt,nope")
    bad = _script("gpu_records.py", "all", "--dry-run", "--steps", "gpt,nope")
    assert bad.returncode != 0 and "no step 'nope'" in bad.stderr


# The dry run of every step of `all` but vit, in groups: each step costs a process start
# or more (about 5 s), so one run of all six takes 40 s or more; four test cases share
# it between the test workers (colab's two pages, about 20 s, on their own). vit is left out: its dry run is chapter 10 in the smoke
# profile (about a minute on its own, and already a test of its own: chapters/10-2-training.md)
# and it records only its full profile, so it would add time and check no record here.
DRY_RUN_GROUPS = ("colab", "flash,gpt", "bert,t5", "notebooks")
# bert and t5 run at the same time (--together), as on the GPU
DRY_RUN_TOGETHER = {"bert,t5": "bert,t5"}
DRY_RUN_RECORDS = {
    "colab": "colab-profile-fp32-cpu",
    "flash": "09-flash-attention-cpu",
    "gpt": "08-training-gpt",
    "bert": "08-training-bert",
    "t5": "08-training-t5",
    "notebooks": "full-profile-notebooks",
}


@pytest.mark.parametrize("steps", DRY_RUN_GROUPS)
def test_gpu_records_dry_run_writes_readable_records(steps: str, tmp_path: Path):
    """`all --steps ...` on the CPU at smoke sizes: each step in order, one summary line
    each and a total, and the records each writes."""
    from lib.utils import read_record

    every = [step for group in DRY_RUN_GROUPS for step in group.split(",")]
    assert sorted(every) == sorted(set(_gpu_records_module().ALL) - {"vit"})
    together = DRY_RUN_TOGETHER.get(steps)
    began = time.time() - 1  # file times can be coarse
    done = _script(
        "gpu_records.py", "all", "--dry-run", "--out", str(tmp_path),
        "--budget-s", "600", "--steps", steps,
        *(["--together", together] if together else []),
    )  # fmt: skip
    summary = _summary(done.stdout)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    names = steps.split(",")
    assert list(summary) == [*names, "total"]
    for step in names:
        assert summary[step].startswith("ok in "), (step, summary[step])
    total = f"{len(names)} ok, 0 timed out, 0 failed, 0 skipped in "
    assert summary["total"].startswith(total)
    if "flash" in names:
        # the benchmark's CPU path: the check at each size, no GPU speed
        flash = read_record(tmp_path / DRY_RUN_RECORDS["flash"])
        assert flash["extra"]["correctness"] and flash["metrics"] == {}
        assert all(check["ok"] for check in flash["extra"]["correctness"])
    if "gpt" in names:
        gpt = read_record(tmp_path / DRY_RUN_RECORDS["gpt"])
        assert gpt["metrics"]["target_val_loss"] == 1.47
        assert gpt["metrics"]["seconds_to_target"] is None  # two steps: not reached
        assert len(gpt["curves"]["eval"]["seconds"]) == 1
    for step in names:
        name = DRY_RUN_RECORDS[step]
        path = tmp_path / name / "metrics.json"
        assert summary[step].split(" (at the same time")[0].endswith(f"-> {path}")
        saved = read_record(path)
        assert saved["name"] == name and saved["profile"] == "smoke"
        others = [n for n in together.split(",") if n != step] if together else None
        assert saved["extra"].get("shared_gpu_with") == others
    if "notebooks" in names:
        notebooks = read_record(tmp_path / DRY_RUN_RECORDS["notebooks"])["metrics"]
        assert notebooks["complete"] and notebooks["all_passed"]
        assert list(notebooks["chapters"]) == ["03-positions"]
    if "colab" in names:
        # one page dry in the colab shapes, one page that trains at smoke sizes, timed;
        # fp32 on the CPU, and no GPU peak to scale the T4's budget by
        colab = read_record(tmp_path / DRY_RUN_RECORDS["colab"])["metrics"]
        assert colab["complete"] and colab["all_passed"] and colab["not_run"] == []
        assert colab["precision"] == "fp32" and colab["timed_profile"] == "smoke"
        assert list(colab["dry_pages"]) == ["03-positions"]
        (timed,) = colab["timed_pages"].values()
        assert list(colab["timed_pages"]) == ["09-2-triton"]
        assert timed["passed"] and 0 < timed["wall_time_s"] < 600
        assert timed["t4_budget_s"] == colab["t4_budget_s"] == 600
        assert timed["scaled_budget_s"] is None and timed["within_budget"] is None
        assert colab["gpu_peak_flops"] is None and colab["t4_peak_flops"] == 65e12
        # a dry page runs in its own folder of executed notebooks: the colab profile's
        dry_copy = ROOT / "_build" / "notebooks-colab-dry" / "03-positions.ipynb"
        assert dry_copy.is_file() and dry_copy.stat().st_mtime > began


def test_gpu_records_colab_step_on_a_gpu(tmp_path: Path, monkeypatch, capsys):
    """The colab step as on an H100, its pages' runs simulated (in-process, about 2 s):
    every page dry in the colab profile under TFS_PRECISION=fp16, then the three pages
    that train for real, one at a time, each against 600 s × 65 / 989 = 39.4 s."""
    import lib.efficiency
    from lib.utils import read_record
    from tools.tangle import chapter_files

    gpu_records = _gpu_records_module()
    monkeypatch.setenv("TFS_COMMIT", "0" * 40)  # no git call for each record
    monkeypatch.setattr(lib.efficiency, "peak_flops", lambda device=None: 989e12)
    monkeypatch.setattr(gpu_records, "gpu_label", lambda: "h100")
    folder = tmp_path / "colab-profile-fp16-h100"
    timed_seconds = {"08-3-runs": 30.0, "09-2-triton": 45.0, "10-2-training": 12.0}
    ran: list[tuple[str, dict]] = []
    seen_before_timing: list[dict] = []
    failing: set[str] = set()

    class SimulatedSession(gpu_records.Session):
        def run(self, command, prefix="", **env):
            page = Path(command[-1]).stem
            assert command[-1] == f"chapters/{page}.md" and "pytest" in command
            ran.append((page, env))
            if env.get("TFS_DRY") == "1":
                return int(page in failing), 1.0, ""
            seen_before_timing.append(read_record(folder)["metrics"])
            return 0, timed_seconds[page], ""

    session = SimulatedSession(tmp_path, notebook_jobs=2)
    (outcome,) = gpu_records.run_steps(["colab"], session)
    pages = sorted(c.stem for c in chapter_files())
    dry = [(page, env) for page, env in ran if env.get("TFS_DRY") == "1"]
    timed = [(page, env) for page, env in ran if "TFS_DRY" not in env]
    assert sorted(page for page, _ in dry) == pages and len(pages) >= 16
    assert ran[len(dry) :] == timed  # the timed pages after every dry one
    assert [page for page, _ in timed] == list(timed_seconds)  # one at a time
    for page, env in ran:
        assert env["TFS_PROFILE"] == "colab" and env["TFS_PRECISION"] == "fp16", page
        assert env["TFS_RESULTS"] == str(folder / "chapter-records")
    assert {env["TFS_THREADS"] for _, env in dry} == {str(max(1, os.cpu_count() // 2))}
    assert all(env["HF_HUB_OFFLINE"] == "1" for _, env in dry)
    # the record before each timed page: not complete, naming what is left
    first = seen_before_timing[0]
    assert not first["complete"] and first["timed_pages"] == {}
    assert first["not_run"] == list(timed_seconds)
    assert list(first["dry_pages"]) == pages
    assert [m["complete"] for m in seen_before_timing] == [False] * 3
    saved = read_record(folder)
    metrics = saved["metrics"]
    assert saved["profile"] == "colab" and saved["name"] == folder.name
    assert metrics["complete"] and metrics["all_passed"] and metrics["not_run"] == []
    assert metrics["precision"] == "fp16" and metrics["scaled_budget_s"] == 39.4
    assert metrics["gpu_peak_flops"] == 989e12 and metrics["jobs"] == 2
    within = {p: page["within_budget"] for p, page in metrics["timed_pages"].items()}
    assert within == {
        "08-3-runs": True,
        "09-2-triton": False,
        "10-2-training": True,
    }
    assert metrics["timed_pages"]["09-2-triton"]["wall_time_s"] == 45.0
    assert metrics["all_within_budget"] is False
    assert saved["wall_seconds"] == len(pages) * 1.0 + sum(timed_seconds.values())
    # over its budget: said, not a failure; a failed page fails the step
    assert outcome.status == "ok"
    assert outcome.note == "over the scaled budget: 09-2-triton 45 s > 39 s"
    failing.add("05-ffn")
    ran.clear()
    (outcome,) = gpu_records.run_steps(["colab"], session)
    assert outcome.status == "failed (failed: 05-ffn (dry))"
    assert not read_record(folder)["metrics"]["all_passed"]
    capsys.readouterr()


def test_gpu_records_scale_the_t4_budget_by_the_gpus_peak():
    """600 s on a T4 (65 TFLOP/s dense fp16) is the same work in 600 × 65 / peak s."""
    from lib.efficiency import gpu_seconds

    gpu_records = _gpu_records_module()
    assert gpu_records.t4_peak_flops() == pytest.approx(65e12)
    assert gpu_records.scaled_budget_s(65e12) == pytest.approx(600.0)  # a T4
    assert gpu_records.scaled_budget_s(989e12) == pytest.approx(39.43, abs=0.01)  # H100
    assert gpu_records.scaled_budget_s(312e12) == pytest.approx(125.0)  # an A100
    assert gpu_records.scaled_budget_s(None) is None  # a CPU, a GPU of no known peak
    # the same work at any MFU: the budget's T4 FLOPs take that long on the A100 too
    t4_flops = 600.0 * 65e12 * 0.3
    assert gpu_seconds(t4_flops, peak="A100", mfu=0.3) == pytest.approx(125.0)


def test_gpu_records_dry_run_keeps_out_of_book_results():
    """Without --out a dry run writes into a new temporary folder (the throughput step,
    the one whose record this script writes itself, at a tiny size: about 10 s)."""
    from lib.utils import read_record

    done = _script("gpu_records.py", "throughput", "--dry-run")
    summary = _summary(done.stdout)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert summary["throughput"].startswith("ok in ")
    path = Path(summary["throughput"].rsplit(" -> ", 1)[1])
    try:
        assert path.is_absolute() and ROOT not in path.parents
        assert path.parent.parent.name.startswith("gpu_records_dry_run_")
        saved = read_record(path)
        assert saved["metrics"]["eager"]["exit_code"] == 0
    finally:
        shutil.rmtree(path.parent.parent)


def test_train_shipped_dry_run_trains_records_and_packages(tmp_path: Path):
    from lib.pretrained import load_shipped
    from lib.utils import read_record

    # a small ViT (the dry run's sizes): 4 steps of chapter 10's recipe
    done = _script(
        "train_shipped.py", "vit-mnist", "--dry-run", "--quiet", "--scratch",
        str(tmp_path), "--threads", "1",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    record = read_record(tmp_path / "10-vit-mnist-cpu")
    assert record["metrics"]["steps"] == 4 and record["device"] == "cpu"
    metrics = record["metrics"]
    assert (
        metrics["val_accuracy_low"]
        <= metrics["val_accuracy"]
        <= metrics["val_accuracy_high"]
    )
    assert record["config"]["d_model"] == 32 and record["config"]["patch_size"] == 7
    shipped = load_shipped("vit-mnist", directory=tmp_path / "checkpoints")
    assert shipped.entry["record"].endswith("10-vit-mnist-cpu/metrics.json")
    # the pixel statistics it was trained with, for whoever loads it
    extra = record["extra"]
    assert shipped.entry["inputs"]["mean"] == extra["mean"]
    assert shipped.entry["inputs"]["std"] == extra["std"]
    assert shipped.model(torch.zeros(2, 1, 28, 28)).shape == (2, 10)
    # evaluate's measure, found by the file's kind, gives the training's numbers
    from lib.shipped import held_out

    assert extra["recipe"] == "lib.vit_training.vit_run" and extra["seed"] == 0
    again = held_out(shipped, record)
    assert again["val_accuracy"] == metrics["val_accuracy"]
    assert again["val_loss"] == pytest.approx(metrics["val_loss"], rel=1e-5)
    assert not (ROOT / "book" / "results" / "10-vit-mnist-cpu" / "train.csv").samefile(
        tmp_path / "10-vit-mnist-cpu" / "train.csv"
    )


def test_train_shipped_dry_run_trains_and_packages_the_translator(tmp_path: Path):
    """t5 --dry-run: lib.runs.t5_run at tiny sizes on a slice of the pairs, its record,
    and a model file that load_shipped reads with its BPE tokenizer and special ids,
    ready for lib.generation.translate; `evaluate`'s measure of the file equals the
    training's."""
    from lib.generation import translate
    from lib.pretrained import load_shipped
    from lib.runs import tatoeba_split
    from lib.shipped import held_out
    from lib.utils import read_record

    done = _script(
        "train_shipped.py", "t5", "--dry-run", "--quiet", "--scratch", str(tmp_path),
        "--threads", "1",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    record = read_record(tmp_path / "08-training-t5-cpu")
    metrics = record["metrics"]
    assert metrics["steps"] == 4 and metrics["threads"] == 1
    assert metrics["test_sentences"] == 20 and metrics["train_pairs"] == 2000
    assert 0.0 <= metrics["bleu_beam_low"] <= metrics["bleu_beam"] <= 100.0
    assert 0.0 <= metrics["bleu_copy_source"] <= 100.0
    shipped = load_shipped("t5-tatoeba-en-fr", directory=tmp_path / "checkpoints")
    inputs = shipped.entry["inputs"]
    specials = shipped.tokenizer.special_tokens
    assert (inputs["pad_id"], inputs["eos_id"]) == (specials["<pad>"], specials["</s>"])
    french = translate(
        shipped.model, shipped.tokenizer, ["Hello.", "I see a cat."], beam_size=2,
        pad_id=inputs["pad_id"], eos_id=inputs["eos_id"],
    )  # fmt: skip
    assert len(french) == 2 and all(isinstance(text, str) for text in french)
    train_pairs, test_pairs = tatoeba_split(0.015)
    assert len({e for e, _ in test_pairs}) >= 1_000
    assert not {e for e, _ in test_pairs} & {e for e, _ in train_pairs}
    again = held_out(shipped, record)  # the measure `evaluate` uses
    assert again["bleu_beam"] == pytest.approx(metrics["bleu_beam"])
    assert again["bleu_copy_source"] == metrics["bleu_copy_source"]


def test_train_shipped_dry_run_trains_and_packages_the_two_berts(tmp_path: Path):
    """bert --dry-run: lib.runs.bert_run at tiny sizes; the masked LM and the book
    classifier, each a model file with its BPE tokenizer; the numbers that `evaluate`
    re-measures from the files equal the training's."""
    from lib.pretrained import load_shipped
    from lib.utils import read_record

    done = _script(
        "train_shipped.py", "bert", "--dry-run", "--quiet", "--scratch", str(tmp_path),
        "--threads", "1",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    record = read_record(tmp_path / "08-training-bert-cpu")
    metrics = record["metrics"]
    assert metrics["test_passages"] == 6 * 4 and metrics["chance"] == 1 / 6
    assert metrics["labelled_passages"] == 6 * 4 and metrics["threads"] == 1
    for key in ("pretrained", "from_scratch", "bag_of_words"):
        low, value, high = (
            metrics[f"accuracy_{key}{e}"] for e in ("_low", "", "_high")
        )
        assert 0.0 <= low <= value <= high <= 1.0
    assert record["config"]["sizes"]["n_steps"] == 4
    directory = tmp_path / "checkpoints"
    mlm = load_shipped("bert-gutenberg-mlm", directory=directory)
    books = load_shipped("bert-gutenberg-books", directory=directory)
    assert books.entry["inputs"]["labels"] == record["samples"]["books"]
    assert len(books.entry["inputs"]["labels"]) == 6
    mask_id = mlm.entry["inputs"]["mask_id"]
    ids = torch.tensor([[*mlm.tokenizer.encode("It is a truth universally "), mask_id]])
    assert mlm.model(ids).shape == (1, ids.shape[1], mlm.model.cfg.vocab_size)
    from lib.shipped import held_out  # the measure `evaluate` uses

    again = held_out(books, record)
    assert again["accuracy_pretrained"] == metrics["accuracy_pretrained"]
    again = held_out(mlm, record)
    assert again["mlm_test_loss"] == pytest.approx(metrics["mlm_test_loss"], abs=1e-6)
    assert again["unigram_test_loss"] == metrics["unigram_test_loss"]


def test_train_shipped_packages_the_last_checkpoint_of_a_gpt_run(
    tmp_path: Path, monkeypatch
):
    from lib import runs
    from lib.pretrained import load_shipped

    # batch_size=32: the held-out loss, computed four times here, reads the whole
    # held-out text in batches of 4 * batch_size windows (55 batches; 872 with 2)
    sizes = ["--set", "d_model=16", "--set", "n_layers=1", "--set", "seq_len=16"]
    sizes += ["--set", "batch_size=32", "--set", "eval_every=2"]
    sizes += ["--set", "eval_iters=1"]
    sizes += [
        "--out",
        str(tmp_path / "record"),
        "--checkpoint-dir",
        str(tmp_path / "run"),
    ]
    # the run by `python -m lib.runs`'s entry point, in this process (one start less)
    monkeypatch.setenv("TFS_PROFILE", "smoke")  # main sets it: undone after the test
    runs.main(["--run", "gpt", "--profile", "smoke", "--steps", "2", *sizes, "--quiet"])
    args = ["char-gpt", "--checkpoint-dir", str(tmp_path / "run")]
    args += [
        "--record",
        str(tmp_path / "record"),
        "--dry-run",
        "--scratch",
        str(tmp_path),
    ]
    done = _script("train_shipped.py", *args)
    assert done.returncode == 0, done.stderr[-2000:]
    shipped = load_shipped("char-gpt-shakespeare", directory=tmp_path / "checkpoints")
    assert shipped.entry["metrics"]["steps"] == 2
    assert shipped.tokenizer.decode(shipped.tokenizer.encode("ROMEO:")) == "ROMEO:"
    # evaluate: the held-out loss per character again, written into the record and
    # the manifest entry; the checkpoint's bytes stay, and no path of this machine
    from lib.runs import char_gpt_val_loss
    from lib.utils import read_record

    before = read_record(tmp_path / "record")
    again = ["evaluate", "--directory", str(tmp_path / "checkpoints"), "--allow-dirty"]
    done = _script("train_shipped.py", *again)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "char-gpt-shakespeare: val_loss" in done.stdout
    after = read_record(tmp_path / "record")
    entry = load_shipped(
        "char-gpt-shakespeare", directory=tmp_path / "checkpoints"
    ).entry
    val_loss = char_gpt_val_loss(shipped.model, before["config"]["sizes"])
    assert after["metrics"]["val_loss"] == pytest.approx(val_loss, rel=1e-5)
    assert entry["metrics"]["val_loss"] == after["metrics"]["val_loss"]
    assert entry["sha256"] == shipped.entry["sha256"]
    assert after["command"] == "python scripts/train_shipped.py " + " ".join(
        ["evaluate", "--directory", "DIRECTORY", "--allow-dirty"]
    )
    training = after["extra"]["training"]
    assert training["commit"] == before["commit"] and training["date"] == before["date"]
    assert "--checkpoint-dir CHECKPOINT_DIR" in training["command"]
    assert (
        entry["command"] == training["command"]
        and str(tmp_path) not in entry["command"]
    )
    assert after["curves"] == before["curves"] and after["config"] == before["config"]
    # re-evaluated twice, the record still names the training's own command
    done = _script("train_shipped.py", *again)
    assert done.returncode == 0, done.stderr[-2000:]
    assert read_record(tmp_path / "record")["extra"]["training"] == training


def _absolute_paths(value, where: str = "") -> list[str]:
    """Where ``value`` (JSON data) holds a string, or a word of one (a command), that
    looks like an absolute path: from '/', '~' or a drive letter."""
    from lib.utils import looks_absolute

    if isinstance(value, dict):
        return [p for k, v in value.items() for p in _absolute_paths(v, f"{where}.{k}")]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in _absolute_paths(v, f"{where}[{i}]")]  # fmt: skip
    if not isinstance(value, str):
        return []
    words = [value, *value.split(), *(w.split("=", 1)[1] for w in value.split() if "=" in w)]  # fmt: skip
    return [f"{where}: {w!r}" for w in dict.fromkeys(words) if looks_absolute(w)]


def test_records_and_the_manifest_hold_no_path_of_a_machine():
    """Every record under book/results/ and every entry of the shipped manifest: no
    string, nor any word of a command, is an absolute path ('/...', '~...', 'C:\\...')."""
    from lib.pretrained import CHECKPOINTS, MANIFEST

    assert _absolute_paths({"a": ["x /tmp/y"], "b": "--out=~/z", "c": "C:\\w"}) == [
        ".a[0]: '/tmp/y'",
        ".b: '~/z'",
        ".c: 'C:\\\\w'",
    ]
    files = [*sorted((ROOT / "book" / "results").glob("*/metrics.json"))]
    files.append(CHECKPOINTS / MANIFEST)
    assert len(files) >= 3
    for path in files:
        found = _absolute_paths(json.loads(path.read_text(encoding="utf-8")))
        assert not found, f"{path.relative_to(ROOT)} holds absolute paths: {found}"


@pytest.mark.slow
def test_the_shipped_gpt_records_its_held_out_loss_per_character():
    """The shipped char-GPT's recorded held-out loss is the mean over every character
    of the held-out text (lib.runs.char_gpt_val_loss), in its record and its manifest."""
    from lib.pretrained import load_shipped
    from lib.runs import char_gpt_val_loss
    from lib.utils import read_record

    shipped = load_shipped("char-gpt-shakespeare")
    record = read_record(ROOT / shipped.entry["record"])
    val_loss = char_gpt_val_loss(shipped.model, record["config"]["sizes"])
    assert record["metrics"]["val_loss"] == pytest.approx(val_loss, rel=1e-5)
    assert shipped.entry["metrics"]["val_loss"] == record["metrics"]["val_loss"]


def test_shipped_checkpoints_readme_states_the_intervals_the_files_give():
    """lib/data/checkpoints/README.md's held-out numbers and 95 % intervals are those
    `train_shipped.py intervals` computes from the shipped files (about 6 s)."""
    module = _train_shipped_module()
    from lib.runs import wilson_interval

    low, high = wilson_interval(976, 1000)
    assert (round(low, 3), round(high, 3)) == (0.965, 0.984)
    found = module.intervals()
    readme = (ROOT / "lib" / "data" / "checkpoints" / "README.md").read_text()
    gpt, vit = found["char-gpt-shakespeare"], found["vit-mnist"]
    assert gpt["n"] == 871 and vit["n"] == 1000
    assert f"**{gpt['value']:.3f} nats**" in readme
    assert f"{gpt['low']:.3f}–{gpt['high']:.3f}" in readme
    assert f"**{100 * vit['value']:.1f} %**" in readme
    assert f"{100 * vit['low']:.1f}–{100 * vit['high']:.1f} %" in readme
    books, mlm = found["bert-gutenberg-books"], found["bert-gutenberg-mlm"]
    assert books["n"] == 1200 and books["low"] < books["value"] < books["high"]
    assert f"accuracy **{100 * books['value']:.1f} %**" in readme
    assert f"{100 * books['low']:.1f}–{100 * books['high']:.1f} %" in readme
    assert mlm["low"] < mlm["value"] < mlm["high"]
    assert f"**{mlm['value']:.2f} nats** below" in readme
    assert f"{mlm['low']:.2f}–{mlm['high']:.2f}" in readme
    t5 = found["t5-tatoeba-en-fr"]  # from the manifest, as `evaluate` measured it
    assert t5["n"] == 1480 and t5["low"] < t5["value"] < t5["high"]
    assert f"sacreBLEU **{t5['value']:.1f}**" in readme
    assert f"{t5['low']:.1f}–{t5['high']:.1f}" in readme
