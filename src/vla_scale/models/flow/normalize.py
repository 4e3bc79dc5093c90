"""The flow families' normalisation of states and actions, openpi's and LeRobot's, read from openpi's
`norm_stats.json` or given (numpy only).

A π0 checkpoint's `assets/<robot>/norm_stats.json` holds, per key (`state`, `actions`), the mean, standard
deviation and 1st/99th percentiles of each dimension: `{"norm_stats": {"state": {"mean": [...], "std": [...],
"q01": [...], "q99": [...]}, "actions": {...}}}`. openpi normalises with one of two rules (`transforms.Normalize`,
`Unnormalize`), chosen by the model: π0 by z-scores, π0.5 by quantiles (q01 -> -1, q99 -> +1). The formulas below
are openpi's to the operation, including its edge rules, so a round trip gives its numbers exactly:

- normalising, the statistics are cut to the value's size (a robot's 8-d state against 8-d statistics);
- un-normalising a value wider than the statistics (the model's 32-d padded actions), z-scores pad the mean with 0
  and the std with 1 (so the padding is scaled by 1 + 1e-6), quantiles leave the extra dimensions as they are;
- 1e-6 is added to every divisor (std, q99 - q01), and multiplied back the same way.

The statistics stay float64 arrays as JSON gives them and numpy's type promotion applies, as in openpi.

LeRobot's π0 / π0.5 (its `NormalizerProcessorStep`, 0.4.4) normalise with the same statistics by other edge rules,
the convention `lerobot` (what a LeRobot-layout folder is read with unless `model.pi0.norm_convention` says):
z-scores divide by std + 1e-8 and multiply back by std alone; quantiles divide by q99 - q01, 1e-8 only where that
is 0, and multiply back by the same; everything in float32, the dtype LeRobot's tensors and statistics meet in,
each formula in LeRobot's order of operations, so the results are LeRobot's bit for bit.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

NORMALIZATIONS = ("zscore", "quantile")
"""openpi's two normalisations (`transforms.Normalize`): (x - mean) / std, or [q01, q99] -> [-1, 1]."""
NORM_CONVENTIONS = ("openpi", "lerobot")
"""Whose edge rules the normalisation follows: openpi's epsilon or LeRobot's."""
EPS = 1e-6
"""Added to every divisor, openpi's."""
LEROBOT_EPS = np.float32(1e-8)
"""LeRobot's: added to the std when normalising, replacing a q99 - q01 of 0."""


@dataclass(frozen=True)
class NormStats:
    """One key's per-dimension statistics (q01 and q99 may be absent: z-scores only)."""

    mean: np.ndarray
    std: np.ndarray
    q01: np.ndarray | None = None
    q99: np.ndarray | None = None

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> NormStats:
        def array(key: str) -> np.ndarray | None:
            return None if d.get(key) is None else np.asarray(d[key], dtype=np.float64)

        mean, std = array("mean"), array("std")
        if mean is None or std is None:
            raise ValueError(f"norm stats need 'mean' and 'std', found {sorted(d)}")
        return cls(mean=mean, std=std, q01=array("q01"), q99=array("q99"))

    def to_json(self) -> dict[str, Any]:
        fields = {"mean": self.mean, "std": self.std, "q01": self.q01, "q99": self.q99}
        return {k: None if v is None else v.tolist() for k, v in fields.items()}


def read_norm_stats(path: str | Path) -> dict[str, NormStats]:
    """`norm_stats.json` (or the folder that holds it) -> statistics per key."""
    path = Path(path)
    if path.is_dir():
        path = path / "norm_stats.json"
    data = json.loads(path.read_text())
    if "norm_stats" not in data:
        raise ValueError(f"{path}: no 'norm_stats' section (keys: {sorted(data)})")
    return {key: NormStats.from_json(stats) for key, stats in data["norm_stats"].items()}


class FlowNormalizer:
    """Normalise and un-normalise the keys of `stats` by z-scores or quantiles (module docstring)."""

    def __init__(self, stats: dict[str, NormStats], mode: str, convention: str = "openpi"):
        if mode not in NORMALIZATIONS:
            raise ValueError(f"normalization {mode!r}: choose one of {NORMALIZATIONS}")
        if convention not in NORM_CONVENTIONS:
            raise ValueError(f"norm convention {convention!r}: choose one of {NORM_CONVENTIONS}")
        if mode == "quantile":
            lacking = sorted(k for k, s in stats.items() if s.q01 is None or s.q99 is None)
            if lacking:
                raise ValueError(f"quantile normalisation needs q01 and q99; {lacking} lack them")
        self.stats = stats
        self.mode = mode
        self.convention = convention

    def _of(self, key: str) -> NormStats:
        if key not in self.stats:
            raise KeyError(f"no norm stats for {key!r} (have {sorted(self.stats)})")
        return self.stats[key]

    def normalize(self, key: str, x: np.ndarray) -> np.ndarray:
        s, dim = self._of(key), x.shape[-1]
        if self.convention == "lerobot":
            return self._lerobot(s, np.asarray(x, dtype=np.float32), inverse=False)
        if self.mode == "zscore":
            return (x - s.mean[..., :dim]) / (s.std[..., :dim] + EPS)
        q01, q99 = s.q01[..., :dim], s.q99[..., :dim]  # type: ignore[index]
        return (x - q01) / (q99 - q01 + EPS) * 2.0 - 1.0

    def unnormalize(self, key: str, x: np.ndarray) -> np.ndarray:
        s, dim = self._of(key), x.shape[-1]
        if self.convention == "lerobot":
            x = np.asarray(x, dtype=np.float32)
            known = s.mean.shape[-1]
            if known < dim:  # the padding past the robot's size stays as it is, as LeRobot cuts it off
                return np.concatenate([self._lerobot(s, x[..., :known], inverse=True), x[..., known:]], axis=-1)
            return self._lerobot(s, x, inverse=True)
        if self.mode == "zscore":
            mean, std = _pad(s.mean, dim, 0.0), _pad(s.std, dim, 1.0)
            return x * (std + EPS) + mean
        q01, q99 = s.q01, s.q99
        assert q01 is not None and q99 is not None
        known = q01.shape[-1]
        if known < dim:
            head = (x[..., :known] + 1.0) / 2.0 * (q99 - q01 + EPS) + q01
            return np.concatenate([head, x[..., known:]], axis=-1)
        return (x + 1.0) / 2.0 * (q99 - q01 + EPS) + q01


    def _lerobot(self, s: NormStats, x: np.ndarray, inverse: bool) -> np.ndarray:
        """LeRobot's rules (module docstring) on float32 `x` no wider than the statistics."""
        dim = x.shape[-1]
        if self.mode == "zscore":
            mean, std = s.mean[..., :dim].astype(np.float32), s.std[..., :dim].astype(np.float32)
            return x * std + mean if inverse else (x - mean) / (std + LEROBOT_EPS)
        assert s.q01 is not None and s.q99 is not None
        q01, q99 = s.q01[..., :dim].astype(np.float32), s.q99[..., :dim].astype(np.float32)
        denom = q99 - q01
        denom = np.where(denom == 0, LEROBOT_EPS, denom)
        if inverse:
            return (x + np.float32(1.0)) * denom / np.float32(2.0) + q01
        return np.float32(2.0) * (x - q01) / denom - np.float32(1.0)


def _pad(values: np.ndarray, dim: int, fill: float) -> np.ndarray:
    """`values` extended to `dim` entries with `fill` (unchanged when already that long or longer)."""
    if values.shape[-1] >= dim:
        return values
    return np.pad(values, [(0, 0)] * (values.ndim - 1) + [(0, dim - values.shape[-1])], constant_values=fill)


def norm_stats_of(values: np.ndarray) -> NormStats:
    """A key's statistics from every step of a dataset, float [N, D]: mean, standard deviation, and the 1st / 99th
    percentiles (numpy's linear interpolation; openpi's `RunningStats` approximates them with histograms)."""
    v = np.asarray(values, dtype=np.float64)
    if v.ndim != 2 or not len(v):
        raise ValueError(f"norm stats need values [N, D] with N >= 1, got shape {v.shape}")
    return NormStats(mean=v.mean(0), std=v.std(0), q01=np.quantile(v, 0.01, axis=0),
                     q99=np.quantile(v, 0.99, axis=0))
