"""OpenVLA-OFT's LIBERO evaluation images (`resize_image_for_policy`, `center_crop_image`) without TensorFlow.

The official LIBERO evaluation resizes every 256x256 camera image to 224x224 with TensorFlow before the processor
sees it: `tf.image.encode_jpeg` (quality 95, 4:2:0 chroma subsampling), `tf.io.decode_image` back to uint8, then
`tf.image.resize(..., method="lanczos3", antialias=True)` in float32, rounded half to even and clipped to uint8.
The JPEG round trip is not a small effect: at 256x256 it alone moves pixels by ~1.6 levels on average (up to ~60).

How each step is reproduced here (numpy, Pillow and simplejpeg only: no torch, no TensorFlow, so it can run in a
process that renders with MuJoCo/EGL):

* JPEG encode: Pillow at quality 95 with 4:2:0 subsampling. Its bytes differ from TensorFlow's (headers), but they
  decode to the same pixels as TensorFlow's own bytes.
* JPEG decode: TensorFlow decodes with libjpeg-turbo's fast integer IDCT (JDCT_IFAST) and fancy (smooth) chroma
  upsampling; simplejpeg (which bundles libjpeg-turbo) with `fastdct=True, fastupsample=False` does the same.
  Pillow's decoder (accurate IDCT) would be off by about a level on average (the fixture's README measures it).
* Resize: a float32 re-implementation of TensorFlow's `ScaleAndTranslate` op with the Lanczos-3 kernel and
  antialiasing: per axis, scale = out/in (float32), the kernel is stretched by max(1/scale, 1) when downsampling,
  each output sample reads a fixed-width span of inputs (9 for 256->224) whose weights are normalised to sum to one,
  and the image is filtered along rows first (into a float32 [out_h, in_w, C] buffer) and then along columns, every
  output summed in span order in float32 (separate multiply and add, no fused multiply-add). The arithmetic follows
  the op's float32 order of operations, so results are bitwise equal, not just close. The kernel's sines come from
  the C library's `sinf`, as in TensorFlow's kernel: glibc's is not always correctly rounded, and correctly rounded
  sines (the fallback where no C library can be loaded) differ from it by 1 ulp in 8 of the 352 sine values of a
  256->224 resize.
* Rounding: half to even (`np.rint`), clipped to [0, 255].

Measured against the official outputs stored in `shared/fixtures/oft_libero_pipeline` (36 images: 6 LIBERO cases x
3 chunks x 2 cameras; chunk 0 compared value by value, all 36 by sha256 of their bytes), with glibc 2.36 on x86-64:

| variant | bit-exact images | chunk 0: mean abs diff | max | share of values that differ |
|---|---|---|---|---|
| `official_libero_resize` (this module) | 36/36 | 0 | 0 | 0 |
| same, correctly rounded sines instead of `sinf` | 26/36 | 3.3e-6 | 1 | 3.3e-6 (2 values in 3 of 12 images) |
| same, fused multiply-add in both passes | 12/36 | 7.2e-6 | 1 | 7.2e-6 |
| Pillow's decoder (accurate IDCT) | 0/36 | 1.114 | 15 | 0.658 |
| simplejpeg decode with fast upsampling | 0/36 | 0.183 | 32 | 0.123 |
| simplejpeg's encoder instead of Pillow's | 0/36 | 0.626 | 10 | 0.478 |
| no JPEG round trip | 0/36 | 1.471 | 42 | 0.723 |

`tests/models/test_official_images.py` checks the first two rows (and that the official centre crop of these outputs is
reproduced bit-exactly by `centre_crop` below). What each part costs per image: `benchmarks/official_images.py`
(docs/performance.md).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import io
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

JPEG_QUALITY = 95  # tf.image.encode_jpeg's default
LANCZOS_RADIUS = 3.0
_PI = np.float32(3.14159265359)  # the float32 constant TensorFlow's Lanczos kernel uses
_F32 = np.float32


def jpeg_round_trip(image: np.ndarray) -> np.ndarray:
    """uint8 [H, W, 3] -> uint8 [H, W, 3]: JPEG encode (quality 95, 4:2:0) and decode as TensorFlow does."""
    image = np.asarray(image)
    if image.dtype != np.uint8 or image.ndim != 3 or image.shape[-1] != 3:
        raise ValueError(f"expected a uint8 [H, W, 3] image, got {image.dtype} {image.shape}")
    import simplejpeg  # imported where used: policies without the JPEG round trip need neither
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(image), mode="RGB").save(buffer, format="JPEG", quality=JPEG_QUALITY,
                                                                  subsampling="4:2:0")
    return simplejpeg.decode_jpeg(buffer.getvalue(), colorspace="RGB", fastdct=True, fastupsample=False)


def _c_sinf():
    """The C library's float `sinf`, which TensorFlow's kernel calls (None when it cannot be loaded)."""
    try:
        name = ctypes.util.find_library("m")
        sinf = ctypes.CDLL(name).sinf if name else ctypes.CDLL(None).sinf
    except (OSError, AttributeError, TypeError):
        return None
    sinf.restype, sinf.argtypes = ctypes.c_float, [ctypes.c_float]
    return sinf


_SINF = _c_sinf()


def _sin_f32(x: np.ndarray) -> np.ndarray:
    """float32 sine, value for value what C's `sinf` returns (glibc's is not always correctly rounded: for 8 of the
    352 arguments of a 256->224 resize it is 1 ulp off, which flips ~3 in 10^6 output values by one level); without
    a C library to call, the correctly rounded sine."""
    if _SINF is None:
        return np.sin(x.astype(np.float64)).astype(_F32)
    values = np.unique(x)
    table = np.fromiter((_SINF(v) for v in values.tolist()), dtype=_F32, count=len(values))
    return table[np.searchsorted(values, x)]


def _lanczos(x: np.ndarray, radius: np.float32) -> np.ndarray:
    """TensorFlow's float32 Lanczos kernel at |x| (x float32)."""
    x = np.abs(x).astype(_F32)
    with np.errstate(divide="ignore", invalid="ignore"):
        a = _PI * x
        value = radius * _sin_f32(a) * _sin_f32(a / radius) / (_PI * _PI * x * x)
    value = np.where(x.astype(np.float64) <= 1e-3, _F32(1), value)  # compared in double, as in the C++ code
    return np.where(x > radius, _F32(0), value).astype(_F32)


@lru_cache(maxsize=64)
def lanczos3_spans(in_size: int, out_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Span starts int64[out_size] and normalised weights float32[out_size, span] of one axis.

    TensorFlow's `ComputeSpansCore` for scale = out/in, no translation, antialias on. Weights past a span's real end
    (and past the image border) are zero, so every output can read the same number of inputs.
    """
    radius = _F32(LANCZOS_RADIUS)
    scale = _F32(out_size) / _F32(in_size)
    inv_scale = _F32(1.0 / float(scale))  # 1.0 / scale is evaluated in double, then stored as float
    kernel_scale = max(inv_scale, _F32(1))
    support = radius * kernel_scale
    span = min(2 * int(np.ceil(support)) + 1, in_size)
    one_over_kernel_scale = _F32(1) / kernel_scale
    sample = (np.arange(out_size, dtype=_F32) + _F32(0.5)) * inv_scale
    inside = (sample >= 0) & (sample <= _F32(in_size))
    first = np.clip(np.ceil(sample - support - _F32(0.5)).astype(np.int64), 0, in_size - 1)
    end = np.clip(np.floor(sample + support - _F32(0.5)).astype(np.int64), 0, in_size - 1) + 1
    if int((end - first).max()) > span:
        raise RuntimeError(f"span of {int((end - first).max())} inputs exceeds its bound {span}")
    source = first[:, None] + np.arange(span)[None, :]
    valid = (source < end[:, None]) & inside[:, None]
    position = (source.astype(_F32) + _F32(0.5)) - sample[:, None]
    weights = np.where(valid, _lanczos(position * one_over_kernel_scale, radius), _F32(0))
    total = np.zeros(out_size, dtype=_F32)
    for k in range(span):  # summed in span order, in float32
        total += weights[:, k]
    usable = np.abs(total) >= _F32(1000) * np.finfo(_F32).tiny
    with np.errstate(divide="ignore"):
        inv_total = _F32(1) / total
    weights = np.where(usable[:, None], weights * inv_total[:, None], _F32(0)).astype(_F32)
    starts = np.where(inside, first, 0)
    weights.setflags(write=False)
    starts.setflags(write=False)
    return starts, weights


def _gather(image: np.ndarray, axis: int, starts: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Filter float32 `image` along `axis`: out[i] = sum_k weights[i, k] * image[starts[i] + k], summed in k order."""
    size = image.shape[axis]
    shape = [1] * image.ndim
    shape[axis] = len(starts)
    out_shape = list(image.shape)
    out_shape[axis] = len(starts)
    out = np.zeros(out_shape, dtype=_F32)
    term = np.empty(out_shape, dtype=_F32)
    for k in range(weights.shape[1]):
        index = np.minimum(starts + k, size - 1)  # past the border the weight is 0
        np.take(image, index, axis=axis, out=term)
        term *= weights[:, k].reshape(shape)
        out += term
    return out


def lanczos3_resize_float(image: np.ndarray, size: int | tuple[int, int]) -> np.ndarray:
    """[..., H, W, C] (any real dtype) -> float32 [..., size, size, C], before rounding: `tf.image.resize(image,
    size, method="lanczos3", antialias=True)`."""
    image = np.asarray(image)
    if image.ndim < 3:
        raise ValueError(f"expected [..., H, W, C], got shape {image.shape}")
    out_h, out_w = (size, size) if isinstance(size, int) else size
    in_h, in_w = image.shape[-3:-1]
    x = image.astype(_F32)
    rows = _gather(x, x.ndim - 3, *lanczos3_spans(in_h, out_h))
    return _gather(rows, x.ndim - 2, *lanczos3_spans(in_w, out_w))


def lanczos3_resize(image: np.ndarray, size: int | tuple[int, int]) -> np.ndarray:
    """uint8 [..., H, W, C] -> uint8 [..., size, size, C]: TensorFlow's antialiased Lanczos-3 resize, rounded half
    to even and clipped as `tf.cast(tf.clip_by_value(tf.round(x), 0, 255), tf.uint8)`."""
    return np.clip(np.rint(lanczos3_resize_float(image, size)), 0, 255).astype(np.uint8)


def official_libero_resize(image: np.ndarray, size: int = 224) -> np.ndarray:
    """OpenVLA-OFT's `resize_image_for_policy`: uint8 [H, W, 3] (or a batch [..., H, W, 3]) -> uint8 [..., size,
    size, 3], JPEG round trip then the Lanczos-3 resize."""
    image = np.asarray(image)
    if image.ndim < 3:
        raise ValueError(f"expected [..., H, W, 3], got shape {image.shape}")
    flat = image.reshape(-1, *image.shape[-3:])
    decoded = np.stack([jpeg_round_trip(one) for one in flat]) if len(flat) else flat
    out = lanczos3_resize(decoded, size)
    return out.reshape(*image.shape[:-3], *out.shape[1:])


def centre_crop(images: np.ndarray, area: float = 0.9) -> np.ndarray:
    """OFT's `center_crop_image`: TensorFlow's `crop_and_resize` of the centre box covering `area` of each image,
    bilinear back to the same size, on x / 255 in float32, then `convert_image_dtype` back (x * 255.5, truncated).

    uint8 [..., H, W, C] -> uint8, same shape. Every value follows TensorFlow's float32 formula (top = tl + (tr - tl)
    * dx, bottom likewise, out = top + (bottom - top) * dy), blending along columns for every row first and then
    gathering the two rows each output reads, so the result is bit-exact (`tests/models/test_official_images.py`).
    """
    h, w = images.shape[-3], images.shape[-2]
    side = np.clip(np.sqrt(_F32(area)), 0, 1)
    lo = (_F32(1) - side) / _F32(2)
    (y0, y1, dy), (x0, x1, dx) = _crop_axis(lo, side, h), _crop_axis(lo, side, w)
    unit = images.astype(np.float32)
    unit *= _F32(1 / 255.0)
    cols = np.take(unit, np.concatenate([x0, x1]), axis=-2)
    blended, right = cols[..., :w, :], cols[..., w:, :]  # blended: left + (right - left) * dx, in place
    right -= blended
    right *= dx[:, None]
    blended += right
    rows = np.take(blended, np.concatenate([y0, y1]), axis=-3)
    out, bottom = rows[..., :h, :, :], rows[..., h:, :, :]  # out: top + (bottom - top) * dy, in place
    bottom -= out
    bottom *= dy[:, None, None]
    out += bottom
    np.clip(out, 0, 1, out=out)
    out *= _F32(255.5)
    np.clip(out, 0, 255, out=out)
    return out.astype(np.uint8)


def _crop_axis(lo: np.float32, side: np.float32, size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """crop_and_resize's sample points along one axis, start*(size-1) + i*(end-start)*(size-1)/(size-1), as the
    two neighbours and the float32 fraction between them."""
    start, end = lo, lo + side
    scale = (end - start) * _F32(size - 1) / _F32(size - 1)
    points = _F32(start * _F32(size - 1)) + np.arange(size, dtype=np.float32) * _F32(scale)
    low = np.floor(points).astype(np.int64)
    high = np.minimum(np.ceil(points).astype(np.int64), size - 1)
    return low, high, (points - low).astype(np.float32)


@dataclass(frozen=True)
class ImagePrep:
    """Camera frames -> the images a policy's towers see, in numpy: the official resize (when a frame is not `size`
    already) and the centre crop. Simulator processes apply it to `cameras` before the images leave them
    (`envs/prepared_images.py: PreparedImages`), so the trainer's decode loop only normalises."""

    size: int
    center_crop: bool = False
    crop_area: float = 0.9
    cameras: tuple[str, ...] = ()

    def __call__(self, image: np.ndarray) -> np.ndarray:
        """uint8 [..., H, W, 3] -> uint8 [..., size, size, 3]."""
        if image.shape[-3:-1] != (self.size, self.size):
            image = official_libero_resize(image, self.size)
        return centre_crop(image, self.crop_area) if self.center_crop else np.ascontiguousarray(image)
