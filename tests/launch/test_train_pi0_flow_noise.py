"""launch/train.py trains a tiny π0 with GRPO and Flow-Noise (`model.pi0.rl_noise=flow_noise`): the run says its noise
head is fresh, the actor scores the rollout's whole chains again (the mismatch before the update is float rounding),
the losses and the learned stds' entropy are finite, and the step's folder is a plain π0 folder with the noise head
beside it, which launch/eval.py evaluates noise-free."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from conftest import read_scalars, run_script
from test_train_pi0 import PI0

from vla_scale.models.families import checkpoint_family


@pytest.mark.slow
def test_grpo_trains_a_tiny_pi0_with_flow_noise_and_its_folder_evaluates(tmp_path: Path) -> None:
    run = tmp_path / "run"
    args = [*(a for a in PI0 if not a.startswith("steps=")), "steps=1", "model.pi0.rl_noise=flow_noise"]
    proc = run_script("train", *args, f"run_dir={run}", timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert "RL's Flow-Noise head (stds in [0.08, 0.16]) freshly initialised (a fresh policy)" in proc.stdout
    scalars = read_scalars(str(run / "tb"))
    for tag in ("train/policy_loss", "train/grad_norm", "train/entropy"):
        assert [s for s, _ in scalars[tag]] == [1] and math.isfinite(scalars[tag][0][1]), tag
    # every step of a chunk stochastic: the entropy sums 10 steps of 4 x 7 Gaussians of std in [0.08, 0.16]
    assert 280 * (0.5 * math.log(2 * math.pi * math.e * 0.08 ** 2)) <= scalars["train/entropy"][0][1] < 0
    assert abs(scalars["train/mismatch_abs_log_ratio"][0][1]) < 1e-4
    step = run / "checkpoints" / "step_1"
    assert checkpoint_family(str(step)).family == "pi0" and (step / "noise_head.safetensors").is_file()

    proc = run_script("eval", "env=pick_place", f"model.checkpoint={run}", "env.num_eval_init_states=1",
                      "env.num_tasks=1", "env.max_steps=8", "parallel.num_workers=1", "parallel.sims_per_worker=2",
                      "progress=false", f"run_dir={tmp_path / 'eval'}", timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
