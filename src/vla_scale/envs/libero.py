"""LIBERO suites (libero_spatial, libero_object, libero_goal, libero_10, libero_90, and libero_130 of all five) behind
the Env protocol.

One `LiberoEnv` plays one episode at a time inside a simulator process. It builds LIBERO's `OffScreenRenderEnv` for
the task of the TaskSpec it is reset to and keeps it while the task stays the same; a new task rebuilds it.

Fidelity to the official OpenVLA-OFT LIBERO evaluation (`run_libero_eval.py`):
- task i of a suite is LIBERO's benchmark task i (task order 0), its instruction the benchmark's `task.language`;
- an episode starts from LIBERO's init state `init_state_id` (`set_init_state`), then `settle_steps` no-op actions
  [0, 0, 0, 0, 0, 0, -1] run before the policy acts: objects are placed slightly above their resting poses and fall
  for a few steps (OFT waits 10). Settle steps do not count against the step limit and their success is ignored;
- step limits default to OFT's (`OFT_MAX_STEPS`); SimpleVLA-RL trained and evaluated with 512 (`SIMPLEVLA_MAX_STEPS`);
- libero_130 (`UNIFIED_SUITES`, the unified suite RLinf reports) is the five suites one after another in LIBERO's own
  `libero_suites` order: its task i is a task of one of them (`member_task`), played exactly as there, with that
  suite's step limit (`step_limit`);
- images are rotated by 180 degrees (`img[::-1, ::-1]`) as OFT does to match its training data; proprio is
  [eef xyz, eef axis-angle, 2 gripper joints] (8-D, float64 as OFT's `prepare_observation` builds it);
- success is LIBERO's own predicate (`done` of `env.step`, i.e. the BDDL goal holds).

Fixtures (cabinets, stoves, racks) are placed by LIBERO's sampler at every reset from numpy's global RNG; the init
state does not hold them (they have no joints), so they are where that reset's draws put them. Two modes
(`scenes`):
- "per_episode" (default): the RNG is reseeded from (seed, task, init state) before each reset, so an episode's
  scene depends only on its TaskSpec. Cheap, but not the scenes the published success rates were measured on.
- "official": episode k of task t shows the scene of the official script's episode k, which builds one env per
  task, calls `env.seed(0)` and plays init states 0, 1, ..., 49 in order with LIBERO's default hard resets (the
  model rebuilt at each reset). Within that loop only `env.reset()` draws: the robot's initialisation noise (7
  normals, scaled by 0), one uniform per open/close/turn-on sampler, and the object and fixture placements
  (rejection sampling, retried from a new rebuild after a RandomizationError); the constructor draws before
  `env.seed`; `set_init_state`, `env.step` and rendering draw nothing. A rebuild draws differently from a soft reset
  in two ways, both reproduced here: LIBERO appends its open/close/turn-on samplers to a list that is never cleared,
  so the r-th model build of an env draws r values for each of them; and the samplers of objects placed on fixture
  sites read site positions from the sim, which a rebuilt model computes from the fixtures' XML poses (a soft reset
  would use the last episode's). The RNG state before each official reset is kept per task, so reaching episode k
  replays only the draws of the resets between the closest known state and k (no rebuild), and the
  episode itself is then a soft reset that draws exactly what the official hard reset draws: the same RNG states,
  fixture poses, sim states and images as the official loop (tested).

Differences that change no physics:
- Resets are soft (the sim is reset, not rebuilt from XML; the robot's gripper action state is cleared as a rebuild
  would): the same observations as a hard reset, in a fraction of its time. `hard_reset=True` rebuilds as LIBERO
  does.
- Camera images are rendered only where the policy sees them, not at every env step; physics does not depend on
  rendering. robosuite samples an observation (images and proprio) on its observables' 20 Hz timers, after 24 of an
  env step's 25 physics substeps. Its camera observables are off except during the steps whose observation is
  returned: the last settle step of a reset and the last step of each chunk (or the step that reaches the step
  limit). For those they are turned on with the timer state of the proprio observables, so the observation is
  robosuite's own, images included, as the official loop sees it (tested bit for bit against the official
  pipeline). A chunk that ends early at success returns images rendered at the end of its last step (one substep
  after its proprio was sampled): that observation only ends the episode.

Actions are LIBERO's: 7-D, [dx, dy, dz, droll, dpitch, dyaw] of the OSC_POSE controller in [-1, 1] and the gripper
(-1 open, +1 close). A policy trained on OpenVLA-style data outputs the gripper in [0, 1] with 1 = open:
`oft_gripper_to_libero` is the one place that converts it.

Memory per simulator process (`benchmarks/libero_sim.py`; figures in docs/performance.md and the README): less with
`texture_max_side=1024` (LIBERO's three 4096x4096 textures shrunk by a box filter); after building a scene,
`release_compiler_memory` frees what MuJoCo keeps from compiling it, below the peak a scene's build reaches.

Nothing here imports torch: init states are read with a numpy-only unpickler (`load_init_states`).
"""

from __future__ import annotations

import ast
import ctypes
import functools
import io
import math
import os
import pickle
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from vla_scale.envs import libero_install
from vla_scale.envs.simulator import Bound, Simulator
from vla_scale.envs.types import ChunkStep, Observation, TaskSpec

OFT_MAX_STEPS = {"libero_spatial": 220, "libero_object": 280, "libero_goal": 300, "libero_10": 520, "libero_90": 400}
"""OpenVLA-OFT's evaluation step limits (policy steps after settling), set from the longest training demo."""
SIMPLEVLA_MAX_STEPS = 512
"""The one step limit SimpleVLA-RL used for every suite."""
SUITE_TASKS = {"libero_spatial": 10, "libero_object": 10, "libero_goal": 10, "libero_10": 10, "libero_90": 90,
               "libero_130": 130}
SUITES = tuple(SUITE_TASKS)
"""The LIBERO suites, the one list of them (config validation and the registry read it here)."""
UNIFIED_SUITES = {"libero_130": ("libero_spatial", "libero_object", "libero_goal", "libero_90", "libero_10")}
"""Suites made of whole suites, in LIBERO's `benchmark.libero_suites` order (RLinf's LIBERO-130 aggregates them so:
tasks 0-9 spatial, 10-19 object, 20-29 goal, 30-119 LIBERO-90, 120-129 LIBERO-10)."""
NUM_INIT_STATES = 50
ACTION_DIM = 7
PROPRIO_DIM = 8
CAMERAS = {"agentview": "agentview", "wrist": "robot0_eye_in_hand"}
"""Our camera name -> LIBERO's camera name."""
CLOCK_OBSERVABLE = "robot0_eef_pos"
"""The proprio observable whose sampling timer the camera observables copy on the steps they are on."""
NOOP_ACTION = (0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -1.0)
SCENES = ("per_episode", "official")
"""How a reset places the fixtures: `LiberoEnv`'s `scenes` (the module docstring says what each gives)."""


# ---- tasks and init states, without importing libero (its benchmark module imports torch) ------------------------
def member_task(suite: str, task_id: int) -> tuple[str, int]:
    """The suite of LIBERO's own and the task id there that task `task_id` of `suite` is (itself unless `suite` is
    unified)."""
    if suite not in SUITES:
        raise ValueError(f"unknown LIBERO suite {suite!r}; valid suites: {list(SUITES)}")
    if not 0 <= task_id < SUITE_TASKS[suite]:
        raise ValueError(f"{suite} task_id must be in [0, {SUITE_TASKS[suite]}), got {task_id}")
    for member in UNIFIED_SUITES.get(suite, ()):
        if task_id < SUITE_TASKS[member]:
            return member, task_id
        task_id -= SUITE_TASKS[member]
    return suite, task_id


def step_limit(suite: str, task_id: int) -> int:
    """OpenVLA-OFT's evaluation step limit of the task: that of the suite it belongs to."""
    return OFT_MAX_STEPS[member_task(suite, task_id)[0]]


@functools.cache
def task_names(suite: str) -> tuple[str, ...]:
    """LIBERO's task names of `suite`, in benchmark order (task_order_index 0)."""
    if suite not in SUITES:
        raise ValueError(f"unknown LIBERO suite {suite!r}; valid suites: {list(SUITES)}")
    if suite in UNIFIED_SUITES:
        return tuple(name for member in UNIFIED_SUITES[suite] for name in task_names(member))
    path = libero_install.benchmark_root() / "benchmark" / "libero_suite_task_map.py"
    source = path.read_text()
    task_map = ast.literal_eval(source[source.index("{") : source.rindex("}") + 1])
    return tuple(task_map[suite])


def task_language(name: str) -> str:
    """The instruction LIBERO's benchmark derives from a task name (LIBERO-90 names start with a scene prefix)."""
    if name[0].isupper():
        start = name.find("SCENE") + (8 if "SCENE10" in name else 7)
        name = name[start:]
    return " ".join(name.split("_"))


def instructions(suite: str) -> list[str]:
    """Every task instruction of `suite`, indexed by task id."""
    return [task_language(name) for name in task_names(suite)]


def num_tasks(suite: str) -> int:
    """Tasks of `suite` (known without the LIBERO install; the tests check it against the task map)."""
    if suite not in SUITE_TASKS:
        raise ValueError(f"unknown LIBERO suite {suite!r}; valid suites: {list(SUITES)}")
    return SUITE_TASKS[suite]


class _NumpyUnpickler(pickle.Unpickler):
    """Unpickles numpy arrays only (what LIBERO's `.pruned_init` files hold); anything else is refused."""

    ALLOWED = {("numpy._core.multiarray", "_reconstruct"), ("numpy", "ndarray"), ("numpy", "dtype"),
               ("_codecs", "encode")}

    def find_class(self, module: str, name: str) -> Any:
        if module.startswith("numpy.core"):  # written by numpy 1.x
            module = "numpy._core" + module[len("numpy.core") :]
        if (module, name) not in self.ALLOWED:
            raise pickle.UnpicklingError(f"init-state file refers to {module}.{name}; only numpy arrays are expected")
        return super().find_class(module, name)

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("init-state file holds torch tensors; only numpy arrays are expected")


@functools.cache
def load_init_states(suite: str, task_id: int) -> np.ndarray:
    """LIBERO's init states of one task, float64[50, state_dim] (MuJoCo time, qpos, qvel), read without torch.

    The files are `torch.save` zip archives whose pickle holds one numpy array; only numpy classes are unpickled.
    """
    suite, task_id = member_task(suite, task_id)
    path = libero_install.benchmark_root() / "init_files" / suite / f"{task_names(suite)[task_id]}.pruned_init"
    with zipfile.ZipFile(path) as archive:
        member = next(n for n in archive.namelist() if n.endswith("data.pkl"))
        states = _NumpyUnpickler(io.BytesIO(archive.read(member))).load()
    if not isinstance(states, np.ndarray) or states.ndim != 2:
        raise ValueError(f"{path}: expected a 2-D array of init states, got {type(states).__name__}")
    states.setflags(write=False)
    return states


# ---- conversions ----------------------------------------------------------------------------------------------------
def quat_to_axis_angle(quat: np.ndarray) -> np.ndarray:
    """Unit quaternion (x, y, z, w), robosuite's order -> axis-angle 3-vector (as OFT's LIBERO utils compute it)."""
    w = float(np.clip(quat[3], -1.0, 1.0))
    den = math.sqrt(1.0 - w * w)
    if math.isclose(den, 0.0):
        return np.zeros(3)
    return np.asarray(quat[:3], dtype=np.float64) * 2.0 * math.acos(w) / den


def oft_gripper_to_libero(actions: np.ndarray, invert: bool = True) -> np.ndarray:
    """OpenVLA-OFT's gripper post-processing, between the policy's un-normalised actions and `LiberoEnv.step`.

    The last dimension of an OpenVLA/OFT action is the gripper in [0, 1] (1 = open, as in the training data).
    LIBERO wants -1 = open, +1 = close. As OFT's `run_libero_eval.py` does: map [0, 1] -> [-1, 1] (2x - 1),
    binarise with the sign, then (for OpenVLA-family checkpoints, `invert=True`) flip the sign. Works on one action
    [A] or a chunk [..., A]; returns a new float64 array.
    """
    out = np.array(actions, dtype=np.float64)
    gripper = np.sign(2.0 * out[..., -1] - 1.0)
    out[..., -1] = -gripper if invert else gripper
    return out


def release_compiler_memory() -> None:
    """Free what MuJoCo keeps after compiling a scene and never uses again: the last XML model it loaded (kept for
    `mj_saveLastXML`: the whole spec with decoded textures and meshes; the Python bindings do not expose
    `mj_freeLastXML`, so it is called through ctypes) and, in the releases that have one, its asset cache (which only
    speeds up compiling the next scene). Then hands freed heap pages back to the OS (docs/ARCHITECTURE.md, LIBERO,
    says how much)."""
    import mujoco

    for library in sorted(Path(mujoco.__file__).parent.glob("libmujoco.so*"))[:1]:  # the one mujoco loaded
        ctypes.CDLL(str(library)).mj_freeLastXML()
    if hasattr(mujoco, "mj_clearCache"):  # not in the pinned 3.3.2
        mujoco.mj_clearCache(mujoco.mj_getCache())
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


def _xml_fixture_poses(inner: Any) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """(root body, pos, quat) of every fixture as the scene's XML gives it: where a rebuilt model has them before the
    reset's placement moves them (LIBERO writes fixture placements into the model, `model.body_pos/quat`)."""
    from robosuite.utils.mjcf_utils import string_to_array

    poses = []
    for fixture in inner.fixtures_dict.values():
        body = inner.model.worldbody.find(f".//body[@name='{fixture.root_body}']")
        if body is None or any(body.get(key) is not None for key in ("euler", "axisangle", "xyaxes", "zaxis")):
            raise ValueError(f"fixture body {fixture.root_body!r}: expected a body posed by pos/quat in the XML")
        quat = string_to_array(body.get("quat", "1 0 0 0"))
        poses.append((fixture.root_body, string_to_array(body.get("pos", "0 0 0")), quat / np.linalg.norm(quat)))
    return poses


# ---- the env --------------------------------------------------------------------------------------------------------
class LiberoEnv:
    """One LIBERO simulator; see the module docstring for what it does and why.

    camera_resolution: side of both cameras in pixels. settle_steps: no-op steps after each reset. max_steps: policy
    steps per episode (None: the task's suite's `OFT_MAX_STEPS`, `step_limit`). seed: per_episode, with (task, init
    state), seeds the fixture layout; official, the `env.seed` of the official script (0 there). assets_path: LIBERO
    scene assets ('' or None: the installed assets). hard_reset: rebuild the sim at every reset. texture_max_side: > 0
    renders from a copy of the assets whose textures are at most this many pixels a side
    (`libero_install.downscaled_assets`: less memory, images within a few intensity levels of the official ones).

    scenes: where a reset puts the fixtures (cabinets, stoves), which the init state does not hold.
    - "per_episode": from numpy's global RNG reseeded by (seed, task, init state). An episode depends only on its
      TaskSpec and costs one soft reset, but its fixtures are not where the official evaluation had them.
    - "official": `reset(TaskSpec(suite, t, k))` shows the scene of episode k of task t in OpenVLA-OFT's
      `run_libero_eval.py` (one env per task, `env.seed(0)`, init states 0..k in order, hard resets), whatever this
      simulator played before: the scenes the published success rates were measured on. The first visit to episode k
      of a task replays the RNG draws of the official resets not yet reached; later visits cost one
      soft reset.
    """

    NUM_INIT_STATES = NUM_INIT_STATES
    ACTION_DIM = ACTION_DIM
    PROPRIO_DIM = PROPRIO_DIM

    def __init__(self, camera_resolution: int = 128, settle_steps: int = 10, max_steps: int | None = None,
                 seed: int = 0, assets_path: str | None = None, hard_reset: bool = False,
                 texture_max_side: int = 0, scenes: str = "per_episode") -> None:
        if camera_resolution < 1 or settle_steps < 0 or (max_steps is not None and max_steps < 1):
            raise ValueError(f"need camera_resolution >= 1, settle_steps >= 0, max_steps >= 1 or None; got "
                             f"{camera_resolution}, {settle_steps}, {max_steps}")
        if scenes not in SCENES:
            raise ValueError(f"scenes must be one of {list(SCENES)}, got {scenes!r}")
        self.camera_resolution = camera_resolution
        self.settle_steps = settle_steps
        self.max_steps = max_steps
        self.seed = seed
        self.hard_reset = hard_reset
        self.scenes = scenes
        self.assets = libero_install.resolve_assets(assets_path)
        if texture_max_side > 0:
            self.assets = libero_install.downscaled_assets(self.assets, texture_max_side)
        self._env: Any = None
        self._convention = 1
        self._built: tuple[str, int] | None = None
        self._task: TaskSpec | None = None
        self._limit = 0
        self._steps = 0
        self._done = True
        # official scenes: per (suite, task), the numpy RNG state before each official reset reached so far, and how
        # many times the official env had built its model by then (one build in its constructor, one per reset)
        self._official: dict[tuple[str, int], list[tuple[tuple, int]]] = {}
        self._property_samplers: list[Any] = []  # LIBERO's open/close/turn-on samplers of one model build
        self._fixture_poses: list[tuple[str, np.ndarray, np.ndarray]] = []

    def _build(self, suite: str, task_id: int) -> None:
        """(Re)build LIBERO's env for a task; imports libero on first use (after writing its config)."""
        self.close()
        libero_install.ensure_config()
        os.environ.setdefault("MUJOCO_GL", "egl")
        import logging

        logging.getLogger("robosuite_logs").setLevel(logging.ERROR)  # "no private macro file" warnings
        import libero.libero as libero_pkg

        libero_pkg._assets_path_cache = str(self.assets)  # LIBERO reads every asset path through this cache
        from libero.libero.envs import OffScreenRenderEnv

        member, member_id = member_task(suite, task_id)
        bddl = libero_install.benchmark_root() / "bddl_files" / member / f"{task_names(member)[member_id]}.bddl"
        res = self.camera_resolution
        self._env = OffScreenRenderEnv(bddl_file_name=str(bddl), camera_heights=res, camera_widths=res,
                                       hard_reset=self.hard_reset, ignore_done=True)
        observables = self._env.env._observables
        for camera in CAMERAS.values():  # on only for the steps whose observation the policy sees (_env_step)
            observables[f"{camera}_image"].set_enabled(False)
            if observables[f"{camera}_image"]._sampling_timestep != observables[CLOCK_OBSERVABLE]._sampling_timestep:
                raise ValueError(f"camera {camera!r} is sampled at another rate than {CLOCK_OBSERVABLE!r}")
        import robosuite.macros
        from robosuite.utils.mjcf_utils import IMAGE_CONVENTION_MAPPING

        self._convention = IMAGE_CONVENTION_MAPPING[robosuite.macros.IMAGE_CONVENTION]
        inner = self._env.env
        self._property_samplers = list(inner.object_property_initializers)  # those of the constructor's build
        self._fixture_poses = _xml_fixture_poses(inner)
        self._built = (suite, task_id)
        release_compiler_memory()

    def reset(self, task: TaskSpec) -> Observation:
        return self._reset(task)

    def _reset(self, task: TaskSpec, scene: int | None = None) -> Observation:
        """`reset`; under official scenes, `scene` picks the official episode whose fixtures to show (default: the
        TaskSpec's init state, as the official script pairs them), for comparisons with other protocols."""
        if task.suite not in SUITES:
            raise ValueError(f"LiberoEnv plays suites {list(SUITES)}, got {task.suite!r}")
        states = load_init_states(task.suite, task.task_id)
        if not 0 <= task.init_state_id < len(states):
            raise ValueError(f"init_state_id must be in [0, {len(states)}), got {task.init_state_id}")
        if scene is not None and (self.scenes != "official" or scene < 0):
            raise ValueError(f"scene={scene} needs scenes='official' and scene >= 0 (scenes={self.scenes!r})")
        if self._built != (task.suite, task.task_id):
            self._build(task.suite, task.task_id)
        env = self._env
        if self.scenes == "official":
            self._official_reset(task, task.init_state_id if scene is None else scene)
        else:
            np.random.seed(np.random.SeedSequence([self.seed, task.task_id, task.init_state_id]).generate_state(1)[0])
            env.reset()
        if self.hard_reset:  # the scene was compiled again
            release_compiler_memory()
        gripper = env.env.robots[0].gripper
        gripper.current_action = np.zeros(gripper.dof)  # a soft reset keeps it; a rebuilt gripper starts at zeros
        obs = env.set_init_state(states[task.init_state_id])  # no settle steps: _observe renders this state
        for i in range(self.settle_steps):
            obs, _ = self._env_step(list(NOOP_ACTION), observe=i == self.settle_steps - 1)
        self._task = task
        self._limit = self.max_steps or step_limit(task.suite, task.task_id)
        self._steps = 0
        self._done = False
        return self._observe(obs)

    def _official_reset(self, task: TaskSpec, episode: int) -> None:
        """Reset to the fixtures of the official script's `episode` of this task (see the module docstring)."""
        known = self._official.setdefault((task.suite, task.task_id), [])
        if not known:
            np.random.seed(self.seed)  # `env.seed(0)`, right after the official env's constructor (its one build)
            known.append((np.random.get_state(), 1))
        while len(known) <= episode:  # official resets not reached yet: their draws only
            state, builds = known[-1]
            np.random.set_state(state)
            builds = self._official_attempts(builds, draws_only=True)
            known.append((np.random.get_state(), builds))
        state, builds = known[episode]
        np.random.set_state(state)
        builds = self._official_attempts(builds, draws_only=False)
        if len(known) == episode + 1:  # nothing below draws before the next official reset
            known.append((np.random.get_state(), builds))

    def _official_attempts(self, builds: int, draws_only: bool) -> int:
        """One official `env.reset()`: attempts until one places every object (LIBERO's `ControlEnv.reset` retries
        after a RandomizationError, each time from a new model build). Every attempt draws what a hard reset draws,
        from a sim in the state a rebuilt model has; `draws_only` skips what does not draw (observations, sensors).
        Returns the official env's model builds after it."""
        from robosuite.utils.errors import RandomizationError

        inner = self._env.env
        while True:
            rebuilds = self.hard_reset and not draws_only  # then inner.reset() appends one build's samplers itself
            inner.object_property_initializers = self._property_samplers * (builds if rebuilds else builds + 1)
            builds += 1
            if not rebuilds:  # a rebuilt model starts with its fixtures at their XML poses
                model = inner.sim.model
                for body, pos, quat in self._fixture_poses:
                    body_id = model.body_name2id(body)
                    model.body_pos[body_id] = pos
                    model.body_quat[body_id] = quat
            try:
                if draws_only:
                    inner.sim.reset()  # what a soft inner.reset() does before its _reset_internal(), which draws
                    inner._reset_internal()
                else:
                    inner.reset()
                return builds
            except RandomizationError:
                continue

    def step(self, chunk: np.ndarray) -> ChunkStep:
        """Run the chunk's actions one by one; stop at success or at the step limit."""
        if self._task is None or self._done:
            raise RuntimeError("step() called before reset() or after the episode ended")
        chunk = np.asarray(chunk, dtype=np.float64)
        if chunk.ndim != 2 or chunk.shape[1] != ACTION_DIM or len(chunk) == 0:
            raise ValueError(f"chunk must have shape [T >= 1, {ACTION_DIM}], got {chunk.shape}")
        success, taken, obs = False, 0, {}
        for action in chunk:
            last = taken == len(chunk) - 1 or self._steps + 1 >= self._limit
            obs, success = self._env_step(action.tolist(), observe=last)
            self._steps += 1
            taken += 1
            if success or self._steps >= self._limit:
                self._done = True
                break
        info = {"episode_steps": self._steps, "step_limit": self._limit}
        return ChunkStep(self._observe(obs), float(success), self._done, success, taken, info)

    def _env_step(self, action: list[float], observe: bool) -> tuple[dict[str, np.ndarray], bool]:
        """One env step: its observation and LIBERO's success. `observe`: the observation holds the camera images,
        sampled as robosuite samples them when its camera observables are on (the policy sees this observation).

        robosuite samples each observable once per sampling period, at the substep its timer says; the camera
        observables are turned on with the timer state of the proprio's, so they sample at the same substep, once.
        They are turned off again after the step (every other step, and a reset's forced update, renders nothing).
        """
        if not observe:
            obs, _, done, _ = self._env.step(action)
            return obs, bool(done)
        observables = self._env.env._observables
        clock = observables[CLOCK_OBSERVABLE]
        cameras = [observables[f"{camera}_image"] for camera in CAMERAS.values()]
        placeholders = []
        for camera in cameras:
            camera.set_enabled(True)  # restarts its timer
            camera._time_since_last_sample = clock._time_since_last_sample
            camera._sampled = clock._sampled
            camera._current_delay = clock._current_delay
            placeholders.append(camera._current_observed_value)
        try:
            obs, _, done, _ = self._env.step(action)
        finally:
            for camera in cameras:
                camera.set_enabled(False)
        for camera, placeholder in zip(cameras, placeholders, strict=True):
            if camera._current_observed_value is placeholder:  # not sampled in this step: _observe renders it
                obs.pop(camera.name, None)
        return obs, bool(done)

    def _observe(self, obs: dict[str, np.ndarray]) -> Observation:
        """The policy's view of a robosuite observation: its camera images rotated by 180 degrees (those it lacks
        rendered from the sim now) and the 8-D proprio, float64 as OFT's `prepare_observation` builds it."""
        assert self._task is not None
        proprio = np.concatenate([obs["robot0_eef_pos"], quat_to_axis_angle(obs["robot0_eef_quat"]),
                                  obs["robot0_gripper_qpos"]]).astype(np.float64)
        images = {}
        for name, camera in CAMERAS.items():
            image = obs.get(f"{camera}_image")
            images[name] = np.ascontiguousarray(image[::-1, ::-1]) if image is not None else self._render(camera)
        instruction = task_language(task_names(self._task.suite)[self._task.task_id])
        return Observation(images=images, proprio=proprio, instruction=instruction)

    def _render(self, camera: str) -> np.ndarray:
        """One camera image of the sim as it is now, as the policy sees it: what robosuite's camera observable would
        return, rotated by 180 degrees as OFT does."""
        res = self.camera_resolution
        raw = self._env.env.sim.render(width=res, height=res, camera_name=camera)
        image = raw[:: self._convention]  # what robosuite's camera observable returns
        return np.ascontiguousarray(image[::-1, ::-1])

    def close(self) -> None:
        if self._env is not None:
            self._env.close()
            self._env = None
            self._built = None


@dataclass
class LiberoSettings:
    """LIBERO's own keys (read when env.name=libero)."""

    settle_steps: int = 10
    """No-op steps after each reset while the objects come to rest (OFT waits 10); not counted in env.max_steps."""
    assets: str = ""
    """Scene assets folder ('' uses the assets installed by `make libero`)."""
    texture_max_side: int = 0
    """Render from a copy of the assets with textures of at most this many pixels a side (0: LIBERO's own, as the
    official evaluation renders); 1024 holds less memory per simulator, images within 2 intensity levels (README,
    LIBERO)."""
    scenes: str = "per_episode"
    """Fixture layouts: per_episode (seeded by task and init state) or official (OFT's eval episode k scenes)."""
    mujoco: str = "3.3.2"
    """The MuJoCo release LIBERO must run under: the one whose renders match the data public LIBERO checkpoints were
    trained on (from 3.3.3 LIBERO-Object's floors render darker; from 3.4.0 libero_spatial task 5's bowl no longer
    settles on the ramekin). Another installed release is refused; name it here to run it anyway."""

    BOUNDS: ClassVar[dict[str, Bound]] = {"settle_steps": (">= 0", 0, True), "texture_max_side": (">= 0", 0, True)}

    def simulator_kwargs(self) -> dict[str, Any]:
        return {"settle_steps": self.settle_steps, "assets_path": self.assets or None,
                "texture_max_side": self.texture_max_side, "scenes": self.scenes}

    def startup_problems(self, suite: str) -> list[str]:
        """The scene mode, the LIBERO package and its scene assets, checked before any simulator starts."""
        problems = []
        if self.scenes not in SCENES:
            problems.append(f"env.libero.scenes={self.scenes!r} is not a LIBERO scene mode; choose one of "
                            f"{list(SCENES)}")
        try:
            libero_install.resolve_assets(self.assets or None)
        except libero_install.LiberoNotInstalled as err:
            problems.append(str(err))
        import mujoco

        if mujoco.__version__ != self.mujoco:
            problems.append(f"MuJoCo {mujoco.__version__} is installed but LIBERO runs under MuJoCo {self.mujoco} "
                            "here (other releases render LIBERO's scenes unlike the data public checkpoints were "
                            f"trained on): install mujoco=={self.mujoco} (`make libero` does), or set "
                            f"env.libero.mujoco={mujoco.__version__} to run this one anyway")
        return problems


def task_step_limits(suite: str) -> list[int]:
    """Each task's own step limit, indexed by task id: OpenVLA-OFT's limit of the suite the task belongs to."""
    return [step_limit(suite, task) for task in range(num_tasks(suite))]


def published_step_limit(suite: str) -> int | None:
    """The step limit LIBERO's published success rates were measured with: OFT's per suite, 0 (each task its own
    suite's) for a unified suite."""
    return 0 if suite in UNIFIED_SUITES else OFT_MAX_STEPS.get(suite)


SIMULATOR = Simulator(
    name="libero", env_class=LiberoEnv, settings=LiberoSettings, suites=SUITES, cameras=tuple(CAMERAS),
    action_dim=ACTION_DIM, proprio_dim=PROPRIO_DIM, num_init_states=NUM_INIT_STATES, instructions=instructions,
    num_tasks=num_tasks, step_limits=task_step_limits, published_step_limit=published_step_limit,
    openvla_actions=oft_gripper_to_libero,
)
