"""What a policy must know of an env, per env name: its cameras, its action and proprio sizes, and the one place
where a policy's actions are turned into the env's convention (applied in rollouts, evaluation and
`PretrainedVLA.predict`).

Action conventions:
- "env": the policy already acts in the env's convention (policies trained here from scratch, whose actions are
  the normalised bins' values): passed through.
- "openvla": OpenVLA / OpenVLA-OFT checkpoints, trained on data whose gripper is in [0, 1] with 1 = open. LIBERO
  wants -1 = open, +1 = close: `oft_gripper_to_libero` (the official `process_action`: 2x - 1, sign, invert).

`PreparedImages` wraps an env so that its observations carry the images a policy's towers see (the official resize
and crop, `official_images.ImagePrep`), made inside the simulator process. Numpy only (simulator processes import
it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from vla_scale.envs import libero, reach
from vla_scale.envs.official_images import ImagePrep
from vla_scale.envs.types import ChunkStep, Env, Observation, TaskSpec

ACTION_CONVENTIONS = ("env", "openvla")


@dataclass(frozen=True)
class EnvInterface:
    """An env as a policy sees it."""

    cameras: tuple[str, ...]  # observation image names, primary first
    action_dim: int
    proprio_dim: int
    openvla_actions: Callable[[np.ndarray], np.ndarray] | None  # OpenVLA-convention actions -> env actions


INTERFACES: dict[str, EnvInterface] = {
    "reach": EnvInterface((reach.CAMERA,), reach.ACTION_DIM, reach.PROPRIO_DIM, None),
    "libero": EnvInterface(tuple(libero.CAMERAS), libero.ACTION_DIM, libero.PROPRIO_DIM, libero.oft_gripper_to_libero),
}


def env_interface(name: str) -> EnvInterface:
    if name not in INTERFACES:
        raise ValueError(f"unknown env {name!r}; valid choices: {sorted(INTERFACES)}")
    return INTERFACES[name]


def action_postprocess(name: str, convention: str) -> Callable[[np.ndarray], np.ndarray]:
    """The function from a policy's un-normalised actions [..., A] to what env `name` steps with (float64)."""
    if convention not in ACTION_CONVENTIONS:
        raise ValueError(f"unknown action convention {convention!r}; choose one of {ACTION_CONVENTIONS}")
    if convention == "env":
        return _as_float64
    convert = env_interface(name).openvla_actions
    if convert is None:
        raise ValueError(f"env {name!r} cannot take OpenVLA-convention actions (an OpenVLA-OFT checkpoint's): "
                         "train a policy of its own on it, or use a LIBERO env")
    return convert


def _as_float64(actions: np.ndarray) -> np.ndarray:
    return np.array(actions, dtype=np.float64)


class PreparedImages:
    """An env whose observations carry the images a policy's towers see (`ImagePrep`), made inside the simulator
    process: the fleet then moves 224 px images instead of 256 px ones and the decode loop skips the resize."""

    def __init__(self, env: Env, prep: ImagePrep):
        self.env, self.prep = env, prep

    def reset(self, task: TaskSpec) -> Observation:
        return self._prepare(self.env.reset(task))

    def step(self, chunk: np.ndarray) -> ChunkStep:
        result = self.env.step(chunk)
        return replace(result, observation=self._prepare(result.observation))

    def close(self) -> None:
        self.env.close()

    def _prepare(self, obs: Observation) -> Observation:
        images = {name: self.prep(image) if name in self.prep.cameras else image for name, image in obs.images.items()}
        return replace(obs, images=images)
