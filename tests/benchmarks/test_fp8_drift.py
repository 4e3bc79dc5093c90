"""benchmarks/fp8_drift.py as `make test` runs it on the CPU: the whole script at a tiny size, and what it prints."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import script_env

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow  # each runs a benchmark script whole: a few RL steps or rollouts


def test_fp8_drift_dry_run_puts_the_fp8_products_beside_bf16s_spread():
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "fp8_drift.py"), "--model", "tiny", "--dry-run",
                           "--rows", "8", "--micro-batch", "4"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300, env=script_env())
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert [line.split(" | ")[0] for line in lines[-3:-1]] == ["| bf16 reordered", "| fp8_emulated"]
    figures = dict(kv.split("=") for kv in lines[-1].removeprefix("fp8_drift: ").split())
    assert figures["model"] == "tiny" and figures["precision"] == "fp8_emulated"
    assert 0 < float(figures["fp8_mean"]) <= float(figures["fp8_max"]) < 0.5 and float(figures["fp8_grad_cos"]) > 0.99
