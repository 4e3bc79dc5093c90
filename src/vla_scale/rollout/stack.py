"""The rollout side of a run, built in one place for the trainer and `launch/eval.py`: Ray joined or started from
the parallel config, one process's simulator fleet for an env config, the episode length in chunks its env loop
plays, and the evaluation episodes played on that loop."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from vla_scale.batches import Trajectory
from vla_scale.config import EnvConfig, ParallelConfig
from vla_scale.envs.types import TaskSpec
from vla_scale.models.interface import PolicySource
from vla_scale.parallel.sim.cluster import sim_node_count, start_ray
from vla_scale.parallel.sim.fleet import SimFleet
from vla_scale.parallel.sim.render_device import render_environment
from vla_scale.rollout.env_loop import EnvLoop

if TYPE_CHECKING:
    from tqdm import tqdm


def needs_ray(parallel: ParallelConfig) -> bool:
    """Whether anything of the run lives on Ray: sim workers as Ray actors (disaggregated mode, or
    parallel.sim_workers_in_trainer=false), a cluster to join, or the dashboard asked for. Colocated sim workers in the
    trainer's process need none, so a run starts without Ray's processes (seconds and a few hundred MiB)."""
    return bool(parallel.ray_address or parallel.ray_dashboard or parallel.disagg_sim.enable
                or not parallel.sim_workers_in_trainer)


def start_ray_for(parallel: ParallelConfig) -> bool:
    """Join `parallel.ray_address`, or start a local Ray as the config says, when the run `needs_ray`; returns
    whether Ray runs."""
    if not needs_ray(parallel):
        return False
    start_ray(parallel.ray_address, parallel.ray_dashboard, parallel.ray_num_cpus)
    return True


def start_fleet(env: EnvConfig, parallel: ParallelConfig, vla: PolicySource, size: int, stages: int = 1) -> SimFleet:
    """`size` simulators of `env` in `stages` pipeline stages (`rollout.pipeline_stage_num`), built with what `vla`
    needs from them (`PolicySource.simulator_kwargs`), placed as `parallel` says, rendering on the EGL device of this
    rank's GPU (`parallel/sim/render_device.py`); in disaggregated mode the simulation nodes must be there first."""
    disagg = parallel.disagg_sim
    found = sim_node_count() if disagg.enable else 0
    if disagg.enable and found < disagg.nnodes:
        raise RuntimeError(
            f"parallel.disagg_sim.enable=true expects {disagg.nnodes} simulation node(s) offering the 'sim' resource, "
            f"the Ray cluster has {found}: start them with `ray start --address=<head>:6379 "
            "--resources='{\"sim\": 1}'` or lower parallel.disagg_sim.nnodes"
        )
    # simulators of this node render on this rank's GPU; those of simulation nodes on their own
    here = torch.cuda.current_device() if torch.cuda.is_available() and not disagg.enable else None
    return SimFleet(env.name, vla.simulator_kwargs(env), size, parallel.num_workers, parallel.sims_per_worker,
                    parallel.step_timeout_s, stages=stages, max_failures=parallel.max_failures,
                    sim_resource=disagg.enable, in_process=parallel.sim_workers_in_trainer,
                    environment=render_environment(here))


def max_chunks(env: EnvConfig, chunk_len: int) -> int:
    """Chunks an episode takes at most (the last one may stop part-way): of `env.max_steps` env steps, or with 0 of
    the longest step limit among the tasks played."""
    return -(-episode_steps(env) // chunk_len)


def episode_steps(env: EnvConfig) -> int:
    """The most env steps an episode of `env` plays: `env.max_steps`, or with 0 the longest own step limit among
    tasks 0..env.num_tasks-1."""
    if env.max_steps:
        return env.max_steps
    from vla_scale.envs.registry import simulator

    limits = simulator(env.name).step_limits
    if limits is None:
        raise ValueError(f"env.max_steps=0 but env {env.name!r} has no step limit per task")
    return max(limits(env.suite)[: env.num_tasks])


def play_eval(loop: EnvLoop, specs: list[TaskSpec], temperature: float, uid_prefix: str,
              bar: tqdm | None = None) -> list[Trajectory]:
    """Each of `specs` played once with greedy decoding (uids `<uid_prefix><index>`), one round of the fleet's slots
    at a time; `bar`, when given, counts the episodes as they end and shows the success rate after each round. What
    the trainer's evaluation and launch/eval.py play."""
    trajs: list[Trajectory] = []
    size = loop.fleet.size
    for start in range(0, len(specs), size):
        part = specs[start : start + size]
        trajs += loop.run(part, [f"{uid_prefix}{start + i}" for i in range(len(part))], temperature, greedy=True,
                          bar=bar)
        if bar is not None:
            bar.set_postfix(success=f"{np.mean([t.success for t in trajs]):.2f}")
    return trajs
