"""Episodes to and from LeRobot datasets (v2.1 and v3.0 layouts): write_dataset, read_dataset, and
dataset_problems, the metadata-only check to run before any heavy work.

A dataset written here loads in LeRobot (same files, columns, metadata and stats), and one LeRobot recorded loads
here: the version is read from meta/info.json's codebase_version. Videos are written with PyAV; the default codec
(h264_yuv444, pix_fmt yuv444p, which LeRobot's get_video_info() reads) re-reads within 2 levels of each RGB value,
"h264_rgb" re-reads bit-exact (pix_fmt gbrp, which get_video_info() refuses), "av1" is LeRobot's own lossy default;
`python -m vla_scale.datasets.video_compare DATASET` measures them on a dataset's frames. Episode success, when
known, is each frame's next.success (true on the last frame of a successful episode) beside next.done.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

import pyarrow as pa

from vla_scale.datasets import lerobot_v21, lerobot_v30
from vla_scale.datasets.episodes import Episode
from vla_scale.datasets.lerobot_format import (
    DatasetError,
    EpisodeStream,
    LeRobotKeys,
    NoEpisodes,
    dataset_problems,
    load_info,
    writing_problems,
)
from vla_scale.datasets.video import DEFAULT_CODEC, codec_named

__all__ = ["DatasetError", "LeRobotKeys", "NoEpisodes", "dataset_problems", "read_dataset", "write_dataset"]

LAYOUTS = {"v2.1": lerobot_v21, "v3.0": lerobot_v30}


def write_dataset(root: Path | str, episodes: Iterable[Episode], keys: LeRobotKeys, *, version: str = "v3.0",
                  fps: int = 10, video: bool = True, codec: str = DEFAULT_CODEC,
                  robot_type: str = "vla_scale") -> Path:
    """Writes `episodes` as a complete LeRobot dataset in `root` (which must be missing or empty) and returns it.

    A sequence is checked whole before anything is written; any other iterable (a generator playing episodes) is
    written one episode at a time, each checked against the first as it comes, so no more than one is held.
    video: cameras as .mp4 files encoded with `codec` (see video.CODECS), else as PNG images in the data files.
    """
    root = Path(root)
    if version not in LAYOUTS:
        raise ValueError(f"version must be one of {sorted(LAYOUTS)}, got {version!r}")
    if fps < 1:
        raise ValueError(f"fps must be >= 1, got {fps}")
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        raise FileExistsError(f"{root} exists and is not an empty folder: a dataset is written only into a new one")
    if isinstance(episodes, Sequence) and (problems := writing_problems(list(episodes), keys)):
        raise ValueError("cannot write these episodes as one dataset: " + "; ".join(problems))
    chosen = codec_named(codec) if video else None
    stream = EpisodeStream(episodes, keys)  # the first episode is played (a generator's) before the folder is made
    root.mkdir(parents=True, exist_ok=True)
    LAYOUTS[version].write(root, stream, keys, fps=fps, codec=chosen, robot_type=robot_type)
    return root


def read_dataset(root: Path | str, keys: LeRobotKeys, *, action_dim: int | None = None,
                 state_dim: int | None = None, image_size: int | tuple[int, int] | None = None,
                 env_name: str | None = None) -> list[Episode]:
    """Every episode of the dataset at `root`, in episode order, frames decoded to uint8 RGB.

    action_dim/state_dim: what the env takes and gives, checked first with dataset_problems (DatasetError lists
    all that is wrong); image_size: (height, width) or a side that every camera's frames are resized to (bicubic)
    when stored at another size, None to keep them as stored.
    """
    problems = dataset_problems(root, keys, action_dim=action_dim, state_dim=state_dim, env_name=env_name)
    if problems:
        raise DatasetError(root, problems)
    root = Path(root)
    info = load_info(root)
    if info.get("total_episodes") == 0:  # as LeRobot leaves a dataset before its first episode: no lists in meta/
        return []
    size = (image_size, image_size) if isinstance(image_size, int) else image_size
    try:
        return LAYOUTS[info["codebase_version"]].read(root, info, keys, size)
    except (OSError, KeyError, IndexError, ValueError, pa.ArrowException) as error:
        if isinstance(error, DatasetError):
            raise
        raise DatasetError(root, [f"the data does not match its metadata: {type(error).__name__}: {error}"]) \
            from error
