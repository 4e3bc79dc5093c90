"""A light embedded manipulation task: put the named cube in the named bowl (suite "pick_place").

The scene: a table, two cubes (red, green), two bowls (blue, yellow) and a two-finger gripper. Every body is a mocap
body, as in the reach task, so a step is only kinematics (no contacts, no integration) and costs a few milliseconds,
most of it rendering the two cameras.

Actions are 7-D in [-1, 1]: [dx, dy, dz, droll, dpitch, dyaw, gripper].
- dx, dy, dz move the gripper's grip point (between the fingertips) by `action * max_delta` metres per env step,
  clipped to the workspace box.
- droll, dpitch, dyaw are ignored (the gripper keeps its orientation).
- gripper > 0 closes the fingers, <= 0 opens them; proprio reports the state as +1 (closed) or -1 (open).

Grasping is kinematic. The transition open -> closed grasps a cube when the grip point lies within `GRASP_RADIUS`
(xy) of the cube's centre and within `GRASP_HEIGHT` (z) above it, i.e. the gripper has descended onto it; the cube
then keeps its offset from the gripper until the gripper opens. Closing anywhere else grasps nothing, and the
gripper must open before the next attempt. A released cube drops straight down: onto a bowl's floor when its centre
lies within `BOWL_RADIUS` of that bowl's centre, onto the table otherwise. Cubes never overlap: a cube released where
it would overlap the other one is first slid beside it, along the axis of their larger offset.

Success: the instructed cube is released with its centre within `BOWL_RADIUS` (xy) of the instructed bowl's centre.
The episode ends at the first success or at `max_steps`; the reward is 1 on success, else 0.

Cameras: "agentview" (third person, over the table) and "wrist" (on the gripper, behind the fingers, looking down
past the fingertips, so a held cube and what lies under it are in view).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import mujoco
import numpy as np

from vla_scale.envs.simulator import Bound, Simulator
from vla_scale.envs.types import ChunkStep, Observation, TaskSpec

SUITE = "pick_place"
ACTION_DIM = 7
PROPRIO_DIM = 4  # grip point xyz + gripper state (+1 closed, -1 open)
CAMERAS = ("agentview", "wrist")

MAX_DELTA = 0.02  # metres per env step at |action| = 1
CUBE_HALF = 0.02
BOWL_RADIUS = 0.06
BOWL_FLOOR = 0.008  # height of a bowl's floor above the table
GRASP_RADIUS = 0.025
GRASP_HEIGHT = 0.015
WORKSPACE_LOW = np.array([-0.24, -0.16, CUBE_HALF])
WORKSPACE_HIGH = np.array([0.24, 0.24, 0.16])
GRIPPER_START = np.array([0.0, 0.04, 0.12])
START_SPREAD = 0.03
"""Default half-width (m, x and y) of the box the gripper's start is drawn from, around GRIPPER_START."""
START_SPREAD_Z = 0.01
SLOTS = np.array([[-0.11, -0.04], [0.11, -0.04], [-0.11, 0.12], [0.11, 0.12]])
"""Table positions the two cubes and two bowls are shuffled into: bowls' rims stay apart by construction (the
closest slots are 0.16 m apart, jitter moves each object at most 0.015 m per axis)."""
SLOT_JITTER = 0.015

CUBES = ("red", "green")
BOWLS = ("blue", "yellow")
CUBE_RGBA = {"red": "0.9 0.1 0.1 1", "green": "0.1 0.8 0.15 1"}
BOWL_RGBA = {"blue": "0.15 0.3 0.95 1", "yellow": "0.95 0.85 0.1 1"}
RIM_SEGMENTS = 12

FINGER_HALF = (0.005, 0.012, 0.024)  # finger box half sizes (x: across the gap)
FINGER_Z = 0.012  # finger centre above the grip point: fingertips 0.012 m below it
PALM_HALF = (0.045, 0.016, 0.008)
PALM_Z = FINGER_Z + FINGER_HALF[2] + PALM_HALF[2]
GAP_OPEN = 0.038  # inner face of each finger from the grip point
GAP_CLOSED = CUBE_HALF

_INSTRUCTIONS = tuple(f"put the {cube} cube in the {bowl} bowl" for cube in CUBES for bowl in BOWLS)


def instructions() -> list[str]:
    """All task instructions of the suite, indexed by task id."""
    return list(_INSTRUCTIONS)


def task_instruction(task_id: int) -> str:
    if not 0 <= task_id < len(_INSTRUCTIONS):
        raise ValueError(f"pick_place task_id must be in [0, {len(_INSTRUCTIONS)}), got {task_id}")
    return _INSTRUCTIONS[task_id]


def task_objects(task_id: int) -> tuple[str, str]:
    """(cube, bowl) names of a task."""
    task_instruction(task_id)
    return CUBES[task_id // len(BOWLS)], BOWLS[task_id % len(BOWLS)]


def _bowl_xml(name: str) -> str:
    rgba = BOWL_RGBA[name]
    segment = 2 * np.pi * BOWL_RADIUS / RIM_SEGMENTS / 2 + 0.002
    rim = "".join(
        f'<geom type="box" size="0.004 {segment:.4f} 0.01" pos="{BOWL_RADIUS * np.cos(a):.4f} '
        f'{BOWL_RADIUS * np.sin(a):.4f} 0.01" euler="0 0 {a:.4f}" rgba="{rgba}"/>'
        for a in np.arange(RIM_SEGMENTS) * 2 * np.pi / RIM_SEGMENTS
    )
    floor = f'<geom type="cylinder" size="{BOWL_RADIUS} {BOWL_FLOOR / 2}" pos="0 0 {BOWL_FLOOR / 2}" rgba="{rgba}"/>'
    return f'    <body name="{name}_bowl" mocap="true">{floor}{rim}</body>'


def _gripper_xml() -> str:
    fx, fy, fz = FINGER_HALF
    fingers = "".join(
        f'<geom name="finger_{side}" type="box" size="{fx} {fy} {fz}" pos="{sign * (GAP_OPEN + fx)} 0 {FINGER_Z}" '
        f'rgba="0.3 0.3 0.32 1"/>'
        for side, sign in (("left", -1), ("right", 1))
    )
    px, py, pz = PALM_HALF
    start = " ".join(str(v) for v in GRIPPER_START)
    return f"""    <body name="gripper" mocap="true" pos="{start}">
      <geom type="box" size="{px} {py} {pz}" pos="0 0 {PALM_Z}" rgba="0.8 0.8 0.82 1"/>{fingers}
      <camera name="wrist" pos="0 -0.065 0.045" xyaxes="1 0 0 0 0.8 0.6" fovy="75"/>
    </body>"""


def _model_xml(offscreen_size: int) -> str:
    cubes = "\n".join(
        f'    <body name="{c}_cube" mocap="true"><geom type="box" size="{CUBE_HALF} {CUBE_HALF} {CUBE_HALF}" '
        f'rgba="{CUBE_RGBA[c]}"/></body>'
        for c in CUBES
    )
    bowls = "\n".join(_bowl_xml(b) for b in BOWLS)
    return f"""
<mujoco model="pick_place">
  <compiler angle="radian"/>
  <visual>
    <quality shadowsize="0" offsamples="0"/>
    <global offwidth="{offscreen_size}" offheight="{offscreen_size}"/>
    <headlight ambient="0.45 0.45 0.45" diffuse="0.5 0.5 0.5" specular="0 0 0"/>
  </visual>
  <default><geom contype="0" conaffinity="0"/></default>
  <worldbody>
    <light pos="0 -0.3 1.2" dir="0 0.25 -1" castshadow="false" diffuse="0.35 0.35 0.35"/>
    <geom name="table" type="box" size="0.40 0.35 0.02" pos="0 0.04 -0.02" rgba="0.55 0.5 0.45 1"/>
{cubes}
{bowls}
{_gripper_xml()}
    <camera name="agentview" pos="0 -0.30 0.50" xyaxes="1 0 0 0 0.5 0.35" fovy="45"/>
  </worldbody>
</mujoco>
"""


@dataclass(frozen=True)
class InitState:
    """One initial layout: the gripper's grip point and every object's centre (xyz), cubes and bowls by name."""

    gripper: np.ndarray
    cubes: dict[str, np.ndarray]
    bowls: dict[str, np.ndarray]


@dataclass(frozen=True)
class Scene:
    """What the task's state is, read-only: positions are (x, y, z) in metres, cubes' and bowls' centres."""

    gripper: tuple[float, float, float]
    closed: bool
    held: str | None
    cubes: dict[str, tuple[float, float, float]]
    bowls: dict[str, tuple[float, float, float]]
    cube: str
    """The instructed cube."""
    bowl: str
    """The instructed bowl."""
    max_delta: float
    """Metres the gripper moves per env step at |action| = 1."""


def _triple(v: np.ndarray) -> tuple[float, float, float]:
    return float(v[0]), float(v[1]), float(v[2])


class PickPlaceEnv:
    """Put the cube named by the instruction in the bowl it names; one episode at a time.

    Init states come from a numpy RNG seeded with (task_id, init_state_id), so every env plays the same split;
    `seed` is kept for the common constructor signature (nothing in this task is stochastic).
    """

    NUM_TASKS = len(_INSTRUCTIONS)
    NUM_INIT_STATES = 100_000
    ACTION_DIM = ACTION_DIM
    PROPRIO_DIM = PROPRIO_DIM

    def __init__(
        self, camera_resolution: int = 64, max_steps: int = 48, seed: int = 0, max_delta: float = MAX_DELTA,
        physics_substeps: int = 0, start_spread: float = START_SPREAD,
    ) -> None:
        """`physics_substeps`: mj_step calls after each action; they cost simulation time (as a heavier scene's
        physics would) and change nothing the task observes, since its bodies are mocap-driven. `start_spread`: see
        `init_state`."""
        if camera_resolution < 1 or max_steps < 1 or physics_substeps < 0 or start_spread < 0:
            raise ValueError(f"camera_resolution and max_steps must be >= 1, physics_substeps and start_spread >= 0, "
                             f"got {camera_resolution}, {max_steps}, {physics_substeps}, {start_spread}")
        self.start_spread = start_spread
        self.camera_resolution = camera_resolution
        self.max_steps = max_steps
        self.max_delta = max_delta
        self.physics_substeps = physics_substeps
        self.seed = seed
        self.model = mujoco.MjModel.from_xml_string(_model_xml(max(camera_resolution, 64)))
        self.data = mujoco.MjData(self.model)
        self._gripper_mocap = self._mocap_id("gripper")
        self._cube_mocap = {c: self._mocap_id(f"{c}_cube") for c in CUBES}
        self._bowl_mocap = {b: self._mocap_id(f"{b}_bowl") for b in BOWLS}
        self._fingers = [mujoco.mj_name2id(self.model, mujoco.mjtObj.mjOBJ_GEOM, f"finger_{side}")
                         for side in ("left", "right")]
        self._renderer: mujoco.Renderer | None = None
        self._task: TaskSpec | None = None
        self._cube, self._bowl = CUBES[0], BOWLS[0]
        self._instruction = ""
        self._closed = False
        self._held: str | None = None
        self._held_offset = np.zeros(3)
        self._steps = 0
        self._done = True

    def _mocap_id(self, body: str) -> int:
        return int(self.model.body_mocapid[mujoco.mj_name2id(self.model, mujoco.mjtObj.mjOBJ_BODY, body)])

    @staticmethod
    def init_state(task_id: int, init_state_id: int, start_spread: float = START_SPREAD) -> InitState:
        """The layout of one initial state: cubes and bowls shuffled over SLOTS with jitter, the gripper drawn from a
        box around GRIPPER_START, `start_spread` metres either side in x and y (START_SPREAD_Z in z).

        With the default spread the gripper starts between the four slots, so the first steps of an episode decide
        which cube it goes for and its position tells the rest; a spread that covers the slots (0.15) makes the start
        say nothing about the target, and the instruction's cube word matters at every step of the approach.
        """
        if not 0 <= init_state_id < PickPlaceEnv.NUM_INIT_STATES:
            raise ValueError(f"pick_place init_state_id must be in [0, {PickPlaceEnv.NUM_INIT_STATES}), "
                             f"got {init_state_id}")
        task_instruction(task_id)
        rng = np.random.default_rng([6271, task_id, init_state_id])
        gripper = GRIPPER_START + rng.uniform(-1.0, 1.0, 3) * np.array([start_spread, start_spread, START_SPREAD_Z])
        xy = SLOTS[rng.permutation(len(SLOTS))] + rng.uniform(-SLOT_JITTER, SLOT_JITTER, SLOTS.shape)
        cubes = {c: np.array([*xy[i], CUBE_HALF]) for i, c in enumerate(CUBES)}
        bowls = {b: np.array([*xy[len(CUBES) + i], 0.0]) for i, b in enumerate(BOWLS)}
        return InitState(gripper, cubes, bowls)

    def reset(self, task: TaskSpec) -> Observation:
        if task.suite != SUITE:
            raise ValueError(f"PickPlaceEnv plays suite {SUITE!r}, got {task.suite!r}")
        state = self.init_state(task.task_id, task.init_state_id, self.start_spread)
        mujoco.mj_resetData(self.model, self.data)
        self.data.mocap_pos[self._gripper_mocap] = state.gripper
        for name, pos in state.cubes.items():
            self.data.mocap_pos[self._cube_mocap[name]] = pos
        for name, pos in state.bowls.items():
            self.data.mocap_pos[self._bowl_mocap[name]] = pos
        self._task = task
        self._cube, self._bowl = task_objects(task.task_id)
        self._instruction = task_instruction(task.task_id)
        self._closed = False
        self._held = None
        self._steps = 0
        self._done = False
        self._apply_fingers()
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
            self._act(action)
            for _ in range(self.physics_substeps):
                mujoco.mj_step(self.model, self.data)
            self._steps += 1
            taken += 1
            success = self.success()
            if success or self._steps >= self.max_steps:
                self._done = True
                break
        self._apply_fingers()
        mujoco.mj_forward(self.model, self.data)
        info = {"held": self._held, "episode_steps": self._steps}
        return ChunkStep(self._observe(), float(success), self._done, success, taken, info)

    def _act(self, action: np.ndarray) -> None:
        """One action: move the gripper (and what it holds), then close or open it."""
        pos = np.clip(self._pos(self._gripper_mocap) + action[:3] * self.max_delta, WORKSPACE_LOW, WORKSPACE_HIGH)
        self.data.mocap_pos[self._gripper_mocap] = pos
        if self._held is not None:
            self.data.mocap_pos[self._cube_mocap[self._held]] = pos + self._held_offset
        close = bool(action[6] > 0)
        if close and not self._closed:
            self._grasp(pos)
        elif self._closed and not close:
            self._release()
        self._closed = close

    def _pos(self, mocap: int) -> np.ndarray:
        return self.data.mocap_pos[mocap].copy()

    def _grasp(self, grip: np.ndarray) -> None:
        """Hold the nearest cube (xy) in reach of the grip point, if any."""
        offsets = {name: self._pos(mocap) - grip for name, mocap in self._cube_mocap.items()}
        reachable = [(float(np.linalg.norm(o[:2])), name) for name, o in offsets.items()
                     if np.linalg.norm(o[:2]) <= GRASP_RADIUS and abs(o[2]) <= GRASP_HEIGHT]
        if reachable:
            name = min(reachable)[1]
            self._held, self._held_offset = name, offsets[name]

    def _release(self) -> None:
        """Drop the held cube straight down, beside the other cube if it would overlap it."""
        if self._held is None:
            return
        name, self._held = self._held, None
        pos = self._pos(self._cube_mocap[name])
        for other, mocap in self._cube_mocap.items():
            if other != name:
                pos[:2] = _beside(pos[:2], self._pos(mocap)[:2])
        pos[2] = CUBE_HALF + (BOWL_FLOOR if self._bowl_under(pos) is not None else 0.0)
        self.data.mocap_pos[self._cube_mocap[name]] = pos

    def _bowl_under(self, pos: np.ndarray) -> str | None:
        for name, mocap in self._bowl_mocap.items():
            if np.linalg.norm(pos[:2] - self._pos(mocap)[:2]) <= BOWL_RADIUS:
                return name
        return None

    def success(self) -> bool:
        """The instructed cube rests (not held) in the instructed bowl."""
        if self._task is None or self._held == self._cube:
            return False
        cube = self._pos(self._cube_mocap[self._cube])
        bowl = self._pos(self._bowl_mocap[self._bowl])
        return bool(np.linalg.norm(cube[:2] - bowl[:2]) <= BOWL_RADIUS)

    def scene(self) -> Scene:
        """The current state, for scripted controllers (pick_place_demo.py) and tests."""
        return Scene(
            gripper=_triple(self._pos(self._gripper_mocap)), closed=self._closed, held=self._held,
            cubes={c: _triple(self._pos(m)) for c, m in self._cube_mocap.items()},
            bowls={b: _triple(self._pos(m)) for b, m in self._bowl_mocap.items()},
            cube=self._cube, bowl=self._bowl, max_delta=self.max_delta,
        )

    def _apply_fingers(self) -> None:
        gap = GAP_CLOSED if self._closed else GAP_OPEN
        for geom, sign in zip(self._fingers, (-1, 1), strict=True):
            self.model.geom_pos[geom, 0] = sign * (gap + FINGER_HALF[0])

    def _observe(self) -> Observation:
        grip = self.data.mocap_pos[self._gripper_mocap]
        proprio = np.append(grip, 1.0 if self._closed else -1.0).astype(np.float32)
        images = {camera: self._render(camera) for camera in CAMERAS}
        return Observation(images=images, proprio=proprio, instruction=self._instruction)

    def _render(self, camera: str) -> np.ndarray:
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
        self._renderer.update_scene(self.data, camera=camera)
        return self._renderer.render()

    def close(self) -> None:
        if self._renderer is not None:
            self._renderer.close()
            self._renderer = None


def _beside(xy: np.ndarray, other: np.ndarray) -> np.ndarray:
    """`xy` moved along the axis of its larger offset from `other` until two axis-aligned cubes no longer overlap."""
    offset = xy - other
    if np.any(np.abs(offset) >= 2 * CUBE_HALF):  # apart along some axis: no overlap
        return xy
    axis = int(np.argmax(np.abs(offset)))
    moved = xy.copy()
    moved[axis] = other[axis] + (1.0 if offset[axis] >= 0 else -1.0) * 2 * CUBE_HALF
    return moved


@dataclass
class PickPlaceSettings:
    """The pick_place task's own keys (read when env.name=pick_place)."""

    max_delta: float = 0.02
    """Gripper displacement in metres per env step at |action| = 1."""
    physics_substeps: int = 0
    """MuJoCo physics steps (mj_step) run after each action (0: none, the task stays kinematic); real simulation work
    that gives its simulators the cost per env step of a heavier scene."""
    start_spread: float = START_SPREAD
    """Half-width (m, x and y) of the box around the table's centre that the gripper starts in. The default keeps it
    between the four object slots; 0.15 spreads the starts over all of them."""

    BOUNDS: ClassVar[dict[str, Bound]] = {"max_delta": ("> 0", 0, False), "physics_substeps": (">= 0", 0, True),
                                          "start_spread": (">= 0", 0, False)}

    def simulator_kwargs(self) -> dict[str, Any]:
        return {"max_delta": self.max_delta, "physics_substeps": self.physics_substeps,
                "start_spread": self.start_spread}

    def startup_problems(self, suite: str) -> list[str]:
        return []


SIMULATOR = Simulator(
    name="pick_place", env_class=PickPlaceEnv, settings=PickPlaceSettings, suites=(SUITE,), cameras=CAMERAS,
    action_dim=ACTION_DIM, proprio_dim=PROPRIO_DIM, num_init_states=PickPlaceEnv.NUM_INIT_STATES,
    instructions=lambda suite: instructions(), num_tasks=lambda suite: PickPlaceEnv.NUM_TASKS,
    scripted_demo="vla_scale.envs.pick_place_demo:play_scripted",
)
