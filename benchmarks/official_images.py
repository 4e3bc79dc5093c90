"""What the official OpenVLA-OFT image path costs per camera image: `python benchmarks/official_images.py`.

Times, on one core, each step that turns a rendered 256 px LIBERO frame into the 224 px image the towers see
(`vla_scale.envs.official_images`): the JPEG round trip, the Lanczos-3 resize, the centre crop, all three as
`ImagePrep` does them in a simulator process (one image per call, as there), and the per-tower normalisation the
trainer still does (one batch per call): on the host, and with a GPU also where the policy runs (the uint8 images
copied there and looked up in the same table, checked bit for bit against the host's). Images are random (JPEG cost
depends a little on content); the median of `--repeats` rounds of `--batch` images is kept.
Prints a table, then `official_images: prep_ms=<x> normalize_ms=<y>` (per image; `normalize_gpu_ms=<z>` with a GPU).
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402

from vla_scale.envs.official_images import ImagePrep, centre_crop, jpeg_round_trip, lanczos3_resize  # noqa: E402


def per_image_ms(fn, images: np.ndarray, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn(images)
        times.append(time.perf_counter() - start)
    return float(np.median(times)) / len(images) * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=16, help="images per timed call")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--side", type=int, default=256, help="rendered side in pixels")
    p.add_argument("--size", type=int, default=224, help="the towers' input side")
    args = p.parse_args()
    import torch

    torch.set_num_threads(1)
    from vla_scale.models.oft.processor import ImageTransform

    rng = np.random.default_rng(0)
    frames = rng.integers(0, 256, (args.batch, args.side, args.side, 3), dtype=np.uint8)
    resized = lanczos3_resize(frames, args.size)
    prep = ImagePrep(args.size, center_crop=True)
    transform = ImageTransform(args.size, ((0.485, 0.456, 0.406), (0.5, 0.5, 0.5)),
                               ((0.229, 0.224, 0.225), (0.5, 0.5, 0.5)))
    rows = [
        ("JPEG round trip (Pillow q95 4:2:0, libjpeg-turbo fast IDCT)", per_image_ms(
            lambda x: [jpeg_round_trip(im) for im in x], frames, args.repeats)),
        (f"Lanczos-3 antialias {args.side} -> {args.size}", per_image_ms(
            lambda x: [lanczos3_resize(im, args.size) for im in x], frames, args.repeats)),
        ("centre crop (0.9 of the area)", per_image_ms(lambda x: [centre_crop(im) for im in x], resized,
                                                       args.repeats)),
        ("ImagePrep: all three (in a simulator process)", per_image_ms(lambda x: [prep(im) for im in x], frames,
                                                                       args.repeats)),
        ("normalisation for two towers (trainer)", per_image_ms(
            lambda x: transform.normalize(x[:, None]), resized, args.repeats)),
    ]
    last = f"official_images: prep_ms={rows[3][1]:.2f} normalize_ms={rows[4][1]:.2f}"
    if torch.cuda.is_available():
        batch = resized[:, None]
        same = torch.equal(transform.normalize(batch, "cuda").cpu(), transform.normalize(batch))

        def on_gpu(x: np.ndarray) -> None:
            transform.normalize(x, "cuda")
            torch.cuda.synchronize()

        on_gpu(batch)
        rows.append((f"the same on the GPU (uint8 copied there; bitwise equal: {same})",
                     per_image_ms(on_gpu, batch, args.repeats)))
        last += f" normalize_gpu_ms={rows[5][1]:.3f}"
    width = max(len(name) for name, _ in rows)
    print(f"{'step':<{width}}  ms per image")
    for name, ms in rows:
        print(f"{name:<{width}}  {ms:11.2f}")
    print(last)


if __name__ == "__main__":
    main()
