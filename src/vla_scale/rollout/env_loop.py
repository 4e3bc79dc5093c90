"""The pipelined env loop: episodes on the simulator fleet, decoded by the rollout engine, kept as trajectories.

The fleet's slots are split into S stages. The loop keeps one request per stage in flight and always serves the
oldest: it waits for stage s's observations, decodes stage s's running episodes in one batch, sends their chunks
to the simulators without waiting, and moves on to the next stage. With S >= 2 the simulators of one stage run
while another stage is decoded. With S = 1 it is the plain sequential loop.

More episodes than the fleet has slots run in rounds (a round is padded with inactive slots). `prefetch(tasks)`
sends the first round's resets early, so the simulators reset while the caller does other work (the update).
An episode whose simulator was restarted begins again from its initial state; its partial record is dropped.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from vla_scale.batches import Trajectory
from vla_scale.envs.types import ChunkStep, Observation, TaskSpec
from vla_scale.models.interface import PolicySource
from vla_scale.parallel.sim.fleet import Restarted, SimFleet
from vla_scale.rollout.engine import RolloutEngine

if TYPE_CHECKING:
    from tqdm import tqdm


@dataclass
class LoopStats:
    """Where the time of the loop went (seconds) and how much simulation it got through."""

    wall_s: float = 0.0
    decode_s: float = 0.0
    wait_s: float = 0.0  # decode side idle: blocked on the simulators
    sim_busy_s: float = 0.0  # simulator CPU time, all processes
    env_steps: int = 0
    restarts: int = 0

    def metrics(self, num_procs: int) -> dict[str, float]:
        wall = max(self.wall_s, 1e-9)
        return {
            "rollout/decode_utilisation": self.decode_s / wall,
            "rollout/env_utilisation": self.sim_busy_s / (wall * num_procs),
            "rollout/decode_wait_s": self.wait_s,
            "rollout/env_wait_s": max(wall * num_procs - self.sim_busy_s, 0.0),
            "rollout/env_steps_per_s": self.env_steps / wall,
            "rollout/restarts": float(self.restarts),
        }


def success_metrics(outcomes: list[tuple[TaskSpec, bool]], num_tasks: int,
                    groups: dict[str, list[int]] | None = None) -> dict[str, float]:
    """`eval/success_rate` over (task, success) outcomes and `eval/task_<k>_success_rate` for tasks 0..num_tasks-1;
    with task `groups` (`Simulator.groups`), `eval/group_<name>_success_rate` (the mean of its tasks' rates) and
    `eval/group_macro_success_rate` (the mean of the groups'): what the trainer's evaluation and launch/eval.py log,
    under the same names."""
    metrics = {"eval/success_rate": float(np.mean([ok for _, ok in outcomes]))}
    for task in range(num_tasks):
        mine = [ok for spec, ok in outcomes if spec.task_id == task]
        metrics[f"eval/task_{task}_success_rate"] = float(np.mean(mine))
    for name, ids in (groups or {}).items():
        metrics[f"eval/group_{name}_success_rate"] = float(np.mean([metrics[f"eval/task_{t}_success_rate"]
                                                                    for t in ids]))
    if groups:
        metrics["eval/group_macro_success_rate"] = float(np.mean([metrics[f"eval/group_{name}_success_rate"]
                                                                  for name in groups]))
    return metrics


class EnvLoop:
    """`vla` supplies the inputs (its processor) and the env's action post-processing; `engine` decodes. When the
    fleet's simulators were built with `image_prep` (`PolicySource.simulator_kwargs`), their images arrive as the
    towers see them and are only normalised here."""

    def __init__(self, fleet: SimFleet, engine: RolloutEngine, vla: PolicySource, max_chunks: int):
        self.fleet, self.engine, self.vla = fleet, engine, vla
        self.processor = vla.processor
        self.max_chunks = max_chunks
        self.images_prepared = "image_prep" in fleet.env_kwargs
        self.stage = fleet.slot_stages()
        self._prefetched: list[TaskSpec] | None = None
        self.stats = LoopStats()

    def prefetch(self, tasks: list[TaskSpec]) -> None:
        """Send the resets of the first round of `tasks` now; `run(tasks, ...)` then starts from them."""
        self._send_resets(tasks[: self.fleet.size])
        self._prefetched = list(tasks[: self.fleet.size])

    def cancel_prefetch(self) -> None:
        """Collect and drop the answers to prefetched resets that will not be used."""
        if self._prefetched is not None:
            for _ in range(self.fleet.stages):
                self.fleet.recv()
            self._prefetched = None

    def run(self, tasks: list[TaskSpec], uids: list[str], temperature: float, greedy: bool = False,
            bar: tqdm | None = None) -> list[Trajectory]:
        """Play every task once; trajectories come back in the order of `tasks`. `bar`, when given, advances by one
        as each episode ends (a round of many long episodes takes minutes)."""
        out: list[Trajectory] = []
        for start in range(0, len(tasks), self.fleet.size):
            part = tasks[start : start + self.fleet.size]
            if self._prefetched is not None and self._prefetched != part:
                self.cancel_prefetch()
            if self._prefetched is None:
                self._send_resets(part)
            self._prefetched = None
            out.extend(self._run_round(part, uids[start : start + self.fleet.size], temperature, greedy, bar))
        return out

    def _send_resets(self, tasks: list[TaskSpec]) -> None:
        padded: list[TaskSpec | None] = list(tasks) + [None] * (self.fleet.size - len(tasks))
        active = np.arange(self.fleet.size) < len(tasks)
        for s in range(self.fleet.stages):
            self.fleet.send_reset(padded, active & (self.stage == s))

    def _run_round(self, tasks: list[TaskSpec], uids: list[str], temperature: float, greedy: bool,
                   bar: tqdm | None) -> list[Trajectory]:
        size = self.fleet.size
        trajs = [Trajectory(task, uid) for task, uid in zip(tasks, uids, strict=True)]
        running = np.arange(size) < len(tasks)
        chunks_done = np.zeros(size, dtype=int)
        observations: list[Observation | None] = [None] * size
        busy0, restarts0 = self.fleet.stats.busy_s, self.fleet.stats.restarts
        start = time.perf_counter()
        outstanding = deque(range(self.fleet.stages))  # stages with a request in flight, oldest first
        asked = deque([self.fleet.request_recv()])  # answers asked for, one per stage at the front of `outstanding`
        while outstanding:
            s = outstanding.popleft()
            waited = time.perf_counter()
            results = self.fleet.collect(asked.popleft())
            self.stats.wait_s += time.perf_counter() - waited
            if outstanding:  # fetch the next stage's answer while this one is decoded
                asked.append(self.fleet.request_recv())
            mine = np.flatnonzero(running & (self.stage == s))
            for i in mine:
                self._apply(i, results[i], trajs[i], observations, running, chunks_done)
            todo = [i for i in mine if running[i]]
            if bar is not None and len(todo) < len(mine):
                bar.update(len(mine) - len(todo))
            if todo:
                self._decode_and_send(todo, s, trajs, observations, chunks_done, temperature, greedy)
                outstanding.append(s)
                if not asked:
                    asked.append(self.fleet.request_recv())
        self.stats.wall_s += time.perf_counter() - start
        self.stats.sim_busy_s += self.fleet.stats.busy_s - busy0
        self.stats.restarts += self.fleet.stats.restarts - restarts0
        return trajs

    def _apply(self, i: int, result, traj: Trajectory, observations, running, chunks_done) -> None:
        if isinstance(result, Restarted):
            traj.restart()
            observations[i], chunks_done[i] = result.observation, 0
        elif isinstance(result, ChunkStep):
            observations[i] = result.observation
            traj.executed.append(result.steps_taken)
            traj.rewards.append(result.reward)
            traj.env_steps += result.steps_taken
            self.stats.env_steps += result.steps_taken
            if result.done or chunks_done[i] >= self.max_chunks:
                running[i] = False
                traj.success = result.success
                if not result.success:  # truncated: a critic values what it ended on
                    images, proprio = self.processor.prepare([result.observation], self.images_prepared)
                    traj.final_images, traj.final_proprio = images[0], proprio[0]
        elif isinstance(result, Observation):
            observations[i] = result
        else:
            raise RuntimeError(f"slot {i} got no answer for its request ({result!r})")

    def _decode_and_send(self, todo, s, trajs, observations, chunks_done, temperature, greedy) -> None:
        t0 = time.perf_counter()
        batch = [observations[i] for i in todo]
        images, proprio = self.processor.prepare(batch, self.images_prepared)
        inputs = self.processor.from_prepared(images, [o.instruction for o in batch], proprio, self.engine.device)
        decoded = self.engine.decode(inputs, temperature, greedy)
        self.stats.decode_s += time.perf_counter() - t0
        actions = self.vla.env_actions(decoded.actions)
        chunks = np.zeros((self.fleet.size, *actions.shape[1:]), dtype=np.float64)  # sent as the env takes them
        chunks[todo] = actions
        for row, i in enumerate(todo):
            obs, traj = observations[i], trajs[i]
            traj.instruction = obs.instruction
            traj.images.append(images[row])
            traj.proprio.append(proprio[row])
            traj.tokens.append(decoded.tokens[row])
            traj.logprobs.append(decoded.logprobs[row])
            traj.sampled.append({key: value[row] for key, value in decoded.sampled.items()})
            traj.versions.append(decoded.version)
            chunks_done[i] += 1
        mask = np.zeros(self.fleet.size, dtype=bool)
        mask[todo] = True
        self.fleet.send_step(chunks, mask)

