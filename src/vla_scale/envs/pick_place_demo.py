"""A scripted demonstrator for the pick_place task, and the recording of the episodes it plays.

`Demonstrator.act` is a waypoint controller that reads only `PickPlaceEnv.scene()`: move above the instructed cube,
descend, close, lift, carry the cube over the instructed bowl, open. It keeps no state between calls, so it recovers
by itself from a grasp that missed or a cube dropped outside the bowl (it opens and starts over). Gaussian noise on
its xyz action makes imperfect demonstrations; with none it succeeds from every init state.

`play` records an episode step by step: the observation the env gave before each action, and that action;
`play_scripted` is the demonstrator as the simulator's record names it (`envs/scripted.ScriptedDemo`).
"""

from __future__ import annotations

import numpy as np

from vla_scale.envs.pick_place import ACTION_DIM, CAMERAS, GRASP_HEIGHT, GRASP_RADIUS, PickPlaceEnv, Scene
from vla_scale.envs.scripted import DemoEpisode
from vla_scale.envs.types import ChunkStep, Observation, TaskSpec

HOVER = 0.05
"""Height above the cube's centre that the gripper approaches it at, before descending."""
CARRY = 0.10
"""Grip-point height a held cube travels at."""
CLEAR = 0.06
"""Grip-point height a held cube is lifted to before it moves sideways."""
DESCEND_XY = 0.01
"""Largest xy error (m) from the cube's centre at which the gripper goes down onto it."""
CLOSE_XY = GRASP_RADIUS / 2
CLOSE_Z = GRASP_HEIGHT / 2
RELEASE_XY = 0.02
"""Largest xy error (m) of the held cube from the bowl's centre at which the gripper opens."""
CLOSE, OPEN = 1.0, -1.0


class Demonstrator:
    """Picks the instructed cube and places it in the instructed bowl, from the scene alone.

    `noise`: std of the Gaussian noise added to the xyz part of each action (action units, the sum clipped to
    [-1, 1]); `rng`: the noise's generator, or a seed for one.
    """

    def __init__(self, noise: float = 0.0, rng: np.random.Generator | int = 0) -> None:
        if noise < 0:
            raise ValueError(f"noise must be >= 0, got {noise}")
        self.noise = noise
        self.rng = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)

    def act(self, scene: Scene) -> np.ndarray:
        """One action [7] from the scene, noise included."""
        return self.act_and_intent(scene)[0]

    def act_and_intent(self, scene: Scene) -> tuple[np.ndarray, np.ndarray]:
        """(the action [7] executed, noise included; the action meant, without it), both clipped to [-1, 1]."""
        target, gripper = self._waypoint(scene)
        action = np.zeros(ACTION_DIM)
        action[:3] = (target - np.array(scene.gripper)) / scene.max_delta
        action[6] = gripper
        intended = np.clip(action, -1.0, 1.0)
        if self.noise > 0:
            action[:3] += self.rng.normal(0.0, self.noise, 3)
        return np.clip(action, -1.0, 1.0), intended

    def _waypoint(self, scene: Scene) -> tuple[np.ndarray, float]:
        """Where the grip point should go next, and the gripper command."""
        grip = np.array(scene.gripper)
        if scene.held == scene.cube:
            return _carry(scene, grip)
        if scene.held is not None or scene.closed:  # the wrong cube, or a grasp that missed: let go, start over
            return grip, OPEN
        return _approach(scene, grip)


def _approach(scene: Scene, grip: np.ndarray) -> tuple[np.ndarray, float]:
    cube = np.array(scene.cubes[scene.cube])
    xy_error = np.linalg.norm(cube[:2] - grip[:2])
    if xy_error > DESCEND_XY:
        return np.array([*cube[:2], cube[2] + HOVER]), OPEN
    if xy_error <= CLOSE_XY and abs(grip[2] - cube[2]) <= CLOSE_Z:
        return grip, CLOSE
    return cube, OPEN


def _carry(scene: Scene, grip: np.ndarray) -> tuple[np.ndarray, float]:
    """Lift, carry the held cube's centre over the bowl's centre, open."""
    cube = np.array(scene.cubes[scene.cube])
    bowl = np.array(scene.bowls[scene.bowl])
    offset = bowl[:2] - cube[:2]
    if np.linalg.norm(offset) <= RELEASE_XY:
        return grip, OPEN
    if grip[2] < CLEAR:
        return np.array([*grip[:2], CARRY]), CLOSE
    return np.array([*(grip[:2] + offset), CARRY]), CLOSE


def play(env: PickPlaceEnv, task: TaskSpec, demonstrator: Demonstrator) -> DemoEpisode:
    """Reset the env to `task` and let the demonstrator play it to its end, one action per env step.

    Each action is computed from the scene after the previous one, so the env is stepped one action at a time; the
    recording is the same however a later consumer cuts it into chunks.
    """
    observation = env.reset(task)
    seen: list[Observation] = []
    actions: list[np.ndarray] = []
    intended: list[np.ndarray] = []
    step: ChunkStep | None = None
    while step is None or not step.done:
        action, meant = (a.astype(np.float32) for a in demonstrator.act_and_intent(env.scene()))
        seen.append(observation)
        actions.append(action)
        intended.append(meant)
        step = env.step(action[None].astype(np.float64))
        observation = step.observation
    return DemoEpisode(
        images={camera: np.stack([o.images[camera] for o in seen]) for camera in CAMERAS},
        state=np.stack([o.proprio for o in seen]).astype(np.float32),
        actions=np.stack(actions),
        instruction=seen[0].instruction,
        success=step.success,
        intended=np.stack(intended),
    )


def play_scripted(env: PickPlaceEnv, task: TaskSpec, noise: float, rng: np.random.Generator) -> DemoEpisode:
    """`play` with a `Demonstrator` of xyz noise `noise` drawn from `rng` (`envs/scripted.ScriptedDemo`)."""
    return play(env, task, Demonstrator(noise, rng))
