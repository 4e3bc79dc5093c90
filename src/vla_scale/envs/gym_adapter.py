"""Our simulators as `gymnasium.Env`, for lerobot-style tools and users' own loops.

    from vla_scale.envs.gym_adapter import GymEnv
    env = GymEnv("libero", suite="libero_spatial", task_id=0)          # LiberoEnv(camera_resolution=128, ...)
    obs, info = env.reset(seed=0)                                        # info["instruction"]: the task's words
    obs, reward, terminated, truncated, info = env.step(env.action_space.sample())

- One gymnasium step is `chunk_len` env steps (default 1: one 7-D action, shape (7,)); with chunk_len > 1 the action
  is a chunk of shape (chunk_len, 7), executed as `Env.step` does (it stops early at the end of the episode).
- Observations: {"images": {camera: uint8[H, W, 3]}, "proprio": float32[d]}; the instruction, fixed for a task, is in
  `info["instruction"]`. The spaces are read from one reset at construction.
- An episode is one TaskSpec of the suite: `reset(seed=...)` draws the task's init state from `init_state_ids` with
  its own RNG (seeded resets are reproducible); `reset(options={"task_id": t, "init_state_id": k})` picks them.
- terminated = success (reward 1.0); truncated = the step limit ended the episode without success.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from vla_scale.envs.registry import make_env
from vla_scale.envs.types import Env, Observation, TaskSpec


class GymEnv(gym.Env):
    """A vla_scale `Env` behind gymnasium's API (see the module docstring)."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 20}  # LIBERO's control frequency

    def __init__(self, env: str | Env, suite: str, task_id: int = 0, init_state_ids: Sequence[int] | None = None,
                 chunk_len: int = 1, render_mode: str | None = None, **env_kwargs: Any) -> None:
        if chunk_len < 1:
            raise ValueError(f"chunk_len must be >= 1, got {chunk_len}")
        if render_mode not in (None, "rgb_array"):
            raise ValueError(f"render_mode must be None or 'rgb_array', got {render_mode!r}")
        self.sim: Env = make_env(env, **env_kwargs) if isinstance(env, str) else env
        self.suite, self.task_id, self.chunk_len, self.render_mode = suite, task_id, chunk_len, render_mode
        self.init_state_ids = list(init_state_ids) if init_state_ids is not None else list(range(10))
        if not self.init_state_ids:
            raise ValueError("init_state_ids must not be empty")
        self.action_dim = int(getattr(self.sim, "ACTION_DIM", 7))
        first = self.sim.reset(TaskSpec(suite, task_id, self.init_state_ids[0]))
        self.observation_space = spaces.Dict({
            "images": spaces.Dict({name: spaces.Box(0, 255, image.shape, np.uint8)
                                   for name, image in first.images.items()}),
            "proprio": spaces.Box(-np.inf, np.inf, first.proprio.shape, np.float32),
        })
        shape = (self.action_dim,) if chunk_len == 1 else (chunk_len, self.action_dim)
        self.action_space = spaces.Box(-1.0, 1.0, shape, np.float32)
        self._last: Observation = first
        self._task = TaskSpec(suite, task_id, self.init_state_ids[0])
        self._running = False

    @staticmethod
    def _obs(observation: Observation) -> dict[str, Any]:
        return {"images": dict(observation.images), "proprio": observation.proprio.astype(np.float32)}

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None
              ) -> tuple[dict[str, Any], dict[str, Any]]:
        super().reset(seed=seed)
        options = options or {}
        task_id = int(options.get("task_id", self.task_id))
        state = options.get("init_state_id")
        if state is None:
            state = self.init_state_ids[int(self.np_random.integers(len(self.init_state_ids)))]
        self._task = TaskSpec(self.suite, task_id, int(state))
        self._last = self.sim.reset(self._task)
        self._running = True
        return self._obs(self._last), {"instruction": self._last.instruction, "task": self._task}

    def step(self, action: np.ndarray) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        if not self._running:
            raise RuntimeError("step() called before reset() or after the episode ended")
        chunk = np.asarray(action, dtype=np.float32).reshape(self.chunk_len, self.action_dim)
        result = self.sim.step(chunk)
        self._last = result.observation
        self._running = not result.done
        info = {"instruction": self._last.instruction, "success": result.success,
                "steps_taken": result.steps_taken, **result.info}
        truncated = result.done and not result.success
        return self._obs(self._last), float(result.reward), bool(result.success), truncated, info

    def render(self) -> np.ndarray | None:
        if self.render_mode != "rgb_array":
            return None
        return next(iter(self._last.images.values()))

    def close(self) -> None:
        self.sim.close()
