"""The third family end to end on the embedded default (reach): launch/sft.py fine-tunes a tiny SmolVLA into a LeRobot
folder, launch/eval.py plays it, and launch/train.py trains it with each algorithm through the flow objectives π0
uses: GRPO on Flow-SDE chains (a resume from step 1 plays and trains step 2 again exactly), PPO on Flow-Noise chains
with its value head on the VLM's prefix, RLOO with LoRA adapters. Under ZeRO-3, with the rollout engine's weights
checked after every sync; the rollout <-> actor mismatch before the update is 0 in CPU float32."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import read_scalars, run_script

from vla_scale.datasets.episodes import Episode
from vla_scale.datasets.lerobot import write_dataset
from vla_scale.datasets.lerobot_format import LeRobotKeys
from vla_scale.envs.registry import simulator
from vla_scale.models.families import checkpoint_family

COMMON = ["env=reach", "model=smolvla_tiny", "progress=false", "env.num_tasks=1"]
RL = [*COMMON, "algo=grpo", "algo.batch_size=2", "algo.group_size=2", "algo.mini_batches=1", "algo.micro_batches=1",
      "algo.max_resample_rounds=0", "algo.filter_low=0", "algo.filter_high=1", "parallel.num_workers=1",
      "parallel.sims_per_worker=2", "env.num_eval_init_states=2", "env.max_steps=8", "eval_every=0", "steps=2",
      "save_every=1"]


@pytest.fixture(scope="module")
def fine_tuned(tmp_path_factory) -> Path:
    """A tiny SmolVLA fine-tuned for 2 steps on random reach demonstrations (no simulator), as LeRobot folders."""
    rng = np.random.default_rng(0)
    texts = simulator("reach").instructions("reach")
    episodes = [Episode(texts[i % len(texts)], {"agentview": rng.integers(0, 256, (n, 64, 64, 3), dtype=np.uint8)},
                        rng.normal(size=(n, 4)).astype(np.float32), rng.uniform(-1, 1, (n, 7)).astype(np.float32),
                        True) for i, n in enumerate((6, 8))]
    root = tmp_path_factory.mktemp("smolvla")
    demos = write_dataset(root / "demos", episodes, LeRobotKeys(cameras={"agentview": "observation.images.agentview"}),
                          video=False)
    run = root / "sft"
    proc = run_script("sft", *COMMON, f"sft.dataset={demos}", "sft.steps=2", "sft.batch_size=4", f"run_dir={run}")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1].startswith("sft: steps=2 loss=")
    return run


@pytest.mark.slow
def test_sft_writes_a_lerobot_folder_that_eval_plays(fine_tuned: Path) -> None:
    found = checkpoint_family(str(fine_tuned / "checkpoints" / "step_2"))
    assert (found.family, found.layout) == ("smolvla", "lerobot")
    proc = run_script("eval", *COMMON, f"model.checkpoint={fine_tuned}", "env.num_eval_init_states=2",
                      "env.max_steps=8", "parallel.num_workers=1", "parallel.sims_per_worker=2",
                      f"run_dir={fine_tuned.parent / 'eval'}")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "SmolVLA checkpoint, LeRobot layout" in proc.stdout
    assert proc.stdout.strip().splitlines()[-1].startswith("eval: suite=reach episodes=2 success_rate=")


def _trained(run: Path, *args: str) -> dict:
    proc = run_script("train", *args, f"run_dir={run}", timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    scalars = read_scalars(str(run / "tb"))
    for tag in ("train/policy_loss", "train/grad_norm"):
        assert all(math.isfinite(v) for _, v in scalars[tag]), tag
    assert all(abs(v) < 1e-5 for _, v in scalars["train/mismatch_abs_log_ratio"])
    return scalars


@pytest.mark.slow
def test_grpo_trains_it_on_flow_sde_chains_and_a_resume_continues_exactly(fine_tuned: Path, tmp_path: Path) -> None:
    args = [*RL, f"model.checkpoint={fine_tuned}"]
    scalars = _trained(tmp_path / "run", *args)
    assert [s for s, _ in scalars["train/policy_loss"]] == [1, 2]
    assert checkpoint_family(str(tmp_path / "run" / "checkpoints" / "step_2")).family == "smolvla"
    part = tmp_path / "part"
    shutil.copytree(tmp_path / "run", part, ignore=shutil.ignore_patterns("step_2", "tb"))
    (part / "checkpoints" / "latest").write_text("step_1")
    proc = run_script("train", *args, f"run_dir={part}", "resume=true", timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    resumed = read_scalars(str(part / "tb"))
    for tag in ("train/success_rate", "train/env_steps", "train/policy_loss", "train/grad_norm"):
        assert resumed[tag] == [x for x in scalars[tag] if x[0] == 2], tag


@pytest.mark.slow
def test_ppo_trains_it_on_flow_noise_chains_with_a_value_head(fine_tuned: Path, tmp_path: Path) -> None:
    scalars = _trained(tmp_path / "run", *RL, f"model.checkpoint={fine_tuned}", "algo=ppo", "algo.batch_size=4",
                       "algo.group_size=1", "algo.critic.warmup_steps=0", "model.smolvla.rl_noise=flow_noise",
                       "steps=1")
    assert math.isfinite(scalars["train/value_loss"][0][1])
    step = tmp_path / "run" / "checkpoints" / "step_1"
    assert (step / "value_head.safetensors").is_file() and (step / "noise_head.safetensors").is_file()


@pytest.mark.slow
def test_rloo_trains_its_lora_adapters(fine_tuned: Path, tmp_path: Path) -> None:
    from safetensors import safe_open

    _trained(tmp_path / "run", *RL, f"model.checkpoint={fine_tuned}", "algo=rloo", "model.lora.rank=4", "steps=1")
    step = tmp_path / "run" / "checkpoints" / "step_1"
    assert checkpoint_family(str(step)).family == "smolvla"
    with safe_open(str(step / "adapter_model.safetensors"), "pt") as adapters:
        assert any(".lm_expert." in key for key in adapters.keys())
