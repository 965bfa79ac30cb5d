"""The record scripts of book/results/: re-running a record, refusing to record on a CPU."""

from __future__ import annotations

import json
import subprocess
import sys
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
    import importlib.util

    from lib.utils import read_record

    spec = importlib.util.spec_from_file_location(
        "gpu_records", ROOT / "scripts" / "gpu_records.py"
    )
    gpu_records = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_records)
    monkeypatch.setattr(gpu_records, "RESULTS", tmp_path)
    monkeypatch.setattr(gpu_records, "ROOT", tmp_path)
    command = [sys.executable, "scripts/gpu_records.py", "throughput"]
    path = gpu_records.record("throughput", {"eager": {"exit_code": 0}}, command, 3.14)
    saved = read_record(path)
    assert saved["name"] == "throughput" and saved["wall_seconds"] == 3.1
    assert saved["metrics"] == {"eager": {"exit_code": 0}}
    assert saved["command"].endswith("scripts/gpu_records.py throughput")
