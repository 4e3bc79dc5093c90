"""Simulators chosen by suite name; `make_env` is what sim worker processes call to build their envs."""

from __future__ import annotations

from typing import Any

from vla_scale.envs.reach import ReachEnv
from vla_scale.envs.types import Env

ENVS: dict[str, type] = {"reach": ReachEnv}


def make_env(name: str, **kwargs: Any) -> Env:
    """Build the env registered under `name` with its constructor kwargs."""
    if name not in ENVS:
        raise ValueError(f"unknown env {name!r}; valid choices: {sorted(ENVS)}")
    return ENVS[name](**kwargs)


def suite_instructions(name: str, suite: str) -> list[str]:
    """Every instruction the tasks of `suite` can give (builds the offline word-level tokenizer)."""
    if name == "reach" and suite == "reach":
        from vla_scale.envs.reach import instructions

        return instructions()
    raise ValueError(f"no instructions known for env {name!r} suite {suite!r}")
