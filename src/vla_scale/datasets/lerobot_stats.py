"""Feature statistics as LeRobot stores them: per episode (v2.1 meta/episodes_stats.jsonl, v3.0 `stats/...` columns
of meta/episodes) and over the dataset (v3.0 meta/stats.json), as JSON-ready nested lists.

Each episode's stats are computed with the same numpy operations, on arrays of the same dtype and layout, as the
LeRobot release that writes that format: v3.0 as 0.4.4 (lerobot/datasets/compute_stats.py: compute_episode_stats,
get_feature_stats, RunningQuantileStats; the same from 0.4.0 to 0.5.1), v2.1 as 0.3.3 (compute_stats.py:
get_feature_stats, plain np.min/max/mean/std). tests/fixtures/lerobot_reference/make_image_stats.py records both
releases' outputs, which tests/datasets/test_lerobot_stats.py compares against.

A vector feature's stats have its width; a scalar column's have shape [1]; an image's are per channel, shape
[3, 1, 1], in [0, 1]. Each has min, max, mean, std and count (frames), and in v3.0 quantiles q01, q10, q50, q90,
q99. Types as LeRobot keeps them: min and max in the column's own dtype (an int64 column's are integers, a bool
column's booleans, so meta/episodes stores list<int64> and list<bool> and stats.json integers and true/false),
count an integer, mean, std and the quantiles floats (a float32 column's computed in float32). Stats written as
floats throughout (earlier files) aggregate the same.

Images (and video frames, whose stats LeRobot takes from the frames before encoding) go in through a sample, the
same in both releases and unchanged up to LeRobot 0.6.1: `sampled_frames` frames evenly spread over the episode,
every `image_stride`-th row and column of each.

Where v3.0 departs from 0.4.4: 0.4.4 squares uint8 pixels in uint8, which wraps and leaves nearly every image std
clipped to 0 (lerobot#3697, fixed in 0.6.0 by casting to float32 first); the pixels here are cast to float64
before the same computation, so min, max, mean and the quantiles equal 0.4.4's and the std is the one its formula
gives without the wrap. Later releases differ too: from 0.6.0 image stats are computed in float32.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import pyarrow as pa

from vla_scale.datasets.lerobot_frames import vectors

QUANTILES = {"q01": 0.01, "q10": 0.10, "q50": 0.50, "q90": 0.90, "q99": 0.99}
HISTOGRAM_BINS = 5000
"""LeRobot 0.4.4 reads an episode's quantiles off a histogram of this many equal bins over [min, max]."""
SAMPLED_FRAMES, MOST_SAMPLED_FRAMES, SAMPLING_POWER = 100, 10_000, 0.75
"""An episode's image stats read all its frames up to SAMPLED_FRAMES, then length ** SAMPLING_POWER of them (once
that is more: from 471 frames), at most MOST_SAMPLED_FRAMES (LeRobot's estimate_num_samples)."""
FULL_SIZE_BELOW, TARGET_SIDE = 300, 150
"""Frames whose longer side is under FULL_SIZE_BELOW px are read whole; larger ones every k-th pixel, k =
int(longer side / TARGET_SIDE) (LeRobot's auto_downsample_height_width)."""

Stats = dict[str, dict[str, Any]]
FormatVersion = Literal["v2.1", "v3.0"]


def sampled_frames(length: int) -> np.ndarray:
    """Indices of the frames of an episode of `length` that its image stats read."""
    count = max(min(length, SAMPLED_FRAMES), min(int(length**SAMPLING_POWER), MOST_SAMPLED_FRAMES))
    return np.round(np.linspace(0, length - 1, count)).astype(int)


def image_stride(height: int, width: int) -> int:
    """Every how many rows and columns image stats read a pixel; the longer side sets it (the height on a tie)."""
    if max(height, width) < FULL_SIZE_BELOW:
        return 1
    return int((width if width > height else height) / TARGET_SIDE)


def vector_stats(values: np.ndarray, version: FormatVersion) -> dict[str, Any]:
    """Stats of a [T, D] or [T] column of numbers or booleans, in its own dtype."""
    values = np.asarray(values)
    rows = values.reshape(len(values), -1)
    stats = _histogram_stats(rows) if version == "v3.0" else _plain_stats(rows, axis=0)
    return _listed(stats, count=len(values))


def image_stats(frames: np.ndarray, version: FormatVersion) -> dict[str, Any]:
    """Per-channel stats of uint8 [T, H, W, 3] frames over their sample, scaled to [0, 1] after they are taken."""
    step = image_stride(*frames.shape[1:3])
    picked = frames[sampled_frames(len(frames))][:, ::step, ::step]
    if version == "v3.0":
        stats = _histogram_stats(picked.reshape(-1, picked.shape[-1]))
    else:  # 0.3.3 reduces [N, C, H, W] frames over (0, 2, 3)
        stats = _plain_stats(np.ascontiguousarray(picked.transpose(0, 3, 1, 2)), axis=(0, 2, 3))
    scaled = {name: (value / 255.0).reshape(-1, 1, 1) for name, value in stats.items()}
    return _listed(scaled, count=len(picked))


def _plain_stats(values: np.ndarray, axis: int | tuple[int, ...]) -> dict[str, np.ndarray]:
    return {"min": values.min(axis), "max": values.max(axis), "mean": values.mean(axis), "std": values.std(axis)}


def _histogram_stats(rows: np.ndarray) -> dict[str, np.ndarray]:
    """LeRobot 0.4.4's stats of [N, D] rows: the mean of squares less the squared mean for the variance, in the
    rows' dtype, and quantiles interpolated in histograms; one row alone has std 0 and its values as quantiles.
    uint8 pixels are squared in float64, where 0.4.4 wraps them in uint8 (the sums of these integers are exact,
    so mean and std are those of the pixels cast to float64)."""
    mean = rows.mean(0)
    if len(rows) < 2:
        return {"min": rows.min(0), "max": rows.max(0), "mean": mean, "std": rows.std(0)} | \
            {name: mean.copy() for name in QUANTILES}
    low, high = rows.min(0), rows.max(0)
    squares = np.square(rows, dtype=np.float64) if rows.dtype == np.uint8 else rows**2
    std = np.sqrt(np.maximum(0, squares.mean(0) - mean**2))
    columns = [_histogram_quantiles(rows[:, i], low[i], high[i]) for i in range(rows.shape[1])]
    return {"min": low, "max": high, "mean": mean, "std": std} | \
        {name: np.array([column[j] for column in columns]) for j, name in enumerate(QUANTILES)}


def _histogram_quantiles(column: np.ndarray, low: np.generic, high: np.generic) -> list[float]:
    """QUANTILES of one column, each the point where the histogram's running count reaches that share of the
    values, linear within its bin (the first edge below the first bin, the last past the end, a bin's lower edge
    when it is empty)."""
    edges = np.linspace(low - 1e-10, high + 1e-10, HISTOGRAM_BINS + 1)
    running = np.cumsum(_bin_counts(column, edges))
    out = []
    for share in QUANTILES.values():
        target = share * len(column)
        i = int(np.searchsorted(running, target))
        if i == 0 or i >= len(running):
            out.append(edges[0] if i == 0 else edges[-1])
            continue
        before = running[i - 1]
        inside = running[i] - before
        out.append(edges[i] if inside == 0 else edges[i] + (target - before) / inside * (edges[i + 1] - edges[i]))
    return out


def _bin_counts(column: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """How many values fall in each bin, as floats; uint8 and bool columns through their levels' counts (the same
    numbers as binning every value, without sorting millions of pixels)."""
    if column.dtype not in (np.uint8, np.bool_):
        return np.histogram(column, bins=edges)[0].astype(np.float64)
    levels = np.bincount(column.astype(np.uint8), minlength=2)
    return np.histogram(np.arange(len(levels)), bins=edges, weights=levels.astype(np.float64))[0]


def _listed(stats: dict[str, np.ndarray], count: int) -> dict[str, Any]:
    """Nested lists, in LeRobot's order: min, max, mean, std, count, then the quantiles."""
    return _in_order({name: value.tolist() for name, value in stats.items()}, count)


def _in_order(stats: dict[str, Any], count: int) -> dict[str, Any]:
    """min, max, mean, std, count, then the quantiles: the order of LeRobot's stats."""
    head = {name: stats[name] for name in ("min", "max", "mean", "std")}
    return head | {"count": [count]} | {name: stats[name] for name in QUANTILES if name in stats}


def aggregate(per_episode: list[Stats]) -> Stats:
    """Dataset stats from episodes' stats: extremes, count-weighted means (quantiles too, as LeRobot does) and the
    pooled standard deviation."""
    return {key: _aggregate_feature([s[key] for s in per_episode]) for key in per_episode[0]}


def _aggregate_feature(stats: list[dict[str, Any]]) -> dict[str, Any]:
    counts = np.array([s["count"][0] for s in stats], dtype=np.float64)
    weights = (counts / counts.sum()).reshape(-1, *[1] * np.ndim(stats[0]["mean"]))
    field = {name: np.array([s[name] for s in stats], dtype=np.float64) for name in stats[0]
             if name not in ("count", "min", "max")}
    mean = (weights * field["mean"]).sum(0)
    variance = (weights * (field["std"] ** 2 + (field["mean"] - mean) ** 2)).sum(0)
    # the extremes keep the episodes' type: ints, bools, or floats as earlier files stored every stat
    out = {"min": np.array([s["min"] for s in stats]).min(0), "max": np.array([s["max"] for s in stats]).max(0),
           "mean": mean, "std": np.sqrt(variance)}
    out |= {name: (weights * field[name]).sum(0) for name in QUANTILES if name in field}
    return _in_order({k: v.tolist() for k, v in out.items()}, int(counts.sum()))


def flattened(stats: Stats) -> dict[str, Any]:
    """{"stats/<feature>/<stat>": value}: the columns v3.0 keeps per episode in meta/episodes."""
    return {f"stats/{key}/{name}": value for key, block in stats.items() for name, value in block.items()}


def episode_stats(rows: pa.Table, images: dict[str, np.ndarray], features: dict[str, dict[str, Any]], *,
                  version: FormatVersion, fps: int) -> Stats:
    """One episode's stats of every feature: `rows` its frame table, `images` feature key -> its frames. Each
    column is taken as LeRobot's episode buffer holds it: `timestamp` as frame_index / fps in float64 (the table
    keeps it in float32), the others in the table's dtype."""
    def column(key: str) -> np.ndarray:
        if key == "timestamp" and "frame_index" in rows.column_names:
            return rows.column("frame_index").to_numpy() / fps
        return vectors(rows.column(key), dtype=None)

    return {key: image_stats(images[key], version) if f["dtype"] in ("image", "video")
            else vector_stats(column(key), version) for key, f in features.items()}
