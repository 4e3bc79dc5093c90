"""OpenVLA-OFT 7B shape (random weights) on one GPU in bf16: batched chunk decode and one training step.

Prints, per batch size, the decode time of a whole action chunk (one forward pass, sampling, log-probs) and one
forward/backward of the GRPO token loss, with the peak GPU memory of each.

    python benchmarks/oft7b_step.py [--batches 8 32] [--train-batch 8]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch
from omegaconf import OmegaConf

from vla_scale.algo import clipped_policy_loss, logprobs_from_logits
from vla_scale.config import ModelConfig
from vla_scale.models import PretrainedVLA
from vla_scale.rollout.engine import RolloutEngine

TEXTS = ["pick up the black bowl and place it on the plate", "open the top drawer", "put the cream cheese in the bowl"]


def model_config(name: str) -> ModelConfig:
    yaml = OmegaConf.load(Path(__file__).resolve().parents[1] / "configs" / "model" / f"{name}.yaml")
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ModelConfig), yaml))


def inputs(cfg: ModelConfig, vla: PretrainedVLA, batch: int, device: str):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (batch, cfg.image_size, cfg.image_size, 3), dtype=np.uint8)
    proprio = rng.uniform(-1, 1, (batch, cfg.proprio_dim)).astype(np.float32)
    return vla.processor.from_arrays(images, [TEXTS[i % 3] for i in range(batch)], proprio).to(device)


def timed(fn, repeats: int = 3) -> float:
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return min(times[1:] if repeats > 1 else times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batches", type=int, nargs="+", default=[8, 32, 64])
    p.add_argument("--train-batch", type=int, default=8)
    args = p.parse_args()
    cfg = model_config("oft_7b")
    vla = PretrainedVLA.from_config(cfg, TEXTS)
    torch.manual_seed(0)
    start = time.perf_counter()
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        policy = vla.new_policy()
    torch.set_default_dtype(torch.float32)
    torch.cuda.synchronize()
    params = sum(p.numel() for p in policy.parameters())
    print(f"oft_7b: {params / 1e9:.3f}B parameters, built on the GPU in {time.perf_counter() - start:.1f}s "
          f"({torch.cuda.get_device_name()}, torch {torch.__version__})")
    trainable_names = {n for n, p in policy.named_parameters() if p.requires_grad}
    engine = RolloutEngine(policy, "cuda")  # shares the weights (eval mode, grads off) for this measurement
    print(f"{'what':<18} {'B':>4} {'seconds':>9} {'chunks/s':>9} {'peak GiB':>9}")
    for batch in args.batches:
        x = inputs(cfg, vla, batch, "cuda")
        torch.cuda.reset_peak_memory_stats()
        with torch.no_grad():
            seconds = timed(lambda x=x: engine.decode(x, temperature=1.6))
        peak = torch.cuda.max_memory_allocated() / 2**30
        print(f"{'decode (sdpa)':<18} {batch:>4} {seconds:>9.3f} {batch / seconds:>9.1f} {peak:>9.1f}")
    x = inputs(cfg, vla, args.train_batch, "cuda")
    with torch.no_grad():
        decoded = engine.decode(x, temperature=1.6)
    tokens = torch.from_numpy(decoded.tokens).cuda()
    old = torch.from_numpy(decoded.logprobs).cuda()
    advantages = torch.linspace(-1, 1, args.train_batch, device="cuda")
    policy.train()
    trainable = [p.requires_grad_(True) for n, p in policy.named_parameters() if n in trainable_names]

    def step() -> None:
        logp = logprobs_from_logits(policy(x), tokens, 1.6)
        loss, _ = clipped_policy_loss(logp, old, advantages, torch.ones_like(logp, dtype=torch.bool))
        loss.backward()
        for param in trainable:
            param.grad = None

    torch.cuda.reset_peak_memory_stats()
    seconds = timed(step)
    peak = torch.cuda.max_memory_allocated() / 2**30
    print(f"{'forward+backward':<18} {args.train_batch:>4} {seconds:>9.3f} {args.train_batch / seconds:>9.1f} "
          f"{peak:>9.1f}")


if __name__ == "__main__":
    main()
