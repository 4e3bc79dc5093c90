"""launch/train.py trains a tiny π0 on pick_place through the one interface, with GRPO and with PPO (its value head
on the PaliGemma prefix): the rollout samples Flow-SDE chains, the actor scores them again (the rollout <-> actor
mismatch before the update is 0 in CPU float32), the losses are finite, each step's checkpoint is a π0 folder (with
PPO, its value head beside it), and a resume from step 1 plays and trains step 2 again exactly."""

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


def _resumed_from_step_1(run: Path, part: Path, args: list[str]) -> dict:
    """The scalars of `run` stopped after step 1 (copied into `part`) and resumed there."""
    shutil.copytree(run, part, ignore=shutil.ignore_patterns("step_2", "tb"))
    (part / "checkpoints" / "latest").write_text("step_1")
    proc = run_script("train", *args, f"run_dir={part}", "resume=true", timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return read_scalars(str(part / "tb"))


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

    resumed = _resumed_from_step_1(run, tmp_path / "part", PI0)
    for tag in ("train/success_rate", "train/env_steps", "train/policy_loss", "train/grad_norm"):
        assert resumed[tag] == [x for x in scalars[tag] if x[0] == 2], tag
    # the same chains' stochastic steps: the entropy agrees up to the order its float32 mean sums the rows in
    assert resumed["train/entropy"][0][1] == pytest.approx(scalars["train/entropy"][1][1], rel=1e-6)


PPO = [*PI0, "algo=ppo", "algo.batch_size=4", "algo.group_size=1", "algo.critic.warmup_steps=0"]
CRITIC_SCALARS = ("train/value_loss", "train/value_mean", "train/return_mean", "train/advantage_std")


@pytest.mark.slow
def test_ppo_trains_a_tiny_pi0_with_a_value_head_on_its_prefix_and_a_resume_continues_exactly(tmp_path: Path) -> None:
    run = tmp_path / "run"
    proc = run_script("train", *PPO, f"run_dir={run}", timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert "critic: a fresh value head (the policy is a fresh one)" in proc.stdout
    scalars = read_scalars(str(run / "tb"))
    for tag in ("train/policy_loss", "train/grad_norm", *CRITIC_SCALARS):
        assert [s for s, _ in scalars[tag]] == [1, 2] and all(math.isfinite(v) for _, v in scalars[tag]), tag
    assert scalars["train/value_loss"][0][1] > 0  # the fresh head predicts 0, the returns are not all 0 ...
    assert scalars["train/value_mean"][1][1] != 0  # ... and its first step moved it
    assert abs(scalars["train/mismatch_abs_log_ratio"][0][1]) < 1e-5
    step = run / "checkpoints" / "step_2"
    assert checkpoint_family(str(step)).family == "pi0" and (step / "value_head.safetensors").is_file()

    resumed = _resumed_from_step_1(run, tmp_path / "part", PPO)
    for tag in ("train/success_rate", "train/env_steps"):
        assert resumed[tag] == [x for x in scalars[tag] if x[0] == 2], tag
    # the same episodes and chains; sums over rows agree up to the order float32 adds them in (as the entropy above;
    # the policy loss of normalised advantages at ratio 1 is 0 up to that rounding, hence the absolute bound too)
    for tag in ("train/policy_loss", "train/grad_norm", *CRITIC_SCALARS):
        assert resumed[tag][0][1] == pytest.approx(scalars[tag][1][1], rel=1e-6, abs=1e-6), tag

    proc = run_script("train", *[a for a in PPO if not a.startswith(("model=", "model.pi0."))], "steps=1",
                      "save_every=0", f"model.checkpoint={run}", f"run_dir={tmp_path / 'again'}", timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert f"critic: the value head of {step}" in proc.stdout


@pytest.mark.slow
def test_lora_trains_a_tiny_pi0_and_its_folder_is_a_plain_pi0_with_the_adapters_beside(tmp_path: Path) -> None:
    from safetensors import safe_open

    run = tmp_path / "run"
    proc = run_script("train", *PI0, "model.lora.rank=4", "steps=1", f"run_dir={run}", timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    step = run / "checkpoints" / "step_1"
    assert checkpoint_family(str(step)).family == "pi0"
    with safe_open(str(step / "adapter_model.safetensors"), "pt") as adapters, \
            safe_open(str(step / "model.safetensors"), "pt") as policy:
        assert any(".gemma_expert." in key for key in adapters.keys())
        assert not any("lora_" in key for key in policy.keys())  # the weights merged, the adapters beside
    proc = run_script("eval", "env=pick_place", f"model.checkpoint={run}", "env.num_eval_init_states=1",
                      "env.num_tasks=1", "env.max_steps=8", "parallel.num_workers=1", "parallel.sims_per_worker=2",
                      "progress=false", f"run_dir={tmp_path / 'eval'}", timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
