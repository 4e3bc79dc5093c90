"""Feature statistics as LeRobot stores them: per episode (v2.1 meta/episodes_stats.jsonl, v3.0 `stats/...` columns
of meta/episodes) and over the dataset (v3.0 meta/stats.json), as JSON-ready nested lists.

A vector feature's stats have its width; a scalar column's have shape [1]; an image's are per channel, shape
[3, 1, 1], in [0, 1]. Each has min, max, mean, std and count (frames), and with quantiles q01, q10, q50, q90, q99.
Types as LeRobot 0.4.4 keeps them (lerobot/datasets/compute_stats.py: RunningQuantileStats, aggregate_feature_stats):
min and max in the column's own dtype (an int64 column's are integers, a bool column's booleans, so meta/episodes
stores list<int64> and list<bool> and stats.json integers and true/false), count an integer, mean, std and the
quantiles floats. Stats written as floats throughout (earlier files) aggregate the same.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from vla_scale.datasets.lerobot_frames import vectors

QUANTILES = {"q01": 0.01, "q10": 0.10, "q50": 0.50, "q90": 0.90, "q99": 0.99}
IMAGE_FRAMES = 64
"""At most this many evenly spaced frames of an episode go into its image stats (LeRobot samples them too)."""
IMAGE_SIDE = 150
"""Image stats read every k-th pixel, k chosen to bring the longer side down to about this."""

Stats = dict[str, dict[str, Any]]


def _stats(values: np.ndarray, quantiles: bool, count: int) -> dict[str, Any]:
    """Stats of [N, ...] over axis 0 as nested lists, in LeRobot's order: min and max in the values' dtype, the
    others in float64, `count` after std."""
    floats = values.astype(np.float64)
    out = {"min": values.min(0), "max": values.max(0), "mean": floats.mean(0), "std": floats.std(0)}
    if quantiles:
        out |= {name: np.quantile(floats, q, axis=0) for name, q in QUANTILES.items()}
    return _in_order({k: v.tolist() for k, v in out.items()}, count)


def _in_order(stats: dict[str, Any], count: int) -> dict[str, Any]:
    """min, max, mean, std, count, then the quantiles: the order of LeRobot's stats."""
    head = {name: stats[name] for name in ("min", "max", "mean", "std")}
    return head | {"count": [count]} | {name: stats[name] for name in QUANTILES if name in stats}


def vector_stats(values: np.ndarray, quantiles: bool) -> dict[str, Any]:
    """Stats of a [T, D] or [T] column of numbers or booleans (min and max keep the dtype: ints, bools)."""
    values = np.asarray(values)
    return _stats(values.reshape(len(values), -1), quantiles, len(values))


def image_stats(frames: np.ndarray, quantiles: bool) -> dict[str, Any]:
    """Per-channel stats of uint8 [T, H, W, 3] frames, scaled to [0, 1], over a sample of frames and pixels."""
    picked = frames[np.unique(np.linspace(0, len(frames) - 1, min(len(frames), IMAGE_FRAMES)).astype(int))]
    step = max(1, round(max(frames.shape[1:3]) / IMAGE_SIDE))
    pixels = picked[:, ::step, ::step].reshape(-1, 3).astype(np.float64) / 255.0
    stats = _stats(pixels, quantiles, len(picked))
    return {k: v if k == "count" else np.reshape(v, (3, 1, 1)).tolist() for k, v in stats.items()}


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


def episode_stats(rows: pa.Table, images: dict[str, np.ndarray], features: dict[str, dict[str, Any]],
                  quantiles: bool) -> Stats:
    """One episode's stats of every feature: `rows` its frame table, `images` feature key -> its frames."""
    return {key: image_stats(images[key], quantiles) if f["dtype"] in ("image", "video")
            else vector_stats(vectors(rows.column(key), dtype=None), quantiles) for key, f in features.items()}
