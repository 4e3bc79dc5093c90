"""Episode: one demonstration as arrays, per step t the observation before action t and action t itself."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np


@dataclass(frozen=True)
class Episode:
    """One demonstrated episode of T steps.

    images: camera name -> uint8 [T, H, W, 3]; state: float32 [T, P], the observation at step t (before action t);
    actions: float32 [T, A], the action taken at step t; success: whether the episode ended in success, None where
    that is not known; extras: dataset feature -> float32 [T, D], more per-step vectors a dataset keeps (written,
    not read back: e.g. Meta-World's full observation and reward). Construction checks every shape and dtype
    (`problems` says what is wrong).
    """

    instruction: str
    images: dict[str, np.ndarray]
    state: np.ndarray
    actions: np.ndarray
    success: bool | None = None
    extras: dict[str, np.ndarray] = field(default_factory=dict)

    def __post_init__(self) -> None:
        found = self.problems()
        if found:
            raise ValueError("invalid Episode: " + "; ".join(found))

    def __len__(self) -> int:
        return len(self.actions)

    def first(self, steps: int) -> Episode:
        """The episode's first `steps` env steps (all of it when it is shorter); `success` becomes unknown when
        steps are cut, since the cut record does not show how the episode ended."""
        if steps >= len(self):
            return self
        return replace(self, images={c: v[:steps] for c, v in self.images.items()}, state=self.state[:steps],
                       actions=self.actions[:steps], success=None,
                       extras={k: v[:steps] for k, v in self.extras.items()})

    def problems(self) -> list[str]:
        """Everything wrong with the record, one message each (empty when it is sound)."""
        found = []
        if not isinstance(self.instruction, str) or not self.instruction.strip():
            found.append(f"instruction must be a non-empty string, got {self.instruction!r}")
        if self.success is not None and not isinstance(self.success, bool | np.bool_):
            found.append(f"success must be a bool or None, got {type(self.success).__name__}")
        found += _vector_problems("actions", self.actions, "A")
        found += _vector_problems("state", self.state, "P")
        steps = len(self.actions) if isinstance(self.actions, np.ndarray) and self.actions.ndim == 2 else None
        if steps == 0:
            found.append("an episode needs at least one step, actions has 0")
        for camera, frames in self.images.items():
            found += _image_problems(camera, frames)
        for key, values in self.extras.items():
            found += _vector_problems(f"extras[{key!r}]", values, "D")
        lengths = {"actions": steps, "state": _length(self.state)}
        lengths |= {f"extras[{key!r}]": _length(values) for key, values in self.extras.items()}
        lengths |= {f"images[{camera!r}]": _length(frames) for camera, frames in self.images.items()}
        if len({n for n in lengths.values() if n is not None}) > 1:
            found.append("all arrays need the same number of steps T, got " +
                         ", ".join(f"{name}: {n}" for name, n in lengths.items()))
        return found


def _length(array: object) -> int | None:
    return len(array) if isinstance(array, np.ndarray) and array.ndim >= 1 else None


def _vector_problems(name: str, array: object, dim: str) -> list[str]:
    if not isinstance(array, np.ndarray):
        return [f"{name} must be a numpy array, got {type(array).__name__}"]
    if array.dtype != np.float32 or array.ndim != 2:
        return [f"{name} must be float32 [T, {dim}], got {array.dtype} {list(array.shape)}"]
    return []


def _image_problems(camera: str, frames: object) -> list[str]:
    if not isinstance(frames, np.ndarray):
        return [f"images[{camera!r}] must be a numpy array, got {type(frames).__name__}"]
    if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[-1] != 3:
        return [f"images[{camera!r}] must be uint8 [T, H, W, 3], got {frames.dtype} {list(frames.shape)}"]
    return []
