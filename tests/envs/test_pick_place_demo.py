"""The scripted pick_place demonstrator: what it records, and how often it succeeds with and without noise."""

from __future__ import annotations

import os

os.environ.setdefault("MUJOCO_GL", "egl")

from collections.abc import Iterator

import numpy as np
import pytest

from vla_scale.envs.pick_place import ACTION_DIM, CAMERAS, PROPRIO_DIM, PickPlaceEnv
from vla_scale.envs.pick_place_demo import DemoEpisode, Demonstrator, play
from vla_scale.envs.types import TaskSpec

MAX_STEPS = 40  # configs/env/pick_place.yaml
TRAIN_INIT_STATES = 80


@pytest.fixture(scope="module")
def env() -> Iterator[PickPlaceEnv]:
    pick_place = PickPlaceEnv(max_steps=MAX_STEPS)
    yield pick_place
    pick_place.close()


def tasks(episodes: int) -> list[TaskSpec]:
    """`episodes` TRAIN episodes spread over the 4 tasks and the init states."""
    return [TaskSpec("pick_place", i % 4, (i * 7) % TRAIN_INIT_STATES) for i in range(episodes)]


def success_rate(env: PickPlaceEnv, demonstrator: Demonstrator, episodes: int) -> tuple[float, list[int]]:
    played = [play(env, task, demonstrator) for task in tasks(episodes)]
    return float(np.mean([e.success for e in played])), [len(e.actions) for e in played]


def test_an_episode_is_recorded_as_the_env_gave_it(env: PickPlaceEnv) -> None:
    task = TaskSpec("pick_place", 1, 3)
    episode = play(env, task, Demonstrator())
    steps = len(episode.actions)
    assert isinstance(episode, DemoEpisode) and episode.success
    assert episode.instruction == "put the red cube in the yellow bowl"
    assert set(episode.images) == set(CAMERAS)
    for frames in episode.images.values():
        assert frames.shape == (steps, 64, 64, 3) and frames.dtype == np.uint8
    assert episode.state.shape == (steps, PROPRIO_DIM) and episode.state.dtype == np.float32
    assert episode.actions.shape == (steps, ACTION_DIM) and episode.actions.dtype == np.float32
    assert np.all(np.abs(episode.actions) <= 1.0)

    # Replaying the recorded actions on a fresh env gives, before each action, the recorded observation.
    replay = PickPlaceEnv(max_steps=MAX_STEPS)
    try:
        obs = replay.reset(task)
        for t in range(steps):
            assert np.array_equal(obs.proprio, episode.state[t])
            for camera in CAMERAS:
                assert np.array_equal(obs.images[camera], episode.images[camera][t])
            step = replay.step(episode.actions[t : t + 1].astype(np.float64))
            obs = step.observation
        assert step.done and step.success and step.info["episode_steps"] == steps
    finally:
        replay.close()


def test_the_demonstration_goes_through_the_phases(env: PickPlaceEnv) -> None:
    """Open while approaching, one close on the cube, closed while carrying, the final action opens."""
    episode = play(env, TaskSpec("pick_place", 2, 10), Demonstrator())
    gripper = episode.actions[:, 6]
    closes = np.flatnonzero(np.diff((gripper > 0).astype(int)) == 1) + 1
    assert len(closes) == 1 and gripper[0] < 0 and gripper[-1] < 0
    assert np.all(gripper[closes[0] : -1] > 0)
    assert episode.state[closes[0], 2] < episode.state[0, 2] - 0.05  # it descended before closing
    assert episode.state[-1, 3] == 1.0 and episode.state[closes[0] + 1, 3] == 1.0  # proprio: closed


def test_without_noise_every_train_episode_succeeds(env: PickPlaceEnv) -> None:
    rate, lengths = success_rate(env, Demonstrator(), 48)
    print(f"noise 0: success {rate:.3f}, episode steps {min(lengths)}-{max(lengths)}, mean {np.mean(lengths):.1f}")
    assert rate == 1.0
    assert 15 <= min(lengths) and max(lengths) <= 28  # a clean episode fits 5 chunks of 8 with room to spare


def test_without_noise_every_episode_from_spread_starts_succeeds() -> None:
    spread = PickPlaceEnv(max_steps=MAX_STEPS, start_spread=0.15)
    try:
        rate, lengths = success_rate(spread, Demonstrator(), 24)
    finally:
        spread.close()
    assert rate == 1.0 and max(lengths) <= 32


def test_noise_changes_the_actions_and_lowers_the_success_rate(env: PickPlaceEnv) -> None:
    task = TaskSpec("pick_place", 0, 0)
    clean = play(env, task, Demonstrator())
    noisy = play(env, task, Demonstrator(noise=0.2, rng=np.random.default_rng(1)))
    again = play(env, task, Demonstrator(noise=0.2, rng=np.random.default_rng(1)))
    assert not np.array_equal(clean.actions[:5], noisy.actions[:5])
    assert np.array_equal(noisy.actions, again.actions)  # the noise is the generator's alone
    rates = {noise: success_rate(env, Demonstrator(noise, rng=3), 40)[0] for noise in (0.2, 0.5)}
    print(f"success rate by noise: {rates}")
    assert rates[0.2] >= 0.85
    assert 0.1 <= rates[0.5] <= 0.85


def test_bad_noise() -> None:
    with pytest.raises(ValueError, match="noise"):
        Demonstrator(noise=-0.1)


def test_the_intended_actions_are_the_noise_free_demonstrator_on_the_states_the_noise_reached(env) -> None:
    episode = play(env, TaskSpec("pick_place", 1, 7), Demonstrator(0.3, 11))
    assert episode.intended is not None and episode.intended.shape == episode.actions.shape
    assert not np.array_equal(episode.intended[:, :3], episode.actions[:, :3])  # the noise moved the arm
    np.testing.assert_array_equal(episode.intended[:, 3:], episode.actions[:, 3:])  # rotation and gripper: no noise
    clean = Demonstrator(0.0)
    env.reset(TaskSpec("pick_place", 1, 7))
    for intended, executed in zip(episode.intended, episode.actions, strict=True):
        np.testing.assert_array_equal(clean.act(env.scene()).astype(np.float32), intended)
        env.step(executed[None].astype(np.float64))
