"""benchmarks/goal_pixels.py as `make test` runs it on the CPU: the whole script at a tiny size, and what it prints."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import script_env

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow  # each runs a benchmark script whole: a few RL steps or rollouts


def test_goal_pixels_counts_the_goal_site_growing_with_the_resolution():
    pytest.importorskip("metaworld", reason="Meta-World is not installed: `make metaworld`")
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "goal_pixels.py"), "--suite", "reach-v3",
                           "--resolutions", "64", "128", "--placements", "1"], cwd=ROOT, env=script_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    low, high = (re.fullmatch(rf"goal_pixels: resolution={r} median=(\d+) min=(\d+)", line)
                 for r, line in zip((64, 128), lines[-2:], strict=True))
    assert low and high and 0 < int(low[1]) < int(high[1])
    assert re.fullmatch(r"\| reach-v3 \| \d+ \| \d+ \|", lines[2])
