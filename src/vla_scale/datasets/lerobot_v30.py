"""LeRobot's v3.0 layout: many episodes per file. Frames in data/chunk-XXX/file-XXX.parquet, each camera's
episodes end to end in videos/<key>/chunk-XXX/file-XXX.mp4, one row per episode in meta/episodes/ (where its rows
and video spans lie: dataset_from_index/dataset_to_index, from_timestamp/to_timestamp; its stats), the tasks in
meta/tasks.parquet and the dataset's stats in meta/stats.json."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from vla_scale.datasets.episodes import Episode
from vla_scale.datasets.lerobot_format import (
    CHUNKS_SIZE,
    EpisodeStream,
    LeRobotKeys,
    chunk_and_file,
    features_of,
    write_json,
)
from vla_scale.datasets.lerobot_frames import (
    assemble,
    frame_schema,
    frame_table,
    read_columns,
    read_rows,
    resized,
    stored_images,
)
from vla_scale.datasets.lerobot_stats import aggregate, episode_stats, flattened
from vla_scale.datasets.video import DecodedVideo, VideoCodec, VideoFile, decode_video, video_info

VERSION = "v3.0"
DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
EPISODES_PATH = "meta/episodes/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
TASKS_PATH = "meta/tasks.parquet"
STATS_PATH = "meta/stats.json"
DATA_FILE_MB, VIDEO_FILE_MB = 100, 200
"""A new data (video) file starts once the current one holds this many MB, LeRobot's defaults."""


class DataFiles:
    """Episodes' frame tables gathered into data files of about DATA_FILE_MB (uncompressed) each, one parquet row
    group per episode."""

    def __init__(self, root: Path, schema: pa.Schema) -> None:
        self.root, self.schema = root, schema
        self.written, self.tables, self.size = 0, [], 0

    def add(self, table: pa.Table) -> tuple[int, int]:
        """Adds an episode's table; returns the (chunk, file) index of the file it lands in."""
        if self.tables and self.size + table.nbytes > DATA_FILE_MB * 2**20:
            self.flush()
        self.tables.append(table)
        self.size += table.nbytes
        return chunk_and_file(self.written)

    def flush(self) -> None:
        if not self.tables:
            return
        chunk, file = chunk_and_file(self.written)
        path = self.root / DATA_PATH.format(chunk_index=chunk, file_index=file)
        path.parent.mkdir(parents=True, exist_ok=True)
        with pq.ParquetWriter(path, self.schema, compression="snappy") as writer:
            for table in self.tables:
                writer.write_table(table)
        self.written, self.tables, self.size = self.written + 1, [], 0


class VideoFiles:
    """One camera's episodes appended to .mp4 files of about VIDEO_FILE_MB each."""

    def __init__(self, root: Path, key: str, codec: VideoCodec, fps: int) -> None:
        self.root, self.key, self.codec, self.fps = root, key, codec, fps
        self.written, self.current, self.first_path = 0, None, None

    def add(self, frames: np.ndarray) -> dict[str, Any]:
        """Appends an episode's frames; returns its episode-metadata columns (file, start and end time)."""
        if self.current is not None and self.current.bytes >= VIDEO_FILE_MB * 2**20:
            self.close()
        if self.current is None:
            chunk, file = chunk_and_file(self.written)
            path = self.root / VIDEO_PATH.format(video_key=self.key, chunk_index=chunk, file_index=file)
            self.current = VideoFile(path, self.codec, self.fps, *frames.shape[1:3])
            self.first_path = self.first_path or path
        start = self.current.frames
        self.current.append(frames)
        chunk, file = chunk_and_file(self.written)
        prefix = f"videos/{self.key}/"
        return {prefix + "chunk_index": chunk, prefix + "file_index": file,
                prefix + "from_timestamp": start / self.fps, prefix + "to_timestamp": (start + len(frames)) / self.fps}

    def close(self) -> None:
        if self.current is not None:
            self.current.close()
            self.current, self.written = None, self.written + 1


def write(root: Path, episodes: EpisodeStream, keys: LeRobotKeys, *, fps: int, codec: VideoCodec | None,
          robot_type: str) -> None:
    """Writes the whole dataset, one episode at a time; `codec` None stores images as PNG in the data files instead
    of videos."""
    features = features_of([episodes.first], keys, video=codec is not None)
    data = DataFiles(root, frame_schema(features))
    videos = {key: VideoFiles(root, key, codec, fps) for key in keys.cameras.values()} if codec else {}
    rows, stats, first_index = [], [], 0
    for i, episode in enumerate(episodes):
        table = frame_table(episode, keys, data.schema, episode_index=i, first_index=first_index,
                            task_index=episodes.tasks[episode.instruction], fps=fps)
        images = {key: episode.images[camera] for camera, key in keys.cameras.items()}
        stats.append(episode_stats(table, images, features, version=VERSION, fps=fps))
        row = episode_row(i, episode, first_index, data.add(table)) | _videos_row(videos, images)
        rows.append(row | flattened(stats[-1]) | {"meta/episodes/chunk_index": 0, "meta/episodes/file_index": 0})
        first_index += len(episode)
    data.flush()
    for key, files in videos.items():
        files.close()
        features[key]["info"] = video_info(files.first_path)
    _write_meta(root, rows, episodes.tasks, aggregate(stats), info(features, episodes, fps, codec is not None,
                                                                   robot_type))


def episode_row(index: int, episode: Episode, first_index: int, data_file: tuple[int, int]) -> dict[str, Any]:
    """An episode's row of meta/episodes: its tasks, length, data file and rows (global indices)."""
    return {"episode_index": index, "tasks": [episode.instruction], "length": len(episode),
            "data/chunk_index": data_file[0], "data/file_index": data_file[1], "dataset_from_index": first_index,
            "dataset_to_index": first_index + len(episode)}


def _videos_row(videos: dict[str, VideoFiles], images: dict[str, np.ndarray]) -> dict[str, Any]:
    """Appends each camera's frames to its video file; returns where they lie (file, start and end time)."""
    row: dict[str, Any] = {}
    for key, files in videos.items():
        row |= files.add(images[key])
    return row


def info(features: dict[str, Any], episodes: EpisodeStream, fps: int, video: bool, robot_type: str) -> dict:
    """meta/info.json of the episodes written."""
    return {"codebase_version": VERSION, "robot_type": robot_type, "total_episodes": episodes.count,
            "total_frames": episodes.frames, "total_tasks": len(episodes.tasks),
            "chunks_size": CHUNKS_SIZE, "data_files_size_in_mb": DATA_FILE_MB,
            "video_files_size_in_mb": VIDEO_FILE_MB, "fps": fps, "splits": {"train": f"0:{episodes.count}"},
            "data_path": DATA_PATH, "video_path": VIDEO_PATH if video else None, "features": features}


PANDAS_INDEX = "__index_level_0__"
"""The column pandas stores an unnamed index in."""


def tasks_table(tasks: dict[str, int]) -> pa.Table:
    """meta/tasks.parquet as LeRobot writes it, a pandas frame of task_index whose unnamed index is the task text
    (`pd.DataFrame({"task_index": ...}, index=tasks).to_parquet(path)`): the text in pandas' index column, which the
    schema's pandas metadata names the frame's index."""
    pandas = {"index_columns": [PANDAS_INDEX], "column_indexes": [
        {"name": None, "field_name": None, "pandas_type": "unicode", "numpy_type": "object",
         "metadata": {"encoding": "UTF-8"}}],
        "columns": [{"name": "task_index", "field_name": "task_index", "pandas_type": "int64", "numpy_type": "int64",
                     "metadata": None},
                    {"name": None, "field_name": PANDAS_INDEX, "pandas_type": "unicode", "numpy_type": "object",
                     "metadata": None}],
        "attributes": {}, "creator": {"library": "pyarrow", "version": pa.__version__}}
    schema = pa.schema([("task_index", pa.int64()), (PANDAS_INDEX, pa.string())],
                       metadata={"pandas": json.dumps(pandas)})
    return pa.table({"task_index": list(tasks.values()), PANDAS_INDEX: list(tasks)}, schema=schema)


def _write_meta(root: Path, rows: list[dict], tasks: dict[str, int], stats: dict, info_json: dict) -> None:
    (root / "meta").mkdir(parents=True, exist_ok=True)
    pq.write_table(tasks_table(tasks), root / TASKS_PATH)
    path = root / EPISODES_PATH.format(chunk_index=0, file_index=0)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    write_json(root / STATS_PATH, stats)
    write_json(root / "meta/info.json", info_json)


def read_tasks(root: Path) -> dict[int, str]:
    """task_index -> text. The text is pandas' index column as LeRobot writes it (unnamed: __index_level_0__), or a
    column named "task" (an index of that name, or a plain column, as earlier writers left it), else the table's one
    string column."""
    table = pq.read_table(root / TASKS_PATH)
    names = [f.name for f in table.schema if pa.types.is_string(f.type) or pa.types.is_large_string(f.type)]
    text = next((name for name in (PANDAS_INDEX, "task") if name in table.column_names), names[0])
    return dict(zip(table.column("task_index").to_pylist(), table.column(text).to_pylist(), strict=True))


def read_episode_rows(root: Path) -> list[dict[str, Any]]:
    """meta/episodes' rows without their stats, in episode order."""
    tables = []
    for path in sorted((root / "meta/episodes").glob("*/*.parquet")):
        schema = pq.read_schema(path)
        tables += pq.read_table(path, columns=[n for n in schema.names if not n.startswith("stats/")]).to_pylist()
    return sorted(tables, key=lambda row: row["episode_index"])


def read(root: Path, info_json: dict, keys: LeRobotKeys, image_size: tuple[int, int] | None) -> list[Episode]:
    features = info_json["features"]
    tasks, columns = read_tasks(root), read_columns(features, keys)
    videos: dict[str, tuple[Path, DecodedVideo]] = {}
    data_path, rows, episodes = None, {}, []
    for meta in read_episode_rows(root):
        path = root / info_json["data_path"].format(chunk_index=meta["data/chunk_index"],
                                                    file_index=meta["data/file_index"])
        if path != data_path:
            data_path, rows = path, read_rows(path, columns)
        if meta["episode_index"] not in rows:
            raise ValueError(f"episode {meta['episode_index']} has no rows in {path}")
        frames = rows[meta["episode_index"]]
        images = {camera: resized(_camera_frames(root, info_json, meta, key, frames, videos, path), image_size)
                  for camera, key in keys.cameras.items()}
        task = frames.column("task_index")[0].as_py()
        episodes.append(assemble(frames, keys, tasks.get(task) or meta["tasks"][0], images))
    return episodes


def _camera_frames(root: Path, info_json: dict, meta: dict, key: str, rows: pa.Table,
                   videos: dict[str, tuple[Path, DecodedVideo]], data_path: Path) -> np.ndarray:
    """One camera's frames of an episode, from its video span or from the data file's image column; `videos`
    keeps each camera's last decoded file."""
    if info_json["features"][key]["dtype"] == "image":
        return stored_images(rows.column(key), root, data_path)
    prefix = f"videos/{key}/"
    path = root / info_json["video_path"].format(video_key=key, chunk_index=meta[prefix + "chunk_index"],
                                                 file_index=meta[prefix + "file_index"])
    if key not in videos or videos[key][0] != path:
        videos[key] = (path, decode_video(path))
    times = meta[prefix + "from_timestamp"] + rows.column("timestamp").to_numpy().astype(np.float64)
    try:
        return videos[key][1].at(times, tolerance=0.4 / info_json["fps"])
    except ValueError as error:
        raise ValueError(f"episode {meta['episode_index']}, {path}: {error}") from error
