"""launch/eval.py on π0 folders (openpi's and LeRobot's layout) and a fresh model=pi0_tiny: the eval episodes of
pick_place played through the rollout engine's π0 decode, the same table and last line as for OFT; launch/train.py
refuses PPO for a π0 policy before anything starts (GRPO trains it: tests/launch/test_train_pi0.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from conftest import ROOT, run_script

sys.path.insert(0, str(ROOT / "tests" / "rollout"))
from test_pi0_decode import TOKENIZER, write_tiny_pi0  # noqa: E402

EVAL = ["env=pick_place", "env.num_tasks=1", "env.num_eval_init_states=2", "env.max_steps=8",
        "parallel.num_workers=1", "parallel.sims_per_worker=2", "progress=false", "env.eval_videos_per_task=1"]


@pytest.mark.slow
@pytest.mark.parametrize(("pi05", "layout"), [(False, "openpi"), (True, "lerobot")])
def test_a_pi0_folder_evaluates_on_pick_place(tmp_path: Path, pi05: bool, layout: str) -> None:
    folder = write_tiny_pi0(tmp_path / "pi0", pi05=pi05, layout=layout)
    proc = run_script("eval", *EVAL, f"model.checkpoint={folder}", f"run_dir={tmp_path / 'run'}", timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("eval: suite=pick_place episodes=2 success_rate="), last
    assert ("π0.5" if pi05 else "π0") in proc.stdout and "norm stats '" in proc.stdout, proc.stdout[-2000:]
    assert (tmp_path / "run" / "eval_pick_place.csv").is_file()


@pytest.mark.slow
def test_a_fresh_pi0_evaluates(tmp_path: Path) -> None:
    proc = run_script("eval", *EVAL, "model=pi0_tiny", f"model.pi0.tokenizer={TOKENIZER}",
                      "model.pi0.max_token_len=24", f"run_dir={tmp_path}", timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert proc.stdout.strip().splitlines()[-1].startswith("eval: suite=pick_place episodes=2 success_rate=")


def test_eval_refuses_to_record_a_pi0_policys_episodes_before_anything_starts(tmp_path: Path) -> None:
    folder = write_tiny_pi0(tmp_path / "pi0")
    proc = run_script("eval", *EVAL, f"model.checkpoint={folder}", f"record.path={tmp_path / 'demos'}",
                      f"run_dir={tmp_path / 'run'}", timeout=120)
    assert proc.returncode != 0 and "drop record.path" in proc.stderr, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and not (tmp_path / "demos").exists()
