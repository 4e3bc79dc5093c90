"""Simulators chosen by suite name; `make_env` is what sim worker processes call to build their envs.

Simulator processes import this module, so it imports no torch and no config machinery (hydra, omegaconf).
"""

from __future__ import annotations

from typing import Any

from vla_scale.envs.libero import SUITES as LIBERO_SUITES
from vla_scale.envs.libero import LiberoEnv
from vla_scale.envs.reach import SUITE as REACH_SUITE
from vla_scale.envs.reach import ReachEnv
from vla_scale.envs.types import Env

ENVS: dict[str, type] = {"reach": ReachEnv, "libero": LiberoEnv}

SUITES: dict[str, tuple[str, ...]] = {"reach": (REACH_SUITE,), "libero": LIBERO_SUITES}
"""Env name -> the task suites it can play."""


def make_env(name: str, image_prep: dict[str, Any] | None = None, **kwargs: Any) -> Env:
    """Build the env registered under `name` with its constructor kwargs; `image_prep` (an `ImagePrep`'s fields)
    makes its observations carry the images a policy's towers see."""
    if name not in ENVS:
        raise ValueError(f"unknown env {name!r}; valid choices: {sorted(ENVS)}")
    env = ENVS[name](**kwargs)
    if image_prep is None:
        return env
    from vla_scale.envs.interface import PreparedImages
    from vla_scale.envs.official_images import ImagePrep

    return PreparedImages(env, ImagePrep(**{**image_prep, "cameras": tuple(image_prep.get("cameras", ()))}))


def suite_instructions(name: str, suite: str) -> list[str]:
    """Every instruction the tasks of `suite` can give (builds the offline word-level tokenizer)."""
    if name == "reach" and suite == "reach":
        from vla_scale.envs.reach import instructions

        return instructions()
    if name == "libero":
        from vla_scale.envs.libero import instructions as libero_instructions

        return libero_instructions(suite)
    raise ValueError(f"no instructions known for env {name!r} suite {suite!r}")


def task_step_limits(name: str, suite: str) -> list[int] | None:
    """Each task's own step limit, indexed by task id (LIBERO: OpenVLA-OFT's limit of the suite the task belongs
    to), what `env.max_steps=0` plays; None for an env without one."""
    if name == "libero":
        from vla_scale.envs.libero import step_limit

        return [step_limit(suite, task) for task in range(suite_num_tasks(name, suite))]
    return None


def suite_num_tasks(name: str, suite: str) -> int:
    """How many tasks `suite` of env `name` has."""
    if name == "libero":
        from vla_scale.envs.libero import num_tasks

        return num_tasks(suite)
    return ENVS[name].NUM_TASKS
