"""`Simulator`: everything the rest of the code asks about one simulator, in one record that the simulator's own
module defines (`reach.SIMULATOR`, `libero.SIMULATOR`) and the registry lists.

The record carries the env class the simulator processes build, its settings class (the `env.<name>.*` keys: a plain
dataclass that turns them into the env's constructor kwargs and says what keeps the simulator from starting), its
suites and their instructions, task counts and step limits, its cameras and sizes as a policy sees them, and how a
policy's actions become the env's.

Action conventions (`Simulator.action_postprocess`):
- "env": the policy already acts in the env's convention (policies trained here from scratch, whose actions are the
  normalised bins' values): passed through.
- "openvla": OpenVLA / OpenVLA-OFT checkpoints, trained on data whose gripper is in [0, 1] with 1 = open; the record's
  `openvla_actions` turns them into the env's (LIBERO: the official `process_action`).

Numpy only (simulator processes import it); no config machinery.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

ACTION_CONVENTIONS = ("env", "openvla")

Bound = tuple[str, float, bool]
"""A numeric setting's range: (phrase, limit, limit allowed), e.g. (">= 0", 0, True); `config.checks` reads them."""


@dataclass(frozen=True)
class Simulator:
    """One simulator, as the config, the checks, the policy and the fleet see it."""

    name: str
    """`env.name`; also the name of its settings group (`env.<name>.*`)."""
    env_class: type
    """What `registry.make_env` builds in a simulator process, with `settings.simulator_kwargs()` and the shared
    kwargs (camera_resolution, max_steps)."""
    settings: type
    """Dataclass of the simulator's own keys, with `simulator_kwargs()`, `startup_problems(suite)` and a `BOUNDS`
    dict (field -> Bound) for its numeric fields."""
    suites: tuple[str, ...]
    cameras: tuple[str, ...]
    """Observation image names, primary first."""
    action_dim: int
    proprio_dim: int
    num_init_states: int
    """Init states per task."""
    instructions: Callable[[str], list[str]]
    """suite -> every instruction its tasks give, indexed by task id (the offline word-level tokenizer's words)."""
    num_tasks: Callable[[str], int]
    step_limits: Callable[[str], list[int]] | None = None
    """suite -> each task's own step limit (what `env.max_steps=0` plays); None: the simulator has none."""
    published_step_limit: Callable[[str], int | None] | None = None
    """suite -> the step limit its published success rates were measured with (0: each task its own; None: the
    suite has none); None: the simulator has no published protocol."""
    published_init_states: tuple[int, ...] = tuple(range(50))
    """The init states of every task its published success rates play (LIBERO: 0..49; Meta-World: LeRobot's
    evaluation seeds 1000..1009)."""
    openvla_actions: Callable[[np.ndarray], np.ndarray] | None = None
    """OpenVLA-convention actions -> the env's; None: OpenVLA checkpoints do not act in this simulator."""
    image_keys: dict[str, str] = field(default_factory=dict)
    """Camera -> the image feature that holds its frames in this simulator's LeRobot datasets (cameras not named:
    `observation.images.<camera>`)."""
    task_names: Callable[[str], list[str]] | None = None
    """suite -> each task's name, indexed by task id (for tables); None: the instructions name the tasks."""
    task_groups: Callable[[str], dict[str, list[int]]] | None = None
    """suite -> group name -> its task ids (Meta-World's difficulty groups); None: the tasks form no groups."""
    max_resolution: int | None = None
    """The largest camera side the simulator renders (None: no bound of its own)."""
    scripted_demo: str = ""
    """The simulator's scripted demonstrator as "module:function" (`envs/scripted.ScriptedDemo`: plays one TaskSpec
    in an env of this simulator and records it); '': launch/demonstrate.py has none to play."""
    observation: Callable[[dict[str, Any]], tuple[str, int]] | None = None
    """The simulator's kwargs -> the name of the state its observations carry and the state's size, where the
    settings choose it (Meta-World's `observation`); None: always `proprio_dim`, unnamed."""
    observation_hint: Callable[[int], str] | None = None
    """A state size -> the setting that gives it ('' where none does), for messages."""

    def state_size(self, kwargs: dict[str, Any]) -> int:
        """The size of `Observation.proprio` of a simulator built with `kwargs`."""
        return self.observation(kwargs)[1] if self.observation is not None else self.proprio_dim

    def observation_name(self, kwargs: dict[str, Any]) -> str:
        """The name of the state a simulator built with `kwargs` observes ('' where the simulator has one kind)."""
        return self.observation(kwargs)[0] if self.observation is not None else ""

    def state_problem(self, trained: int, kwargs: dict[str, Any], what: str) -> str:
        """'' when a policy trained on `trained`-D states fits a simulator built with `kwargs`; else what to change
        (`what` names the policy's side, e.g. "the checkpoint was trained on")."""
        size = self.state_size(kwargs)
        if trained == size:
            return ""
        name = self.observation_name(kwargs)
        given = f"{size}-d states ({name})" if name else f"{size}-d states"
        hint = self.observation_hint(trained) if self.observation_hint is not None else ""
        fix = f"set {hint} to play it" if hint else "use a policy trained on this env's states"
        return f"{what} {trained}-d states but env {self.name!r} gives {given}: {fix}"

    def image_key(self, camera: str) -> str:
        """The image feature of `camera`'s frames in a dataset of this simulator."""
        return self.image_keys.get(camera, f"observation.images.{camera}")

    def groups(self, suite: str, num_tasks: int) -> dict[str, list[int]]:
        """The task groups among tasks 0..num_tasks-1 of `suite` (groups left without a task dropped); empty when
        the simulator has none."""
        if self.task_groups is None:
            return {}
        kept = {name: [t for t in ids if t < num_tasks] for name, ids in self.task_groups(suite).items()}
        return {name: ids for name, ids in kept.items() if ids}

    def action_postprocess(self, convention: str) -> Callable[[np.ndarray], np.ndarray]:
        """The function from a policy's un-normalised actions [..., A] to what this env steps with (float64)."""
        if convention not in ACTION_CONVENTIONS:
            raise ValueError(f"unknown action convention {convention!r}; choose one of {ACTION_CONVENTIONS}")
        if convention == "env":
            return _as_float64
        if self.openvla_actions is None:
            raise ValueError(f"env {self.name!r} cannot take OpenVLA-convention actions (an OpenVLA-OFT "
                             "checkpoint's): train a policy of its own on it, or use a LIBERO env")
        return self.openvla_actions


def _as_float64(actions: np.ndarray) -> np.ndarray:
    return np.array(actions, dtype=np.float64)
