"""The embedded reach task: determinism, observation format, episode ends, and the learnability window."""

from __future__ import annotations

import os

os.environ.setdefault("MUJOCO_GL", "egl")

from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import yaml

from vla_scale.envs.reach import (
    ACTION_DIM,
    CAMERA,
    MAX_DELTA,
    PROPRIO_DIM,
    ReachEnv,
    instructions,
    task_instruction,
)
from vla_scale.envs.registry import SIMULATORS, make_env
from vla_scale.envs.types import ChunkStep, Observation, TaskSpec

CHUNK = 8


@pytest.fixture
def env() -> Iterator[ReachEnv]:
    reach = ReachEnv()
    yield reach
    reach.close()


def scripted_chunk(env: ReachEnv, obs: Observation, task: TaskSpec) -> np.ndarray:
    """Head straight for the named block, planning the whole chunk open-loop from the current proprio."""
    _, blocks = ReachEnv.init_state(task.task_id, task.init_state_id)
    target = blocks[task.task_id, :2]
    ee = obs.proprio[:2].astype(np.float64)
    chunk = np.zeros((CHUNK, ACTION_DIM))
    for t in range(CHUNK):
        chunk[t, :2] = np.clip((target - ee) / MAX_DELTA, -1.0, 1.0)
        ee = ee + chunk[t, :2] * MAX_DELTA
    return chunk


def play(env: ReachEnv, task: TaskSpec, policy: Callable[[Observation], np.ndarray]) -> list[ChunkStep]:
    obs = env.reset(task)
    steps = []
    while not steps or not steps[-1].done:
        steps.append(env.step(policy(obs)))
        obs = steps[-1].observation
    return steps


def test_observation_format(env: ReachEnv) -> None:
    obs = env.reset(TaskSpec("reach", 1, 0))
    image = obs.images[CAMERA]
    assert image.shape == (64, 64, 3) and image.dtype == np.uint8
    assert image.std() > 10  # a real scene, not a blank frame
    assert obs.proprio.shape == (PROPRIO_DIM,) and obs.proprio.dtype == np.float32
    assert obs.instruction == task_instruction(1) == "reach the green block"
    assert instructions() == [task_instruction(i) for i in range(ReachEnv.NUM_TASKS)]
    small = ReachEnv(camera_resolution=32)
    assert small.reset(TaskSpec("reach", 0, 0)).images[CAMERA].shape == (32, 32, 3)
    small.close()


def test_deterministic_across_instances() -> None:
    task = TaskSpec("reach", 2, 7)
    chunks = np.random.default_rng(0).uniform(-1, 1, (5, CHUNK, ACTION_DIM))
    runs = []
    for _ in range(2):
        env = ReachEnv(seed=3)
        obs = [env.reset(task)]
        outcome = []
        for chunk in chunks:
            step = env.step(chunk)
            obs.append(step.observation)
            outcome.append((step.reward, step.done, step.success, step.steps_taken))
            if step.done:
                break
        env.close()
        runs.append((obs, outcome))
    (obs_a, out_a), (obs_b, out_b) = runs
    assert out_a == out_b
    for a, b in zip(obs_a, obs_b, strict=True):
        assert np.array_equal(a.images[CAMERA], b.images[CAMERA])
        assert np.array_equal(a.proprio, b.proprio)


def test_physics_substeps_simulate_without_changing_the_task() -> None:
    """The cost knob runs real physics steps (simulated time advances by each) and the episode is the same."""
    task = TaskSpec("reach", 1, 3)
    chunks = np.random.default_rng(1).uniform(-1, 1, (3, CHUNK, ACTION_DIM))
    plain, heavy = ReachEnv(max_steps=24), ReachEnv(max_steps=24, physics_substeps=7)
    try:
        for env in (plain, heavy):
            env.reset(task)
        for chunk in chunks:
            a, b = plain.step(chunk), heavy.step(chunk)
            assert (a.reward, a.done, a.success, a.steps_taken) == (b.reward, b.done, b.success, b.steps_taken)
            assert np.array_equal(a.observation.images[CAMERA], b.observation.images[CAMERA])
            assert np.array_equal(a.observation.proprio, b.observation.proprio)
        assert plain.data.time == 0.0
        assert heavy.data.time == pytest.approx(24 * 7 * heavy.model.opt.timestep)
    finally:
        plain.close()
        heavy.close()


def test_the_env_config_builds_the_physics_cost_into_its_simulators() -> None:
    from vla_scale.config import EnvConfig
    from vla_scale.envs.reach import ReachSettings

    env = make_env("reach", **EnvConfig(reach=ReachSettings(physics_substeps=3)).simulator_kwargs())
    try:
        assert env.physics_substeps == 3
    finally:
        env.close()


def test_init_states_differ(env: ReachEnv) -> None:
    a = env.reset(TaskSpec("reach", 0, 0))
    b = env.reset(TaskSpec("reach", 0, 1))
    again = env.reset(TaskSpec("reach", 0, 0))
    assert not np.array_equal(a.images[CAMERA], b.images[CAMERA])
    assert not np.array_equal(a.proprio, b.proprio)
    assert np.array_equal(a.images[CAMERA], again.images[CAMERA])
    ee0, blocks0 = ReachEnv.init_state(0, 0)
    ee1, blocks1 = ReachEnv.init_state(0, 1)
    assert not np.allclose(blocks0, blocks1) and not np.allclose(ee0, ee1)


def test_colour_regions_are_consistent() -> None:
    """Red stays left and blue right of the start, green ahead: the instruction fixes the direction."""
    for task_id in range(ReachEnv.NUM_TASKS):
        for init_state_id in range(ReachEnv.NUM_INIT_STATES):
            ee, blocks = ReachEnv.init_state(task_id, init_state_id)
            red, green, blue = blocks
            assert red[0] < ee[0] - 0.05 < ee[0] + 0.05 < blue[0]
            assert green[1] > ee[1] + 0.1
            assert np.all(np.linalg.norm(blocks[:, :2] - ee[:2], axis=1) > 0.08)


def test_scripted_policy_succeeds_on_every_task(env: ReachEnv) -> None:
    for task_id in range(ReachEnv.NUM_TASKS):
        for init_state_id in (0, 17, 49):
            task = TaskSpec("reach", task_id, init_state_id)
            steps = play(env, task, lambda obs, task=task: scripted_chunk(env, obs, task))
            assert steps[-1].success and steps[-1].reward == 1.0 and steps[-1].done
            assert all(s.reward == 0.0 for s in steps[:-1])


def test_early_stop_inside_chunk_on_success(env: ReachEnv) -> None:
    task = TaskSpec("reach", 0, 3)
    step = env.step(scripted_chunk(env, env.reset(task), task))
    assert step.success and step.done and step.steps_taken < CHUNK
    with pytest.raises(RuntimeError):
        env.step(np.zeros((CHUNK, ACTION_DIM)))


def test_episode_stops_at_max_steps() -> None:
    env = ReachEnv(max_steps=12)
    env.reset(TaskSpec("reach", 1, 0))
    first = env.step(np.zeros((CHUNK, ACTION_DIM)))
    second = env.step(np.zeros((CHUNK, ACTION_DIM)))
    env.close()
    assert (first.steps_taken, first.done) == (CHUNK, False)
    assert (second.steps_taken, second.done, second.success, second.reward) == (4, True, False, 0.0)


SHIPPED = Path(__file__).resolve().parents[2] / "configs" / "env" / "reach.yaml"


@pytest.mark.parametrize("settings", ["constructor defaults", "configs/env/reach.yaml"])
def test_random_policy_success_rate(settings: str) -> None:
    """The learnability window: a uniform random policy succeeds sometimes, but rarely."""
    kwargs = {}
    if settings != "constructor defaults":
        shipped = yaml.safe_load(SHIPPED.read_text())
        kwargs = {"max_steps": shipped["max_steps"], "max_delta": shipped["reach"]["max_delta"]}
    env = ReachEnv(**kwargs)
    rng = np.random.default_rng(0)
    episodes = 150
    successes = 0
    for i in range(episodes):
        task = TaskSpec("reach", i % ReachEnv.NUM_TASKS, (i // ReachEnv.NUM_TASKS) % ReachEnv.NUM_INIT_STATES)
        steps = play(env, task, lambda _obs: rng.uniform(-1.0, 1.0, (CHUNK, ACTION_DIM)))
        assert sum(s.steps_taken for s in steps) <= env.max_steps
        successes += steps[-1].success
    rate = successes / episodes
    print(f"random policy success rate: {rate:.3f} over {episodes} episodes")
    env.close()
    assert 0.05 <= rate <= 0.4


def test_bad_inputs(env: ReachEnv) -> None:
    with pytest.raises(ValueError, match="suite"):
        env.reset(TaskSpec("libero_spatial", 0, 0))
    with pytest.raises(ValueError, match="task_id"):
        env.reset(TaskSpec("reach", ReachEnv.NUM_TASKS, 0))
    with pytest.raises(ValueError, match="init_state_id"):
        env.reset(TaskSpec("reach", 0, ReachEnv.NUM_INIT_STATES))
    with pytest.raises(RuntimeError):
        env.step(np.zeros((CHUNK, ACTION_DIM)))
    env.reset(TaskSpec("reach", 0, 0))
    with pytest.raises(ValueError, match="shape"):
        env.step(np.zeros((CHUNK, 3)))


def test_registry() -> None:
    env = make_env("reach", camera_resolution=32, max_steps=5)
    assert isinstance(env, ReachEnv) and env.max_steps == 5
    env.close()
    assert SIMULATORS["reach"].env_class is ReachEnv
    with pytest.raises(ValueError, match="reach"):
        make_env("no_such_env")
