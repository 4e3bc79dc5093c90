"""Typed records that cross the simulator boundary, and the Env protocol.

These records travel between simulator processes, Ray sim workers and the trainer, so they hold only numpy arrays
and plain Python values (no torch): simulator processes never import torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np


@dataclass(frozen=True)
class TaskSpec:
    """Which episode to play: a task of a suite and one of its initial states."""

    suite: str
    task_id: int
    init_state_id: int


@dataclass
class Observation:
    """What the policy sees after a reset or a chunk of actions."""

    images: dict[str, np.ndarray]  # camera name -> uint8[H, W, 3]
    proprio: np.ndarray  # float32[d] or float64[d], as the env gives it (LIBERO: float64, as OFT builds it)
    instruction: str


@dataclass
class ChunkStep:
    """The outcome of executing one action chunk (stops early at the end of the episode)."""

    observation: Observation
    reward: float
    done: bool
    success: bool
    steps_taken: int
    info: dict[str, Any] = field(default_factory=dict)


class Env(Protocol):
    """One simulator playing one episode at a time, built inside its worker process."""

    def reset(self, task: TaskSpec) -> Observation: ...

    def step(self, chunk: np.ndarray) -> ChunkStep: ...

    def close(self) -> None: ...


def observation_of(answer: Observation | ChunkStep) -> Observation:
    """What the policy sees next after a slot's answer: the reset's observation, or the chunk's last one."""
    return answer.observation if isinstance(answer, ChunkStep) else answer
