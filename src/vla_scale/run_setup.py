"""What starting a run takes, for the entry scripts and both trainers (RL and supervised): the process group joined
(or created), same-seed runs made repeatable, the configuration with what the policy decides filled in, and the one
collective both loops ask (a value's mean over the ranks)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
from collections.abc import Callable, Collection
from dataclasses import replace

import torch
import torch.distributed as dist

from vla_scale.algo.registry import algorithm_class
from vla_scale.checkpoint import RUN_CONFIG, TRAINED_ENV
from vla_scale.config import Config, ConfigError
from vla_scale.models.checkpoint_folders import step_folder
from vla_scale.models.critic import value_head_problems
from vla_scale.models.interface import PolicySource
from vla_scale.parallel.sim.cluster import ray_address_problem
from vla_scale.run_policy import resolved_model_config, vla_for_env


def checked_policy(cfg: Config, explicit: Collection[str] = (), training: bool = True) -> PolicySource:
    """The checks of a run's start that need nothing started and neither DeepSpeed nor transformers' Llama imported
    (the entry scripts run them before importing a trainer, which takes seconds): the Ray address, then the policy
    against the env and the command line's `explicit` keys (`run_policy.vla_for_env`), whether the engine can roll
    it out and (`training`: launch/train.py; launch/eval.py passes False) whether RL can train it; the checked
    policy, or a ConfigError that names what to change. A checkpoint trained here renders its env as it was trained
    (`adopt_trained_resolution`)."""
    unreachable = ray_address_problem(cfg.parallel.ray_address)
    if unreachable:
        raise ConfigError(unreachable)
    adopt_trained_resolution(cfg, explicit)
    vla = vla_for_env(cfg.model, cfg.env, explicit)
    if problems := vla.rollout_problems():
        raise ConfigError("cannot roll the policy out:\n  - " + "\n  - ".join(problems))
    needs_values = algorithm_class(cfg.algo.name).needs_values
    untrainable = vla.training_problems(needs_values)
    if training and untrainable:
        raise ConfigError("cannot train the policy with RL:\n  - " + "\n  - ".join(untrainable))
    if needs_values and not untrainable:  # a checkpoint's value head must fit the critic this run builds
        critic = cfg.algo.critic
        problems = value_head_problems(vla.weights, vla.value_width, critic.width, critic.position)
        if problems:
            raise ConfigError("the checkpoint's critic does not fit:\n  - " + "\n  - ".join(problems))
    return vla


def trained_resolution(checkpoint: str, env_name: str) -> int:
    """The camera side `checkpoint` was trained at on env `env_name`, read from its run config (0: not a checkpoint
    of this project, or trained on another env)."""
    try:
        with open(os.path.join(step_folder(checkpoint), RUN_CONFIG)) as f:
            env = json.load(f).get(TRAINED_ENV, {})
    except (OSError, ValueError, AttributeError):
        return 0
    return int(env.get("camera_resolution", 0)) if env.get("name") == env_name else 0


def adopt_trained_resolution(cfg: Config, explicit: Collection[str] = ()) -> None:
    """Set `cfg.env.camera_resolution` to the side `model.checkpoint` was trained at, unless the command line set
    it: the env config's default (Meta-World's 480 px) would otherwise render other images than the policy learnt
    from, resized to its tower without a word. Says so when it changes the value."""
    if not cfg.model.checkpoint or "env.camera_resolution" in explicit:
        return
    side = trained_resolution(cfg.model.checkpoint, cfg.env.name)
    if side and side != cfg.env.camera_resolution:
        print(f"env.camera_resolution={side}: the side {cfg.model.checkpoint} was trained at (the env config says "
              f"{cfg.env.camera_resolution}; set env.camera_resolution to render at another)", flush=True)
        cfg.env.camera_resolution = side


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


def launched_world_size() -> int:
    """The world size `init_distributed` will join: the launcher's `WORLD_SIZE`, else 1 (known before the process
    group exists, so a run's checks need none)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


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
            release_shared_buffer()
        else:
            _init_alone(lambda: deepspeed.init_distributed(dist_backend=backend, auto_mpi_discovery=False))
    return dist.get_rank(), dist.get_world_size()


SHARED_BUFFER = "/dev/shm/deepspeed_allreduce_buffer"
"""DeepSpeed's CPU all-reduce buffers: `<this>_<uid>_<master addr>_<master port>_<rank>`, 66 MB each."""


def release_shared_buffer() -> None:
    """Remove this rank's name of DeepSpeed's CPU all-reduce buffer from /dev/shm.

    When a launcher starts every rank on one machine (its LOCAL_SIZE is the world size), DeepSpeed's CPU
    communication op creates a 66 MB shared-memory buffer per rank while the process group starts, each rank mapping
    every rank's, and never removes them. Once every rank has mapped them all (the barrier), the names can go: the
    mappings live until the processes end, and nothing is left in /dev/shm, even by a run that is killed later."""
    path = f"{SHARED_BUFFER}_{os.getuid()}_{os.environ.get('MASTER_ADDR', '')}_{os.environ.get('MASTER_PORT', '')}_" \
           f"{dist.get_rank()}"
    if dist.get_world_size() > 1:
        dist.barrier()
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def make_deterministic() -> None:
    """What makes a same-seed run repeat bit for bit: CPU float sums split over several threads land in an order
    that varies from run to run, so one intra-op thread; on GPU, deterministic kernels (cuBLAS needs its workspace
    size fixed before its first call)."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.set_num_threads(1)
    if torch.cuda.is_available():
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.benchmark = False


def resolved_config(cfg: Config, vla: PolicySource) -> Config:
    """`cfg` with what the policy decides filled in: a checkpoint's architecture, the prompt budget, the env's
    camera resolution (0: the policy pipeline's). The run logs and saves this one."""
    env = replace(cfg.env, camera_resolution=vla.camera_resolution(cfg.env))
    return replace(cfg, model=resolved_model_config(vla, cfg.model), env=env)
