"""What LeRobot's two dataset layouts (v2.1, v3.0) share: the keys that map our names onto a dataset's features,
meta/info.json's `features` block, and the metadata-only checks that say what keeps a dataset from being read."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from vla_scale.datasets.episodes import Episode

INFO_PATH = "meta/info.json"
VERSIONS = ("v2.1", "v3.0")
VIDEO_CODECS = ("h264_yuv444", "h264_rgb", "av1")
"""The codecs videos can be written with (`video.CODECS`, named here so that checking a name needs no PyAV)."""
CHUNKS_SIZE = 1000
"""Files (v3.0) or episodes (v2.1) per chunk-XXX folder, LeRobot's default."""
SUCCESS, DONE = "next.success", "next.done"
IMAGE_NAMES = ["height", "width", "channels"]
INDEX_FEATURES: dict[str, dict[str, Any]] = {
    "timestamp": {"dtype": "float32", "shape": [1], "names": None},
    "frame_index": {"dtype": "int64", "shape": [1], "names": None},
    "episode_index": {"dtype": "int64", "shape": [1], "names": None},
    "index": {"dtype": "int64", "shape": [1], "names": None},
    "task_index": {"dtype": "int64", "shape": [1], "names": None},
}
"""The per-frame columns every LeRobot dataset has besides its own features."""
EPISODES_META = {"v2.1": "meta/episodes.jsonl", "v3.0": "meta/episodes"}
"""Where each layout lists its episodes (v3.0: a folder of chunk-XXX/file-XXX.parquet)."""
TASKS_META = {"v2.1": "meta/tasks.jsonl", "v3.0": "meta/tasks.parquet"}
UNFINISHED = ("a recording stopped before LeRobotDataset.finalize() leaves it so (LeRobot writes meta/episodes in "
              "batches and completes it there): call finalize() when recording ends, or record the dataset again")


class DatasetError(ValueError):
    """A dataset that cannot be read as asked; `problems` holds one message per thing to change."""

    def __init__(self, root: Path | str, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__(f"cannot read the LeRobot dataset at {root}:\n" + "\n".join(f"- {p}" for p in problems))


@dataclass(frozen=True)
class LeRobotKeys:
    """Which dataset features hold what an Episode holds.

    cameras: our camera name -> the image or video feature's key (e.g. {"agentview": "observation.images.image"});
    state_key, action_key: the 1-D float features. `setting` names where these keys are set, so that a message says
    what to change (the config group "sft" makes them say "sft.cameras[...]", "sft.state_key", "sft.action_key").
    """

    cameras: dict[str, str]
    state_key: str = "observation.state"
    action_key: str = "action"
    setting: str = "LeRobotKeys"


def load_info(root: Path) -> dict[str, Any]:
    return json.loads((root / INFO_PATH).read_text())


def write_json(path: Path, value: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, indent=4) + "\n")


def chunk_and_file(n: int) -> tuple[int, int]:
    """The n-th file's (chunk index, file index) in a layout of CHUNKS_SIZE files per chunk."""
    return n // CHUNKS_SIZE, n % CHUNKS_SIZE


class NoEpisodes(ValueError):
    """A dataset was asked of no episodes."""


class EpisodeStream:
    """Episodes as a writer takes them, one at a time, so a dataset of any size is written without holding it: each
    checked against the first (`writing_problems`), each instruction given its task index at its first appearance
    (`tasks`), the counts meta/info.json needs kept as they pass."""

    def __init__(self, episodes: Iterable[Episode], keys: LeRobotKeys) -> None:
        self._rest = iter(episodes)
        first = next(self._rest, None)
        if first is None:
            raise NoEpisodes("cannot write these episodes as one dataset: there are no episodes to write")
        self.first, self.keys = first, keys
        self.tasks: dict[str, int] = {}
        self.count = self.frames = 0

    def __iter__(self) -> Iterator[Episode]:
        for episode in itertools.chain([self.first], self._rest):
            if self.count and (problems := writing_problems([self.first, episode], self.keys)):
                raise ValueError(f"cannot write episode {self.count} into this dataset: " +
                                 "; ".join(p.replace("episode 1", f"episode {self.count}") for p in problems))
            self.tasks.setdefault(episode.instruction, len(self.tasks))
            self.count += 1
            self.frames += len(episode)
            yield episode


def features_of(episodes: list[Episode], keys: LeRobotKeys, video: bool) -> dict[str, dict[str, Any]]:
    """meta/info.json's `features` for these episodes (video `info` blocks are added once the files exist)."""
    first = episodes[0]
    features: dict[str, dict[str, Any]] = {}
    for camera, key in keys.cameras.items():
        shape = list(first.images[camera].shape[1:])
        features[key] = {"dtype": "video" if video else "image", "shape": shape, "names": list(IMAGE_NAMES)}
    for key, array, stem in ((keys.state_key, first.state, "state"), (keys.action_key, first.actions, "action")):
        width = array.shape[1]
        features[key] = {"dtype": "float32", "shape": [width], "names": [f"{stem}_{i}" for i in range(width)]}
    for key, array in first.extras.items():
        width = array.shape[1]
        names = None if width == 1 else [f"{key.rsplit('.', 1)[-1]}_{i}" for i in range(width)]
        features[key] = {"dtype": "float32", "shape": [width], "names": names}
    if first.success is not None:
        for key in (SUCCESS, DONE):
            features[key] = {"dtype": "bool", "shape": [1], "names": None}
    return features | {key: dict(value) for key, value in INDEX_FEATURES.items()}


def writing_problems(episodes: list[Episode], keys: LeRobotKeys) -> list[str]:
    """What keeps these episodes from being one dataset under these keys."""
    if not episodes:
        return ["there are no episodes to write"]
    first, found = episodes[0], []
    names = {keys.state_key, keys.action_key, *keys.cameras.values()}
    if len(names) != 2 + len(keys.cameras):
        found.append(f"the keys name one feature twice: {keys}")
    taken = names | {SUCCESS, DONE, *INDEX_FEATURES}
    if clashing := sorted(set(first.extras) & taken):
        found.append(f"the episodes' extras {clashing} are features the dataset already has")
    for i, episode in enumerate(episodes):
        if set(episode.images) != set(keys.cameras):
            found.append(f"episode {i} has cameras {sorted(episode.images)}, the keys map {sorted(keys.cameras)}")
            continue
        shapes = {c: episode.images[c].shape[1:] for c in keys.cameras}
        if shapes != {c: first.images[c].shape[1:] for c in keys.cameras}:
            found.append(f"episode {i} has image shapes {shapes}, episode 0 others")
        if (episode.state.shape[1], episode.actions.shape[1]) != (first.state.shape[1], first.actions.shape[1]):
            found.append(f"episode {i} has state/action widths {episode.state.shape[1]}/{episode.actions.shape[1]}"
                         f", episode 0 {first.state.shape[1]}/{first.actions.shape[1]}")
        if {k: v.shape[1] for k, v in episode.extras.items()} != {k: v.shape[1] for k, v in first.extras.items()}:
            found.append(f"episode {i} has extras {sorted(episode.extras)}, episode 0 {sorted(first.extras)} (each "
                         "with its width): a dataset's columns cover all frames")
        if (episode.success is None) != (first.success is None):
            found.append("success must be known for every episode or for none (episode 0 and episode "
                         f"{i} differ): a dataset's next.success column covers all frames")
    return found


def dataset_problems(root: Path | str, keys: LeRobotKeys, *, action_dim: int | None = None,
                     state_dim: int | None = None, env_name: str | None = None) -> list[str]:
    """Everything that keeps the dataset at `root` from giving episodes under `keys`, read from meta/ alone (no data
    or video file is opened): meta/info.json, and the episode and task lists that it announces episodes in.
    `action_dim`/`state_dim`: what the env takes and gives (None: not checked); `env_name` names the env in those
    messages. Empty when the dataset can be read."""
    root = Path(root)
    if not root.is_dir():
        return [f"no dataset folder at {root}: record one there or point to an existing LeRobot dataset"]
    if not (root / INFO_PATH).is_file():
        return [f"{root} is not a LeRobot dataset: it has no {INFO_PATH}"]
    try:
        info = load_info(root)
    except (OSError, json.JSONDecodeError) as error:
        return [f"{root / INFO_PATH} cannot be read as JSON: {error}"]
    version = info.get("codebase_version")
    if version not in VERSIONS:
        return [f"{root} is a LeRobot {version} dataset; only {' and '.join(VERSIONS)} are read: convert it with "
                "LeRobot's conversion scripts (lerobot.scripts.convert_dataset_v21_to_v30 and the older ones)"]
    features = info.get("features")
    if not isinstance(features, dict):
        return [f"{root / INFO_PATH} has no `features` block"]
    env = f"env.name={env_name}" if env_name else "the env"
    return (camera_problems(features, keys) + vector_problems(features, keys, "state", state_dim, env)
            + vector_problems(features, keys, "action", action_dim, env) + listing_problems(root, info, version))


def listing_problems(root: Path, info: dict[str, Any], version: str) -> list[str]:
    """The episode and task lists of meta/ that are missing, unreadable or shorter than meta/info.json's
    `total_episodes` (a dataset that announces no episode needs neither)."""
    announced = info.get("total_episodes")
    if announced == 0:
        return []
    said = f"meta/info.json announces {announced} episodes" if isinstance(announced, int) else \
        "meta/info.json gives no total_episodes"
    found, advice = [], UNFINISHED if version == "v3.0" else "copy the dataset whole or record it again"
    if not (root / TASKS_META[version]).is_file():
        found.append(f"{root} has no {TASKS_META[version]} (the tasks' text), yet {said}: {advice}")
    listing = root / EPISODES_META[version]
    if version == "v3.0":
        files = sorted(listing.glob("*/*.parquet"))
        if not files:
            what = "no parquet file in" if listing.is_dir() else "no"
            return found + [f"{root} has {what} {EPISODES_META[version]}/ (each episode's rows: its length, data and "
                            f"video files, tasks), yet {said}: {UNFINISHED}"]
        listed = 0
        for path in files:
            try:
                listed += pq.ParquetFile(path).metadata.num_rows
            except (OSError, pa.ArrowException) as error:
                found.append(f"{path.relative_to(root)} cannot be read as parquet ({error}): {UNFINISHED}")
        if found:
            return found
    else:
        if not listing.is_file():
            return found + [f"{root} has no {EPISODES_META[version]} (each episode's length and tasks), yet {said}: "
                            f"{advice}"]
        listed = sum(1 for line in listing.read_text().splitlines() if line.strip())
    if isinstance(announced, int) and listed < announced:
        found.append(f"{EPISODES_META[version]} lists {listed} episodes, yet {said}: {advice}")
    return found


def _listing(features: dict[str, dict[str, Any]], dtypes: tuple[str, ...] | None = None) -> str:
    names = [k for k, f in features.items() if k not in INDEX_FEATURES and (dtypes is None or f.get("dtype") in dtypes)]
    return ", ".join(names) if names else "(none)"


def camera_problems(features: dict[str, dict[str, Any]], keys: LeRobotKeys) -> list[str]:
    found, images = [], _listing(features, ("image", "video"))
    for camera, key in keys.cameras.items():
        setting = f"{keys.setting}.cameras[{camera!r}]"
        feature = features.get(key)
        if feature is None:
            found.append(f"camera {camera!r} maps to {key!r}, which the dataset does not have: set {setting} to "
                         f"one of its image features ({images}); it has {_listing(features)}")
        elif feature.get("dtype") not in ("image", "video"):
            found.append(f"camera {camera!r} maps to {key!r}, a {feature.get('dtype')} feature, not an image or "
                         f"video: set {setting} to one of {images}")
        elif len(feature.get("shape", [])) != 3 or feature["shape"][2] != 3:
            found.append(f"camera {camera!r} ({key!r}) has shape {feature.get('shape')}, not [height, width, 3] "
                         f"(channels last, RGB): map {setting} to an RGB image feature ({images})")
    return found


def vector_problems(features: dict[str, dict[str, Any]], keys: LeRobotKeys, role: str, want: int | None,
                    env: str) -> list[str]:
    """A state or action feature that is missing, not a 1-D number vector, or of another width than `want`."""
    key = keys.state_key if role == "state" else keys.action_key
    setting, feature = f"{keys.setting}.{role}_key", features.get(key)
    if feature is None:
        return [f"the {role} key {key!r} is not in the dataset: set {setting} to one of its features "
                f"({_listing(features)})"]
    if feature.get("dtype") in ("image", "video", "string") or len(feature.get("shape", [])) != 1:
        return [f"the {role} feature {key!r} has dtype {feature.get('dtype')} shape {feature.get('shape')}, not a "
                f"1-D vector of numbers: set {setting} to a 1-D feature"]
    width = feature["shape"][0]
    if want is not None and width != want:
        verb = "takes" if role == "action" else "gives"
        return [f"dataset {role} ({key!r}) has {width} dims, {env} {verb} {want}: record the dataset with "
                f"{want}-dim {role}s, map {setting} to a {want}-dim feature, or use an env that {verb} {width}"]
    return []
