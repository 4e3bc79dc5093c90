"""Meta-World through the entry scripts: the experts' demonstrations recorded with LeRobot's Meta-World features
(failures dropped and counted per task) re-read to the episodes played, in both layouts; a tiny policy fine-tunes on
them and its checkpoint is evaluated (tasks, difficulty groups, TensorBoard); a dataset of other cameras than the
policy's is refused before any compute."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT, read_scalars, run_script
from hydra import compose, initialize_config_dir

pytestmark = pytest.mark.slow  # launches the entry scripts: demonstrations, a fine-tune, an evaluation
pytest.importorskip("av", reason="PyAV (the av package) writes and reads the datasets' videos: `make install`")
pytest.importorskip("metaworld", reason="Meta-World is not installed: `make metaworld`")

from vla_scale.datasets.lerobot import LeRobotKeys, read_dataset  # noqa: E402
from vla_scale.envs.metaworld import MetaWorldEnv  # noqa: E402
from vla_scale.envs.metaworld_demo import play_expert  # noqa: E402
from vla_scale.envs.types import TaskSpec  # noqa: E402

SMALL = ["env=metaworld_mt10", "env.num_tasks=2", "env.camera_resolution=32", "env.max_steps=60"]
"""reach-v3 (its expert needs 41-51 steps from these states) and push-v3 (65-68: cut at 60, so it fails)."""
KEYS = LeRobotKeys(cameras={"corner2": "observation.image"})


@pytest.fixture(scope="module")
def demonstrations(tmp_path_factory) -> dict[str, Path]:
    """The same 4 episodes recorded in both layouts."""
    root = tmp_path_factory.mktemp("metaworld_demos")
    out = {}
    for version in ("v3.0", "v2.1"):
        out[version] = root / version
        proc = run_script("demonstrate", *SMALL, "demo.episodes=4", f"record.path={out[version]}",
                          f"record.version={version}", f"hydra.run.dir={root / 'hydra'}", timeout=300)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        lines = proc.stdout.strip().splitlines()
        assert "task 0 (reach-v3): played=2 succeeded=2 dropped=0" in lines
        assert "task 1 (push-v3): played=2 succeeded=0 dropped=2" in lines
        assert lines[-1].startswith("demonstrate: episodes=4 recorded=2 success_rate=0.500")
    return out


@pytest.mark.parametrize("version", ["v3.0", "v2.1"])
def test_expert_demonstrations_have_lerobots_features_and_re_read(demonstrations, version: str) -> None:
    info = json.loads((demonstrations[version] / "meta" / "info.json").read_text())
    features = info["features"]
    assert (info["codebase_version"], info["fps"], info["robot_type"]) == (version, 80, "metaworld")
    assert features["observation.image"]["shape"] == [32, 32, 3]
    shapes = {k: features[k]["shape"] for k in ("observation.state", "action", "observation.environment_state",
                                                "next.reward", "next.success")}
    assert shapes == {"observation.state": [4], "action": [4], "observation.environment_state": [39],
                      "next.reward": [1], "next.success": [1]}
    read = read_dataset(demonstrations[version], KEYS, action_dim=4, state_dim=4)
    env = MetaWorldEnv(camera_resolution=32, max_steps=60)
    played = [play_expert(env, TaskSpec("mt10", 0, k), 0.0, np.random.default_rng(0)) for k in (0, 1)]
    env.close()
    assert len(read) == 2 and all(e.success for e in read)
    for got, want in zip(read, played, strict=True):
        assert got.instruction == "Reach a goal position" and want.success
        assert np.array_equal(got.actions, want.actions) and np.array_equal(got.state, want.state)
        error = np.abs(got.images["corner2"].astype(np.int16) - want.images["corner2"])
        assert got.images["corner2"].shape == want.images["corner2"].shape and error.max() <= 2


def test_a_tiny_policy_fine_tunes_evaluates_and_other_cameras_are_refused(demonstrations, tmp_path: Path) -> None:
    run = tmp_path / "sft"
    proc = run_script("sft", *SMALL, "model=tiny_metaworld", f"sft.dataset={demonstrations['v3.0']}",
                      "sft.steps=2", "sft.batch_size=8", f"run_dir={run}", "progress=false", timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (run / "checkpoints").is_dir()
    evaluated = tmp_path / "eval"
    proc = run_script("eval", *SMALL, f"model.checkpoint={run}", "env.num_eval_init_states=1",
                      "rollout.pipeline_stage_num=2", f"run_dir={evaluated}", "progress=false", timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("eval: suite=mt10 obs=agent episodes=2 success_rate=") and "macro_success_rate=" in last
    table = (evaluated / "eval_mt10.md").read_text()
    assert "| 0 | reach-v3: Reach a goal position | 1 |" in table and "| easy | 1 | 1 |" in table
    assert "| hard | 1 | 1 |" in table and "**macro**" in table and "init states 1000-1000" in table
    # without env.camera_resolution on the command line, the checkpoint renders at the side it was trained at, not
    # at the env config's 480 px
    from vla_scale.config import register_configs, to_config
    from vla_scale.run_setup import adopt_trained_resolution
    register_configs()
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        cfg = to_config(compose(config_name="config", overrides=["env=metaworld_mt10", f"model.checkpoint={run}"]))
    assert cfg.env.camera_resolution == 480
    adopt_trained_resolution(cfg, explicit=["model.checkpoint"])
    assert cfg.env.camera_resolution == 32
    cfg.env.camera_resolution = 128
    adopt_trained_resolution(cfg, explicit=["model.checkpoint", "env.camera_resolution"])
    assert cfg.env.camera_resolution == 128
    scalars = read_scalars(str(evaluated / "tb"))
    assert {"eval/task_1_success_rate", "eval/group_easy_success_rate", "eval/group_hard_success_rate",
            "eval/group_macro_success_rate"} <= set(scalars)
    refused = run_script("sft", "env=pick_place", "model=tiny_pick_place", f"sft.dataset={demonstrations['v3.0']}",
                         f"run_dir={tmp_path / 'refused'}", timeout=120)
    assert refused.returncode != 0
    assert "camera 'agentview' maps to 'observation.images.agentview', which the dataset does not have" in \
        refused.stderr and "observation.image" in refused.stderr, refused.stderr[-2000:]
