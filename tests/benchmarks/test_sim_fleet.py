"""benchmarks/sim_fleet.py as `make test` runs it on the CPU: the whole script at a tiny size, and what it prints."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import script_env

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow  # each runs a benchmark script whole: a few RL steps or rollouts


def test_sim_fleet_steps_meta_world_beside_pick_place():
    pytest.importorskip("metaworld", reason="Meta-World is not installed: `make metaworld`")
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "sim_fleet.py"), "--seconds", "1", "--sims", "2",
                           "--procs", "1", "--override", "env.camera_resolution=32"], cwd=ROOT, env=script_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("sim_fleet:")]
    assert [ln.split()[1] for ln in lines] == ["env=metaworld_mt10", "env=pick_place"]
    for line in lines:
        assert re.fullmatch(r"sim_fleet: env=\S+ sims=2 procs=1 resolution=32 env_steps_per_s=[\d.]+", line), line
        assert float(line.rsplit("=", 1)[1]) > 0
