"""benchmarks/follows_instruction.py as `make test` runs it on the CPU: the whole script, and what it prints."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import script_env

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow  # each runs a benchmark script whole: a few RL steps or rollouts


def test_follows_instruction_scores_the_demonstrator_fully_and_needs_one_policy():
    script = str(ROOT / "benchmarks" / "follows_instruction.py")
    proc = subprocess.run([sys.executable, script, "--demonstrator", "--layouts", "3"], cwd=ROOT, env=script_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == ("follows_instruction: policy=demonstrator first_state=0 "
                                                    "start_spread=0.03 towards_named_cube=24/24")
    both = subprocess.run([sys.executable, script, "runs/x", "--demonstrator"], cwd=ROOT, env=script_env(),
                          capture_output=True, text=True, timeout=300)
    assert both.returncode == 2 and "not both" in both.stderr
