"""The rollout engine's log-probs against the actor's at a model's shape: `python benchmarks/logprob_mismatch.py`.

What the first PPO ratio of an RL step sees under each `algo.old_logprobs`. One random-weight policy (`--model`,
default oft_7b) in bf16 as the actor holds it under `deepspeed=zero3_bf16` (DeepSpeed gathers the weights but runs the
module's own forward), a rollout engine holding the same weights (its default CUDA path: FastForward, compiled) and
the same weights upcast to fp32 as the reference. The engine samples one chunk per example at the sampling
temperature from random images, proprio and prompts; then the log-probs of those tokens are computed by the engine,
by the actor without gradient (what `recompute` takes as old log-probs), by the actor in training mode with autograd
(what the update's first forward computes) and by the fp32 reference. Prints, per pair, the mean and max |delta
log-prob|, the k3 estimate of the KL and the share of ratios outside [1 - clip_low, 1 + clip_high]; then how the
truncated importance weights min(actor / rollout, cap) come out. On CPU it runs the same steps (a dry run).

With `--fp8`, an FP8 engine (`precision="fp8"`, the same weights) samples its own chunk from the same inputs; its
log-probs are set against the actor's update forward (what `old_logprobs=rollout` would take), the bf16 engine's on
the same tokens and the fp32 reference, with the truncated importance weights that `algo.tis_cap` would apply. Last
line then: `logprob_mismatch_fp8: actor_abs=... actor_k3=... actor_outside_clip=... bf16_abs=...`.
"""

from __future__ import annotations

import argparse
import datetime
from pathlib import Path

import numpy as np
import torch
from omegaconf import OmegaConf

from vla_scale.config import ModelConfig
from vla_scale.models.oft import PretrainedVLA
from vla_scale.models.oft.decode import OFTDecoder
from vla_scale.objectives import logprob_mismatch, logprobs_from_logits, truncated_is_weights
from vla_scale.rollout.engine import RolloutEngine
from vla_scale.run_policy import fresh_vla

TEXTS = ["pick up the black bowl and place it on the plate", "open the top drawer", "put the cream cheese in the bowl"]
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def model_config(name: str) -> ModelConfig:
    yaml = OmegaConf.load(Path(__file__).resolve().parents[1] / "configs" / "model" / f"{name}.yaml")
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ModelConfig), yaml))


def build(vla: PretrainedVLA, dtype: torch.dtype) -> torch.nn.Module:
    torch.set_default_dtype(dtype)
    try:
        with torch.device(DEVICE):
            return vla.new_policy()
    finally:
        torch.set_default_dtype(torch.float32)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="oft_7b")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--temperature", type=float, default=1.6)
    p.add_argument("--clip-low", type=float, default=0.2)
    p.add_argument("--clip-high", type=float, default=0.28)
    p.add_argument("--tis-cap", type=float, default=2.0)
    p.add_argument("--fp8", action="store_true", help="an FP8 engine beside the bf16 one (emulated on a CPU)")
    args = p.parse_args()
    print(f"{datetime.datetime.now(datetime.UTC).isoformat(timespec='seconds')}  {DEVICE}  torch {torch.__version__}"
          + (f"  {torch.cuda.get_device_name()}" if DEVICE == "cuda" else ""), flush=True)
    cfg = model_config(args.model)
    vla = fresh_vla(cfg, TEXTS)
    torch.manual_seed(0)
    dtype = torch.bfloat16 if DEVICE == "cuda" else torch.float32
    actor = build(vla, dtype)
    engine = RolloutEngine(build(vla, dtype), DEVICE, seed=0, dtype=dtype, decoder=OFTDecoder())
    engine.update_weights_from_tensor(list(actor.named_parameters()), version=1)
    reference = build(vla, torch.float32).eval().requires_grad_(False)
    reference.load_state_dict({k: v.float() for k, v in actor.state_dict().items()})

    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (args.batch, cfg.image_size, cfg.image_size, 3), dtype=np.uint8)
    proprio = rng.uniform(-1, 1, (args.batch, cfg.proprio_dim))
    batch = vla.processor.from_arrays(images, [TEXTS[i % len(TEXTS)] for i in range(args.batch)], proprio)
    decoded = engine.decode(batch, args.temperature)
    tokens = torch.from_numpy(decoded.tokens).to(DEVICE)
    on_device = batch.to(DEVICE)
    t = args.temperature
    with torch.no_grad():
        actor_old = logprobs_from_logits(actor.eval()(on_device), tokens, t).float()
        ref = logprobs_from_logits(reference(on_device), tokens, t).float()
    actor_train = logprobs_from_logits(actor.train()(on_device), tokens, t).float().detach()
    rollout = torch.from_numpy(decoded.logprobs).to(DEVICE).float()
    mask = torch.ones_like(rollout, dtype=torch.bool)

    pairs = [
        ("engine (bf16 fast path) vs fp32 reference", rollout, ref),
        ("actor (bf16 forward) vs fp32 reference", actor_train, ref),
        ("old_logprobs=rollout: engine vs actor update forward", actor_train, rollout),
        ("old_logprobs=recompute: actor no-grad vs actor update forward", actor_train, actor_old),
    ]
    print(f"\n{args.model}, batch {args.batch}, {tokens.numel()} sampled tokens at T={t}, clip range "
          f"[{1 - args.clip_low:.2f}, {1 + args.clip_high:.2f}]")
    width = max(len(name) for name, *_ in pairs)
    print(f"{'pair':<{width}}  mean|d|   max|d|    k3 KL      outside clip")
    for name, new, old in pairs:
        stats = logprob_mismatch(new, old, mask, args.clip_low, args.clip_high)
        worst = float((new - old).abs().max())
        print(f"{name:<{width}}  {stats['abs_log_ratio']:.2e}  {worst:.2e}  {stats['approx_kl']:.2e}  "
              f"{stats['outside_clip']:.4f}")
    weights = truncated_is_weights(actor_old, rollout, args.tis_cap)
    raw = torch.exp(actor_old - rollout)
    print(f"\ntruncated IS weights min(actor / rollout, {args.tis_cap}): mean {float(weights.mean()):.4f}, "
          f"min {float(weights.min()):.4f}, capped {float((raw > args.tis_cap).float().mean()):.4f}, "
          f"outside [0.8, 1.25] {float(((raw < 0.8) | (raw > 1.25)).float().mean()):.4f}")
    rollout_mode = logprob_mismatch(actor_train, rollout, mask, args.clip_low, args.clip_high)
    recompute_mode = logprob_mismatch(actor_train, actor_old, mask, args.clip_low, args.clip_high)
    print(f"logprob_mismatch: rollout_abs={rollout_mode['abs_log_ratio']:.2e} "
          f"rollout_outside_clip={rollout_mode['outside_clip']:.4f} recompute_abs={recompute_mode['abs_log_ratio']:.2e}"
          f" recompute_outside_clip={recompute_mode['outside_clip']:.4f}", flush=True)
    if args.fp8:
        fp8_rows(args, engine, actor, reference, batch)


def fp8_rows(args: argparse.Namespace, bf16: RolloutEngine, actor: torch.nn.Module, reference: torch.nn.Module,
             batch) -> None:
    """The FP8 engine's sampled chunk against the actor, the bf16 engine and the fp32 reference."""
    fp8 = RolloutEngine(bf16.policy, DEVICE, seed=0, precision="fp8", emulate_fp8=DEVICE != "cuda",
                        decoder=OFTDecoder())
    decoded = fp8.decode(batch, args.temperature)
    tokens = torch.from_numpy(decoded.tokens).to(DEVICE)
    t = args.temperature
    on_device = batch.to(DEVICE)
    with torch.no_grad():
        actor_old = logprobs_from_logits(actor.eval()(on_device), tokens, t).float()
        ref = logprobs_from_logits(reference(on_device), tokens, t).float()
        engine_bf16 = logprobs_from_logits(bf16.logits(bf16.inputs(batch)), tokens, t).float()
    actor_train = logprobs_from_logits(actor.train()(on_device), tokens, t).float().detach()
    rollout = torch.from_numpy(decoded.logprobs).to(DEVICE).float()
    mask = torch.ones_like(rollout, dtype=torch.bool)
    pairs = [("fp8 engine vs fp32 reference", rollout, ref),
             ("fp8 engine vs bf16 engine (same tokens)", engine_bf16, rollout),
             ("old_logprobs=rollout with fp8: engine vs actor update forward", actor_train, rollout)]
    print(f"\nfp8 engine, its own {tokens.numel()} sampled tokens")
    width = max(len(name) for name, *_ in pairs)
    print(f"{'pair':<{width}}  mean|d|   max|d|    k3 KL      outside clip")
    figures = {}
    for name, new, old in pairs:
        figures[name] = stats = logprob_mismatch(new, old, mask, args.clip_low, args.clip_high)
        print(f"{name:<{width}}  {stats['abs_log_ratio']:.2e}  {float((new - old).abs().max()):.2e}  "
              f"{stats['approx_kl']:.2e}  {stats['outside_clip']:.4f}")
    weights = truncated_is_weights(actor_old, rollout, args.tis_cap)
    raw = torch.exp(actor_old - rollout)
    print(f"truncated IS weights min(actor / fp8 rollout, {args.tis_cap}): mean {float(weights.mean()):.4f}, "
          f"min {float(weights.min()):.4f}, capped {float((raw > args.tis_cap).float().mean()):.4f}")
    actor_pair, bf16_pair = figures[pairs[2][0]], figures[pairs[1][0]]
    print(f"logprob_mismatch_fp8: actor_abs={actor_pair['abs_log_ratio']:.2e} actor_k3={actor_pair['approx_kl']:.2e} "
          f"actor_outside_clip={actor_pair['outside_clip']:.4f} bf16_abs={bf16_pair['abs_log_ratio']:.2e}", flush=True)


if __name__ == "__main__":
    main()
