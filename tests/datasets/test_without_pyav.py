"""The modules whose imports need PyAV are skipped with the reason when it is missing, not collection errors that stop
a run (`pytest -m gpu` on a machine without it): collected here in a pytest of its own, with `av` not importable."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from conftest import script_env

ROOT = Path(__file__).resolve().parents[2]
NEEDS_PYAV = ["tests/datasets/test_lerobot.py", "tests/launch/test_demonstrate.py", "tests/launch/test_eval_record.py",
              "tests/sft/test_sft_run.py"]
WITHOUT_PYAV = """
import sys
from importlib.abc import MetaPathFinder


class NotInstalled(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "av":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, NotInstalled())
import pytest

sys.exit(pytest.main(sys.argv[1:]))
"""


def test_without_pyav_its_modules_are_skipped_with_the_reason() -> None:
    proc = subprocess.run([sys.executable, "-c", WITHOUT_PYAV, "-m", "gpu", "-rs", "-p", "no:cacheprovider",
                           *NEEDS_PYAV], cwd=ROOT, env=script_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode in (0, 5), proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "error" not in proc.stdout.lower(), proc.stdout[-3000:]
    skipped = [line for line in proc.stdout.splitlines() if line.startswith("SKIPPED")]
    assert len(skipped) == len(NEEDS_PYAV), proc.stdout[-3000:]
    assert all("PyAV (the av package) writes and reads the datasets' videos" in line for line in skipped)
