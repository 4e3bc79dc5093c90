"""benchmarks/sft_step.py as `make test` runs it on the CPU: the whole script at a tiny size, and what it prints."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import script_env

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow  # each runs a benchmark script whole: a few RL steps or rollouts


def test_sft_step_dry_run_prints_the_table_and_the_last_line():
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "sft_step.py"), "--model", "tiny", "--dry-run"],
                          cwd=ROOT, env=script_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert re.fullmatch(r"sft_step: model=tiny lora_rank=32 batch=8 step_s=\d+\.\d{3} peak_gib=(nan|\d+\.\d)",
                        lines[-1]), lines[-1]
    assert "| 0 (warm-up) |" in proc.stdout and "| 1 |" in proc.stdout
