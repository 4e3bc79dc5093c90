"""launch/demonstrate.py end to end: scripted pick_place demonstrations written as a LeRobot dataset re-read to the
very episodes the demonstrator plays (frames within the default video codec's 2 levels); bad input refused before any
simulator starts."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import run_script

# before the imports that need it: without PyAV the module is skipped, not a collection error
pytest.importorskip("av", reason="PyAV (the av package) writes and reads the datasets' videos: `make install`")

from vla_scale.datasets.lerobot import LeRobotKeys, read_dataset  # noqa: E402
from vla_scale.envs.pick_place import CAMERAS, PickPlaceEnv  # noqa: E402
from vla_scale.envs.pick_place_demo import Demonstrator, play  # noqa: E402
from vla_scale.envs.types import TaskSpec  # noqa: E402

VIDEO_ERROR = 2
"""The most an RGB value moves through the default video codec (h264_yuv444, tests/datasets/test_lerobot.py)."""


@pytest.mark.parametrize(("codec", "largest_error"), [((), VIDEO_ERROR), (("record.codec=h264_rgb",), 0)])
def test_recorded_demonstrations_re_read_to_the_episodes_played(tmp_path: Path, codec: tuple[str, ...],
                                                                 largest_error: int) -> None:
    """With the default codec frames come back within its 2 levels; with record.codec=h264_rgb bit for bit."""
    out = tmp_path / "demos"
    proc = run_script("demonstrate", "env=pick_place", f"record.path={out}", "demo.episodes=3", "demo.noise=0.2",
                      "record.episodes=successes", "seed=5", f"hydra.run.dir={tmp_path / 'hydra'}", *codec,
                      timeout=200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1].startswith("demonstrate: episodes=3 recorded=")
    keys = LeRobotKeys(cameras={c: f"observation.images.{c}" for c in CAMERAS})
    read = read_dataset(out, keys, action_dim=7, state_dim=4)
    env = PickPlaceEnv(camera_resolution=64, max_steps=40, max_delta=0.02)
    demonstrator = Demonstrator(0.2, 5)
    played = [play(env, TaskSpec("pick_place", i, 0), demonstrator) for i in range(3)]
    recorded = [d for d in played if d.success]
    assert len(read) == len(recorded) > 0
    for got, want in zip(read, recorded, strict=True):
        assert got.instruction == want.instruction and got.success is True
        assert np.array_equal(got.actions, want.actions) and np.array_equal(got.state, want.state)
        for camera in CAMERAS:
            error = np.abs(got.images[camera].astype(np.int16) - want.images[camera].astype(np.int16))
            assert got.images[camera].shape == want.images[camera].shape and error.max() <= largest_error


def test_an_env_without_a_demonstrator_is_refused_before_anything_starts(tmp_path: Path) -> None:
    proc = run_script("demonstrate", "env=reach", f"hydra.run.dir={tmp_path}", timeout=100)
    assert proc.returncode != 0
    assert "has no scripted demonstrator" in proc.stderr and "record.path is not set" in proc.stderr
