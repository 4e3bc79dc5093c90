"""Played episodes as demonstrations: every env step of a `Trajectory`, replayed in a simulator of this process.

A rollout keeps what the policy saw at each chunk step, not the frames between them. The env is deterministic from
its init state, so the episode is replayed action by action: the chunk the policy decoded (its tokens made env
actions exactly as the rollout made them), only the actions that ran (`executed`), each step's cameras and proprio
recorded before its action. The replay must end as the episode did (success and step count) and see at every chunk
step the very images the policy was given; otherwise it is refused (`ReplayMismatch`), never recorded.
"""

from __future__ import annotations

import numpy as np

from vla_scale.batches import Trajectory
from vla_scale.config import EnvConfig, RecordConfig
from vla_scale.datasets.episodes import Episode
from vla_scale.envs.registry import make_env, simulator
from vla_scale.envs.types import ChunkStep, Env, Observation
from vla_scale.models.oft import PretrainedVLA


class ReplayMismatch(RuntimeError):
    """A replayed episode did not follow the played one (an env that is not deterministic from its init state)."""


def chunk_actions(vla: PretrainedVLA, traj: Trajectory) -> list[np.ndarray]:
    """The env actions [executed, action_dim] of each chunk the episode ran, from its recorded tokens."""
    return [vla.env_actions(vla.policy.tokens_to_actions(tokens[None], greedy=True))[0][:executed]
            for tokens, executed in zip(traj.tokens, traj.executed, strict=True)]


def replay(env: Env, vla: PretrainedVLA, traj: Trajectory, cameras: tuple[str, ...]) -> Episode:
    """`traj` replayed in `env` (built as the fleet's simulators are, without `image_prep`: it gives the frames as
    rendered) one action at a time: an Episode of every step's `cameras`, proprio and action."""
    observation = env.reset(traj.task)
    seen: list[Observation] = []
    actions: list[np.ndarray] = []
    step: ChunkStep | None = None
    for index, chunk in enumerate(chunk_actions(vla, traj)):
        if not np.array_equal(vla.processor.prepare([observation])[0][0], traj.images[index]):
            raise ReplayMismatch(f"episode {traj.uid} ({traj.task}): the replay's images at chunk {index} differ "
                                 "from what the policy saw")
        for action in chunk:
            seen.append(observation)
            actions.append(action)
            step = env.step(action[None])
            observation = step.observation
    if step is None or step.success != traj.success or len(actions) != traj.env_steps:
        raise ReplayMismatch(f"episode {traj.uid} ({traj.task}): played {traj.env_steps} steps "
                             f"(success={traj.success}), the replay {len(actions)} (success="
                             f"{step.success if step else False})")
    return Episode(traj.instruction or seen[0].instruction,
                   {camera: np.stack([o.images[camera] for o in seen]) for camera in cameras},
                   np.stack([o.proprio for o in seen]).astype(np.float32), np.stack(actions).astype(np.float32),
                   traj.success)


def replay_env(vla: PretrainedVLA, env: EnvConfig) -> Env:
    """A simulator of this process built as the fleet builds its own for `vla`, its frames as rendered."""
    kwargs = {k: v for k, v in vla.simulator_kwargs(env).items() if k != "image_prep"}
    return make_env(env.name, **kwargs)


def record_played(vla: PretrainedVLA, env: EnvConfig, trajs: list[Trajectory], record: RecordConfig) -> int:
    """The episodes of `trajs` that `record.episodes` keeps, replayed and written as a LeRobot dataset to
    `record.path` (every camera the env renders, under the simulator's feature names: `Simulator.image_key`); returns
    how many were written."""
    from vla_scale.datasets.lerobot import LeRobotKeys, write_dataset

    record_of = simulator(env.name)
    cameras = record_of.cameras
    chosen = [t for t in trajs if t.success or record.episodes == "all"]
    sim = replay_env(vla, env)
    try:
        episodes = [replay(sim, vla, traj, cameras) for traj in chosen]
    finally:
        sim.close()
    if episodes:
        keys = LeRobotKeys({camera: record_of.image_key(camera) for camera in cameras}, setting="record")
        write_dataset(record.path, episodes, keys, version=record.version, fps=record.fps, video=record.video,
                      codec=record.codec)
    return len(episodes)
