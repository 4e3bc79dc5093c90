"""Scripted demonstrations: `DemoEpisode`, one episode a scripted demonstrator played and recorded step by step, and
`ScriptedDemo`, what a simulator's demonstrator is to launch/demonstrate.py (named in its record by import path,
`Simulator.scripted_demo`, so a simulator's module need not import its demonstrator's)."""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from vla_scale.envs.types import TaskSpec


@dataclass(frozen=True)
class DemoEpisode:
    """One demonstrated episode, per env step t: the observation before action t, and action t.

    images: camera -> uint8 [T, H, W, 3]; state: float32 [T, P] (the env's proprio); actions: float32 [T, A], exactly
    what the env executed; intended: float32 [T, A], what the demonstrator meant before its noise (the label of
    noise-injected demonstrations, DART: the states stray as the noise drives them, the labels correct them);
    extras: dataset feature -> float32 [T, D], what else the simulator records per step (Meta-World: its full
    observation and its reward).
    """

    images: dict[str, np.ndarray]
    state: np.ndarray
    actions: np.ndarray
    instruction: str
    success: bool
    intended: np.ndarray | None = None
    extras: dict[str, np.ndarray] = field(default_factory=dict)


class ScriptedDemo(Protocol):
    """Resets `env` to `task` and plays it to its end with the simulator's scripted demonstrator, Gaussian noise of
    std `noise` (action units) on its xyz actions drawn from `rng`."""

    def __call__(self, env: Any, task: TaskSpec, noise: float, rng: np.random.Generator) -> DemoEpisode: ...


def scripted_demo(path: str) -> ScriptedDemo:
    """The demonstrator a record names as "module:function"."""
    module, _, name = path.partition(":")
    demo: ScriptedDemo = getattr(importlib.import_module(module), name)
    return demo
