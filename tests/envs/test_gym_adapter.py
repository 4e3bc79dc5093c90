"""The gymnasium adapter: gymnasium's own `check_env` passes on the embedded task (LIBERO's run is in
test_libero.py), seeded resets repeat, and terminated/truncated follow success and the step limit."""

from __future__ import annotations

import os

os.environ.setdefault("MUJOCO_GL", "egl")

import warnings

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from vla_scale.envs.gym_adapter import GymEnv
from vla_scale.envs.reach import ReachEnv


def checked(env: GymEnv, **kwargs) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(env, **kwargs)
    return [str(w.message) for w in caught if "infinity" not in str(w.message) and "spec" not in str(w.message)]


@pytest.mark.parametrize("chunk_len", [1, 8])
def test_check_env_passes_on_reach(chunk_len: int) -> None:
    env = GymEnv("reach", suite="reach", task_id=1, chunk_len=chunk_len, render_mode="rgb_array",
                 camera_resolution=32)
    assert checked(env) == []
    assert env.action_space.shape == ((7,) if chunk_len == 1 else (chunk_len, 7))
    assert env.observation_space["images"]["agentview"].shape == (32, 32, 3)
    assert env.render().shape == (32, 32, 3)
    env.close()


def test_seeded_resets_repeat_and_options_pick_the_episode() -> None:
    env = GymEnv(ReachEnv(camera_resolution=32), suite="reach", init_state_ids=range(50))
    a, info = env.reset(seed=7)
    b, _ = env.reset(seed=7)
    assert np.array_equal(a["images"]["agentview"], b["images"]["agentview"]) and info["instruction"]
    _, info = env.reset(options={"task_id": 2, "init_state_id": 45})
    assert (info["task"].task_id, info["task"].init_state_id, info["instruction"]) == (2, 45, "reach the blue block")
    env.close()


def test_terminated_on_success_truncated_at_the_step_limit() -> None:
    env = GymEnv(ReachEnv(camera_resolution=32, max_steps=3, max_delta=0.06), suite="reach", task_id=0)
    env.reset(seed=0)
    away = np.array([1.0, -1.0, 0.0, 0.0, 0.0, 0.0, 0.0], dtype=np.float32)  # red block is left: go right
    results = [env.step(away) for _ in range(3)]
    assert [r[2:4] for r in results] == [(False, False), (False, False), (False, True)]
    with pytest.raises(RuntimeError, match="after the episode ended"):
        env.step(away)
    ee, blocks = ReachEnv.init_state(0, 0)
    env.reset(options={"init_state_id": 0})
    toward = np.zeros(7, dtype=np.float32)
    toward[:2] = np.clip((blocks[0, :2] - ee[:2]) / 0.06, -1, 1)
    for _ in range(3):
        _, reward, terminated, truncated, info = env.step(toward)
        if terminated or truncated:
            break
    assert terminated and not truncated and reward == 1.0 and info["success"]
    env.close()
