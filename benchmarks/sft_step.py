"""Supervised fine-tuning steps at a model's shape on one device, built as launch/sft.py builds them.

    python benchmarks/sft_step.py --model oft_7b --lora-rank 32 --batch 8     # one H200
    python benchmarks/sft_step.py --model tiny --dry-run                     # CPU: the whole script in seconds

A LeRobot dataset of `--episodes` random-pixel episodes (both pick_place cameras at the model's image size, so no
resize; 4-D proprio, 7-D actions) is written to a temporary folder; `SupervisedTrainer` (the ZeRO-3 actor under the
`zero3_bf16` settings on a GPU, LoRA of `--lora-rank` on every linear layer but the LM head, or full-parameter with
0) reads it, and `--steps` optimizer steps of `--batch` examples in `--micro-batches` run after one warm-up step.
Per step it prints seconds, examples per second and the peak of allocated device memory. Last line:
`sft_step: model=<name> lora_rank=<r> batch=<b> step_s=<mean> peak_gib=<max>`.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from vla_scale.config import Config, register_configs, to_config, validate  # noqa: E402


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="oft_7b", help="a configs/model preset")
    p.add_argument("--lora-rank", type=int, default=32, help="LoRA rank (0: full-parameter)")
    p.add_argument("--batch", type=int, default=8, help="examples per optimizer step")
    p.add_argument("--micro-batches", type=int, default=1, help="gradient accumulation steps per optimizer step")
    p.add_argument("--steps", type=int, default=3, help="timed optimizer steps (after one warm-up step)")
    p.add_argument("--episodes", type=int, default=4, help="episodes of the synthetic dataset (40 steps each)")
    p.add_argument("--dry-run", action="store_true", help="the tiny model shrunk further, one timed step")
    return p.parse_args()


def synthetic_dataset(folder: Path, episodes: int, size: int) -> Path:
    """Random-pixel pick_place episodes as a LeRobot dataset (PNG frames): the step's work does not depend on
    what the pixels show."""
    from vla_scale.datasets.episodes import Episode
    from vla_scale.datasets.lerobot import LeRobotKeys, write_dataset
    from vla_scale.envs.pick_place import CAMERAS
    from vla_scale.envs.pick_place import instructions as pick_place_instructions

    rng = np.random.default_rng(0)
    instructions = pick_place_instructions()
    made = [Episode(instructions[i % len(instructions)],
                    {c: rng.integers(0, 256, (40, size, size, 3), dtype=np.uint8) for c in CAMERAS},
                    rng.uniform(-0.3, 0.3, (40, 4)).astype(np.float32), rng.uniform(-1, 1, (40, 7)).astype(np.float32))
            for i in range(episodes)]
    keys = LeRobotKeys({c: f"observation.images.{c}" for c in CAMERAS})
    return write_dataset(folder / "demos", made, keys, video=False)


def sft_config(args: argparse.Namespace, dataset: Path, run_dir: Path) -> Config:
    from hydra import compose, initialize_config_dir

    gpu = torch.cuda.is_available()
    overrides = [f"model={args.model}", "model.proprio_dim=4", "model.num_images=2",
                 f"model.lora.rank={args.lora_rank}", "env=pick_place", f"sft.dataset={dataset}",
                 f"sft.batch_size={args.batch}",
                 f"sft.micro_batches={args.micro_batches}", f"sft.steps={args.steps + 1}", "progress=false",
                 f"deepspeed={'zero3_bf16' if gpu else 'zero3'}", f"run_dir={run_dir}"]
    register_configs()
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        cfg = to_config(compose(config_name="config", overrides=overrides))
    if args.dry_run:
        cfg = replace(cfg, model=replace(cfg.model, hidden_size=32, intermediate_size=64, num_layers=1, vision_dim=32,
                                         num_heads=2))
    cfg = replace(cfg, env=replace(cfg.env, camera_resolution=cfg.model.image_size))  # rendered at the towers' size
    return validate(cfg)


def main() -> None:
    args = parse()
    if args.dry_run:
        args.steps = 1
    from vla_scale.sft.trainer import SupervisedTrainer

    with tempfile.TemporaryDirectory() as tmp:
        probe = sft_config(args, Path(tmp) / "none", Path(tmp) / "run")
        dataset = synthetic_dataset(Path(tmp), args.episodes, probe.model.image_size)
        trainer = SupervisedTrainer(sft_config(args, dataset, Path(tmp) / "run"), str(Path(tmp) / "run"))
        built = time.perf_counter()
        trainer.setup()
        device = trainer.actor.device
        print(f"sft_step: {trainer.vla.describe(trainer.cfg.env)}; set up in {time.perf_counter() - built:.1f}s",
              flush=True)
        rows = []
        for step in range(args.steps + 1):  # step 0 warms up (kernels, allocator)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
                torch.cuda.reset_peak_memory_stats(device)
            start = time.perf_counter()
            stats = trainer.actor.supervised_update(trainer.micro_batches())
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            seconds = time.perf_counter() - start
            peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else float("nan")
            rows.append((step, seconds, args.batch / seconds, peak, stats["loss"]))
        trainer.close()
    print("| step | seconds | examples/s | peak GiB | loss |\n|---|---|---|---|---|")
    for step, seconds, rate, peak, loss in rows:
        print(f"| {step}{' (warm-up)' if step == 0 else ''} | {seconds:.3f} | {rate:.1f} | {peak:.1f} | {loss:.4f} |")
    timed = rows[1:]
    print(f"sft_step: model={args.model} lora_rank={args.lora_rank} batch={args.batch} "
          f"step_s={np.mean([r[1] for r in timed]):.3f} peak_gib={max(r[3] for r in timed):.1f}", flush=True)


if __name__ == "__main__":
    main()
