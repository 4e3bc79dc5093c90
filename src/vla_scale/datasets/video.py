"""Camera frames to .mp4 and back with PyAV: the codecs a dataset can be written with, an encoder that appends
episodes to one file, and the decoding of a whole file to uint8 RGB frames with their timestamps."""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path

import av
import numpy as np


@dataclass(frozen=True)
class VideoCodec:
    """How frames are encoded: the PyAV encoder, the pixel format it is fed, its options."""

    encoder: str
    pix_fmt: str
    options: dict[str, str] = field(default_factory=dict)


CODECS: dict[str, VideoCodec] = {
    # H.264 at quantiser 0 on full-resolution YUV (4:4:4, BT.601 limited range, PyAV's conversion): the YUV planes
    # are kept exactly, the RGB -> YUV -> RGB round trip is off by at most 2 levels (pix_fmt yuv444p, which
    # LeRobot's get_video_info() reads). One encoder thread because x264's output depends on its thread count: the
    # same episodes give the same bytes on any machine. Keyframes every 2 frames keep random access as cheap as
    # LeRobot's default.
    "h264_yuv444": VideoCodec("libx264", "yuv444p", {"qp": "0", "g": "2", "threads": "1"}),
    # H.264 on RGB planes at quantiser 0: every frame decodes to the exact pixels it was given. Its files' pix_fmt
    # is gbrp, which LeRobot 0.4.4's get_video_info() refuses ("Unknown format"), so LeRobot's tools that inspect
    # videos fail on them; its dataset loading reads them.
    "h264_rgb": VideoCodec("libx264rgb", "rgb24", {"qp": "0", "g": "2", "threads": "1"}),
    # LeRobot's default: SVT-AV1 on 4:2:0 YUV, crf 30, keyframe every 2 frames, preset 12 (lossy).
    "av1": VideoCodec("libsvtav1", "yuv420p", {"crf": "30", "g": "2", "preset": "12"}),
}
DEFAULT_CODEC = "h264_yuv444"
BIT_EXACT_CODEC = "h264_rgb"


def codec_named(name: str) -> VideoCodec:
    if name not in CODECS:
        raise ValueError(f"unknown video codec {name!r}; choose one of {sorted(CODECS)}")
    return CODECS[name]


class VideoFile:
    """One .mp4 being written: episodes' frames appended end to end, frame k of the file at k / fps seconds."""

    def __init__(self, path: Path, codec: VideoCodec, fps: int, height: int, width: int) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.frames = 0
        self.bytes = 0
        self._container = av.open(str(path), mode="w", format="mp4")
        self._stream = self._container.add_stream(codec.encoder, rate=fps, options=dict(codec.options))
        self._stream.width, self._stream.height, self._stream.pix_fmt = width, height, codec.pix_fmt
        self._time_base = Fraction(1, fps)
        self._pix_fmt = codec.pix_fmt

    def append(self, frames: np.ndarray) -> None:
        """Encodes uint8 [T, H, W, 3] RGB frames after those already written."""
        for rgb in frames:
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(rgb), format="rgb24")
            if self._pix_fmt != "rgb24":
                frame = frame.reformat(format=self._pix_fmt)
            frame.pts, frame.time_base = self.frames, self._time_base
            self._mux(self._stream.encode(frame))
            self.frames += 1

    def close(self) -> None:
        self._mux(self._stream.encode(None))
        self._container.close()

    def _mux(self, packets: list[av.Packet]) -> None:
        for packet in packets:
            self.bytes += packet.size
            self._container.mux(packet)


@dataclass(frozen=True)
class DecodedVideo:
    """Every frame of a file: uint8 [N, H, W, 3] RGB and each frame's presentation time in seconds."""

    frames: np.ndarray
    times: np.ndarray

    def at(self, times: np.ndarray, tolerance: float) -> np.ndarray:
        """The frames shown at `times` (s): for each, the decoded frame nearest to it, which must lie within
        `tolerance` of it (else ValueError naming the first time with no frame)."""
        if len(self.times) == 0:
            raise ValueError("the video has no frames")
        order = np.argsort(self.times, kind="stable")
        sorted_times = self.times[order]
        after = np.searchsorted(sorted_times, times)
        left, right = np.clip(after - 1, 0, len(order) - 1), np.clip(after, 0, len(order) - 1)
        nearest = np.where(np.abs(sorted_times[left] - times) <= np.abs(sorted_times[right] - times), left, right)
        missing = np.abs(sorted_times[nearest] - times) > tolerance
        if missing.any():
            t = float(times[np.argmax(missing)])
            raise ValueError(f"no frame within {tolerance:.4f} s of t={t:.4f} s "
                             f"(the video spans {sorted_times[0]:.4f}-{sorted_times[-1]:.4f} s)")
        return self.frames[order[nearest]]


def decode_video(path: Path) -> DecodedVideo:
    """All frames of the first video stream of `path` as RGB (any codec the installed FFmpeg decodes: AV1 through
    libdav1d, H.264, ...)."""
    frames, times = [], []
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        for frame in container.decode(stream):
            if frame.pts is None:
                continue
            frames.append(frame.to_ndarray(format="rgb24"))
            times.append(float(frame.pts * frame.time_base))
    if not frames:
        return DecodedVideo(np.zeros((0, 0, 0, 3), np.uint8), np.zeros(0))
    return DecodedVideo(np.stack(frames), np.asarray(times))


def video_info(path: Path) -> dict[str, object]:
    """The stream facts LeRobot keeps in a video feature's `info` block of meta/info.json, read from the file: the
    keys and their order of LeRobot's get_video_info() (0.4.4, and 0.3.3's for v2.1) for a colour video without
    audio."""
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        return {"video.height": stream.height, "video.width": stream.width,
                "video.codec": stream.codec_context.codec.canonical_name, "video.pix_fmt": stream.pix_fmt,
                "video.is_depth_map": False, "video.fps": int(stream.base_rate or stream.average_rate),
                "video.channels": 3, "has_audio": len(container.streams.audio) > 0}
