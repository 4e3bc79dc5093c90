"""Meta-World (Farama's `metaworld` 3.1.1: 50 Sawyer manipulation tasks in MuJoCo) behind the Env protocol.

Suites: "mt10" (Meta-World's MT10, its order), "mt50" (all 50 tasks in Meta-World's own order) and each task name
alone ("reach-v3", ...: MT1, what `env=metaworld_mt1 env.metaworld.task=<name>` plays).

As LeRobot's Meta-World env and dataset (`lerobot/envs/metaworld.py`, `lerobot/metaworld_mt50`) have it:
- one camera, Meta-World's "corner2" moved to (0.75, 0.075, 0.7) in the world frame (its orientation as the scene's
  XML gives it: it looks at the table from the robot's front right), the rendered image flipped on both axes;
  LeRobot renders 480x480 (`env.camera_resolution`);
- actions 4-D in [-1, 1]: the end effector's xyz displacement (x 1/100 m per step, Meta-World's action scale) and
  the gripper (+1 closes); the agent state 4-D: the end effector's xyz and how far the fingers are apart (the
  first four numbers of Meta-World's 39-D observation);
- the goal observable in Meta-World's 39-D observation, as its multi-task benchmarks build it
  (`partially_observable=False`), kept beside the image in demonstrations (`observation.environment_state`);
- the instruction of a task is LeRobot's task description, the difficulty groups (easy 28, medium 11, hard 6, very
  hard 5) LeRobot's split of MT50, the one its VLA papers report;
- success is the env's own `info["success"]`; an episode ends at its first success or after `max_steps` steps
  (Meta-World's `max_path_length`, 500, what LeRobot's evaluation plays).

What the policy reads beside the image is a choice (`observation`, `env.metaworld.observation`), since the field runs
Meta-World under two protocols: `agent` (LeRobot's VLA protocol: the 4-D agent state, the goal only in the picture,
the default), `agent_goal` (the agent state and the goal's xyz, `obs[36:39]`: 7-D) and `full` (Meta-World's 39-D
observation, what its MT10 / MT50 benchmarks hand an agent). Reach, push and pick-place put their goal at a random
place each episode and draw it as a small sphere, so under `agent` a policy must find it in the image.

Init states: init state k of any task is the object and goal placement Meta-World draws after `env.seed(k)`
(`seeded_rand_vec`, what LeRobot's `reset(seed=k)` does), so the configs' EVAL block 1000..1009 is the seeds of
LeRobot's evaluation (`eval.seed` 1000, 10 episodes per task) and the TRAIN states 0..999 never overlap it.

Rendering: only where the policy looks (after a reset and at the end of each chunk), through a `mujoco.Renderer`
of our own with the scene's shadows, reflections and multisampling as the settings say (all off by default: about
8 ms a 128 px frame on the CPU's software EGL instead of about 25 ms; Meta-World's own path has all three on).

Meta-World is imported only inside the simulator processes (`MetaWorldEnv`), so the config and the registry work
without it; `MetaWorldSettings.startup_problems` refuses a run when it is not installed.
"""

from __future__ import annotations

import difflib
import importlib.util
import os
import weakref
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from vla_scale.envs.simulator import Bound, Simulator
from vla_scale.envs.types import ChunkStep, Observation, TaskSpec

MT50 = (
    "assembly-v3", "basketball-v3", "bin-picking-v3", "box-close-v3", "button-press-topdown-v3",
    "button-press-topdown-wall-v3", "button-press-v3", "button-press-wall-v3", "coffee-button-v3", "coffee-pull-v3",
    "coffee-push-v3", "dial-turn-v3", "disassemble-v3", "door-close-v3", "door-lock-v3", "door-open-v3",
    "door-unlock-v3", "hand-insert-v3", "drawer-close-v3", "drawer-open-v3", "faucet-open-v3", "faucet-close-v3",
    "hammer-v3", "handle-press-side-v3", "handle-press-v3", "handle-pull-side-v3", "handle-pull-v3", "lever-pull-v3",
    "pick-place-wall-v3", "pick-out-of-hole-v3", "pick-place-v3", "plate-slide-v3", "plate-slide-side-v3",
    "plate-slide-back-v3", "plate-slide-back-side-v3", "peg-insert-side-v3", "peg-unplug-side-v3", "soccer-v3",
    "stick-push-v3", "stick-pull-v3", "push-v3", "push-wall-v3", "push-back-v3", "reach-v3", "reach-wall-v3",
    "shelf-place-v3", "sweep-into-v3", "sweep-v3", "window-open-v3", "window-close-v3",
)
"""Every task, in Meta-World's order (`metaworld.env_dict.ALL_V3_ENVIRONMENTS`, what MT50 holds)."""
MT10 = ("reach-v3", "push-v3", "pick-place-v3", "door-open-v3", "drawer-open-v3", "drawer-close-v3",
        "button-press-topdown-v3", "peg-insert-side-v3", "window-open-v3", "window-close-v3")
"""MT10, in Meta-World's order (`metaworld.env_dict.MT10_V3`)."""
BENCHMARKS = {"mt10": MT10, "mt50": MT50}
SUITES = (*BENCHMARKS, *MT50)
"""The benchmarks, then each task alone (MT1)."""

DIFFICULTY = {
    "easy": ("button-press-v3", "button-press-topdown-v3", "button-press-topdown-wall-v3", "button-press-wall-v3",
             "coffee-button-v3", "dial-turn-v3", "door-close-v3", "door-lock-v3", "door-open-v3", "door-unlock-v3",
             "drawer-close-v3", "drawer-open-v3", "faucet-close-v3", "faucet-open-v3", "handle-press-v3",
             "handle-press-side-v3", "handle-pull-v3", "handle-pull-side-v3", "lever-pull-v3", "plate-slide-v3",
             "plate-slide-back-v3", "plate-slide-back-side-v3", "plate-slide-side-v3", "reach-v3", "reach-wall-v3",
             "window-close-v3", "window-open-v3", "peg-unplug-side-v3"),
    "medium": ("basketball-v3", "bin-picking-v3", "box-close-v3", "coffee-pull-v3", "coffee-push-v3", "hammer-v3",
               "peg-insert-side-v3", "push-wall-v3", "soccer-v3", "sweep-v3", "sweep-into-v3"),
    "hard": ("assembly-v3", "hand-insert-v3", "pick-out-of-hole-v3", "pick-place-v3", "push-v3", "push-back-v3"),
    "very_hard": ("shelf-place-v3", "disassemble-v3", "stick-pull-v3", "stick-push-v3", "pick-place-wall-v3"),
}
"""The difficulty groups of MT50 that LeRobot's evaluations report (LeRobot's metaworld_config.json)."""

INSTRUCTIONS = {
    "assembly-v3": "Pick up a nut and place it onto a peg",
    "basketball-v3": "Dunk the basketball into the basket",
    "bin-picking-v3": "Grasp the puck from one bin and place it into another bin",
    "box-close-v3": "Grasp the cover and close the box with it",
    "button-press-topdown-v3": "Press a button from the top",
    "button-press-topdown-wall-v3": "Bypass a wall and press a button from the top",
    "button-press-v3": "Press a button",
    "button-press-wall-v3": "Bypass a wall and press a button",
    "coffee-button-v3": "Push a button on the coffee machine",
    "coffee-pull-v3": "Pull a mug from a coffee machine",
    "coffee-push-v3": "Push a mug under a coffee machine",
    "dial-turn-v3": "Rotate a dial 180 degrees",
    "disassemble-v3": "Pick a nut out of a peg",
    "door-close-v3": "Close a door with a revolving joint",
    "door-lock-v3": "Lock the door by rotating the lock clockwise",
    "door-open-v3": "Open a door with a revolving joint",
    "door-unlock-v3": "Unlock the door by rotating the lock counter-clockwise",
    "hand-insert-v3": "Insert the gripper into a hole",
    "drawer-close-v3": "Push and close a drawer",
    "drawer-open-v3": "Open a drawer",
    "faucet-open-v3": "Rotate the faucet counter-clockwise",
    "faucet-close-v3": "Rotate the faucet clockwise",
    "hammer-v3": "Hammer a screw on the wall",
    "handle-press-side-v3": "Press a handle down sideways",
    "handle-press-v3": "Press a handle down",
    "handle-pull-side-v3": "Pull a handle up sideways",
    "handle-pull-v3": "Pull a handle up",
    "lever-pull-v3": "Pull a lever down 90 degrees",
    "peg-insert-side-v3": "Insert a peg sideways",
    "pick-place-wall-v3": "Pick a puck, bypass a wall and place the puck",
    "pick-out-of-hole-v3": "Pick up a puck from a hole",
    "reach-v3": "Reach a goal position",
    "push-back-v3": "Push the puck to a goal",
    "push-v3": "Push the puck to a goal",
    "pick-place-v3": "Pick and place a puck to a goal",
    "plate-slide-v3": "Slide a plate into a cabinet",
    "plate-slide-side-v3": "Slide a plate into a cabinet sideways",
    "plate-slide-back-v3": "Get a plate from the cabinet",
    "plate-slide-back-side-v3": "Get a plate from the cabinet sideways",
    "peg-unplug-side-v3": "Unplug a peg sideways",
    "soccer-v3": "Kick a soccer into the goal",
    "stick-push-v3": "Grasp a stick and push a box using the stick",
    "stick-pull-v3": "Grasp a stick and pull a box with the stick",
    "push-wall-v3": "Bypass a wall and push a puck to a goal",
    "reach-wall-v3": "Bypass a wall and reach a goal",
    "shelf-place-v3": "Pick and place a puck onto a shelf",
    "sweep-into-v3": "Sweep a puck into a hole",
    "sweep-v3": "Sweep a puck off the table",
    "window-open-v3": "Push and open a window",
    "window-close-v3": "Push and close a window",
}
"""Each task's instruction: LeRobot's task descriptions (two tasks share one: push-v3 and push-back-v3)."""

CAMERA = "corner2"
CAMERA_POS = (0.75, 0.075, 0.7)
"""Where LeRobot's Meta-World env and dataset put the corner2 camera (world frame, metres)."""
SCENE_CAMERAS = ("topview", "corner", "corner2", "corner3", "corner4", "behindGripper", "gripperPOV")
"""The cameras Meta-World's Sawyer scenes have."""
ACTION_DIM = 4
PROPRIO_DIM = 4
STATE_DIM = 39
"""Meta-World's full observation: end effector, gripper, objects (this step and the last), goal."""
GOAL = slice(36, 39)
"""The goal's xyz in the full observation."""
OBSERVATIONS = {"agent": 4, "agent_goal": 7, "full": STATE_DIM}
"""What the policy reads beside the image (`observation`) -> its size: the agent state (LeRobot's VLA protocol), the
agent state and the goal's xyz, or Meta-World's whole observation."""


def proprio(state: np.ndarray, observation: str) -> np.ndarray:
    """The policy's state vector of `observation` from Meta-World's 39-D observation (float64)."""
    state = np.asarray(state, dtype=np.float64)
    if observation == "agent":
        return state[:PROPRIO_DIM].copy()
    if observation == "agent_goal":
        return np.concatenate([state[:PROPRIO_DIM], state[GOAL]])
    if observation == "full":
        return state.copy()
    raise ValueError(f"observation must be one of {list(OBSERVATIONS)}, got {observation!r}")


def observation_of(proprio_dim: int) -> str:
    """The observation whose state vector has `proprio_dim` values ('' when none has)."""
    return next((name for name, size in OBSERVATIONS.items() if size == proprio_dim), "")
MAX_PATH_LENGTH = 500
"""Meta-World's episode length (`max_path_length`), the step limit of LeRobot's evaluation."""
LEROBOT_EVAL_SEEDS = tuple(range(1000, 1010))
"""The placements LeRobot's Meta-World evaluation plays: `eval.seed` 1000, 10 episodes a task."""
NUM_INIT_STATES = 100_000
"""Init states per task (seeds of Meta-World's placement draw): far more than any split uses."""
MAX_RESOLUTION = 1024


def tasks(suite: str) -> tuple[str, ...]:
    """The task names of `suite`, indexed by task id."""
    if suite in BENCHMARKS:
        return BENCHMARKS[suite]
    if suite in MT50:
        return (suite,)
    raise ValueError(f"unknown Meta-World suite {suite!r}; choose mt10, mt50 or one task's name ({task_hint(suite)})")


def task_hint(name: str) -> str:
    """The task names closest to `name`, for messages."""
    close = difflib.get_close_matches(name, MT50, n=3)
    return f"did you mean {' or '.join(close)}?" if close else f"the tasks: {', '.join(MT50)}"


def instructions(suite: str) -> list[str]:
    return [INSTRUCTIONS[name] for name in tasks(suite)]


def task_groups(suite: str) -> dict[str, list[int]]:
    """Difficulty group -> the ids of the suite's tasks in it (groups without one are left out)."""
    names = tasks(suite)
    groups = {group: [names.index(t) for t in members if t in names] for group, members in DIFFICULTY.items()}
    return {group: sorted(ids) for group, ids in groups.items() if ids}


def installed() -> bool:
    return importlib.util.find_spec("metaworld") is not None


# ---- the env --------------------------------------------------------------------------------------------------------
class MetaWorldEnv:
    """One Meta-World simulator; see the module docstring for what it does and why.

    camera_resolution: the camera image's side in pixels. max_steps: policy steps per episode (None: 500).
    observation: what `Observation.proprio` holds (`OBSERVATIONS`: agent, agent_goal or full).
    shadows, reflections, multisamples: the renderer's scene (Meta-World's own: on, on, 4). tasks_kept: the most
    scenes that stay built in this process, shared evenly by its open simulators, each keeping at least the one it
    plays (a scene is about 110 MB: Meta-World's env and its renderer); the one used longest ago is closed to build
    another (0.4 s), so an MT50 simulator need not hold fifty, nor a process of 20 simulators two hundred.
    """

    NUM_INIT_STATES = NUM_INIT_STATES
    ACTION_DIM = ACTION_DIM
    PROPRIO_DIM = PROPRIO_DIM

    def __init__(self, camera_resolution: int = 480, max_steps: int | None = None, shadows: bool = False,
                 reflections: bool = False, multisamples: int = 0, tasks_kept: int = 10,
                 observation: str = "agent") -> None:
        if not 1 <= camera_resolution <= MAX_RESOLUTION:
            raise ValueError(f"camera_resolution must be in [1, {MAX_RESOLUTION}], got {camera_resolution}")
        if tasks_kept < 1:
            raise ValueError(f"tasks_kept must be >= 1, got {tasks_kept}")
        if observation not in OBSERVATIONS:
            raise ValueError(f"observation must be one of {list(OBSERVATIONS)}, got {observation!r}")
        self.observation = observation
        self.tasks_kept = tasks_kept
        self.camera_resolution = camera_resolution
        self.limit = max_steps or MAX_PATH_LENGTH
        self.shadows, self.reflections, self.multisamples = shadows, reflections, multisamples
        self._envs: dict[str, Any] = {}
        self._renderers: dict[str, Any] = {}
        self._name = ""
        self._task: TaskSpec | None = None
        self._state = np.zeros(STATE_DIM)
        self._steps = 0
        self._done = True
        _OPEN.add(self)

    @property
    def kept(self) -> int:
        """The scenes this simulator keeps built: its share of `tasks_kept` among the process's open simulators."""
        return max(1, self.tasks_kept // max(len(_OPEN), 1))

    @property
    def state(self) -> np.ndarray:
        """Meta-World's 39-D observation after the last reset or step (what its scripted experts read)."""
        return self._state.copy()

    @property
    def raw(self) -> Any:
        """The Meta-World env of the current task."""
        return self._envs[self._name]

    @property
    def raw_name(self) -> str:
        """The current task's Meta-World name."""
        return self._name

    def _build(self, name: str) -> None:
        """Meta-World's env of task `name` as its multi-task benchmarks set it up (goal observable, placements drawn
        from the env's seeded generator), and a renderer of its corner2 camera at LeRobot's pose."""
        os.environ.setdefault("MUJOCO_GL", "egl")
        import mujoco
        from metaworld.env_dict import ALL_V3_ENVIRONMENTS

        env = ALL_V3_ENVIRONMENTS[name]()
        env._partially_observable = False  # the MT benchmarks' override (metaworld._MT_OVERRIDE)
        del env.sawyer_observation_space  # recomputed for the observable goal, as set_task does
        env._set_task_called = True
        env._freeze_rand_vec = False
        env.seeded_rand_vec = True
        env.max_path_length = max(self.limit, MAX_PATH_LENGTH)
        camera = mujoco.mj_name2id(env.model, mujoco.mjtObj.mjOBJ_CAMERA, CAMERA)
        env.model.cam_pos[camera] = CAMERA_POS
        env.model.vis.quality.offsamples = self.multisamples  # read when the renderer's buffers are made
        if not self.shadows:  # the scene's 4096 px shadow map is never drawn: no buffer for it (68 MB less a scene)
            env.model.vis.quality.shadowsize = 0
        env.model.vis.global_.offwidth = env.model.vis.global_.offheight = self.camera_resolution  # not 640 x 480
        renderer = mujoco.Renderer(env.model, self.camera_resolution, self.camera_resolution)
        renderer.scene.flags[mujoco.mjtRndFlag.mjRND_SHADOW] = self.shadows
        renderer.scene.flags[mujoco.mjtRndFlag.mjRND_REFLECTION] = self.reflections
        self._envs[name], self._renderers[name] = env, renderer

    def reset(self, task: TaskSpec) -> Observation:
        names = tasks(task.suite)
        if not 0 <= task.task_id < len(names):
            raise ValueError(f"{task.suite} task_id must be in [0, {len(names)}), got {task.task_id}")
        if not 0 <= task.init_state_id < NUM_INIT_STATES:
            raise ValueError(f"init_state_id must be in [0, {NUM_INIT_STATES}), got {task.init_state_id}")
        self._name = names[task.task_id]
        if self._name in self._envs:  # the most recently used last
            self._envs[self._name] = self._envs.pop(self._name)
        else:
            while len(self._envs) >= self.kept:
                self._drop(next(iter(self._envs)))
            self._build(self._name)
        env = self.raw
        env.seed(task.init_state_id)
        self._state, _ = env.reset()
        self._task, self._steps, self._done = task, 0, False
        return self._observe()

    def step(self, chunk: np.ndarray) -> ChunkStep:
        """Run the chunk's actions one by one, as float32 (Meta-World's action space; LeRobot hands it its policies'
        float32 actions); stop at success or at the step limit. info: Meta-World's reward of each step run
        (`rewards`), the episode's steps and its limit."""
        if self._task is None or self._done:
            raise RuntimeError("step() called before reset() or after the episode ended")
        chunk = np.asarray(chunk, dtype=np.float64)
        if chunk.ndim != 2 or chunk.shape[1] != ACTION_DIM or len(chunk) == 0:
            raise ValueError(f"chunk must have shape [T >= 1, {ACTION_DIM}], got {chunk.shape}")
        success, rewards = False, []
        for action in chunk.astype(np.float32):
            self._state, reward, _, _, info = self.raw.step(action)
            rewards.append(float(reward))
            self._steps += 1
            success = bool(info["success"])
            if success or self._steps >= self.limit:
                self._done = True
                break
        info = {"rewards": rewards, "episode_steps": self._steps, "step_limit": self.limit}
        return ChunkStep(self._observe(), float(success), self._done, success, len(rewards), info)

    def _observe(self) -> Observation:
        assert self._task is not None
        return Observation(images={CAMERA: self.render()}, proprio=proprio(self._state, self.observation),
                           instruction=INSTRUCTIONS[self._name])

    def render(self) -> np.ndarray:
        """The corner2 image of the scene as it is now, flipped on both axes as LeRobot's env flips it."""
        renderer = self._renderers[self._name]
        renderer.update_scene(self.raw.data, camera=CAMERA)
        return np.ascontiguousarray(renderer.render()[::-1, ::-1])

    def _drop(self, name: str) -> None:
        """Close task `name`'s scene and its renderer."""
        self._renderers.pop(name).close()
        self._envs.pop(name).close()

    @property
    def built(self) -> tuple[str, ...]:
        """The tasks whose scene is built, the one used longest ago first."""
        return tuple(self._envs)

    def close(self) -> None:
        for name in list(self._envs):
            self._drop(name)
        self._task, self._done = None, True
        _OPEN.discard(self)


_OPEN: weakref.WeakSet[MetaWorldEnv] = weakref.WeakSet()
"""The simulators open in this process (a simulator process hosts several), which share `tasks_kept`."""


@dataclass
class MetaWorldSettings:
    """Meta-World's own keys (read when env.name=metaworld)."""

    task: str = ""
    """The one task env=metaworld_mt1 plays (its suite is this name); '' for env=metaworld_mt10 / metaworld_mt50,
    which play every task of the benchmark."""
    shadows: bool = False
    """Render shadows (Meta-World's scenes: on, 4096 px shadow maps; off renders a CPU frame about 3x faster)."""
    reflections: bool = False
    """Render the floor's reflections (Meta-World's scenes: on)."""
    multisamples: int = 0
    """Multisampling of the offscreen image (Meta-World's scenes: 4)."""
    tasks_kept: int = 10
    """Scenes a simulator process keeps built (about 110 MB each), shared evenly by its simulators, each keeping at
    least the one it plays; playing another closes the one used longest ago and builds it (0.4 s)."""
    observation: str = "agent"
    """What the policy reads beside the image: agent (LeRobot's VLA protocol: the 4-D agent state, end effector xyz
    and finger gap; the goal only in the picture), agent_goal (the agent state and the goal's xyz: 7-D) or full
    (Meta-World's 39-D observation, as its MT10 / MT50 benchmarks hand it to an agent). Demonstrations record it as
    `observation.state`; a checkpoint plays only the observation it was trained on."""

    BOUNDS: ClassVar[dict[str, Bound]] = {"multisamples": (">= 0", 0, True), "tasks_kept": (">= 1", 1, True)}

    def simulator_kwargs(self) -> dict[str, Any]:
        return {"shadows": self.shadows, "reflections": self.reflections, "multisamples": self.multisamples,
                "tasks_kept": self.tasks_kept, "observation": self.observation}

    def startup_problems(self, suite: str) -> list[str]:
        """The task against the suite, and the `metaworld` package, checked before any simulator starts."""
        problems = []
        if self.task and self.task not in MT50:
            problems.append(f"env.metaworld.task={self.task!r} is not a Meta-World task: {task_hint(self.task)}")
        elif self.task and suite in BENCHMARKS and self.task not in BENCHMARKS[suite]:
            problems.append(f"env.metaworld.task={self.task!r} is not in {suite.upper()} ({', '.join(tasks(suite))})"
                            f": play it alone with env=metaworld_mt1 env.metaworld.task={self.task}, or on "
                            "env=metaworld_mt50")
        elif self.task and suite in BENCHMARKS:
            problems.append(f"env.metaworld.task={self.task!r}: env=metaworld_{suite} plays every task of "
                            f"{suite.upper()}; play one alone with env=metaworld_mt1 env.metaworld.task={self.task}")
        elif suite in MT50 and self.task != suite:
            problems.append(f"env.suite={suite!r} is one Meta-World task: choose it with env=metaworld_mt1 "
                            f"env.metaworld.task={suite}")
        if self.observation not in OBSERVATIONS:
            problems.append(f"env.metaworld.observation={self.observation!r} is not a Meta-World observation; choose "
                            f"one of {', '.join(OBSERVATIONS)}")
        if self.multisamples > 16:
            problems.append(f"env.metaworld.multisamples={self.multisamples}: MuJoCo's offscreen buffers take 0-16")
        if not installed():
            problems.append("Meta-World is not installed: run `make metaworld` (it installs metaworld==3.1.1 with "
                            "the MuJoCo this project pins), or `pip install --no-deps metaworld==3.1.1` beside "
                            "gymnasium, scipy and imageio")
        return problems


def _observation(kwargs: dict[str, Any]) -> tuple[str, int]:
    """The observation the simulator kwargs ask for, and its state size (`Simulator.observation`)."""
    name = kwargs.get("observation", "agent")
    return name, OBSERVATIONS.get(name, PROPRIO_DIM)


def _observation_hint(proprio_dim: int) -> str:
    """The key that gives a `proprio_dim`-D state (`Simulator.observation_hint`)."""
    name = observation_of(proprio_dim)
    return f"env.metaworld.observation={name}" if name else ""


SIMULATOR = Simulator(
    name="metaworld", env_class=MetaWorldEnv, settings=MetaWorldSettings, suites=SUITES, cameras=(CAMERA,),
    action_dim=ACTION_DIM, proprio_dim=PROPRIO_DIM, num_init_states=NUM_INIT_STATES, instructions=instructions,
    num_tasks=lambda suite: len(tasks(suite)), step_limits=lambda suite: [MAX_PATH_LENGTH] * len(tasks(suite)),
    image_keys={CAMERA: "observation.image"}, task_names=lambda suite: list(tasks(suite)), task_groups=task_groups,
    max_resolution=MAX_RESOLUTION, published_step_limit=lambda suite: MAX_PATH_LENGTH,
    published_init_states=LEROBOT_EVAL_SEEDS, scripted_demo="vla_scale.envs.metaworld_demo:play_expert",
    observation=_observation, observation_hint=_observation_hint,
)
