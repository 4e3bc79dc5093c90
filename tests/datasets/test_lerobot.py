"""LeRobot datasets written and read back (v2.1 and v3.0, videos and PNG frames), the checks that refuse a dataset
before any heavy work, and datasets laid out by hand as LeRobot lays them out, read without our writer."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import shutil
from fractions import Fraction
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

# before the imports that need it: without PyAV the module is skipped, not a collection error
av = pytest.importorskip("av", reason="PyAV (the av package) writes and reads the datasets' videos: `make install`")

from vla_scale.datasets import lerobot_stats, lerobot_v30, video_compare  # noqa: E402
from vla_scale.datasets.episodes import Episode  # noqa: E402
from vla_scale.datasets.lerobot import (  # noqa: E402
    DatasetError,
    LeRobotKeys,
    NoEpisodes,
    dataset_problems,
    read_dataset,
    write_dataset,
)
from vla_scale.datasets.video import BIT_EXACT_CODEC  # noqa: E402

KEYS = LeRobotKeys({"agentview": "observation.images.image", "wrist": "observation.images.wrist_image"})
FORMATS = [("v2.1", True), ("v2.1", False), ("v3.0", True), ("v3.0", False)]


def make_episodes(seed: int = 0, success: bool = True) -> list[Episode]:
    """Four episodes of different lengths, random 64x64 frames from two cameras, one instruction repeated."""
    rng = np.random.default_rng(seed)
    plan = [(5, "put the red cube in the bowl", True), (3, "open the drawer", False),
            (7, "put the red cube in the bowl", True), (4, "stack the blocks", False)]
    cameras = ("agentview", "wrist")
    return [Episode(instruction=text,
                    images={c: rng.integers(0, 256, (steps, 64, 64, 3), dtype=np.uint8) for c in cameras},
                    state=rng.standard_normal((steps, 4)).astype(np.float32),
                    actions=rng.uniform(-1, 1, (steps, 7)).astype(np.float32), success=done if success else None)
            for steps, text, done in plan]


DEFAULT_VIDEO_ERROR = 2
"""The most any RGB value of a frame moves through the default codec (h264_yuv444): the RGB -> YUV 4:4:4 -> RGB
round trip; `python -m vla_scale.datasets.video_compare` measures it on pick_place frames."""


def assert_same(written: list[Episode], read: list[Episode], image_error: int = 0) -> None:
    """Equal episodes; frames within `image_error` of each RGB value (0: bit for bit)."""
    assert len(read) == len(written)
    for a, b in zip(written, read, strict=True):
        assert (b.instruction, b.success, len(b)) == (a.instruction, a.success, len(a))
        np.testing.assert_array_equal(b.state, a.state)
        np.testing.assert_array_equal(b.actions, a.actions)
        assert set(b.images) == set(a.images)
        for camera in a.images:
            assert b.images[camera].dtype == np.uint8 and b.images[camera].shape == a.images[camera].shape
            error = np.abs(b.images[camera].astype(np.int16) - a.images[camera].astype(np.int16))
            assert error.max() <= image_error, (camera, error.max())


def info_of(root: Path) -> dict:
    return json.loads((root / "meta/info.json").read_text())


@pytest.mark.parametrize(("version", "video"), FORMATS)
def test_a_written_dataset_reads_back(tmp_path: Path, version: str, video: bool) -> None:
    """PNG frames bit for bit, the default video within DEFAULT_VIDEO_ERROR; all else exactly."""
    episodes = make_episodes()
    root = write_dataset(tmp_path / "ds", episodes, KEYS, version=version, video=video)
    assert_same(episodes, read_dataset(root, KEYS, action_dim=7, state_dim=4), DEFAULT_VIDEO_ERROR if video else 0)
    info = info_of(root)
    assert (info["codebase_version"], info["total_episodes"], info["total_frames"], info["total_tasks"]) == \
        (version, 4, 19, 3)
    image = info["features"]["observation.images.image"]
    assert (image["dtype"], image["shape"]) == ("video" if video else "image", [64, 64, 3])
    assert info["features"]["action"]["shape"] == [7] and info["features"]["observation.state"]["shape"] == [4]
    if version == "v3.0":
        assert (root / "data/chunk-000/file-000.parquet").is_file() and (root / "meta/stats.json").is_file()
        assert (root / "videos/observation.images.wrist_image/chunk-000/file-000.mp4").is_file() == video
        episodes_meta = pq.read_table(root / "meta/episodes/chunk-000/file-000.parquet").to_pylist()
        assert [(e["dataset_from_index"], e["dataset_to_index"]) for e in episodes_meta] == \
            [(0, 5), (5, 8), (8, 15), (15, 19)]
        assert episodes_meta[1]["stats/action/count"] == [3]
        stats = json.loads((root / "meta/stats.json").read_text())
        # LeRobot 0.4.4 takes a float32 feature's episode mean and std in float32: float32 precision
        actions = np.concatenate([e.actions for e in episodes]).astype(np.float64)
        np.testing.assert_allclose(stats["action"]["mean"], actions.mean(0), atol=1e-6)
        np.testing.assert_allclose(stats["action"]["std"], actions.std(0), atol=1e-6)
        assert stats["action"]["count"] == [19] and np.shape(stats["observation.images.image"]["mean"]) == (3, 1, 1)
    else:
        assert (root / "data/chunk-000/episode_000003.parquet").is_file()
        assert (root / "videos/chunk-000/observation.images.image/episode_000002.mp4").is_file() == video
        assert len((root / "meta/episodes_stats.jsonl").read_text().splitlines()) == 4


LEROBOT_VIDEO_INFO = ["video.height", "video.width", "video.codec", "video.pix_fmt", "video.is_depth_map",
                      "video.fps", "video.channels", "has_audio"]
"""The keys, in order, of LeRobot's get_video_info() for a video without audio (0.4.4; 0.3.3 the same)."""


@pytest.mark.parametrize("version", ["v2.1", "v3.0"])
def test_video_features_carry_lerobots_info_keys(tmp_path: Path, version: str) -> None:
    root = write_dataset(tmp_path / "ds", make_episodes()[:1], KEYS, version=version)
    for key in KEYS.cameras.values():
        info = info_of(root)["features"][key]["info"]
        assert list(info) == LEROBOT_VIDEO_INFO
        assert (info["video.is_depth_map"], info["video.channels"], info["has_audio"]) == (False, 3, False)


def lerobot_channels(pix_fmt: str) -> int:
    """LeRobot 0.4.4's channel table, copied from lerobot/datasets/video_utils.py (get_video_pixel_channels, which
    get_video_info() calls for every video it inspects)."""
    if "gray" in pix_fmt or "depth" in pix_fmt or "monochrome" in pix_fmt:
        return 1
    elif "rgba" in pix_fmt or "yuva" in pix_fmt:
        return 4
    elif "rgb" in pix_fmt or "yuv" in pix_fmt:
        return 3
    else:
        raise ValueError("Unknown format")


@pytest.mark.parametrize("version", ["v2.1", "v3.0"])
def test_the_default_videos_pix_fmt_is_one_lerobots_get_video_info_reads(tmp_path: Path, version: str) -> None:
    root = write_dataset(tmp_path / "ds", make_episodes()[:2], KEYS, version=version)
    videos = sorted(root.glob("videos/**/*.mp4"))
    assert len(videos) == (4 if version == "v2.1" else 2)
    for path in videos:
        with av.open(str(path)) as container:
            pix_fmt = container.streams.video[0].pix_fmt
        assert pix_fmt == "yuv444p" and lerobot_channels(pix_fmt) == 3, (path, pix_fmt)
    for key in KEYS.cameras.values():
        assert info_of(root)["features"][key]["info"]["video.pix_fmt"] == "yuv444p"
    with pytest.raises(ValueError, match="Unknown format"):  # what the bit-exact option's files give
        lerobot_channels("gbrp")


@pytest.mark.parametrize("version", ["v2.1", "v3.0"])
def test_the_bit_exact_codec_round_trips_exactly(tmp_path: Path, version: str) -> None:
    episodes = make_episodes()
    root = write_dataset(tmp_path / "ds", episodes, KEYS, version=version, codec=BIT_EXACT_CODEC)
    assert_same(episodes, read_dataset(root, KEYS, action_dim=7, state_dim=4))
    assert info_of(root)["features"]["observation.images.image"]["info"]["video.pix_fmt"] == "gbrp"


def test_video_compare_measures_every_codec_on_a_datasets_frames(tmp_path: Path) -> None:
    root = write_dataset(tmp_path / "ds", smooth_episodes(), KEYS, video=False)
    found = {(row.codec, row.camera): row for row in video_compare.main([str(root)])}
    assert {codec for codec, _ in found} == set(video_compare.CODECS)
    rgb, yuv = found[(BIT_EXACT_CODEC, "image")], found[("h264_yuv444", "image")]
    assert (rgb.exact, rgb.pix_fmt, rgb.lerobot_reads) == (True, "gbrp", False)
    assert (yuv.pix_fmt, yuv.lerobot_reads) == ("yuv444p", True)
    assert 0 < max(yuv.max_error) <= DEFAULT_VIDEO_ERROR and yuv.frames == 6


REFERENCE = Path(__file__).resolve().parents[1] / "fixtures" / "lerobot_reference"
"""Files written as LeRobot 0.4.4 writes them (tests/fixtures/lerobot_reference/make_reference.py says how)."""


def test_v30_tasks_are_written_as_lerobot_writes_them_and_read_in_both_layouts(tmp_path: Path) -> None:
    reference = pq.read_table(REFERENCE / "tasks.parquet")
    texts = ["put the red cube in the bowl", "open the drawer", "stack the blocks"]
    ours = lerobot_v30.tasks_table({text: i for i, text in enumerate(texts)})
    assert ours.schema.equals(reference.schema, check_metadata=False) and ours.equals(reference)

    def pandas(table: pa.Table) -> dict:
        meta = json.loads(table.schema.metadata[b"pandas"])
        return {k: v for k, v in meta.items() if k not in ("creator", "pandas_version")}

    assert pandas(ours) == pandas(reference)
    (tmp_path / "meta").mkdir()
    shutil.copy(REFERENCE / "tasks.parquet", tmp_path / "meta/tasks.parquet")
    assert lerobot_v30.read_tasks(tmp_path) == dict(enumerate(texts))
    write_v30_tasks(tmp_path, texts)  # the text as a column named "task", as earlier writers left it
    assert lerobot_v30.read_tasks(tmp_path) == dict(enumerate(texts))


def json_types(value: object) -> set[type]:
    """The types of the numbers in a (nested) JSON list."""
    if isinstance(value, list):
        return set().union(*(json_types(v) for v in value))
    return {type(value)}


def test_v30_stats_keep_the_columns_dtypes_as_lerobot_stores_them(tmp_path: Path) -> None:
    """int64 and bool columns' min and max stay ints and bools (meta/episodes list<int64>, list<bool>; stats.json
    integers, true/false), count an int, the rest floats, as in LeRobot 0.4.4's reference files."""
    root = write_dataset(tmp_path / "ds", make_episodes(), KEYS, video=False)
    ours = pq.read_schema(root / "meta/episodes/chunk-000/file-000.parquet")
    reference = pq.read_schema(REFERENCE / "episodes_stats.parquet")
    shared = [name for name in reference.names if name in ours.names]
    for feature in ("action", "next.success", "timestamp", "frame_index", "episode_index", "index", "task_index"):
        assert f"stats/{feature}/min" in shared and f"stats/{feature}/q99" in shared, feature
    assert {name: str(ours.field(name).type) for name in shared} == \
        {name: str(reference.field(name).type) for name in shared}
    assert str(ours.field("stats/next.success/min").type) == "list<element: bool>"
    assert str(ours.field("stats/index/max").type) == "list<element: int64>"

    expected = json.loads((REFERENCE / "stats.json").read_text())
    stats = json.loads((root / "meta/stats.json").read_text())
    for feature in [feature for feature in expected if feature in stats]:
        assert list(stats[feature]) == list(expected[feature]), feature
        for name in expected[feature]:
            assert json_types(stats[feature][name]) == json_types(expected[feature][name]), (feature, name)
    assert stats["next.success"]["min"] == [False] and stats["next.success"]["max"] == [True]
    assert stats["index"]["min"] == [0] and stats["index"]["max"] == [18] and stats["index"]["count"] == [19]
    assert stats["frame_index"]["mean"] == [np.mean([i for n in (5, 3, 7, 4) for i in range(n)])]


def test_stats_stored_as_floats_still_read_and_aggregate(tmp_path: Path) -> None:
    """A dataset whose stats are all floats (as written before they kept their dtypes) reads back, and episode
    stats in floats aggregate to the same numbers as in their own dtypes."""
    episodes = make_episodes()
    root = write_dataset(tmp_path / "ds", episodes, KEYS, video=False)
    path = root / "meta/episodes/chunk-000/file-000.parquet"
    table = pq.read_table(path)
    floats = pa.list_(pa.float64())
    for i, field in enumerate(table.schema):
        if field.name.startswith("stats/") and not field.name.endswith("/count") and \
                field.type in (pa.list_(pa.int64()), pa.list_(pa.bool_())):
            table = table.set_column(i, pa.field(field.name, floats), table.column(i).cast(floats))
    pq.write_table(table, path)
    stats = json.loads((root / "meta/stats.json").read_text())
    as_floats = {f: {k: v if k == "count" else np.asarray(v, np.float64).tolist() for k, v in block.items()}
                 for f, block in stats.items()}
    (root / "meta/stats.json").write_text(json.dumps(as_floats, indent=4))
    assert_same(episodes, read_dataset(root, KEYS, action_dim=7, state_dim=4))

    rows = pq.read_table(path).to_pylist()
    per_episode = [{f: {name: row[f"stats/{f}/{name}"] for name in stats[f]} for f in ("index", "next.success")}
                   for row in rows]
    aggregated = lerobot_stats.aggregate(per_episode)
    assert aggregated["index"]["min"] == [0.0] and aggregated["index"]["max"] == [18.0]
    assert isinstance(aggregated["index"]["min"][0], float) and isinstance(aggregated["next.success"]["max"][0], float)
    assert aggregated["next.success"]["max"] == [1.0] and aggregated["index"]["count"] == [19]
    for name in ("mean", "std", "q50"):
        np.testing.assert_allclose(aggregated["index"][name], stats["index"][name], rtol=1e-12)


def test_v30_starts_new_files_at_its_size_limits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Limits of 0 MB: every episode opens a new data file and new video files, located by meta/episodes."""
    monkeypatch.setattr(lerobot_v30, "DATA_FILE_MB", 0)
    monkeypatch.setattr(lerobot_v30, "VIDEO_FILE_MB", 0)
    episodes = make_episodes()
    root = write_dataset(tmp_path / "ds", episodes, KEYS, codec=BIT_EXACT_CODEC)
    assert len(list((root / "data/chunk-000").glob("file-*.parquet"))) == 4
    assert len(list((root / "videos/observation.images.image/chunk-000").glob("file-*.mp4"))) == 4
    episodes_meta = pq.read_table(root / "meta/episodes/chunk-000/file-000.parquet").to_pylist()
    assert [e["videos/observation.images.image/from_timestamp"] for e in episodes_meta] == [0.0] * 4
    assert_same(episodes, read_dataset(root, KEYS))


@pytest.mark.parametrize("version", ["v2.1", "v3.0"])
def test_an_unknown_success_reads_back_as_none(tmp_path: Path, version: str) -> None:
    episodes = make_episodes(success=False)
    root = write_dataset(tmp_path / "ds", episodes, KEYS, version=version, video=False)
    assert "next.success" not in info_of(root)["features"]
    assert [e.success for e in read_dataset(root, KEYS)] == [None] * 4


def smooth_episodes() -> list[Episode]:
    """Camera-like frames (smooth gradients moving over time), which a lossy codec keeps close."""
    y, x = np.mgrid[0:64, 0:64]
    frames = np.stack([np.stack([x * 2 + t * 3, y * 2 + t, 60 + x + y + t * 4], -1) for t in range(6)]).astype(np.uint8)
    state, actions = np.zeros((6, 4), np.float32), np.ones((6, 7), np.float32)
    return [Episode("look around", {"agentview": frames, "wrist": frames[:, ::-1].copy()}, state, actions, True)]


def test_the_av1_codec_is_close(tmp_path: Path) -> None:
    episodes = smooth_episodes()
    root = write_dataset(tmp_path / "ds", episodes, KEYS, codec="av1")
    assert info_of(root)["features"]["observation.images.image"]["info"]["video.codec"] == "av1"
    read = read_dataset(root, KEYS)[0]
    for camera, frames in episodes[0].images.items():
        error = np.abs(read.images[camera].astype(int) - frames.astype(int))
        assert read.images[camera].shape == frames.shape
        assert error.mean() < 3 and error.max() < 24, (error.mean(), error.max())


def file_digests(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in root.rglob("*")
            if p.is_file()}


def test_writing_is_deterministic(tmp_path: Path) -> None:
    first = write_dataset(tmp_path / "a", make_episodes(), KEYS)
    second = write_dataset(tmp_path / "b", make_episodes(), KEYS)
    assert file_digests(first) == file_digests(second)


@pytest.mark.parametrize("version", ["v2.1", "v3.0"])
def test_episodes_streamed_write_the_same_files_and_extras_are_features(tmp_path: Path, version: str) -> None:
    """A generator's episodes are written one at a time into the same files as the list; extra per-step vectors
    become float32 features (a [T, 1] one a scalar column) with their stats; an episode that does not fit the first
    is refused when it comes; no episode at all is NoEpisodes, before the folder is made."""
    whole = write_dataset(tmp_path / "list", make_episodes(), KEYS, version=version, video=False)
    streamed = write_dataset(tmp_path / "stream", (e for e in make_episodes()), KEYS, version=version, video=False)
    assert file_digests(whole) == file_digests(streamed)
    rng = np.random.default_rng(1)
    extra = [dataclasses.replace(e, extras={"observation.environment_state": rng.random((len(e), 39), np.float32),
                                            "next.reward": rng.random((len(e), 1), np.float32)})
             for e in make_episodes()]
    root = write_dataset(tmp_path / "extras", iter(extra), KEYS, version=version, video=False)
    features = info_of(root)["features"]
    assert features["observation.environment_state"]["shape"] == [39] and features["next.reward"]["shape"] == [1]
    assert features["next.reward"]["names"] is None
    assert_same(make_episodes(), read_dataset(root, KEYS))  # the extras are written, not read back
    odd = [*extra[:2], make_episodes()[2]]  # no extras
    with pytest.raises(ValueError, match="cannot write episode 2 into this dataset: episode 2 has extras"):
        write_dataset(tmp_path / "odd", iter(odd), KEYS, version=version, video=False)
    with pytest.raises(NoEpisodes):
        write_dataset(tmp_path / "none", iter([]), KEYS, version=version)
    assert not (tmp_path / "none").exists()


def test_a_dataset_is_not_written_over_another(tmp_path: Path) -> None:
    root = write_dataset(tmp_path / "ds", make_episodes(), KEYS, video=False)
    with pytest.raises(FileExistsError, match="not an empty folder"):
        write_dataset(root, make_episodes(), KEYS)
    (tmp_path / "empty").mkdir()
    write_dataset(tmp_path / "empty", make_episodes(), KEYS, video=False)


def test_an_episode_checks_its_arrays() -> None:
    frames = np.zeros((3, 8, 8, 3), np.uint8)
    with pytest.raises(ValueError, match=r"actions must be float32 \[T, A\], got float64"):
        Episode("go", {"cam": frames}, np.zeros((3, 4), np.float32), np.zeros((3, 7)))
    with pytest.raises(ValueError, match="same number of steps"):
        Episode("go", {"cam": frames[:2]}, np.zeros((3, 4), np.float32), np.zeros((3, 7), np.float32))
    assert len(Episode("go", {"cam": frames}, np.zeros((3, 4), np.float32), np.zeros((3, 7), np.float32))) == 3


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_dataset(tmp_path_factory.mktemp("recorded") / "ds", make_episodes(), KEYS, video=False)


def edited(recorded: Path, tmp_path: Path, feature: str, shape: list[int]) -> Path:
    """A copy of the recorded dataset's metadata with one feature's shape changed (no data: only metadata is read)."""
    info = info_of(recorded)
    info["features"][feature]["shape"] = shape
    shutil.copytree(recorded / "meta", tmp_path / "meta")
    (tmp_path / "meta/info.json").write_text(json.dumps(info))
    return tmp_path


def refused(root: Path, keys: LeRobotKeys = KEYS, **checks: int | str) -> list[str]:
    """dataset_problems' messages, checked to be what read_dataset raises."""
    problems = dataset_problems(root, keys, **checks)
    assert problems
    with pytest.raises(DatasetError) as raised:
        read_dataset(root, keys, **checks)
    assert raised.value.problems == problems
    return problems


def test_a_missing_folder_is_refused(tmp_path: Path) -> None:
    assert "no dataset folder" in refused(tmp_path / "nowhere")[0]


def test_a_folder_without_info_json_is_refused(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    assert "not a LeRobot dataset: it has no meta/info.json" in refused(tmp_path)[0]


def test_an_unsupported_version_is_refused(recorded: Path, tmp_path: Path) -> None:
    root = edited(recorded, tmp_path, "action", [7])
    info = info_of(root) | {"codebase_version": "v2.0"}
    (root / "meta/info.json").write_text(json.dumps(info))
    (problem,) = refused(root)
    assert "v2.0 dataset; only v2.1 and v3.0 are read" in problem and "convert" in problem


def test_a_camera_key_missing_from_the_dataset_is_refused(recorded: Path) -> None:
    keys = LeRobotKeys({"agentview": "observation.images.image", "wrist": "observation.images.hand"},
                       setting="data.lerobot")
    (problem,) = refused(recorded, keys)
    assert "'observation.images.hand', which the dataset does not have" in problem
    assert "data.lerobot.cameras['wrist']" in problem
    assert "observation.images.image, observation.images.wrist_image" in problem


def test_a_wrong_image_shape_is_refused(recorded: Path, tmp_path: Path) -> None:
    (problem,) = refused(edited(recorded, tmp_path, "observation.images.wrist_image", [3, 64, 64]))
    assert "'observation.images.wrist_image') has shape [3, 64, 64], not [height, width, 3]" in problem


def test_an_action_dim_the_env_does_not_take_is_refused(recorded: Path) -> None:
    (problem,) = refused(recorded, action_dim=6, state_dim=4, env_name="pick_place")
    assert "dataset action ('action') has 7 dims, env.name=pick_place takes 6" in problem


def test_a_state_dim_mismatch_is_refused(recorded: Path) -> None:
    (problem,) = refused(recorded, action_dim=7, state_dim=8)
    assert "dataset state ('observation.state') has 4 dims, the env gives 8" in problem


def test_every_problem_is_said_at_once(recorded: Path, tmp_path: Path) -> None:
    root = edited(recorded, tmp_path, "observation.state", [2, 2])
    keys = LeRobotKeys({"agentview": "observation.images.front"}, action_key="actions")
    problems = refused(root, keys, action_dim=7, state_dim=4)
    assert len(problems) == 3
    assert "not a 1-D vector" in problems[1] and "'actions' is not in the dataset" in problems[2]


@pytest.mark.parametrize("version", ["v2.1", "v3.0"])
def test_a_dataset_that_announces_episodes_without_their_list_is_refused_naming_it(tmp_path: Path,
                                                                                   version: str) -> None:
    root = write_dataset(tmp_path / "ds", make_episodes(), KEYS, version=version, video=False)
    listing = root / ("meta/episodes" if version == "v3.0" else "meta/episodes.jsonl")
    shutil.rmtree(listing) if listing.is_dir() else listing.unlink()
    (problem,) = refused(root)
    assert f"has no {listing.relative_to(root)}" in problem and "meta/info.json announces 4 episodes" in problem
    assert ("LeRobotDataset.finalize()" in problem) == (version == "v3.0")
    (root / "meta/tasks.jsonl" if version == "v2.1" else root / "meta/tasks.parquet").unlink()
    problems = refused(root)
    assert len(problems) == 2 and "(the tasks' text), yet meta/info.json announces 4 episodes" in problems[0]


def test_an_unfinished_episode_list_is_refused(tmp_path: Path) -> None:
    """meta/episodes as a recording leaves it before finalize(): a parquet file without its footer, or fewer rows
    than meta/info.json counts."""
    root = write_dataset(tmp_path / "v30", make_episodes(), KEYS, video=False)
    listing = root / "meta/episodes/chunk-000/file-000.parquet"
    whole = listing.read_bytes()
    listing.write_bytes(whole[:len(whole) // 2])
    (problem,) = refused(root)
    assert problem.startswith("meta/episodes/chunk-000/file-000.parquet cannot be read as parquet")
    assert "finalize()" in problem
    pq.write_table(pq.read_table(pa.BufferReader(whole)).slice(0, 3), listing)
    (problem,) = refused(root)
    assert "meta/episodes lists 3 episodes, yet meta/info.json announces 4 episodes" in problem
    root = write_dataset(tmp_path / "v21", make_episodes(), KEYS, version="v2.1", video=False)
    lines = (root / "meta/episodes.jsonl").read_text().splitlines()
    (root / "meta/episodes.jsonl").write_text("\n".join(lines[:2]) + "\n")
    (problem,) = refused(root)
    assert "meta/episodes.jsonl lists 2 episodes, yet meta/info.json announces 4 episodes" in problem


def test_a_dataset_that_announces_no_episode_reads_as_none(tmp_path: Path) -> None:
    """As LeRobotDataset.create() leaves a dataset before its first episode: meta/info.json alone."""
    root = write_dataset(tmp_path / "ds", make_episodes(), KEYS, video=False)
    info = info_of(root) | {"total_episodes": 0, "total_frames": 0, "total_tasks": 0, "splits": {}}
    shutil.rmtree(root / "meta")
    shutil.rmtree(root / "data")
    (root / "meta").mkdir()
    (root / "meta/info.json").write_text(json.dumps(info))
    assert dataset_problems(root, KEYS) == [] and read_dataset(root, KEYS) == []


# Datasets laid out by hand the way LeRobot lays them out (pyarrow and PyAV directly), read without our writer.

FPS = 10
IMAGE_TYPE = pa.struct([("bytes", pa.binary()), ("path", pa.string())])


def encode_video(path: Path, frames: np.ndarray) -> None:
    """Frames end to end in one lossless H.264 (RGB) .mp4, frame k at k / FPS seconds."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with av.open(str(path), "w", format="mp4") as container:
        stream = container.add_stream("libx264rgb", rate=FPS, options={"qp": "0"})
        stream.width, stream.height, stream.pix_fmt = frames.shape[2], frames.shape[1], "rgb24"
        for k, rgb in enumerate(frames):
            frame = av.VideoFrame.from_ndarray(rgb, format="rgb24")
            frame.pts, frame.time_base = k, Fraction(1, FPS)
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))


def vector_column(values: np.ndarray) -> pa.Array:
    return pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1)), values.shape[1])


def data_table(episode: Episode, index: int, first: int, task: int, images: dict[str, pa.Array]) -> pa.Table:
    steps = len(episode)
    return pa.table({**images, "observation.state": vector_column(episode.state),
                     "action": vector_column(episode.actions),
                     "timestamp": pa.array(np.arange(steps, dtype=np.float32) / FPS),
                     "frame_index": pa.array(np.arange(steps)), "episode_index": pa.array(np.full(steps, index)),
                     "index": pa.array(first + np.arange(steps)), "task_index": pa.array(np.full(steps, task))})


def lerobot_features(dtype: str) -> dict:
    image = {"dtype": dtype, "shape": [64, 64, 3], "names": ["height", "width", "channels"]}
    scalar = {"shape": [1], "names": None}
    return {"observation.images.image": image, "observation.images.wrist_image": dict(image),
            "observation.state": {"dtype": "float32", "shape": [4], "names": ["x", "y", "z", "grip"]},
            "action": {"dtype": "float32", "shape": [7], "names": None},
            "timestamp": {"dtype": "float32", **scalar}, "frame_index": {"dtype": "int64", **scalar},
            "episode_index": {"dtype": "int64", **scalar}, "index": {"dtype": "int64", **scalar},
            "task_index": {"dtype": "int64", **scalar}}


def write_v30_tasks(root: Path, tasks: list[str]) -> None:
    """meta/tasks.parquet as pandas writes a frame indexed by task text."""
    pandas = {"index_columns": ["task"], "column_indexes": [], "columns": [
        {"name": "task_index", "field_name": "task_index", "pandas_type": "int64", "numpy_type": "int64",
         "metadata": None},
        {"name": "task", "field_name": "task", "pandas_type": "unicode", "numpy_type": "object", "metadata": None}]}
    schema = pa.schema([("task_index", pa.int64()), ("task", pa.string())], metadata={"pandas": json.dumps(pandas)})
    pq.write_table(pa.table({"task_index": list(range(len(tasks))), "task": tasks}, schema=schema),
                   root / "meta/tasks.parquet")


def test_a_v30_dataset_laid_out_as_lerobot_does_reads(tmp_path: Path) -> None:
    """Two episodes in two data files, each camera's episodes end to end in one video file."""
    episodes = make_episodes()[:2]
    root, cameras = tmp_path / "lerobot_v30", dict(KEYS.cameras)
    (root / "meta/episodes/chunk-000").mkdir(parents=True)
    for camera, key in cameras.items():
        frames = np.concatenate([e.images[camera] for e in episodes])
        encode_video(root / f"videos/{key}/chunk-000/file-000.mp4", frames)
    rows, first = [], 0
    for i, episode in enumerate(episodes):
        path = root / f"data/chunk-000/file-{i:03d}.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(data_table(episode, i, first, task=1 - i, images={}), path)
        row = {"episode_index": i, "tasks": [episode.instruction], "length": len(episode), "data/chunk_index": 0,
               "data/file_index": i, "dataset_from_index": first, "dataset_to_index": first + len(episode)}
        for key in cameras.values():
            row |= {f"videos/{key}/chunk_index": 0, f"videos/{key}/file_index": 0,
                    f"videos/{key}/from_timestamp": first / FPS,
                    f"videos/{key}/to_timestamp": (first + len(episode)) / FPS}
        rows.append(row | {"stats/action/count": [len(episode)], "meta/episodes/chunk_index": 0,
                           "meta/episodes/file_index": 0})
        first += len(episode)
    pq.write_table(pa.Table.from_pylist(rows), root / "meta/episodes/chunk-000/file-000.parquet")
    write_v30_tasks(root, [episodes[1].instruction, episodes[0].instruction])
    info = {"codebase_version": "v3.0", "robot_type": "panda", "total_episodes": 2, "total_frames": first,
            "total_tasks": 2, "chunks_size": 1000, "data_files_size_in_mb": 100, "video_files_size_in_mb": 200,
            "fps": FPS, "splits": {"train": "0:2"},
            "data_path": "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet",
            "video_path": "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4",
            "features": lerobot_features("video")}
    (root / "meta/info.json").write_text(json.dumps(info))
    expected = [Episode(e.instruction, e.images, e.state, e.actions, None) for e in episodes]
    assert_same(expected, read_dataset(root, KEYS, action_dim=7, state_dim=4))
    small = read_dataset(root, KEYS, image_size=32)
    assert small[0].images["wrist"].shape == (5, 32, 32, 3)


def png(frame: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(frame).save(buffer, format="PNG")
    return buffer.getvalue()


def test_a_v21_dataset_with_image_files_reads(tmp_path: Path) -> None:
    """Images as PNG bytes (one camera) and as files named by path (the other), vectors as variable-length lists,
    success as gym recordings keep it (next.reward, next.done, next.success per frame)."""
    episodes = make_episodes()[:2]
    root = tmp_path / "lerobot_v21"
    for i, episode in enumerate(episodes):
        paths = []
        for t, frame in enumerate(episode.images["wrist"]):
            path = f"images/observation.images.wrist_image/episode_{i:06d}/frame_{t:06d}.png"
            (root / path).parent.mkdir(parents=True, exist_ok=True)
            (root / path).write_bytes(png(frame))
            paths.append({"bytes": None, "path": path})
        images = {"observation.images.image": pa.array([{"bytes": png(f), "path": None}
                                                        for f in episode.images["agentview"]], IMAGE_TYPE),
                  "observation.images.wrist_image": pa.array(paths, IMAGE_TYPE)}
        table = data_table(episode, i, 5 * i, task=i, images=images)
        table = table.set_column(table.schema.get_field_index("observation.state"), "observation.state",
                                 pa.array(episode.state.tolist(), pa.list_(pa.float32())))
        last = np.arange(len(episode)) == len(episode) - 1
        table = table.append_column("next.reward", pa.array(last * float(episode.success), pa.float32()))
        table = table.append_column("next.done", pa.array(last)).append_column("next.success",
                                                                               pa.array(last & episode.success))
        (root / "data/chunk-000").mkdir(parents=True, exist_ok=True)
        pq.write_table(table, root / f"data/chunk-000/episode_{i:06d}.parquet")
    lines = {"tasks.jsonl": [{"task_index": i, "task": e.instruction} for i, e in enumerate(episodes)],
             "episodes.jsonl": [{"episode_index": i, "tasks": [e.instruction], "length": len(e)}
                                for i, e in enumerate(episodes)]}
    (root / "meta").mkdir()
    for name, rows in lines.items():
        (root / "meta" / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    outcome = (("next.reward", "float32"), ("next.done", "bool"), ("next.success", "bool"))
    features = lerobot_features("image") | {k: {"dtype": d, "shape": [1], "names": None} for k, d in outcome}
    info = {"codebase_version": "v2.1", "robot_type": "panda", "total_episodes": 2, "total_frames": 8, "total_tasks": 2,
            "total_videos": 0, "total_chunks": 1, "chunks_size": 1000, "fps": FPS, "splits": {"train": "0:2"},
            "data_path": "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet", "video_path": None,
            "features": features}
    (root / "meta/info.json").write_text(json.dumps(info))
    assert_same(episodes, read_dataset(root, KEYS, action_dim=7, state_dim=4))


def test_record_codec_names_every_codec() -> None:
    """`record.codec`'s choices (checked without PyAV) are the codecs the writer has."""
    from vla_scale.datasets.lerobot_format import VIDEO_CODECS
    from vla_scale.datasets.video import CODECS

    assert VIDEO_CODECS == tuple(CODECS)
