"""launch/eval.py record.path=DIR: the episodes played, written as a LeRobot dataset, re-read to the very episodes the
env plays from their init states with the recorded actions (every frame within the default video codec's 2 levels,
the state, the outcome), and the first chunk's actions are the policy's greedy decode of the first observation."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import TINY_ENV, TINY_MODEL, run_script

# before the imports that need it: without PyAV the module is skipped, not a collection error
pytest.importorskip("av", reason="PyAV (the av package) writes and reads the datasets' videos: `make install`")

from vla_scale.datasets.lerobot import LeRobotKeys, read_dataset  # noqa: E402
from vla_scale.envs.registry import make_env  # noqa: E402
from vla_scale.rollout.sampler import eval_specs  # noqa: E402
from vla_scale.run_policy import vla_for_env  # noqa: E402

SMALL = [*TINY_MODEL, *TINY_ENV, "env.max_steps=16", "progress=false", "seed=3"]
VIDEO_ERROR = 2
"""The most an RGB value moves through the default video codec (h264_yuv444, tests/datasets/test_lerobot.py)."""


def _record(tmp_path: Path, name: str, *args: str) -> tuple[str, Path]:
    out = tmp_path / name
    proc = run_script("eval", *SMALL, f"record.path={out}", f"run_dir={tmp_path / ('run_' + name)}", *args,
                      timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc.stdout, out


@pytest.mark.slow
def test_recorded_episodes_re_read_to_what_the_env_plays_with_their_actions(tmp_path: Path, tiny_config) -> None:
    stdout, out = _record(tmp_path, "all", "record.episodes=all")
    cfg = tiny_config("env.max_steps=16", "seed=3")
    env = cfg.env
    specs = eval_specs(env)
    assert f"record: {len(specs)} episodes (all) -> {out}" in stdout
    episodes = read_dataset(out, LeRobotKeys({"agentview": "observation.images.agentview"}), action_dim=7,
                            state_dim=4)
    assert len(episodes) == len(specs)
    torch.manual_seed(3)  # launch/eval.py's fresh policy: the same seed, the same weights
    vla = vla_for_env(cfg.model, env)
    sim = make_env(env.name, **env.simulator_kwargs())
    for episode, spec in zip(episodes, specs, strict=True):  # the evaluation played again, here, chunk by chunk
        observation, t, step = sim.reset(spec), 0, None
        assert episode.instruction == observation.instruction
        while step is None or not step.done:
            for action in vla.predict([observation]).env_actions[0]:
                frame, seen = episode.images["agentview"][t], observation.images["agentview"]
                assert frame.shape == seen.shape
                assert np.abs(frame.astype(np.int16) - seen.astype(np.int16)).max() <= VIDEO_ERROR
                assert np.array_equal(episode.state[t], observation.proprio.astype(np.float32))
                assert np.array_equal(episode.actions[t], action.astype(np.float32))
                step, t = sim.step(action[None]), t + 1
                observation = step.observation
                if step.done:
                    break
        assert t == len(episode) and step.success == episode.success
    successes = sum(e.success for e in episodes)
    assert 0 < successes < len(episodes)  # both kinds recorded
    stdout, out = _record(tmp_path, "successes", "record.episodes=successes")
    assert f"record: {successes} episodes (successes) -> {out}" in stdout


def test_a_non_empty_record_path_is_refused_before_anything_starts(tmp_path: Path) -> None:
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "file").write_text("x")
    proc = run_script("eval", *SMALL, f"record.path={tmp_path / 'taken'}", f"run_dir={tmp_path / 'run'}", timeout=120)
    assert proc.returncode != 0 and "is not empty" in proc.stderr
    assert {p.name for p in (tmp_path / "run").iterdir()} <= {".hydra", "eval.log"}  # Hydra's record, nothing played
