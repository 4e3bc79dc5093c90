"""TensorBoard logging (rank 0 only), episode videos and progress bars."""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
from torch.utils.tensorboard import SummaryWriter
from tqdm import tqdm


class RunLogError(OSError):
    """TensorBoard's events could not be written (a full disk, a file-size limit); the message says where."""


def _quiet_writer_thread_errors(args: threading.ExceptHookArgs) -> None:
    """TensorBoard's writer thread re-raises a failed write after keeping it for the next write or flush, which
    `RunLogger` reports as a `RunLogError`; its traceback on stderr would only repeat that."""
    if isinstance(args.exc_value, OSError) and type(args.thread).__name__ == "_AsyncWriterThread":
        return
    _default_excepthook(args)


_default_excepthook = threading.excepthook
threading.excepthook = _quiet_writer_thread_errors


class RunLogger:
    """Writes scalars and text to `<run_dir>/tb` on rank 0; a no-op on other ranks. Each step's scalars are flushed
    to the file as they are logged, so a write that fails (`RunLogError`) is reported at the step it happened in."""

    def __init__(self, run_dir: str, rank: int = 0):
        self.enabled = rank == 0
        self.tb_dir = os.path.join(run_dir, "tb")
        self.writer = SummaryWriter(self.tb_dir) if self.enabled else None

    @contextlib.contextmanager
    def _writing(self) -> Iterator[None]:
        """The event writer's OSError (raised by its thread at the next write or flush) as a `RunLogError`."""
        try:
            yield
        except OSError as err:
            free = shutil.disk_usage(os.path.dirname(self.tb_dir) or ".").free
            raise RunLogError(f"TensorBoard cannot write its events in {self.tb_dir} ({err}); {free} bytes are free "
                              "there. The run's checkpoints are untouched: free space (or raise the file-size limit, "
                              "`ulimit -f`), then continue with resume=true") from err

    def scalars(self, values: dict[str, float], step: int) -> None:
        if self.writer is not None:
            with self._writing():
                for key, value in values.items():
                    self.writer.add_scalar(key, value, step)
                self.writer.flush()

    def text(self, tag: str, text: str, step: int = 0) -> None:
        if self.writer is not None:
            with self._writing():
                self.writer.add_text(tag, text, step)

    def video(self, tag: str, frames: np.ndarray, step: int, fps: int = 5) -> None:
        """uint8[T, H, W, 3] frames as an animated GIF under TensorBoard's Images tab (what `add_video` writes,
        without its moviepy dependency)."""
        if self.writer is None:
            return
        from tensorboard.compat.proto.summary_pb2 import Summary

        _, height, width, _ = frames.shape
        image = Summary.Image(height=height, width=width, colorspace=3, encoded_image_string=gif_bytes(frames, fps))
        self.writer._get_file_writer().add_summary(Summary(value=[Summary.Value(tag=tag, image=image)]), step)

    def episode_videos(self, episodes: Sequence[Any], per_task: int, step: int, folder: str, fps: int = 5
                       ) -> list[str]:
        """The first `per_task` episodes of every task as MP4 files in `folder` and GIFs in TensorBoard.

        An episode is anything with `.task` (a TaskSpec), `.images` (the frames the policy saw, one per chunk;
        [cameras, H, W, 3] frames show the first camera) and `.success`, e.g. a rollout Trajectory. Returns the
        written paths (none on ranks other than 0).
        """
        if self.writer is None or per_task < 1:
            return []
        counts: dict[int, int] = {}
        paths = []
        for episode in episodes:
            task = episode.task.task_id
            k = counts.get(task, 0)
            if k >= per_task or not len(episode.images):
                continue
            counts[task] = k + 1
            frames = np.stack(episode.images)
            if frames.ndim == 5:  # several cameras per step: the primary one
                frames = frames[:, 0]
            name = f"task_{task}_init_{episode.task.init_state_id}_{'success' if episode.success else 'failure'}"
            paths.append(write_video(os.path.join(folder, name), frames, fps))
            self.video(f"video/task_{task}/{k}", frames, step, fps)
        return paths

    def close(self) -> None:
        if self.writer is not None:
            with self._writing():
                self.writer.flush()
                self.writer.close()


def gif_bytes(frames: np.ndarray, fps: int = 5) -> bytes:
    """uint8[T, H, W, 3] frames encoded as a looping GIF."""
    from PIL import Image

    images = [Image.fromarray(np.asarray(frame, dtype=np.uint8)) for frame in frames]
    buffer = io.BytesIO()
    images[0].save(buffer, format="GIF", save_all=True, append_images=images[1:], duration=int(1000 / fps), loop=0)
    return buffer.getvalue()


def write_video(stem: str, frames: np.ndarray, fps: int = 5) -> str:
    """Write `<stem>.mp4` (H.264 through imageio-ffmpeg), or `<stem>.gif` where ffmpeg is not installed."""
    os.makedirs(os.path.dirname(stem) or ".", exist_ok=True)
    try:
        import imageio.v2 as imageio
        import imageio_ffmpeg  # noqa: F401 - the ffmpeg binary imageio's mp4 writer needs
    except ImportError:
        with open(stem + ".gif", "wb") as f:
            f.write(gif_bytes(frames, fps))
        return stem + ".gif"
    imageio.mimwrite(stem + ".mp4", list(frames), fps=fps, codec="libx264", macro_block_size=1)
    return stem + ".mp4"


def progress(total: int, initial: int, enabled: bool, desc: str, unit: str = "it", leave: bool = True) -> tqdm:
    """A progress bar (silent when disabled, as it is on ranks other than 0): over training steps, or the episodes
    of one rollout or evaluation (`unit="episode"`, `leave=False`: it goes away when they are done, below the bar
    of the steps)."""
    return tqdm(total=total, initial=initial, disable=not enabled, desc=desc, unit=unit, leave=leave,
                dynamic_ncols=True)
