"""Episode stats equal those LeRobot's own compute_stats.py gives on the same synthetic episodes: v3.0's those of
0.4.4, v2.1's those of 0.3.3 (tests/fixtures/lerobot_reference/make_image_stats.py recorded them and makes the
episodes for both sides)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from vla_scale.datasets import lerobot_stats

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures/lerobot_reference"
REFERENCE = json.loads((FIXTURES / "episode_stats.json").read_text())
RELEASES = {"v3.0": "v0.4.4", "v2.1": "v0.3.3"}


def _maker() -> Any:
    spec = importlib.util.spec_from_file_location("make_image_stats", FIXTURES / "make_image_stats.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


MAKER = _maker()


def our_stats(index: int, version: lerobot_stats.FormatVersion) -> lerobot_stats.Stats:
    """The episode's stats through episode_stats, from a frame table typed as our writer types it."""
    spec = REFERENCE["episodes"][index]
    arrays = MAKER.synthetic_episode(spec)
    assert MAKER.digest(arrays) == spec["sha256"], "numpy's generator no longer makes the recorded episode"
    state = arrays["observation.state"]
    table = pa.table({
        "observation.state": pa.FixedSizeListArray.from_arrays(pa.array(state.reshape(-1)), state.shape[1]),
        "observation.extra": arrays["observation.extra"][:, 0], "next.success": arrays["next.success"][:, 0],
        "frame_index": arrays["frame_index"],
        "timestamp": (arrays["frame_index"] / REFERENCE["fps"]).astype(np.float32)})
    images = {key: arrays[key] for key in spec["images"]}
    features = {key: {"dtype": "image"} for key in images} | MAKER.VECTORS
    return lerobot_stats.episode_stats(table, images, features, version=version, fps=REFERENCE["fps"])


def assert_same(ours: Any, theirs: Any, where: tuple) -> None:
    """Equal nested lists: ints and bools exactly and of their type, floats to float32 precision."""
    assert np.shape(ours) == np.shape(theirs), where
    leaves = zip(np.ravel(np.array(ours, dtype=object)), np.ravel(np.array(theirs, dtype=object)), strict=True)
    for a, b in leaves:
        assert type(a) is type(b), (where, a, b)
        if isinstance(b, float):
            np.testing.assert_allclose(a, b, rtol=1e-7, atol=1e-9, err_msg=str(where))
        else:
            assert a == b, (where, a, b)


@pytest.mark.parametrize("version", list(RELEASES))
@pytest.mark.parametrize("index", range(len(REFERENCE["episodes"])))
def test_episode_stats_equal_lerobots(version: lerobot_stats.FormatVersion, index: int) -> None:
    """Every feature, every stat, in LeRobot's order; v3.0's image std as 0.4.4's code gives it without its uint8
    overflow (test below)."""
    theirs = dict(REFERENCE["stats"][RELEASES[version]][index])
    if version == "v3.0":
        for key, std in REFERENCE["image_std_without_overflow"][index].items():
            theirs[key] = theirs[key] | {"std": std}
    ours = our_stats(index, version)
    assert sorted(ours) == sorted(theirs)
    for key, block in theirs.items():
        assert list(ours[key]) == list(block), key
        for name, value in block.items():
            assert_same(ours[key][name], value, (index, key, name))


def test_lerobot_044_image_std_wraps_in_uint8() -> None:
    """Why v3.0's image std follows 0.4.4 without the overflow: 0.4.4 stores 0 for these images, whose std is
    ~0.1-0.2 (as 0.3.3 finds)."""
    for index, stds in enumerate(REFERENCE["image_std_without_overflow"]):
        for key, std in stds.items():
            assert np.all(np.array(REFERENCE["stats"]["v0.4.4"][index][key]["std"]) == 0.0)
            np.testing.assert_allclose(std, REFERENCE["stats"]["v0.3.3"][index][key]["std"], rtol=1e-12)
            assert np.all(np.array(std) > 0.1)


def test_the_sample_follows_lerobots_rule() -> None:
    """All frames up to 100, then 100 until length ** 0.75 passes it (the counts in LeRobot's docstring), evenly
    spread with the ends kept; the pixel stride int(longer side / 150) from 300 px."""
    assert [len(lerobot_stats.sampled_frames(n)) for n in (1, 65, 93, 100, 250, 470, 471, 1000, 2000, 5000)] == \
        [1, 65, 93, 100, 100, 100, 101, 177, 299, 594]
    assert len(lerobot_stats.sampled_frames(20_000)) == 1681
    np.testing.assert_array_equal(lerobot_stats.sampled_frames(93), np.arange(93))
    picked = lerobot_stats.sampled_frames(250)
    assert (picked[0], picked[-1], len(set(picked.tolist()))) == (0, 249, 100)
    sizes = [(64, 64), (120, 230), (299, 299), (300, 100), (480, 480), (480, 640), (400, 230), (700, 700)]
    assert [lerobot_stats.image_stride(h, w) for h, w in sizes] == [1, 1, 1, 2, 3, 4, 2, 4]
