"""Many simulator slots' answers packed into a few arrays: what a simulator process sends over its pipe and a Ray
sim worker returns (numpy only)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vla_scale.envs.types import ChunkStep, Observation, observation_of


@dataclass
class SlotBatch:
    """The answers of many simulator slots packed into a few arrays.

    A list of Observation/ChunkStep records costs one pickled object and one buffer per image; packed, a whole
    request crosses a pipe or Ray's object store as a handful of contiguous arrays. `index` holds the slots that
    answered (others answered None); `kind` is "reset" (observations) or "step" (chunk outcomes).
    """

    kind: str
    size: int
    index: np.ndarray  # int64[k]
    images: dict[str, np.ndarray]  # camera -> uint8[k, H, W, 3]
    proprio: np.ndarray  # float32[k, d] or float64[k, d]: the envs' proprio dtype, carried through
    instructions: list[str]
    reward: np.ndarray  # float64[k]
    done: np.ndarray  # bool[k]
    success: np.ndarray  # bool[k]
    steps_taken: np.ndarray  # int64[k]
    infos: list[dict[str, Any]]
    shared: dict[str, tuple[str, tuple[int, ...]]] = field(default_factory=dict)  # camera -> shared block, shape

    @staticmethod
    def pack(kind: str, results: list[Observation | ChunkStep | None], images: bool = True) -> SlotBatch:
        """Pack one request's answers (one pass over them); `images=False` leaves the images out (a shared-memory
        writer places them itself)."""
        index: list[int] = []
        obs: list[Observation] = []
        steps: list[ChunkStep] = []
        for slot, result in enumerate(results):
            if result is None:
                continue
            index.append(slot)
            obs.append(observation_of(result))
            if isinstance(result, ChunkStep):
                steps.append(result)
        cameras = list(obs[0].images) if obs and images else []
        return SlotBatch(
            kind=kind,
            size=len(results),
            index=np.array(index, dtype=np.int64),
            images={c: np.stack([o.images[c] for o in obs]) for c in cameras},
            proprio=np.stack([o.proprio for o in obs]) if obs else np.zeros((0, 0), np.float32),
            instructions=[o.instruction for o in obs],
            reward=np.array([s.reward for s in steps], dtype=np.float64),
            done=np.array([s.done for s in steps], dtype=bool),
            success=np.array([s.success for s in steps], dtype=bool),
            steps_taken=np.array([s.steps_taken for s in steps], dtype=np.int64),
            infos=[s.info for s in steps],
        )

    def unpack(self) -> list[Observation | ChunkStep | None]:
        """One record per slot; images are views into the packed arrays."""
        out: list[Observation | ChunkStep | None] = [None] * self.size
        for row, slot in enumerate(self.index):
            obs = Observation({c: a[row] for c, a in self.images.items()}, self.proprio[row], self.instructions[row])
            if self.kind == "reset":
                out[slot] = obs
            else:
                out[slot] = ChunkStep(obs, float(self.reward[row]), bool(self.done[row]), bool(self.success[row]),
                                      int(self.steps_taken[row]), self.infos[row])
        return out
