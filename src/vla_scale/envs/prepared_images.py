"""`PreparedImages` wraps an env so that its observations carry the images a policy's towers see (the official
resize and crop, `official_images.ImagePrep`), made inside the simulator process. Numpy only (simulator processes
import it)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from vla_scale.envs.official_images import ImagePrep
from vla_scale.envs.types import ChunkStep, Env, Observation, TaskSpec


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
