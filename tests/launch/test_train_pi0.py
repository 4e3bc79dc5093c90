"""launch/train.py trains a tiny π0 on pick_place with GRPO through the one interface: the rollout samples Flow-SDE
chains, the actor scores them again (the rollout <-> actor mismatch before the update is 0 in CPU float32), the
losses are finite, each step's checkpoint is a π0 folder, and a resume from step 1 plays and trains step 2 again
exactly."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest
from conftest import ROOT, read_scalars, run_script

from vla_scale.models.families import checkpoint_family

TOKENIZER = ROOT / "tests" / "fixtures" / "openpi_reference" / "tokenizer.model"
PI0 = ["env=pick_place", "model=pi0_tiny", f"model.pi0.tokenizer={TOKENIZER}", "model.pi0.max_token_len=24",
       "algo=grpo", "algo.batch_size=2", "algo.group_size=2", "algo.mini_batches=1", "algo.micro_batches=1",
       "algo.max_resample_rounds=0", "algo.filter_low=0", "algo.filter_high=1", "parallel.num_workers=1",
       "parallel.sims_per_worker=2", "env.num_eval_init_states=2", "env.num_tasks=1", "env.max_steps=8",
       "eval_every=10", "progress=false", "steps=2", "save_every=1"]


@pytest.mark.slow
def test_grpo_trains_a_tiny_pi0_and_a_resume_continues_exactly(tmp_path: Path) -> None:
    run = tmp_path / "run"
    proc = run_script("train", *PI0, f"run_dir={run}", timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    scalars = read_scalars(str(run / "tb"))
    for tag in ("train/policy_loss", "train/grad_norm", "train/entropy"):
        assert [s for s, _ in scalars[tag]] == [1, 2] and all(math.isfinite(v) for _, v in scalars[tag]), tag
    for tag in ("train/mismatch_abs_log_ratio", "train/mismatch_approx_kl"):
        assert all(abs(v) < 1e-5 for _, v in scalars[tag]), (tag, scalars[tag])
    assert checkpoint_family(str(run / "checkpoints" / "step_2")).family == "pi0"

    part = tmp_path / "part"
    shutil.copytree(run, part, ignore=shutil.ignore_patterns("step_2", "tb"))
    (part / "checkpoints" / "latest").write_text("step_1")
    proc = run_script("train", *PI0, f"run_dir={part}", "resume=true", timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    resumed = read_scalars(str(part / "tb"))
    for tag in ("train/success_rate", "train/env_steps", "train/policy_loss", "train/grad_norm"):
        assert resumed[tag] == [x for x in scalars[tag] if x[0] == 2], tag
    # the same chains' stochastic steps: the entropy agrees up to the order its float32 mean sums the rows in
    assert resumed["train/entropy"][0][1] == pytest.approx(scalars["train/entropy"][1][1], rel=1e-6)
