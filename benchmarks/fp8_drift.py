"""How far the update's FP8 products (`deepspeed.update_precision=fp8`) move the policy's log-probs and gradient from
bf16's, against bf16's own run-to-run spread, on the same samples, on one device.

    python benchmarks/fp8_drift.py --model oft_7b --rows 32        # one H100: the 7B's shape
    python benchmarks/fp8_drift.py --model tiny --dry-run          # CPU: the whole script in seconds (make test)

A fresh policy of the model's shape (as `benchmarks/rl_step.py` builds it: the reach task's instructions and
cameras, `model.proprio_dim=4`), in bf16 on a GPU (float32 on the CPU), `--rows` observations of random camera
images and the task's instructions, and the tokens sampled from the policy's own distribution (as a rollout samples
them). Then three passes over those samples, each a forward and a backward of GRPO's surrogate loss (minus each
row's advantage, ±1, times its tokens' log-probs, averaged over the tokens):

- `bf16`: the reference;
- `bf16 reordered`: the same rows in reverse order in micro-batches half as large: other matrix shapes, so other
  kernels and other reduction orders of the same products. Its distance from the reference is the run-to-run spread
  the update already lives with, what a bound on FP8's drift is set against;
- `fp8`: the blocks' linear layers on FP8 tensor cores (`models/fp8_update.py`; with `--dry-run` on the CPU the same
  quantisation multiplied in float32, `fp8_emulated`).

Each row: mean and max |Δ log p| per token against the reference, and the cosine of its gradient (every parameter's,
flattened) to the reference's. Last line: `fp8_drift: model=<m> tokens=<n> spread_mean=<> spread_max=<>
fp8_mean=<> fp8_max=<> ratio=<fp8_mean / spread_mean> spread_grad_cos=<> fp8_grad_cos=<> precision=<fp8|fp8_emulated>`.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import rl_step  # noqa: E402  (the run's settings, as its steps run them)

from vla_scale.envs.registry import simulator  # noqa: E402
from vla_scale.models.fp8_update import use_update_precision  # noqa: E402
from vla_scale.run_policy import fresh_vla  # noqa: E402


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="oft_7b")
    p.add_argument("--rows", type=int, default=32, help="observations (samples) compared")
    p.add_argument("--micro-batch", type=int, default=16, help="rows per forward of the reference and FP8 passes")
    p.add_argument("--temperature", type=float, default=1.6, help="the sampling temperature (algo.temperature)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dry-run", action="store_true", help="CPU: a policy of a few thousand parameters, in seconds")
    args = p.parse_args()
    if args.rows < 2 or args.micro_batch < 2:
        p.error("--rows and --micro-batch must be at least 2 (the reordered pass halves the micro-batch)")
    for name, value in (("lora_rank", 0), ("precision", "bf16"), ("action_head", "tokens"), ("run_algo", ""),
                        ("groups", 1), ("group_size", 2), ("max_steps", 8), ("workers", 1), ("sims", 1),
                        ("stages", 1), ("max_staleness", 0)):
        setattr(args, name, value)  # what rl_step's settings read
    return args


def samples(vla, cfg, texts: list[str], rows: int, seed: int) -> tuple[object, np.ndarray]:
    """`rows` observations: random camera images, the task's instructions in turn, random proprio; and each row's
    advantage (±1)."""
    rng = np.random.default_rng(seed)
    m = cfg.model
    images = rng.integers(0, 256, (rows, len(vla.cameras), m.image_size, m.image_size, 3), dtype=np.uint8)
    texts = [texts[i % len(texts)] for i in range(rows)]
    proprio = rng.uniform(-1, 1, (rows, m.proprio_dim)).astype(np.float32)
    return vla.processor.from_prepared(images, texts, proprio), rng.choice([-1.0, 1.0], rows)


def rows_of(inputs, index: Tensor):
    return type(inputs)(*(t[index] for t in vars(inputs).values()))


def one_pass(policy: nn.Module, inputs, tokens: Tensor, advantages: Tensor, order: Tensor, micro: int,
             temperature: float, device: torch.device) -> Tensor:
    """Per-token log-probs [rows, tokens] (rows in their own order) over the rows in `order`, `micro` rows per
    forward; the surrogate loss's gradient is left in the parameters' `.grad`."""
    policy.zero_grad(set_to_none=True)
    out = torch.empty(tokens.shape, dtype=torch.float32)
    total = tokens.numel()
    for start in range(0, len(order), micro):
        index = order[start:start + micro]
        params = policy(rows_of(inputs, index).to(device))
        logprobs = policy.distribution.logprobs(params, tokens[index].to(device), temperature)
        loss = -(advantages[index].to(device)[:, None] * logprobs.float()).sum() / total
        loss.backward()
        out[index] = logprobs.detach().float().cpu()
    return out


def gradients(policy: nn.Module) -> list[Tensor]:
    """The parameters' gradients, copied to the host in their own dtype (a 7B's float32 gradient, flattened, would
    not fit beside the policy on an 80 GB card)."""
    return [p.grad.to("cpu", copy=True) for p in policy.parameters() if p.grad is not None]


def cosine(policy: nn.Module, reference: list[Tensor]) -> float:
    """The cosine between the parameters' gradients now and `reference`, summed parameter by parameter in float64."""
    dot = norm = norm_ref = 0.0
    grads = [p.grad for p in policy.parameters() if p.grad is not None]
    for grad, ref in zip(grads, reference, strict=True):
        g, r = grad.float(), ref.to(grad.device).float()
        dot += (g * r).sum(dtype=torch.float64).item()
        norm += g.square().sum(dtype=torch.float64).item()
        norm_ref += r.square().sum(dtype=torch.float64).item()
    return dot / max(norm * norm_ref, 1e-300) ** 0.5


def drift(logprobs: Tensor, reference: Tensor, cos: float) -> dict[str, float]:
    gap = (logprobs - reference).abs()
    return {"mean": gap.mean().item(), "max": gap.max().item(), "cos": cos}


def main(args: argparse.Namespace) -> None:
    gpu = torch.cuda.is_available() and not args.dry_run
    device = torch.device("cuda" if gpu else "cpu")
    dtype = torch.bfloat16 if gpu else torch.float32
    cfg = rl_step.trainer_config(args, 0, gpu=gpu)
    precision = rl_step.update_precision("fp8", gpu)
    torch.manual_seed(args.seed)
    start = time.perf_counter()
    texts = simulator(cfg.env.name).instructions(cfg.env.suite)
    with device:
        vla = fresh_vla(cfg.model, texts, cfg.env.name)
        policy = vla.policy.to(dtype).train()
    inputs, advantages = samples(vla, cfg, texts, args.rows, args.seed)
    advantages = torch.from_numpy(advantages).float()
    with torch.no_grad():
        params = policy(inputs.to(device))
        generator = torch.Generator(device=device).manual_seed(args.seed)
        tokens = policy.distribution.sample(params, args.temperature, False, generator).cpu()
    del params
    print(f"fp8_drift setup {time.perf_counter() - start:.1f}s: model={cfg.model.name} device={device} dtype={dtype} "
          f"rows={args.rows} tokens={tokens.numel()} micro-batch={args.micro_batch}", flush=True)
    rows = torch.arange(args.rows)
    passes, reference_grad = {}, None
    for name, order, micro, how in (("bf16", rows, args.micro_batch, "bf16"),
                                    ("bf16 reordered", rows.flip(0), max(1, args.micro_batch // 2), "bf16"),
                                    (precision, rows, args.micro_batch, precision)):
        layers = use_update_precision(policy, how, device, bf16=dtype == torch.bfloat16)
        t0 = time.perf_counter()
        logprobs = one_pass(policy, inputs, tokens, advantages, order, micro, args.temperature, device)
        print(f"{name}: {time.perf_counter() - t0:.2f}s ({layers} layers in FP8)", flush=True)
        if reference_grad is None:
            passes[name], reference_grad = (logprobs, 1.0), gradients(policy)
        else:
            passes[name] = (logprobs, cosine(policy, reference_grad))
    reference = passes["bf16"][0]
    spread = drift(*passes["bf16 reordered"][:1], reference, passes["bf16 reordered"][1])
    fp8 = drift(passes[precision][0], reference, passes[precision][1])
    print("\n| against bf16 | mean abs d log p | max abs d log p | gradient cosine |\n|---|---|---|---|")
    for name, d in (("bf16 reordered", spread), (precision, fp8)):
        print(f"| {name} | {d['mean']:.2e} | {d['max']:.2e} | {d['cos']:.6f} |")
    ratio = fp8["mean"] / spread["mean"] if spread["mean"] > 0 else float("inf")
    print(f"fp8_drift: model={cfg.model.name} tokens={tokens.numel()} spread_mean={spread['mean']:.3e} "
          f"spread_max={spread['max']:.3e} fp8_mean={fp8['mean']:.3e} fp8_max={fp8['max']:.3e} ratio={ratio:.2f} "
          f"spread_grad_cos={spread['cos']:.6f} fp8_grad_cos={fp8['cos']:.6f} precision={precision}", flush=True)


if __name__ == "__main__":
    main(parse())
