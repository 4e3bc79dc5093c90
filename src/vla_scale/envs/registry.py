"""The simulators by name: each simulator's module defines its `Simulator` record (`envs/simulator.py`), this
registry lists them, and everything else asks it (`simulator(name)`); `make_env` is what simulator processes call to
build their envs.

Adding a simulator: its module (the env class, its settings dataclass and its `SIMULATOR` record), its config file
(`configs/env/<name>.yaml`) and one line in `SIMULATORS` below (docs/ARCHITECTURE.md, "Adding a simulator").

Simulator processes import this module, so it imports no torch and no config machinery (hydra, omegaconf).
"""

from __future__ import annotations

from typing import Any

from vla_scale.envs import libero, metaworld, pick_place, reach
from vla_scale.envs.simulator import Simulator
from vla_scale.envs.types import Env

SIMULATORS: dict[str, Simulator] = {
    sim.name: sim for sim in (reach.SIMULATOR, pick_place.SIMULATOR, libero.SIMULATOR, metaworld.SIMULATOR)
}


def simulator(name: str) -> Simulator:
    """The record of the simulator `env.name` names."""
    if name not in SIMULATORS:
        raise ValueError(f"env.name={name!r} is not a known simulator; choose one of {sorted(SIMULATORS)}")
    return SIMULATORS[name]


def make_env(name: str, image_prep: dict[str, Any] | None = None, **kwargs: Any) -> Env:
    """Build the env registered under `name` with its constructor kwargs; `image_prep` (an `ImagePrep`'s fields)
    makes its observations carry the images a policy's towers see."""
    env = simulator(name).env_class(**kwargs)
    if image_prep is None:
        return env
    from vla_scale.envs.official_images import ImagePrep
    from vla_scale.envs.prepared_images import PreparedImages

    return PreparedImages(env, ImagePrep(**{**image_prep, "cameras": tuple(image_prep.get("cameras", ()))}))
