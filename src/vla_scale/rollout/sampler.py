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
    """Draws (task, train init state) specs; its state is saved in checkpoints so a resumed run draws the same.

    Tasks come in rounds of every task once, in task order, a round carried over from one draw to the next: a draw
    of at least `num_tasks` specs holds every task (a multi-task step learns from all of them), a draw of n holds
    each task floor(n / num_tasks) or one more times, and smaller draws cover every task over consecutive steps. In
    order, not shuffled: when a step draws a multiple of `num_tasks`, each simulator of the fleet (group g plays on
    the same simulators every step) plays the same task every step, so a simulator whose scene takes time and
    memory to build (Meta-World's) builds it once. Init states are drawn uniformly from the TRAIN block."""

    def __init__(self, env: EnvConfig, seed: int):
        self.env = env
        self.rng = np.random.default_rng(seed)
        self.train_ids = init_state_ids(env, "train")
        self.round: list[int] = []  # the tasks of the current round not yet drawn

    def draw(self, n: int) -> list[TaskSpec]:
        tasks = [self._next_task() for _ in range(n)]
        states = self.rng.integers(0, len(self.train_ids), size=n)
        return [TaskSpec(self.env.suite, t, self.train_ids[s]) for t, s in zip(tasks, states, strict=True)]

    def _next_task(self) -> int:
        if not self.round:
            self.round = list(range(self.env.num_tasks))
        return self.round.pop(0)

    def eval_specs(self) -> list[TaskSpec]:
        return eval_specs(self.env)

    def state_dict(self) -> dict[str, Any]:
        return {"bit_generator": self.rng.bit_generator.state, "round": list(self.round)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rng.bit_generator.state = state["bit_generator"]
        self.round = list(state.get("round", []))
