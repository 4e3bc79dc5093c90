"""One full GRPO step on LIBERO-Spatial through the real entry script (the shipped `libero_spatial` config, shrunk):
2 LIBERO simulator processes, DeepSpeed ZeRO-3, evaluation with a video, TensorBoard."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import TINY_MODEL, read_scalars, script_env

ROOT = Path(__file__).resolve().parents[2]
SMALL = [
    *TINY_MODEL, "algo.batch_size=1", "algo.group_size=2", "algo.mini_batches=1", "algo.micro_batches=1",
    "algo.max_resample_rounds=0", "algo.filter_low=0", "algo.filter_high=1", "env.num_tasks=1",
    "env.num_eval_init_states=1", "env.max_steps=16", "parallel.num_workers=1", "parallel.sims_per_worker=2",
    "env.eval_videos_per_task=1", "progress=false",
]


@pytest.mark.slow
def test_one_grpo_step_on_libero_spatial(tmp_path: Path) -> None:
    env = script_env()  # without the process-group variables an in-process test may have left
    cmd = [sys.executable, str(ROOT / "launch" / "train.py"), "--config-name", "libero_spatial", *SMALL, "steps=1",
           "eval_every=1", "save_every=0", f"run_dir={tmp_path}"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert proc.stdout.strip().splitlines()[-1].startswith("train: steps=1 eval_success_rate=")
    scalars = read_scalars(str(tmp_path / "tb"))
    assert [s for s, _ in scalars["train/policy_loss"]] == [1]
    assert [v for _, v in scalars["train/episodes"]] == [2.0]
    assert [s for s, _ in scalars["eval/success_rate"]] == [0, 1]
    assert [v for _, v in scalars["sync/version"]] == [1]
    videos = sorted(p.name for p in (tmp_path / "videos").rglob("*.mp4"))
    assert videos == ["task_0_init_40_failure.mp4"] * 2, videos


def test_shipped_training_config_validates() -> None:
    from hydra import compose, initialize_config_dir

    from vla_scale.config import register_configs, to_config, validate

    register_configs()
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        cfg = validate(to_config(compose(config_name="libero_spatial")))
    assert (cfg.env.name, cfg.env.suite, cfg.env.max_steps, cfg.env.camera_resolution) == ("libero", "libero_spatial",
                                                                                            220, 128)
    assert (cfg.model.name, cfg.model.proprio_dim, cfg.model.image_size) == ("tiny_libero", 8, 64)
