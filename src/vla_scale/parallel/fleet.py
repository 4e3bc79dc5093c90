"""The simulator fleet: Ray sim workers, each running its simulators in subprocesses.

Layout: a trainer rank drives `env.num_workers` Ray actors (`SimWorker`); each runs `env.sims_per_worker`
`SimProcess`es; each process hosts `slots` simulators. Episode i of a call lives in worker i // (slots*sims),
process (i // slots) % sims, slot i % slots. A worker sends a call to all its processes before it waits for any,
so its simulators run concurrently. Neither this module nor the sim workers import torch.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import ray

from vla_scale.envs.sim_process import SimProcess
from vla_scale.envs.types import ChunkStep, Observation, TaskSpec


class SimWorker:
    """A Ray actor owning `sims` simulator processes of `slots` simulators each."""

    def __init__(self, env_name: str, env_kwargs: dict[str, Any], sims: int, slots: int, timeout_s: float):
        self.slots, self.timeout_s = slots, timeout_s
        self.procs = [SimProcess(env_name, slots, env_kwargs) for _ in range(sims)]

    def reset(self, tasks: list[TaskSpec]) -> list[Observation]:
        for k, proc in enumerate(self.procs):
            proc.send_reset(tasks[k * self.slots : (k + 1) * self.slots])
        return [obs for proc in self.procs for obs in proc.recv(self.timeout_s)]

    def step(self, chunks: np.ndarray, active: np.ndarray) -> list[ChunkStep | None]:
        for k, proc in enumerate(self.procs):
            part = slice(k * self.slots, (k + 1) * self.slots)
            proc.send_step(chunks[part], active[part])
        return [result for proc in self.procs for result in proc.recv(self.timeout_s)]

    def node_id(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def pids(self) -> list[int]:
        return [proc.pid for proc in self.procs]

    def close(self) -> None:
        for proc in self.procs:
            proc.close()


def start_ray(address: str = "", dashboard: bool = False, num_cpus: int = 0) -> None:
    """Join `address`, or start a local Ray (dashboard off unless asked, and then bound to 127.0.0.1)."""
    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    if address:
        ray.init(address=address, log_to_driver=True)
        return
    ray.init(
        num_cpus=num_cpus or os.cpu_count(),
        include_dashboard=dashboard,
        dashboard_host="127.0.0.1",
        log_to_driver=True,
        configure_logging=False,
    )


class SimFleet:
    """`size` simulators spread over `num_workers` Ray sim workers; reset/step take one entry per simulator."""

    def __init__(self, env_name: str, env_kwargs: dict[str, Any], size: int, num_workers: int, sims_per_worker: int,
                 timeout_s: float):
        per_proc, rest = divmod(size, num_workers * sims_per_worker)
        if rest or per_proc == 0:
            raise ValueError(f"{size} simulators do not divide over {num_workers} workers x {sims_per_worker} sims")
        self.size, self.per_worker = size, size // num_workers
        remote = ray.remote(num_cpus=0)(SimWorker)
        self.workers = [remote.remote(env_name, env_kwargs, sims_per_worker, per_proc, timeout_s)
                        for _ in range(num_workers)]

    def reset(self, tasks: list[TaskSpec]) -> list[Observation]:
        assert len(tasks) == self.size, f"fleet of {self.size} simulators got {len(tasks)} tasks"
        calls = [w.reset.remote(tasks[i * self.per_worker : (i + 1) * self.per_worker])
                 for i, w in enumerate(self.workers)]
        return [obs for part in ray.get(calls) for obs in part]

    def step(self, chunks: np.ndarray, active: np.ndarray) -> list[ChunkStep | None]:
        calls = []
        for i, worker in enumerate(self.workers):
            part = slice(i * self.per_worker, (i + 1) * self.per_worker)
            calls.append(worker.step.remote(chunks[part], active[part]))
        return [result for part in ray.get(calls) for result in part]

    def close(self) -> None:
        ray.get([w.close.remote() for w in self.workers])
        for worker in self.workers:
            ray.kill(worker)
