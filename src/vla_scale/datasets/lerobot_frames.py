"""The per-frame parquet table of a LeRobot dataset, both ways: an Episode's steps to rows (images as PNG in
{bytes, path} structs when they are not videos) and rows back to the arrays of an Episode."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from PIL import Image

from vla_scale.datasets.episodes import Episode
from vla_scale.datasets.lerobot_format import DONE, SUCCESS, LeRobotKeys

IMAGE_TYPE = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
"""How the `datasets` library stores an Image feature, which LeRobot uses for image (not video) features."""


def png_bytes(frame: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(frame)).save(buffer, format="PNG")
    return buffer.getvalue()


def image_file(data: bytes | Path | str) -> np.ndarray:
    """uint8 [H, W, 3] from encoded image bytes or an image file's path."""
    with Image.open(io.BytesIO(data) if isinstance(data, bytes) else data) as image:
        return np.asarray(image.convert("RGB"))


def _hf_feature(feature: dict[str, Any]) -> dict[str, Any]:
    if feature["dtype"] == "image":
        return {"_type": "Image"}
    if list(feature["shape"]) == [1]:
        return {"dtype": feature["dtype"], "_type": "Value"}
    return {"feature": {"dtype": feature["dtype"], "_type": "Value"}, "length": feature["shape"][0],
            "_type": "Sequence"}


def _arrow_type(feature: dict[str, Any]) -> pa.DataType:
    if feature["dtype"] == "image":
        return IMAGE_TYPE
    value = pa.from_numpy_dtype(np.dtype(feature["dtype"]))
    return value if list(feature["shape"]) == [1] else pa.list_(value, feature["shape"][0])


def frame_schema(features: dict[str, dict[str, Any]]) -> pa.Schema:
    """The data files' schema: every feature but the videos, in `features` order, with the `datasets` library's
    feature metadata so that it restores image columns as images."""
    stored = {key: f for key, f in features.items() if f["dtype"] != "video"}
    metadata = {"info": {"features": {key: _hf_feature(f) for key, f in stored.items()}}}
    return pa.schema([(key, _arrow_type(f)) for key, f in stored.items()],
                     metadata={"huggingface": json.dumps(metadata)})


def frame_table(episode: Episode, keys: LeRobotKeys, schema: pa.Schema, *, episode_index: int, first_index: int,
                task_index: int, fps: int) -> pa.Table:
    """The episode's rows: one per step, `index` counting from `first_index` over the whole dataset."""
    steps = len(episode)
    columns: dict[str, Any] = {
        keys.state_key: _fixed_lists(episode.state), keys.action_key: _fixed_lists(episode.actions),
        "timestamp": (np.arange(steps) / fps).astype(np.float32), "frame_index": np.arange(steps),
        "episode_index": np.full(steps, episode_index), "index": first_index + np.arange(steps),
        "task_index": np.full(steps, task_index),
    }
    for key, values in episode.extras.items():
        columns[key] = values[:, 0] if values.shape[1] == 1 else _fixed_lists(values)
    if SUCCESS in schema.names:
        columns[SUCCESS] = np.arange(steps) == steps - 1 if episode.success else np.zeros(steps, bool)
        columns[DONE] = np.arange(steps) == steps - 1
    for camera, key in keys.cameras.items():
        if key in schema.names:
            columns[key] = pa.array([{"bytes": png_bytes(f), "path": None} for f in episode.images[camera]],
                                    IMAGE_TYPE)
    return pa.table({name: columns[name] for name in schema.names}, schema=schema)


def _fixed_lists(values: np.ndarray) -> pa.FixedSizeListArray:
    return pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1)), values.shape[1])


def read_rows(path: Path, columns: list[str]) -> dict[int, pa.Table]:
    """A data file's rows grouped by episode_index, each group in frame_index order."""
    table = pq.read_table(path, columns=columns)
    table = table.sort_by([("episode_index", "ascending"), ("frame_index", "ascending")])
    episode = table.column("episode_index").to_numpy()
    starts = np.flatnonzero(np.diff(episode, prepend=-1)) if len(episode) else np.zeros(0, int)
    ends = np.append(starts[1:], len(episode))
    return {int(episode[s]): table.slice(s, e - s) for s, e in zip(starts, ends, strict=True)}


def vectors(column: pa.ChunkedArray, dtype: type[np.generic] | None = np.float32) -> np.ndarray:
    """[T, D] from a list, fixed-size list or (D = 1) scalar column, as `dtype` (None: the column's own)."""
    array = column.combine_chunks()
    if not pa.types.is_list(array.type) and not pa.types.is_fixed_size_list(array.type) \
            and not pa.types.is_large_list(array.type):
        values, width = array.to_numpy(zero_copy_only=False), 1
    else:
        lengths = pc.list_value_length(array).to_numpy(zero_copy_only=False)
        if len(lengths) and (lengths != lengths[0]).any():
            raise ValueError(f"rows hold vectors of different lengths {sorted(set(lengths.tolist()))}")
        values, width = array.flatten().to_numpy(zero_copy_only=False), int(lengths[0]) if len(lengths) else 0
    return (values if dtype is None else values.astype(dtype)).reshape(len(array), width)


def stored_images(column: pa.ChunkedArray, root: Path, data_file: Path) -> np.ndarray:
    """uint8 [T, H, W, 3] from an image column: PNG (or other) bytes, else the file each row's path names
    (absolute, or relative to the dataset root or to the data file's folder)."""
    frames = []
    for row in column.to_pylist():
        if row.get("bytes"):
            frames.append(image_file(row["bytes"]))
            continue
        path = Path(row.get("path") or "")
        candidates = [path] if path.is_absolute() else [root / path, data_file.parent / path]
        found = next((p for p in candidates if p.is_file()), None)
        if found is None:
            raise ValueError(f"an image row has no bytes and its path {str(path)!r} names no file")
        frames.append(image_file(found))
    return np.stack(frames)


def success_of(rows: pa.Table) -> bool | None:
    """The episode's outcome: next.success of its last frame, None when the dataset has no such column."""
    if SUCCESS not in rows.column_names or rows.num_rows == 0:
        return None
    last = rows.column(SUCCESS)[-1].as_py()
    return None if last is None else bool(last)


def resized(frames: np.ndarray, size: tuple[int, int] | None) -> np.ndarray:
    """`frames` at (height, width) `size` (bicubic, antialiased when shrinking); as they are when None or equal."""
    if size is None or frames.shape[1:3] == tuple(size):
        return frames
    height, width = size
    return np.stack([np.asarray(Image.fromarray(f).resize((width, height), Image.Resampling.BICUBIC))
                     for f in frames])


def read_columns(features: dict[str, dict[str, Any]], keys: LeRobotKeys) -> list[str]:
    """The data-file columns an Episode is made from."""
    cameras = [key for key in keys.cameras.values() if features[key]["dtype"] == "image"]
    extra = [SUCCESS] if SUCCESS in features else []
    return [keys.state_key, keys.action_key, "timestamp", "frame_index", "episode_index", "task_index", *extra,
            *cameras]


def assemble(rows: pa.Table, keys: LeRobotKeys, instruction: str, images: dict[str, np.ndarray]) -> Episode:
    """The Episode of one episode's rows (in frame order) and its cameras' frames."""
    return Episode(instruction=instruction, images=images, state=vectors(rows.column(keys.state_key)),
                   actions=vectors(rows.column(keys.action_key)), success=success_of(rows))
