"""benchmarks/learning_curves.py as `make test` runs it on the CPU: the whole script, and what it prints."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import script_env

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow  # each runs a benchmark script whole: a few RL steps or rollouts


def test_learning_curves_puts_runs_side_by_side_at_equal_environment_steps(tmp_path):
    """Two runs' real TensorBoard files: each evaluation with the environment steps trained on before it, then each
    run's last evaluation within the smaller final count."""
    from torch.utils.tensorboard import SummaryWriter

    for name, per_step, rates in (("a", 100, [0.1, 0.5, 0.9]), ("b", 40, [0.2, 0.3, 0.4])):
        writer = SummaryWriter(str(tmp_path / name / "tb"))
        for step in range(0, 21):
            if step:
                writer.add_scalar("train/env_steps", per_step, step)
            if step % 10 == 0:
                writer.add_scalar("eval/success_rate", rates[step // 10], step)
        writer.close()
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "learning_curves.py"), f"a={tmp_path / 'a'}",
                           f"b={tmp_path / 'b'}"], cwd=ROOT, env=script_env(), capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "| a | 20 | 2000 |" in proc.stdout and "| b | 20 | 800 |" in proc.stdout
    budget = proc.stdout.split("at 800 environment steps:")[1]
    assert "| a | 0 | 0 |" in budget and budget.strip().endswith("| 0.400 |")
