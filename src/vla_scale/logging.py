"""TensorBoard logging (rank 0 only) and progress bars."""

from __future__ import annotations

import os

from torch.utils.tensorboard import SummaryWriter
from tqdm import tqdm


class RunLogger:
    """Writes scalars and text to `<run_dir>/tb` on rank 0; a no-op on other ranks."""

    def __init__(self, run_dir: str, rank: int = 0):
        self.enabled = rank == 0
        self.tb_dir = os.path.join(run_dir, "tb")
        self.writer = SummaryWriter(self.tb_dir) if self.enabled else None

    def scalars(self, values: dict[str, float], step: int) -> None:
        if self.writer is not None:
            for key, value in values.items():
                self.writer.add_scalar(key, value, step)

    def text(self, tag: str, text: str, step: int = 0) -> None:
        if self.writer is not None:
            self.writer.add_text(tag, text, step)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.flush()
            self.writer.close()


def progress(total: int, initial: int, enabled: bool, desc: str) -> tqdm:
    """A progress bar over training steps (silent when disabled or not on rank 0)."""
    return tqdm(total=total, initial=initial, disable=not enabled, desc=desc, dynamic_ncols=True)


def read_scalars(tb_dir: str) -> dict[str, list[tuple[int, float]]]:
    """Every scalar series in a TensorBoard directory, as {tag: [(step, value), ...]} sorted by step."""
    from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator

    acc = EventAccumulator(tb_dir, size_guidance={SCALARS: 0})
    acc.Reload()
    return {tag: sorted((e.step, e.value) for e in acc.Scalars(tag)) for tag in acc.Tags()["scalars"]}
