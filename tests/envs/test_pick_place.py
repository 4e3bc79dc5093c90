"""The embedded pick_place task: determinism, layouts, the kinematic grasp and release, success, the random floor."""

from __future__ import annotations

import os

os.environ.setdefault("MUJOCO_GL", "egl")

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import yaml

from vla_scale.config import EnvConfig
from vla_scale.envs.pick_place import (
    ACTION_DIM,
    BOWL_FLOOR,
    BOWL_RADIUS,
    CAMERAS,
    CUBE_HALF,
    PROPRIO_DIM,
    SLOTS,
    PickPlaceEnv,
    PickPlaceSettings,
    instructions,
    task_instruction,
    task_objects,
)
from vla_scale.envs.registry import SIMULATORS, make_env
from vla_scale.envs.types import ChunkStep, TaskSpec

CHUNK = 8
SHIPPED = Path(__file__).resolve().parents[2] / "configs" / "env" / "pick_place.yaml"


@pytest.fixture(scope="module")
def env() -> Iterator[PickPlaceEnv]:
    pick_place = PickPlaceEnv(max_steps=200)  # room for the scripted sequences below
    yield pick_place
    pick_place.close()


def action(move: np.ndarray | tuple[float, float, float] = (0.0, 0.0, 0.0), close: bool = False) -> np.ndarray:
    """One action as a chunk of length 1."""
    chunk = np.zeros((1, ACTION_DIM))
    chunk[0, :3] = move
    chunk[0, 6] = 1.0 if close else -1.0
    return chunk


def go_to(env: PickPlaceEnv, target: np.ndarray, close: bool) -> ChunkStep:
    """Move the grip point to `target` in straight steps, the gripper held closed or open."""
    for _ in range(env.max_steps):
        error = target - np.array(env.scene().gripper)
        step = env.step(action(np.clip(error / env.max_delta, -1.0, 1.0), close))
        if step.done or np.allclose(env.scene().gripper, target, atol=1e-9):
            return step
    raise AssertionError(f"did not reach {target}")


def grasp(env: PickPlaceEnv, cube: str) -> ChunkStep:
    """Go above `cube`, descend onto it and close."""
    centre = np.array(env.scene().cubes[cube])
    go_to(env, centre + [0.0, 0.0, 0.05], close=False)
    go_to(env, centre, close=False)
    return env.step(action(close=True))


def carry_and_release(env: PickPlaceEnv, bowl: str) -> ChunkStep:
    go_to(env, np.array(env.scene().gripper) + [0.0, 0.0, 0.06], close=True)
    over = np.array(env.scene().bowls[bowl])
    go_to(env, np.array([over[0], over[1], env.scene().gripper[2]]), close=True)
    return env.step(action(close=False))


def test_observation_format(env: PickPlaceEnv) -> None:
    obs = env.reset(TaskSpec("pick_place", 2, 0))
    assert set(obs.images) == set(CAMERAS) == {"agentview", "wrist"}
    for image in obs.images.values():
        assert image.shape == (64, 64, 3) and image.dtype == np.uint8 and image.std() > 10
    assert obs.proprio.shape == (PROPRIO_DIM,) and obs.proprio.dtype == np.float32
    assert obs.proprio[3] == -1.0  # open
    assert obs.instruction == task_instruction(2) == "put the green cube in the blue bowl"
    assert instructions() == [task_instruction(i) for i in range(PickPlaceEnv.NUM_TASKS)]
    for task_id, text in enumerate(instructions()):
        cube, bowl = task_objects(task_id)
        assert f"{cube} cube" in text and f"{bowl} bowl" in text
    assert len(set(instructions())) == 4


def test_the_cameras_see_the_colours(env: PickPlaceEnv) -> None:
    """Every object's colour is visible from the agentview camera, whatever the layout."""
    colours = {"red": (200, 40, 40), "green": (30, 180, 40), "blue": (40, 70, 210), "yellow": (210, 190, 30)}
    for init_state_id in range(5):
        image = env.reset(TaskSpec("pick_place", 0, init_state_id)).images["agentview"].astype(int)
        for name, rgb in colours.items():
            close = np.abs(image - np.array(rgb)).max(axis=-1) < 60
            assert close.sum() >= 4, name


def test_reset_and_steps_are_reproducible_across_instances() -> None:
    task = TaskSpec("pick_place", 3, 41)
    chunks = np.random.default_rng(0).uniform(-1, 1, (4, CHUNK, ACTION_DIM))
    runs = []
    for _ in range(2):
        env = PickPlaceEnv(seed=5)
        seen = [env.reset(task)]
        for chunk in chunks:
            step = env.step(chunk)
            seen.append(step.observation)
            if step.done:
                break
        env.close()
        runs.append(seen)
    for a, b in zip(*runs, strict=True):
        assert np.array_equal(a.proprio, b.proprio)
        for camera in CAMERAS:
            assert np.array_equal(a.images[camera], b.images[camera])


def test_init_states_differ_and_never_overlap(env: PickPlaceEnv) -> None:
    a = env.reset(TaskSpec("pick_place", 0, 0))
    b = env.reset(TaskSpec("pick_place", 0, 1))
    assert not np.array_equal(a.images["agentview"], b.images["agentview"])
    assert not np.array_equal(a.proprio, b.proprio)
    footprints = [CUBE_HALF * np.sqrt(2)] * 2 + [BOWL_RADIUS] * 2
    arrangements = set()
    for task_id in range(PickPlaceEnv.NUM_TASKS):
        for init_state_id in range(1000):  # of the 100000 generated layouts per task
            state = PickPlaceEnv.init_state(task_id, init_state_id)
            centres = [p[:2] for p in (*state.cubes.values(), *state.bowls.values())]
            for i in range(4):
                for j in range(i + 1, 4):
                    assert np.linalg.norm(centres[i] - centres[j]) > footprints[i] + footprints[j]
            slots = tuple(int(np.argmin(np.linalg.norm(SLOTS - c, axis=1))) for c in centres)
            arrangements.add(slots)
    assert len(arrangements) == 24  # every assignment of the four objects to the four slots occurs


def test_closing_away_from_a_cube_grasps_nothing(env: PickPlaceEnv) -> None:
    env.reset(TaskSpec("pick_place", 0, 4))
    step = env.step(action(close=True))  # high above the table
    assert step.info["held"] is None and env.scene().closed and step.observation.proprio[3] == 1.0
    red = np.array(env.scene().cubes["red"])
    go_to(env, red, close=True)  # descending already closed: no open -> closed transition at the cube
    assert env.scene().held is None
    step = env.step(action(close=True))
    assert step.info["held"] is None
    go_to(env, red + [0.0, 0.0, 0.03], close=False)  # opened, but too high to reach the cube
    assert env.step(action(close=True)).info["held"] is None
    assert env.scene().cubes["red"] == tuple(red)


def test_a_grasp_lifts_the_cube_and_the_fingers_close(env: PickPlaceEnv) -> None:
    open_image = env.reset(TaskSpec("pick_place", 0, 4)).images["wrist"]
    step = grasp(env, "red")
    assert step.info["held"] == "red" and env.scene().held == "red"
    assert not np.array_equal(open_image, step.observation.images["wrist"])
    before = np.array(env.scene().cubes["red"])
    go_to(env, np.array(env.scene().gripper) + [0.03, 0.02, 0.06], close=True)
    assert np.allclose(env.scene().cubes["red"], before + [0.03, 0.02, 0.06])
    green = env.scene().cubes["green"]
    env.step(action(close=False))  # released over the table: drops straight down
    scene = env.scene()
    assert scene.held is None and not env.success()
    assert np.allclose(scene.cubes["red"], [*(before[:2] + [0.03, 0.02]), CUBE_HALF])
    assert scene.cubes["green"] == green


@pytest.mark.parametrize("task_id", range(4))
def test_success_only_for_the_instructed_cube_in_the_instructed_bowl(env: PickPlaceEnv, task_id: int) -> None:
    cube, bowl = task_objects(task_id)
    other_cube = next(c for c in ("red", "green") if c != cube)
    other_bowl = next(b for b in ("blue", "yellow") if b != bowl)
    env.reset(TaskSpec("pick_place", task_id, 9))
    assert grasp(env, other_cube).info["held"] == other_cube
    step = carry_and_release(env, bowl)  # the other cube in the right bowl
    assert not step.success and not step.done and step.reward == 0.0
    assert env.scene().cubes[other_cube][2] == pytest.approx(CUBE_HALF + BOWL_FLOOR)
    assert grasp(env, cube).info["held"] == cube
    step = carry_and_release(env, other_bowl)  # the right cube in the wrong bowl
    assert not step.success and not step.done
    assert grasp(env, cube).info["held"] == cube
    step = carry_and_release(env, bowl)
    assert step.success and step.done and step.reward == 1.0 and step.steps_taken == 1
    with pytest.raises(RuntimeError):
        env.step(action())


def test_a_released_cube_never_lands_on_the_other(env: PickPlaceEnv) -> None:
    env.reset(TaskSpec("pick_place", 0, 2))
    grasp(env, "red")
    green = np.array(env.scene().cubes["green"])
    go_to(env, np.array(env.scene().gripper) + [0.0, 0.0, 0.06], close=True)
    go_to(env, green + [0.01, 0.005, 0.08], close=True)
    env.step(action(close=False))
    red = np.array(env.scene().cubes["red"])
    assert np.abs(red[:2] - green[:2]).max() == pytest.approx(2 * CUBE_HALF)
    assert red[2] == pytest.approx(CUBE_HALF) and env.scene().cubes["green"] == tuple(green)


def test_episode_stops_at_max_steps() -> None:
    env = PickPlaceEnv(max_steps=12)
    env.reset(TaskSpec("pick_place", 1, 0))
    first = env.step(np.zeros((CHUNK, ACTION_DIM)))
    second = env.step(np.zeros((CHUNK, ACTION_DIM)))
    env.close()
    assert (first.steps_taken, first.done) == (CHUNK, False)
    assert (second.steps_taken, second.done, second.success, second.info["episode_steps"]) == (4, True, False, 12)


def test_random_policy_rarely_succeeds(env: PickPlaceEnv) -> None:
    """The shipped step limit leaves a uniformly random policy (almost) no chance: the task has to be learned."""
    shipped = yaml.safe_load(SHIPPED.read_text())
    random_env = PickPlaceEnv(max_steps=shipped["max_steps"], max_delta=shipped["pick_place"]["max_delta"])
    rng = np.random.default_rng(0)
    episodes, successes = 100, 0
    for i in range(episodes):
        random_env.reset(TaskSpec("pick_place", i % 4, i // 4))
        step = random_env.step(rng.uniform(-1.0, 1.0, (CHUNK, ACTION_DIM)))
        while not step.done:
            step = random_env.step(rng.uniform(-1.0, 1.0, (CHUNK, ACTION_DIM)))
        successes += step.success
    random_env.close()
    print(f"random policy success rate: {successes / episodes:.3f} over {episodes} episodes")
    assert successes / episodes <= 0.03


def test_bad_inputs(env: PickPlaceEnv) -> None:
    with pytest.raises(ValueError, match="suite"):
        env.reset(TaskSpec("reach", 0, 0))
    with pytest.raises(ValueError, match="task_id"):
        env.reset(TaskSpec("pick_place", PickPlaceEnv.NUM_TASKS, 0))
    with pytest.raises(ValueError, match="init_state_id"):
        env.reset(TaskSpec("pick_place", 0, PickPlaceEnv.NUM_INIT_STATES))
    env.reset(TaskSpec("pick_place", 0, 0))
    with pytest.raises(ValueError, match="shape"):
        env.step(np.zeros((CHUNK, 3)))


def test_registry_and_config() -> None:
    assert SIMULATORS["pick_place"].env_class is PickPlaceEnv
    assert SIMULATORS["pick_place"].cameras == ("agentview", "wrist")
    kwargs = EnvConfig(name="pick_place", suite="pick_place",
                       pick_place=PickPlaceSettings(physics_substeps=2)).simulator_kwargs()
    env = make_env("pick_place", **{**kwargs, "camera_resolution": 32})
    try:
        assert isinstance(env, PickPlaceEnv) and env.physics_substeps == 2 and env.max_delta == 0.02
        obs = env.reset(TaskSpec("pick_place", 0, 0))
        assert obs.images["wrist"].shape == (32, 32, 3)
        env.step(np.zeros((3, ACTION_DIM)))
        assert env.data.time == pytest.approx(3 * 2 * env.model.opt.timestep)
    finally:
        env.close()


def test_start_spread_sets_where_the_gripper_starts() -> None:
    """The default keeps every start between the slots, where the first steps decide the cube; 0.15 spreads the
    starts over all four slots, so the start no longer says which cube the gripper goes for."""
    centre = np.array([0.0, 0.04])
    default = np.array([PickPlaceEnv.init_state(0, i).gripper for i in range(400)])
    wide = np.array([PickPlaceEnv.init_state(0, i, start_spread=0.15).gripper for i in range(400)])
    assert np.abs(default[:, :2] - centre).max() <= 0.03
    assert np.abs(wide[:, :2] - centre).max() <= 0.15 and np.abs(wide[:, :2] - centre).max(axis=0).min() > 0.13
    nearest = {int(np.argmin(np.linalg.norm(SLOTS - g, axis=1))) for g in wide[:, :2]}
    assert nearest == {0, 1, 2, 3}
    assert np.array_equal(default[:, 2], wide[:, 2])  # the height's draw is the same either way
    same = PickPlaceEnv.init_state(0, 7, start_spread=0.15)
    assert all(np.array_equal(same.cubes[c], PickPlaceEnv.init_state(0, 7).cubes[c]) for c in same.cubes)

    kwargs = EnvConfig(name="pick_place", suite="pick_place",
                       pick_place=PickPlaceSettings(start_spread=0.15)).simulator_kwargs()
    env = make_env("pick_place", **{**kwargs, "camera_resolution": 32})
    try:
        obs = env.reset(TaskSpec("pick_place", 0, 3))
        assert np.allclose(obs.proprio[:3], PickPlaceEnv.init_state(0, 3, start_spread=0.15).gripper)
    finally:
        env.close()
    with pytest.raises(ValueError, match="start_spread"):
        PickPlaceEnv(start_spread=-0.1)
