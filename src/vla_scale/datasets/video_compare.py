"""Each codec of video.CODECS on a dataset's camera frames: every camera's episodes encoded end to end into one
.mp4 as a dataset writes them, decoded back as a dataset is read, and compared with the frames given.

    python -m vla_scale.datasets.video_compare DATASET [--episodes N]

DATASET is read as it is (a dataset with PNG frames, `record.video=false`, or bit-exact videos gives the frames the
simulator rendered). One line per codec and camera: the files' pix_fmt, whether LeRobot's get_video_info() reads it,
the file's bytes (and the same frames as PNG, for scale), the largest difference per RGB channel, the mean
difference and the share of values that differ.
"""

from __future__ import annotations

import argparse
import io
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from vla_scale.datasets.lerobot import LeRobotKeys, read_dataset
from vla_scale.datasets.lerobot_format import load_info
from vla_scale.datasets.video import CODECS, VideoFile, decode_video, video_info


def lerobot_channels(pix_fmt: str) -> int | None:
    """The channel count LeRobot 0.4.4 gives a pix_fmt (lerobot/datasets/video_utils.py,
    get_video_pixel_channels, which get_video_info() calls), None where it raises "Unknown format"."""
    if "gray" in pix_fmt or "depth" in pix_fmt or "monochrome" in pix_fmt:
        return 1
    if "rgba" in pix_fmt or "yuva" in pix_fmt:
        return 4
    if "rgb" in pix_fmt or "yuv" in pix_fmt:
        return 3
    return None


@dataclass(frozen=True)
class Comparison:
    codec: str
    camera: str
    frames: int
    pix_fmt: str
    lerobot_reads: bool
    bytes: int
    png_bytes: int
    max_error: tuple[int, int, int]
    """The largest |decoded - given| of each RGB channel."""
    mean_error: float
    differing: float
    """The share of RGB values that differ."""

    @property
    def exact(self) -> bool:
        return max(self.max_error) == 0

    def line(self) -> str:
        return (f"{self.codec:12s} {self.camera:10s} frames={self.frames} pix_fmt={self.pix_fmt} "
                f"lerobot_reads={'yes' if self.lerobot_reads else 'no'} bytes={self.bytes} png_bytes={self.png_bytes} "
                f"max_error_rgb={list(self.max_error)} mean_error={self.mean_error:.3f} "
                f"differing={self.differing:.3f} bit_exact={'yes' if self.exact else 'no'}")


def png_size(frames: np.ndarray) -> int:
    total = 0
    for frame in frames:
        buffer = io.BytesIO()
        Image.fromarray(frame).save(buffer, format="png")
        total += buffer.tell()
    return total


def compare(frames: np.ndarray, camera: str, folder: Path, fps: int = 10) -> list[Comparison]:
    """Every codec on uint8 [T, H, W, 3] frames."""
    found, png = [], png_size(frames)
    for name, codec in CODECS.items():
        path = folder / f"{name}_{camera}.mp4"
        video = VideoFile(path, codec, fps, *frames.shape[1:3])
        video.append(frames)
        video.close()
        decoded = decode_video(path).frames
        if decoded.shape != frames.shape:
            raise ValueError(f"{name}: {decoded.shape[0]} frames decoded of {frames.shape[0]} written")
        error = np.abs(decoded.astype(np.int16) - frames.astype(np.int16))
        pix_fmt = str(video_info(path)["video.pix_fmt"])
        found.append(Comparison(name, camera, len(frames), pix_fmt, lerobot_channels(pix_fmt) == 3,
                                path.stat().st_size, png, tuple(int(e) for e in error.reshape(-1, 3).max(0)),
                                float(error.mean()), float((error > 0).mean())))
    return found


def main(argv: list[str] | None = None) -> list[Comparison]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dataset", type=Path)
    parser.add_argument("--episodes", type=int, default=0, help="the first N episodes (0: all)")
    args = parser.parse_args(argv)
    info = load_info(args.dataset)
    features = info["features"]
    cameras = {key.split(".")[-1]: key for key, f in features.items() if f["dtype"] in ("image", "video")}
    episodes = read_dataset(args.dataset, LeRobotKeys(cameras))
    episodes = episodes[:args.episodes] if args.episodes else episodes
    found = []
    with tempfile.TemporaryDirectory() as folder:
        for camera in cameras:
            frames = np.concatenate([e.images[camera] for e in episodes])
            for row in compare(frames, camera, Path(folder), int(info["fps"])):
                print(row.line(), flush=True)
                found.append(row)
    return found


if __name__ == "__main__":
    main()
