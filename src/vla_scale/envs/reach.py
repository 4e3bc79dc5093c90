"""The embedded default task: reach the named coloured block on a table (suite "reach").

A light language-conditioned MuJoCo scene: a table, three coloured blocks (red left, green ahead, blue right) and a
spherical end-effector. Every body is a mocap body, so a step is only kinematics (no contacts, no integration) and
an episode costs a few milliseconds of CPU, most of it rendering.

Actions are 7-D in [-1, 1]: [dx, dy, dz, droll, dpitch, dyaw, gripper].
- dx, dy, dz move the end-effector by `action * max_delta` metres per env step (default MAX_DELTA), clipped
  to the workspace box.
- droll, dpitch, dyaw are ignored (the end-effector is a sphere).
- gripper is cosmetic: its last value is reported in proprio and tints the end-effector (dark when closed, > 0).

Success: the end-effector's xy lies within `SUCCESS_RADIUS` of the named block's xy (height is ignored). The
geometry is tuned so that, with 40 env steps, a uniformly random policy succeeds in roughly 15% of episodes while a
policy that heads straight for the block succeeds always (see tests/envs/test_reach.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import mujoco
import numpy as np

from vla_scale.envs.simulator import Bound, Simulator
from vla_scale.envs.types import ChunkStep, Observation, TaskSpec

SUITE = "reach"
ACTION_DIM = 7
PROPRIO_DIM = 4  # end-effector xyz + gripper state
CAMERA = "agentview"
CAMERA_POS = "0 -0.34 0.66"
CAMERA_XYAXES = "1 0 0 0 0.867 0.499"
CAMERA_FOVY = 50

MAX_DELTA = 0.03  # metres per env step at |action| = 1
SUCCESS_RADIUS = 0.05
BLOCK_HALF = 0.025
EE_RADIUS = 0.02
WORKSPACE_LOW = np.array([-0.22, -0.18, 0.03])
WORKSPACE_HIGH = np.array([0.22, 0.20, 0.15])
EE_START = np.array([0.0, -0.08, 0.08])
EE_START_JITTER = np.array([0.02, 0.02, 0.01])
BLOCK_JITTER = 0.03

COLOURS = ("red", "green", "blue")
BLOCK_LAYOUT = {"red": (-0.12, 0.02), "green": (0.0, 0.08), "blue": (0.12, 0.02)}
BLOCK_RGBA = {"red": "0.85 0.1 0.1 1", "green": "0.1 0.75 0.15 1", "blue": "0.1 0.2 0.9 1"}
EE_RGBA_OPEN = np.array([0.85, 0.85, 0.85, 1.0], dtype=np.float32)
EE_RGBA_CLOSED = np.array([0.25, 0.25, 0.25, 1.0], dtype=np.float32)

_INSTRUCTIONS = tuple(f"reach the {colour} block" for colour in COLOURS)


def instructions() -> list[str]:
    """All task instructions of the suite, indexed by task id."""
    return list(_INSTRUCTIONS)


def task_instruction(task_id: int) -> str:
    if not 0 <= task_id < len(_INSTRUCTIONS):
        raise ValueError(f"reach task_id must be in [0, {len(_INSTRUCTIONS)}), got {task_id}")
    return _INSTRUCTIONS[task_id]


def _model_xml(offscreen_size: int) -> str:
    blocks = "\n".join(
        f'    <body name="{c}_block" mocap="true" pos="{x} {y} {BLOCK_HALF}">'
        f'<geom type="box" size="{BLOCK_HALF} {BLOCK_HALF} {BLOCK_HALF}" rgba="{BLOCK_RGBA[c]}"/></body>'
        for c, (x, y) in BLOCK_LAYOUT.items()
    )
    return f"""
<mujoco model="reach">
  <visual>
    <quality shadowsize="0" offsamples="0"/>
    <global offwidth="{offscreen_size}" offheight="{offscreen_size}"/>
    <headlight ambient="0.4 0.4 0.4" diffuse="0.5 0.5 0.5" specular="0 0 0"/>
  </visual>
  <default><geom contype="0" conaffinity="0"/></default>
  <worldbody>
    <light pos="0 -0.3 1.2" dir="0 0.25 -1" castshadow="false" diffuse="0.4 0.4 0.4"/>
    <geom name="table" type="box" size="0.40 0.35 0.02" pos="0 0.02 -0.02" rgba="0.62 0.5 0.38 1"/>
{blocks}
    <body name="ee" mocap="true" pos="{EE_START[0]} {EE_START[1]} {EE_START[2]}">
      <geom name="ee" type="sphere" size="{EE_RADIUS}" rgba="0.85 0.85 0.85 1"/>
    </body>
    <camera name="{CAMERA}" pos="{CAMERA_POS}" xyaxes="{CAMERA_XYAXES}" fovy="{CAMERA_FOVY}"/>
  </worldbody>
</mujoco>
"""


class ReachEnv:
    """Reach the block named by the instruction; one episode at a time.

    The episode is fully determined by the TaskSpec and the actions: init states come from a numpy RNG seeded with
    (task_id, init_state_id), so train/eval splits are the same for every env. `seed` is kept for the common
    constructor signature; nothing in this task is stochastic.
    """

    NUM_TASKS = len(_INSTRUCTIONS)
    NUM_INIT_STATES = 50
    ACTION_DIM = ACTION_DIM
    PROPRIO_DIM = PROPRIO_DIM

    def __init__(
        self, camera_resolution: int = 64, max_steps: int = 40, seed: int = 0, max_delta: float = MAX_DELTA,
        physics_substeps: int = 0,
    ) -> None:
        """`physics_substeps`: mj_step calls after each action; they cost simulation time (as a heavier scene's
        physics would) and change nothing the task observes, since its bodies are mocap-driven."""
        if camera_resolution < 1 or max_steps < 1 or physics_substeps < 0:
            raise ValueError(f"camera_resolution and max_steps must be >= 1 and physics_substeps >= 0, got "
                             f"{camera_resolution}, {max_steps}, {physics_substeps}")
        self.physics_substeps = physics_substeps
        self.camera_resolution = camera_resolution
        self.max_steps = max_steps
        self.max_delta = max_delta
        self.seed = seed
        self.model = mujoco.MjModel.from_xml_string(_model_xml(max(camera_resolution, 64)))
        self.data = mujoco.MjData(self.model)
        self._ee_mocap = self._mocap_id("ee")
        self._block_mocap = [self._mocap_id(f"{c}_block") for c in COLOURS]
        self._ee_geom = mujoco.mj_name2id(self.model, mujoco.mjtObj.mjOBJ_GEOM, "ee")
        self._renderer: mujoco.Renderer | None = None
        self._task: TaskSpec | None = None
        self._instruction = ""
        self._gripper = -1.0
        self._steps = 0
        self._done = True

    def _mocap_id(self, body: str) -> int:
        return int(self.model.body_mocapid[mujoco.mj_name2id(self.model, mujoco.mjtObj.mjOBJ_BODY, body)])

    @staticmethod
    def init_state(task_id: int, init_state_id: int) -> tuple[np.ndarray, np.ndarray]:
        """(end-effector xyz, block xyz [3, 3] in COLOURS order) of one initial state."""
        if not 0 <= init_state_id < ReachEnv.NUM_INIT_STATES:
            raise ValueError(f"reach init_state_id must be in [0, {ReachEnv.NUM_INIT_STATES}), got {init_state_id}")
        task_instruction(task_id)
        rng = np.random.default_rng([7919, task_id, init_state_id])
        ee = EE_START + rng.uniform(-1.0, 1.0, 3) * EE_START_JITTER
        blocks = np.array([[x, y, BLOCK_HALF] for x, y in BLOCK_LAYOUT.values()])
        blocks[:, :2] += rng.uniform(-BLOCK_JITTER, BLOCK_JITTER, (len(COLOURS), 2))
        return ee, blocks

    def reset(self, task: TaskSpec) -> Observation:
        if task.suite != SUITE:
            raise ValueError(f"ReachEnv plays suite {SUITE!r}, got {task.suite!r}")
        ee, blocks = self.init_state(task.task_id, task.init_state_id)
        mujoco.mj_resetData(self.model, self.data)
        self.data.mocap_pos[self._ee_mocap] = ee
        for mocap, pos in zip(self._block_mocap, blocks, strict=True):
            self.data.mocap_pos[mocap] = pos
        self._task = task
        self._instruction = task_instruction(task.task_id)
        self._gripper = -1.0
        self._steps = 0
        self._done = False
        self._apply_gripper()
        mujoco.mj_forward(self.model, self.data)
        return self._observe()

    def step(self, chunk: np.ndarray) -> ChunkStep:
        """Run the chunk's actions one by one; stop at success or at `max_steps`."""
        if self._task is None or self._done:
            raise RuntimeError("step() called before reset() or after the episode ended")
        chunk = np.asarray(chunk, dtype=np.float64)
        if chunk.ndim != 2 or chunk.shape[1] != ACTION_DIM:
            raise ValueError(f"chunk must have shape [T, {ACTION_DIM}], got {chunk.shape}")
        success = False
        taken = 0
        for action in np.clip(chunk, -1.0, 1.0):
            pos = self.data.mocap_pos[self._ee_mocap] + action[:3] * self.max_delta
            self.data.mocap_pos[self._ee_mocap] = np.clip(pos, WORKSPACE_LOW, WORKSPACE_HIGH)
            self._gripper = float(action[6])
            for _ in range(self.physics_substeps):
                mujoco.mj_step(self.model, self.data)
            self._steps += 1
            taken += 1
            success = self._target_distance() < SUCCESS_RADIUS
            if success or self._steps >= self.max_steps:
                self._done = True
                break
        self._apply_gripper()
        mujoco.mj_forward(self.model, self.data)
        info = {"distance": self._target_distance(), "episode_steps": self._steps}
        return ChunkStep(self._observe(), float(success), self._done, success, taken, info)

    def _target_distance(self) -> float:
        assert self._task is not None
        ee = self.data.mocap_pos[self._ee_mocap, :2]
        block = self.data.mocap_pos[self._block_mocap[self._task.task_id], :2]
        return float(np.linalg.norm(ee - block))

    def _apply_gripper(self) -> None:
        self.model.geom_rgba[self._ee_geom] = EE_RGBA_CLOSED if self._gripper > 0 else EE_RGBA_OPEN

    def _observe(self) -> Observation:
        proprio = np.append(self.data.mocap_pos[self._ee_mocap], self._gripper).astype(np.float32)
        return Observation(images={CAMERA: self._render()}, proprio=proprio, instruction=self._instruction)

    def _render(self) -> np.ndarray:
        if self._renderer is None:
            size = self.camera_resolution
            self._renderer = mujoco.Renderer(self.model, height=size, width=size)
            flags = self._renderer.scene.flags
            for flag in (
                mujoco.mjtRndFlag.mjRND_SHADOW,
                mujoco.mjtRndFlag.mjRND_REFLECTION,
                mujoco.mjtRndFlag.mjRND_SKYBOX,
                mujoco.mjtRndFlag.mjRND_FOG,
                mujoco.mjtRndFlag.mjRND_HAZE,
            ):
                flags[flag] = 0
        self._renderer.update_scene(self.data, camera=CAMERA)
        return self._renderer.render()

    def close(self) -> None:
        if self._renderer is not None:
            self._renderer.close()
            self._renderer = None


@dataclass
class ReachSettings:
    """The reach task's own keys (read when env.name=reach)."""

    max_delta: float = 0.03
    """End-effector displacement in metres per env step at |action| = 1."""
    physics_substeps: int = 0
    """MuJoCo physics steps (mj_step) run after each action (0: none, the task stays kinematic); real simulation work
    that gives its simulators the cost per env step of a heavier scene (benchmarks/rl_step.py)."""

    BOUNDS: ClassVar[dict[str, Bound]] = {"max_delta": ("> 0", 0, False), "physics_substeps": (">= 0", 0, True)}

    def simulator_kwargs(self) -> dict[str, Any]:
        return {"max_delta": self.max_delta, "physics_substeps": self.physics_substeps}

    def startup_problems(self, suite: str) -> list[str]:
        return []


SIMULATOR = Simulator(
    name="reach", env_class=ReachEnv, settings=ReachSettings, suites=(SUITE,), cameras=(CAMERA,),
    action_dim=ACTION_DIM, proprio_dim=PROPRIO_DIM, num_init_states=ReachEnv.NUM_INIT_STATES,
    instructions=lambda suite: instructions(), num_tasks=lambda suite: ReachEnv.NUM_TASKS,
)
