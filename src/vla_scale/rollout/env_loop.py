"""The env loop: episodes on the simulator fleet, decoded by the rollout engine, collected as trajectories.

One stage: at every chunk step all still-running episodes are decoded in one batch, their chunks are stepped on
the fleet, and episodes that ended drop out. More episodes than the fleet has simulators run in rounds; a round is
padded with inactive copies, which are never decoded or stepped.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from vla_scale.envs.types import Observation, TaskSpec
from vla_scale.models.policy import Processor
from vla_scale.parallel.fleet import SimFleet
from vla_scale.rollout.engine import RolloutEngine


@dataclass
class Trajectory:
    """One episode, per executed chunk step: model inputs, action tokens, rollout log-probs, policy version.

    Every recorded step counts for the loss: an episode ends at its first success, so the recorded steps are
    exactly those up to and including the first success.
    """

    task: TaskSpec
    uid: str
    instruction: str
    images: list[np.ndarray] = field(default_factory=list)  # uint8[H, W, 3] per chunk step
    proprio: list[np.ndarray] = field(default_factory=list)
    tokens: list[np.ndarray] = field(default_factory=list)  # int64[chunk*action_dim]
    logprobs: list[np.ndarray] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    success: bool = False
    env_steps: int = 0

    @property
    def reward(self) -> float:
        return float(self.success)

    def __len__(self) -> int:
        return len(self.tokens)


def run_episodes(
    tasks: list[TaskSpec],
    uids: list[str],
    fleet: SimFleet,
    engine: RolloutEngine,
    processor: Processor,
    max_chunks: int,
    temperature: float,
    greedy: bool = False,
    camera: str = "agentview",
) -> list[Trajectory]:
    """Play every task once; trajectories come back in the order of `tasks`."""
    out: list[Trajectory] = []
    for start in range(0, len(tasks), fleet.size):
        round_tasks = tasks[start : start + fleet.size]
        out.extend(
            _run_round(round_tasks, uids[start : start + fleet.size], fleet, engine, processor, max_chunks,
                       temperature, greedy, camera)
        )
    return out


def _run_round(tasks, uids, fleet, engine, processor, max_chunks, temperature, greedy, camera) -> list[Trajectory]:
    n = len(tasks)
    padded = tasks + [tasks[0]] * (fleet.size - n)
    observations: list[Observation] = fleet.reset(padded)
    trajs = [Trajectory(task, uids[i], observations[i].instruction) for i, task in enumerate(tasks)]
    active = np.zeros(fleet.size, dtype=bool)
    active[:n] = True
    for _ in range(max_chunks):
        idx = np.flatnonzero(active)
        if idx.size == 0:
            break
        decoded = engine.decode(processor([observations[i] for i in idx]), temperature, greedy)
        chunks = np.zeros((fleet.size, *decoded.actions.shape[1:]), dtype=np.float32)
        chunks[idx] = decoded.actions
        for row, i in enumerate(idx):
            traj = trajs[i]
            traj.images.append(observations[i].images[camera])
            traj.proprio.append(observations[i].proprio)
            traj.tokens.append(decoded.tokens[row])
            traj.logprobs.append(decoded.logprobs[row])
            traj.versions.append(decoded.version)
        results = fleet.step(chunks, active)
        for i in idx:
            result = results[i]
            assert result is not None
            observations[i] = result.observation
            trajs[i].env_steps += result.steps_taken
            if result.done:
                active[i] = False
                trajs[i].success = result.success
    return trajs
