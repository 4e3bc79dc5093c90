"""benchmarks/update_profile.py as `make test` runs it on the CPU: the whole script at a tiny size, what it prints."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import script_env

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow  # each runs a benchmark script whole: a few RL steps or rollouts


def test_update_profile_dry_run_profiles_the_phases_and_runs_every_lever():
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "update_profile.py"), "--model", "tiny",
                           "--dry-run", "--loop-steps", "1", "--profile", "", "mb=4",
                           "--variants", "mb=4,recompute=0", "overlap=0,resident=1,kernels=eager"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600, env=script_env())
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert sum(line.startswith("profile of one update") for line in lines) == 2
    phases = [line.split(" | ")[0] for line in lines if line.startswith(("| forward", "| backward", "| step "))]
    assert phases == ["| forward", "| backward", "| step"] * 2
    assert any(line.startswith("step in the loop: ") for line in lines)
    rows = [line for line in lines if line.startswith(("| as configured", "| mb=4,recompute=0", "| overlap=0"))]
    assert len(rows) == 6  # each variant as it runs, then in the table
    assert re.fullmatch(r"update_profile: base_s=\d+\.\d\d base_mfu=\d+\.\d{3} best=\S+ best_s=\d+\.\d\d "
                        r"best_mfu=\d+\.\d{3}", lines[-1])
    bad = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "update_profile.py"), "--variants", "mb=4,x=1"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120, env=script_env())
    assert bad.returncode != 0 and "'x=1' is not key=value" in bad.stdout + bad.stderr
    if not torch.cuda.is_available():
        no_gpu = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "update_profile.py"), "--variants",
                                 "kernels=liger"], cwd=ROOT, capture_output=True, text=True, timeout=120,
                                env=script_env())
        assert no_gpu.returncode != 0
        assert "--variants 'kernels=liger': model.kernels=liger runs Liger Kernel's Triton kernels on a CUDA GPU" in (
            no_gpu.stdout + no_gpu.stderr)


def test_update_profile_profile_none_runs_only_the_levers_and_fp8_is_one():
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "update_profile.py"), "--model", "tiny",
                           "--dry-run", "--profile", "none", "--variants", "precision=fp8"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600, env=script_env())
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert not any(line.startswith(("profile of one update", "| forward")) for line in lines)
    assert sum(line.startswith("| precision=fp8 |") for line in lines) == 2
    assert lines[-1].startswith("update_profile: base_s=")
    both = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "update_profile.py"), "--profile", "none", "mb=4"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120, env=script_env())
    assert both.returncode != 0 and "--profile none means no profile" in both.stderr
