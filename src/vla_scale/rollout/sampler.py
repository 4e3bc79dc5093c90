"""Task sampling: TRAIN init states for rollouts, held-out EVAL init states for evaluation."""

from __future__ import annotations

from typing import Any

import numpy as np

from vla_scale.config import EnvConfig, init_state_ids
from vla_scale.envs.types import TaskSpec


def eval_specs(env: EnvConfig) -> list[TaskSpec]:
    """Every task on every held-out init state (see config.init_state_ids for the split): what an evaluation plays."""
    return [TaskSpec(env.suite, task, s) for task in range(env.num_tasks) for s in init_state_ids(env, "eval")]


class TaskSampler:
    """Draws (task, train init state) specs; its state is saved in checkpoints so a resumed run draws the same."""

    def __init__(self, env: EnvConfig, seed: int):
        self.env = env
        self.rng = np.random.default_rng(seed)
        self.train_ids = init_state_ids(env, "train")

    def draw(self, n: int) -> list[TaskSpec]:
        tasks = self.rng.integers(0, self.env.num_tasks, size=n)
        states = self.rng.integers(0, len(self.train_ids), size=n)
        return [TaskSpec(self.env.suite, int(t), self.train_ids[s]) for t, s in zip(tasks, states, strict=True)]

    def eval_specs(self) -> list[TaskSpec]:
        return eval_specs(self.env)

    def state_dict(self) -> dict[str, Any]:
        return {"bit_generator": self.rng.bit_generator.state}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rng.bit_generator.state = state["bit_generator"]
