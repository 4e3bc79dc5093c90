"""Action bins <-> normalised actions <-> robot actions, exactly as OpenVLA(-OFT) defines them.

Discretisation (OpenVLA's `ActionTokenizer` and `predict_action`): `n_bins` edges `linspace(-1, 1, n_bins)` give
`n_bins - 1` bin centres. The action tokens are the last `n_bins` ids of the text vocabulary; token t decodes to
centre `clip(text_vocab - t - 1, 0, n_bins - 2)`. Here bins are indexed in vocabulary order, j = t - (text_vocab -
n_bins), so bin j decodes to centre `clip(n_bins - 1 - j, 0, n_bins - 2)`: larger j means a smaller action, and
j = 0 and j = 1 both decode to the largest centre. Indices outside [0, n_bins) are what the official decode does with
non-action tokens (they clip to the ends), so a full-vocabulary argmax can be decoded too.

Normalisation (BOUNDS_Q99 / BOUNDS): actions live in [-1, 1] between the dataset's q01/q99 (or min/max); the
dataset's `mask` leaves some dimensions (the gripper) as they are. Proprio states are mapped into [-1, 1] the same
way and clipped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

NORMALIZATIONS = {"bounds_q99": ("q01", "q99"), "bounds": ("min", "max")}
"""Normalisation type -> (low, high) statistic names."""


class ActionTokenizer:
    """Bin indices (vocabulary order) <-> normalised actions in [-1, 1]."""

    def __init__(self, n_bins: int):
        self.n_bins = n_bins
        self.edges = np.linspace(-1.0, 1.0, n_bins)
        self.centres = (self.edges[:-1] + self.edges[1:]) / 2.0
        self.values = self.to_actions(np.arange(n_bins))
        """The action each bin index decodes to, float64[n_bins]."""

    def to_bins(self, actions: np.ndarray) -> np.ndarray:
        """Normalised actions (clipped to [-1, 1]) -> bin indices int64 (the official tokenisation)."""
        digitized = np.digitize(np.clip(actions, -1.0, 1.0), self.edges)
        return (self.n_bins - digitized).astype(np.int64)

    def to_actions(self, bins: np.ndarray) -> np.ndarray:
        """Bin indices -> normalised actions float64 (bin centres)."""
        index = np.clip(self.n_bins - 1 - np.asarray(bins, dtype=np.int64), 0, self.n_bins - 2)
        return self.centres[index]


@dataclass(frozen=True)
class DatasetStats:
    """One dataset's normalisation: action bounds and mask, proprio bounds and mask."""

    action_low: np.ndarray
    action_high: np.ndarray
    action_mask: np.ndarray
    proprio_low: np.ndarray | None
    proprio_high: np.ndarray | None
    proprio_mask: np.ndarray | None

    @classmethod
    def from_json(cls, stats: dict[str, Any], normalization: str) -> DatasetStats:
        """From one entry of `norm_stats` / dataset_statistics.json."""
        if normalization not in NORMALIZATIONS:
            raise ValueError(f"unknown normalisation {normalization!r}; choose one of {sorted(NORMALIZATIONS)}")
        low, high = NORMALIZATIONS[normalization]
        action = stats["action"]
        proprio = stats.get("proprio")
        a_low, a_high = np.asarray(action[low], np.float64), np.asarray(action[high], np.float64)
        a_mask = np.asarray(action.get("mask", np.ones_like(a_low, dtype=bool)), dtype=bool)
        if proprio is None:
            return cls(a_low, a_high, a_mask, None, None, None)
        p_low, p_high = np.asarray(proprio[low], np.float64), np.asarray(proprio[high], np.float64)
        p_mask = np.asarray(proprio.get("mask", np.ones_like(p_low, dtype=bool)), dtype=bool)
        return cls(a_low, a_high, a_mask, p_low, p_high, p_mask)

    @property
    def action_dim(self) -> int:
        return int(self.action_low.shape[0])

    def normalize_actions(self, actions: np.ndarray) -> np.ndarray:
        """Robot actions -> [-1, 1] (clipped) where `mask`, other dimensions unchanged: the official training-side
        `normalize_action_and_proprio`, the inverse of `unnormalize_actions` inside the bounds."""
        scaled = 2 * (actions - self.action_low) / (self.action_high - self.action_low + 1e-8) - 1
        return np.where(self.action_mask, np.clip(scaled, -1.0, 1.0), actions)

    def unnormalize_actions(self, normalized: np.ndarray) -> np.ndarray:
        """[-1, 1] -> robot actions where `mask`; other dimensions unchanged (official `_unnormalize_actions`)."""
        scaled = 0.5 * (normalized + 1) * (self.action_high - self.action_low + 1e-8) + self.action_low
        return np.where(self.action_mask, scaled, normalized)

    def normalize_proprio(self, raw: np.ndarray) -> np.ndarray:
        """Raw proprio -> [-1, 1] (clipped), as the official `normalize_proprio` does."""
        if self.proprio_low is None:
            raise ValueError("these dataset statistics have no 'proprio' entry")
        scaled = 2 * (raw - self.proprio_low) / (self.proprio_high - self.proprio_low + 1e-8) - 1
        return np.clip(np.where(self.proprio_mask, scaled, raw), -1.0, 1.0)
