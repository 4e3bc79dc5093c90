"""What starting a run takes, for both entry scripts and the trainer: the process group joined (or created), and the
configuration with what the policy decides filled in."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from dataclasses import replace

import torch
import torch.distributed as dist

from vla_scale.config import Config
from vla_scale.models import PretrainedVLA


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _init_alone(init: Callable[[], None], attempts: int = 5) -> None:
    """A world of one on a port of its own: a free port found now can be taken by another process before the store
    binds it, so a port in use is tried again with another."""
    for attempt in range(attempts):
        os.environ["MASTER_PORT"] = str(_free_port())
        try:
            init()
            return
        except dist.DistNetworkError:
            if attempt == attempts - 1:
                raise


def init_distributed() -> tuple[int, int]:
    """Join (or, without a launcher, create) the process group; returns (rank, world size)."""
    if not dist.is_initialized():
        import deepspeed  # seconds to import: only where a process group is made

        for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1")):
            os.environ.setdefault(key, value)
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        if torch.cuda.is_available():  # before anything is allocated (zero.Init builds on the current device)
            torch.cuda.set_device(int(os.environ["LOCAL_RANK"]) % torch.cuda.device_count())
        if "MASTER_PORT" in os.environ:  # a launcher's: every rank must meet there
            deepspeed.init_distributed(dist_backend=backend, auto_mpi_discovery=False)
        else:
            _init_alone(lambda: deepspeed.init_distributed(dist_backend=backend, auto_mpi_discovery=False))
    return dist.get_rank(), dist.get_world_size()


def resolved_config(cfg: Config, vla: PretrainedVLA) -> Config:
    """`cfg` with what the policy decides filled in: a checkpoint's architecture, the prompt budget, the env's
    camera resolution (0: the policy pipeline's). The run logs and saves this one."""
    env = replace(cfg.env, camera_resolution=vla.camera_resolution(cfg.env))
    return replace(cfg, model=vla.model_config(cfg.model), env=env)
