#!/usr/bin/env python3
"""Repeat a recorded run from its record: `python scripts/rerun_record.py book/results/X/metrics.json`.

Every record under book/results/ stores the exact command that made it (the key
"command"); this runs that command again from the repository root, so a reader can
compare their numbers with ours. `--print` only shows the command.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def recorded_command(path: Path) -> list[str]:
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        sys.exit(f"no record at {path}")
    except json.JSONDecodeError as error:
        sys.exit(f"{path} is not valid JSON: {error}")
    command = record.get("command")
    if not isinstance(command, str) or not command.strip():
        sys.exit(f"{path} has no 'command' to repeat")
    return shlex.split(command)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("record", type=Path, help="a metrics.json under book/results/")
    parser.add_argument(
        "--print", action="store_true", help="show the command, run nothing"
    )
    args = parser.parse_args()
    command = recorded_command(args.record)
    print("$", shlex.join(command), flush=True)
    if args.print:
        return 0
    env = dict(os.environ)
    while command and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", command[0]):
        name, value = command.pop(0).split(
            "=", 1
        )  # a leading VAR=value, as a shell reads it
        env[name] = value
    return subprocess.run(command, cwd=ROOT, env=env, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
