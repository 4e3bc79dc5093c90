"""LeRobot's v2.1 layout: one file per episode. Frames in data/chunk-XXX/episode_XXXXXX.parquet, each camera's
video in videos/chunk-XXX/<key>/episode_XXXXXX.mp4 starting at 0 s, and JSON lines in meta/: episodes.jsonl (tasks,
length), tasks.jsonl and episodes_stats.jsonl (the format has no dataset-wide stats file)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from vla_scale.datasets.episodes import Episode
from vla_scale.datasets.lerobot_format import CHUNKS_SIZE, EpisodeStream, LeRobotKeys, features_of, write_json
from vla_scale.datasets.lerobot_frames import (
    assemble,
    frame_schema,
    frame_table,
    read_columns,
    read_rows,
    resized,
    stored_images,
)
from vla_scale.datasets.lerobot_stats import episode_stats
from vla_scale.datasets.video import VideoCodec, VideoFile, decode_video, video_info

VERSION = "v2.1"
DATA_PATH = "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet"
VIDEO_PATH = "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4"


def write(root: Path, episodes: EpisodeStream, keys: LeRobotKeys, *, fps: int, codec: VideoCodec | None,
          robot_type: str) -> None:
    """Writes the whole dataset, one episode at a time; `codec` None stores images as PNG in the data files instead
    of videos."""
    features = features_of([episodes.first], keys, video=codec is not None)
    schema = frame_schema(features)
    listed, stats, first_index = [], [], 0
    for i, episode in enumerate(episodes):
        table = frame_table(episode, keys, schema, episode_index=i, first_index=first_index,
                            task_index=episodes.tasks[episode.instruction], fps=fps)
        path = root / DATA_PATH.format(episode_chunk=i // CHUNKS_SIZE, episode_index=i)
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, path, compression="snappy")
        if codec is not None:
            _write_videos(root, i, episode, keys, codec, fps)
        images = {key: episode.images[camera] for camera, key in keys.cameras.items()}
        stats.append({"episode_index": i, "stats": episode_stats(table, images, features, version=VERSION, fps=fps)})
        listed.append({"episode_index": i, "tasks": [episode.instruction], "length": len(episode)})
        first_index += len(episode)
    if codec is not None:
        for key in keys.cameras.values():
            first = root / VIDEO_PATH.format(episode_chunk=0, video_key=key, episode_index=0)
            features[key]["info"] = video_info(first)
    _write_lines(root / "meta/tasks.jsonl", [{"task_index": i, "task": text} for text, i in episodes.tasks.items()])
    _write_lines(root / "meta/episodes.jsonl", listed)
    _write_lines(root / "meta/episodes_stats.jsonl", stats)
    write_json(root / "meta/info.json", info(features, episodes, fps, codec is not None, robot_type))


def _write_videos(root: Path, index: int, episode: Episode, keys: LeRobotKeys, codec: VideoCodec, fps: int) -> None:
    for camera, key in keys.cameras.items():
        path = root / VIDEO_PATH.format(episode_chunk=index // CHUNKS_SIZE, video_key=key, episode_index=index)
        video = VideoFile(path, codec, fps, *episode.images[camera].shape[1:3])
        video.append(episode.images[camera])
        video.close()


def info(features: dict[str, Any], episodes: EpisodeStream, fps: int, video: bool, robot_type: str) -> dict[str, Any]:
    """meta/info.json of the episodes written."""
    count = episodes.count
    return {"codebase_version": VERSION, "robot_type": robot_type, "total_episodes": count,
            "total_frames": episodes.frames, "total_tasks": len(episodes.tasks),
            "total_videos": count * sum(f["dtype"] == "video" for f in features.values()),
            "total_chunks": -(-count // CHUNKS_SIZE), "chunks_size": CHUNKS_SIZE, "fps": fps,
            "splits": {"train": f"0:{count}"}, "data_path": DATA_PATH, "video_path": VIDEO_PATH if video else None,
            "features": features}


def _write_lines(path: Path, rows: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def _read_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def read(root: Path, info_json: dict, keys: LeRobotKeys, image_size: tuple[int, int] | None) -> list[Episode]:
    features, chunks = info_json["features"], info_json.get("chunks_size", CHUNKS_SIZE)
    tasks = {row["task_index"]: row["task"] for row in _read_lines(root / "meta/tasks.jsonl")}
    columns, episodes = read_columns(features, keys), []
    for listed in sorted(_read_lines(root / "meta/episodes.jsonl"), key=lambda row: row["episode_index"]):
        index = listed["episode_index"]
        path = root / info_json["data_path"].format(episode_chunk=index // chunks, episode_index=index)
        rows = read_rows(path, columns).get(index)
        if rows is None:
            raise ValueError(f"episode {index} has no rows in {path}")
        images = {camera: resized(_camera_frames(root, info_json, index // chunks, index, key, rows, path),
                                  image_size) for camera, key in keys.cameras.items()}
        task = rows.column("task_index")[0].as_py()
        episodes.append(assemble(rows, keys, tasks.get(task) or listed["tasks"][0], images))
    return episodes


def _camera_frames(root: Path, info_json: dict, chunk: int, index: int, key: str, rows: pa.Table,
                   data_path: Path) -> np.ndarray:
    if info_json["features"][key]["dtype"] == "image":
        return stored_images(rows.column(key), root, data_path)
    path = root / info_json["video_path"].format(episode_chunk=chunk, video_key=key, episode_index=index)
    times = rows.column("timestamp").to_numpy().astype(np.float64)
    try:
        return decode_video(path).at(times, tolerance=0.4 / info_json["fps"])
    except ValueError as error:
        raise ValueError(f"episode {index}, {path}: {error}") from error
