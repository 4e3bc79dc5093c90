"""The flow families at their real shapes on one GPU (π0 / π0.5 at openpi's, SmolVLA at LeRobot's): the chunk decode,
π0's beside openpi's own `sample_actions` on the same weights, and whole RL steps (rollout + update) with their time
and peak memory.

    python benchmarks/pi0_scale.py --model pi0 --memory-gib 80 --openpi .openpi   # one GPU
    python benchmarks/pi0_scale.py --model smolvla --memory-gib 80                 # SmolVLA's 450M, one GPU
    python benchmarks/pi0_scale.py --model pi0_tiny --dry-run                      # CPU: the whole script, seconds

**The decode.** A fresh policy of the preset (seeded; bfloat16 on a GPU), `--batch` LIBERO-shaped observations (two
cameras at the tower's side and a masked third slot, as openpi's LIBERO inputs fill it; a prompt of 12-24 tokens; an
8-D state zero-padded to the model's) and fixed noise. Ours: `Pi0Policy.sample_actions`, `--num-steps` Euler steps
on the prefix's KV cache (what evaluation runs), and `sample_chain` (the Flow-SDE chain RL's rollout draws). openpi's:
`PI0Pytorch.sample_actions` run by `benchmarks/openpi_sample_actions.py` in a process of its own (`--openpi DIR`:
openpi's `src/openpi` in DIR/src, the wheels that process needs in DIR/wheels; its docstring says which), on the same
weights (our parameter names are openpi's), inputs and noise; eager, and with `--openpi-compile` also compiled as
openpi's default config compiles it. Each is timed over `--repeats` calls after `--warmup`, synchronised; the table
has the median and the actions' largest difference from ours. Our decode's model FLOPs are counted once (attention
as matmuls, below) and set against the card's matmul rate: the decode's MFU, and the floor no decode of these shapes
goes under; the prefix pass is also timed and counted alone, which splits the decode's time and MFU between the
prefix and the K suffix passes.

SmolVLA (`--model smolvla` / `smolvla_tiny`) decodes the same inputs at its own shapes (three 512 px camera slots, two
filled; 48 prompt tokens) with `SmolVLAPolicy`; there is no openpi to compare with.

**The RL step** (`--steps` > 0). The trainer as `benchmarks/rl_step.py` builds ours (launch/train.py's Trainer: the
ZeRO-3 actor under zero3_bf16, the rollout engine on the same GPU, the reach task's simulators; GRPO, every group
kept), with this family's model (a fresh one of the preset, its parity fixture's tokenizer; chunks of `--horizon`).
One warm-up step, then `--steps` timed ones under `--memory-gib` (rollout, update, sync, peak memory per phase),
then the update alone on the last step's samples with its MFU: three forward-equivalents per sample of the update's
own forward (the prefix and the stochastic step's suffix pass, counted by FlopCounterMode with the attention spelled
out as matmuls while it counts, `attention_as_matmuls`: the same multiply-adds, in a form the counter takes).

`--kernels liger` runs our policy with Liger Kernel's Triton kernels (`model.kernels`, models/kernels.py).

`--precision fp8` times our decode twice in one process: bf16, then with the prefix pass's products in FP8 as the
rollout engine runs them under `rollout.precision=fp8` (`models/flow/fp8.py`: the vision tower's and the VLM's
linear layers on FP8 tensor cores; emulated in float32 on a CPU); the table has both, the FP8 actions' largest
difference from bf16's, and `decode_s` is then FP8's. The RL steps run the FP8 engine too (on a GPU).

Last line: `pi0_scale: model=<m> kernels=<k> precision=<bf16|fp8> decode_s=<ours> openpi_s=<openpi eager, or nan>
ratio=<openpi / ours> step_s=<mean, or nan> peak_gib=<the steps' peak> decode_mfu=<our decode's model FLOPs / its
seconds / the matmul rate> vs_openpi_compiled=<openpi compiled / ours, or nan> vs_openpi_eager=<openpi eager / ours,
or nan>`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from vla_scale.models.flow.fp8 import PrefixFp8
from vla_scale.models.flow.policy import FlowInputs, FlowPolicy
from vla_scale.models.fp8 import PRECISIONS
from vla_scale.models.kernels import KERNELS, use_kernels
from vla_scale.models.pi0.policy import Pi0Policy
from vla_scale.models.pi0.spec import PRESETS as PI0_PRESETS
from vla_scale.models.smolvla.policy import SmolVLAPolicy
from vla_scale.models.smolvla.spec import PRESETS as SMOLVLA_PRESETS

ROOT = Path(__file__).resolve().parents[1]
TOKENIZER = ROOT / "tests" / "fixtures" / "openpi_reference" / "tokenizer.model"
SMOLVLA_TOKENIZER = ROOT / "tests" / "fixtures" / "smolvla_reference" / "vlm"
PRESETS = {**PI0_PRESETS, **SMOLVLA_PRESETS}
OPENPI_CHILD = Path(__file__).resolve().parent / "openpi_sample_actions.py"


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="pi0", choices=sorted(PRESETS))
    p.add_argument("--batch", type=int, default=64, help="observations per decode")
    p.add_argument("--num-steps", type=int, default=10, help="Euler steps per chunk")
    p.add_argument("--horizon", type=int, default=10, help="actions per chunk (model.pi0.action_horizon)")
    p.add_argument("--repeats", type=int, default=5, help="timed decodes of each way")
    p.add_argument("--warmup", type=int, default=2, help="untimed decodes first")
    p.add_argument("--openpi", default="", help="DIR with openpi's source (DIR/src/openpi) and the wheels (DIR/wheels)")
    p.add_argument("--openpi-compile", action="store_true", help="openpi's decode compiled too (max-autotune)")
    p.add_argument("--kernels", default="eager", choices=KERNELS, help="model.kernels for our policy")
    p.add_argument("--precision", default="bf16", choices=PRECISIONS,
                   help="fp8: our decode's prefix pass in FP8 too (rollout.precision=fp8), beside the bf16 one")
    p.add_argument("--steps", type=int, default=2, help="timed RL steps (0: the decode only)")
    p.add_argument("--groups", type=int, default=12)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--max-steps", type=int, default=64)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--sims", type=int, default=6)
    p.add_argument("--stages", type=int, default=2)
    p.add_argument("--micro-batch", type=int, default=64, help="samples per update micro-batch")
    p.add_argument("--memory-gib", type=float, default=0.0, help="cap the GPU memory at this many GiB (0: none)")
    p.add_argument("--sim-ms", type=float, default=0.0)
    p.add_argument("--dry-run", action="store_true", help="CPU: the whole script at a tiny size, in seconds")
    args = p.parse_args()
    for name, value in (("lora_rank", 0), ("action_head", "tokens"), ("run_algo", ""), ("max_staleness", 0)):
        setattr(args, name, value)  # what rl_step's settings read
    return args


def smolvla(args: argparse.Namespace) -> bool:
    return args.model in SMOLVLA_PRESETS


def spec_of(args: argparse.Namespace) -> Any:
    if smolvla(args):
        return replace(PRESETS[args.model](), chunk_size=args.horizon, num_steps=args.num_steps)
    return replace(PRESETS[args.model](), action_horizon=args.horizon, num_steps=args.num_steps)


def new_policy(spec: Any, dtype: torch.dtype, device: torch.device) -> FlowPolicy:
    cls = SmolVLAPolicy if hasattr(spec, "chunk_size") else Pi0Policy
    return cls.from_spec(spec, dtype=dtype, device=str(device)).eval()


def decode_case(spec: Any, batch: int, device: torch.device) -> tuple[FlowInputs, torch.Tensor]:
    """Seeded LIBERO-shaped inputs (module docstring) on `device` and the chain's starting noise."""
    gen = torch.Generator().manual_seed(1)
    side, slots = (spec.image_size, spec.num_images) if hasattr(spec, "chunk_size") else \
        (spec.vision.image_size, spec.num_images)
    budget = getattr(spec, "tokenizer_max_length", None) or spec.max_token_len
    vocab = spec.text.vocab_size if hasattr(spec, "text") else spec.vocab_size
    state_dim = getattr(spec, "max_state_dim", spec.action_dim)
    images = torch.rand(batch, slots, 3, side, side, generator=gen) * 2 - 1
    masks = torch.arange(slots).expand(batch, -1) < min(2, slots)
    images[~masks] = 0.0
    lengths = torch.randint(min(12, budget), min(24, budget) + 1, (batch,), generator=gen)
    token_masks = torch.arange(budget).expand(batch, -1) < lengths[:, None]
    tokens = torch.randint(4, min(vocab, 256), (batch, budget), generator=gen) * token_masks
    state = torch.zeros(batch, state_dim)
    state[:, : min(8, state_dim)] = torch.randn(batch, min(8, state_dim), generator=gen)
    noise = torch.randn(batch, spec.action_horizon, spec.action_dim, generator=gen)
    inputs = FlowInputs(images=images.to(device), image_masks=masks.to(device), tokens=tokens.to(device),
                        token_masks=token_masks.to(device), state=state.to(device))
    return inputs, noise.to(device)


def timed(call, repeats: int, warmup: int, device: torch.device) -> list[float]:
    seconds = []
    for index in range(warmup + repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        call()
        if device.type == "cuda":
            torch.cuda.synchronize()
        if index >= warmup:
            seconds.append(time.perf_counter() - start)
    return seconds


def ours_decode(args: argparse.Namespace, device: torch.device, case_dir: Path | None) -> dict:
    """Our sample_actions, sample_chain and prefix pass timed in bf16 (float32 on a CPU), then with `--precision fp8`
    again with the prefix's products in FP8 as the rollout engine runs them (`models/flow/fp8.py`; emulated on a
    CPU), by precision; the case written for openpi's process when `case_dir`."""
    spec = spec_of(args)
    torch.manual_seed(0)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    policy = use_kernels(new_policy(spec, dtype, device), args.kernels)
    inputs, noise = decode_case(spec, args.batch, device)
    flops = {"decode": counted_flops(lambda: policy.sample_actions(inputs, noise.clone())),
             "prefix": counted_flops(lambda: policy.prefix_cache(inputs))}
    if case_dir is not None:
        write_case(case_dir, args, spec, policy, inputs, noise)
    ways = {}
    for precision in ("bf16", "fp8") if args.precision == "fp8" else ("bf16",):
        if precision == "fp8":
            PrefixFp8(emulate=device.type != "cuda").refresh(policy)
        with torch.no_grad():
            ways[precision] = {
                "actions": policy.sample_actions(inputs, noise.clone()).float().cpu(),
                "sample_actions": timed(lambda: policy.sample_actions(inputs, noise.clone()), args.repeats,
                                        args.warmup, device),
                "sample_chain": timed(lambda: policy.sample_chain(inputs, noise.clone(), 0.5), args.repeats,
                                      args.warmup, device),
                "prefix": timed(lambda: policy.prefix_cache(inputs), args.repeats, args.warmup, device)}
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else float("nan")
    return {**ways[args.precision], "actions": ways["bf16"]["actions"], "ways": ways, "peak_gib": peak,
            "flops": flops}


def counted_flops(call: Callable[[], object]) -> float:
    """The model FLOPs of `call()` (a decode, or its prefix pass), attention counted as matmuls: at the card's
    matmul rate a decode's set the floor no decode of these shapes, compiled or not, can go under."""
    from torch.utils.flop_counter import FlopCounterMode

    with torch.no_grad(), FlopCounterMode(display=False) as counter, attention_as_matmuls():
        call()
    return float(counter.get_total_flops())


def decode_split(ours: dict, rate: float) -> str:
    """Where our decode's time goes: the prefix pass (timed alone) and the K suffix passes (the rest), each with its
    FLOPs and its share of the matmul rate."""
    decode_s, prefix_s = statistics.median(ours["sample_actions"]), statistics.median(ours["prefix"])
    parts = {"prefix pass": (prefix_s, ours["flops"]["prefix"]),
             "K suffix passes": (decode_s - prefix_s, ours["flops"]["decode"] - ours["flops"]["prefix"])}
    return "; ".join(f"{name} {s:.4f} s, {f / 1e12:.2f} TFLOP, {f / max(s, 1e-9) / rate:.1%} of the matmul rate"
                     for name, (s, f) in parts.items())


def matmul_rate_here(device: torch.device) -> float:
    """This device's bf16 8192^3 matmul rate (float32 512^3 on a CPU), as every benchmark measures it."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from decode import matmul_rate

    size, dtype = (8192, torch.bfloat16) if device.type == "cuda" else (512, torch.float32)
    return matmul_rate(size, size, size, dtype=dtype)


def write_case(case_dir: Path, args: argparse.Namespace, spec: Any, policy: FlowPolicy, inputs: FlowInputs,
               noise: torch.Tensor) -> None:
    from safetensors.torch import save_file

    from vla_scale.models.pi0.checkpoint import variant_name

    case_dir.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu().clone() for k, v in policy.state_dict().items()}  # tied tensors stored twice
    save_file(state, str(case_dir / "weights.safetensors"))
    save_file({"images": inputs.images.cpu().contiguous(), "image_masks": inputs.image_masks.cpu().contiguous(),
               "tokens": inputs.tokens.cpu().contiguous(), "token_masks": inputs.token_masks.cpu().contiguous(),
               "state": inputs.state.cpu().contiguous(), "noise": noise.cpu().contiguous()},
              str(case_dir / "inputs.safetensors"))
    (case_dir / "case.json").write_text(json.dumps({
        "paligemma_variant": variant_name(spec.paligemma), "action_expert_variant": variant_name(spec.expert),
        "pi05": spec.pi05, "action_dim": spec.action_dim, "action_horizon": spec.action_horizon,
        "num_steps": spec.num_steps, "repeats": args.repeats, "warmup": args.warmup, "compile": False}))


def openpi_site(openpi: Path) -> Path:
    """A folder with the wheels of `openpi`/wheels installed and openpi's transformers_replace copied over them
    (built once per machine, under the temp folder)."""
    import shutil

    site = Path(tempfile.gettempdir()) / "openpi_site"
    wheels = " ".join(sorted(p.name for p in (openpi / "wheels").glob("*.whl")))
    if not (site / "wheels.txt").is_file() or (site / "wheels.txt").read_text() != wheels:
        shutil.rmtree(site, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                        "--target", str(site), *map(str, sorted((openpi / "wheels").glob("*.whl")))], check=True)
        shutil.copytree(openpi / "src" / "openpi" / "models_pytorch" / "transformers_replace", site / "transformers",
                        dirs_exist_ok=True)
        (site / "wheels.txt").write_text(wheels)
    return site


def openpi_decode(args: argparse.Namespace, case_dir: Path, compiled: bool) -> dict:
    """openpi's sample_actions on the case, in its own process (its seconds, its first actions), or the error."""
    from safetensors.torch import load_file

    case = json.loads((case_dir / "case.json").read_text())
    (case_dir / "case.json").write_text(json.dumps({**case, "compile": compiled}))
    out = case_dir / f"openpi_{'compiled' if compiled else 'eager'}.json"
    openpi = Path(args.openpi).resolve()
    env = {**os.environ, "PYTHONPATH": f"{openpi_site(openpi)}:{openpi / 'src'}"}
    proc = subprocess.run([sys.executable, str(OPENPI_CHILD), "--case", str(case_dir), "--out", str(out)], env=env,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        return {"error": (proc.stdout + proc.stderr)[-3000:]}
    result = json.loads(out.read_text())
    result["actions"] = load_file(str(out.with_suffix(".safetensors")))["actions"]
    return result


@contextmanager
def attention_as_matmuls() -> Iterator[None]:
    """The backbone's attention as two batched matmuls around a float32 softmax, the keys' and values' heads repeated
    per query head, while FLOPs are counted: torch's counter has no formula for the CPU's fused attention kernel and
    asserts equal head counts for the GPU's, and grouped-query attention does the same multiply-adds as this form
    (what it shares is memory, not arithmetic)."""
    from vla_scale.models.pi0 import backbone
    from vla_scale.models.smolvla import backbone as smolvla_backbone

    fused, smolvla_fused = backbone.attend, smolvla_backbone.attend

    def as_matmuls(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scaling: float | None = None):
        groups = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
        scale = q.shape[-1] ** -0.5 if scaling is None else scaling
        scores = (q @ k.transpose(-1, -2)).float() * scale + mask.float()
        out = (scores.softmax(-1).to(v.dtype) @ v).transpose(1, 2)
        return out.reshape(*out.shape[:2], -1)

    backbone.attend = smolvla_backbone.attend = as_matmuls
    try:
        yield
    finally:
        backbone.attend, smolvla_backbone.attend = fused, smolvla_fused


def rl_steps(args: argparse.Namespace) -> list[dict]:
    """The trainer's steps as rl_step times ours, then the update alone; one row each. (Imported here: the decode
    alone needs neither Ray nor Hydra.)"""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import rl_step  # the trainer's settings, its build, the timed step and the update alone

    from vla_scale.trainer import Trainer

    substeps = rl_step.substeps_for(args.sim_ms)
    if smolvla(args):
        extra = [f"model.smolvla.tokenizer={SMOLVLA_TOKENIZER}", f"model.smolvla.chunk_size={args.horizon}",
                 f"model.smolvla.num_steps={args.num_steps}"]
    else:
        extra = [f"model.pi0.tokenizer={TOKENIZER}", f"model.pi0.action_horizon={args.horizon}",
                 f"model.pi0.num_steps={args.num_steps}", *(["model.pi0.max_token_len=24"] if args.dry_run else [])]
    gpu = torch.cuda.is_available()
    steps_args = args if gpu else argparse.Namespace(**{**vars(args), "precision": "bf16"})  # FP8 engines need a GPU
    cfg = rl_step.trainer_config(steps_args, substeps, shrink=False, extra=extra)
    cap = rl_step.cap_memory(args.memory_gib) if args.memory_gib else "no memory cap"
    start = time.perf_counter()
    trainer = Trainer(cfg, tempfile.mkdtemp(prefix="pi0_scale_"))
    trainer.setup()
    rl_step.keep_batches(trainer)
    device = trainer.actor.device
    size, dtype = (8192, torch.bfloat16) if device.type == "cuda" else (512, torch.float32)
    rate = rl_step.matmul_rate(size, size, size, dtype=dtype)
    print(f"pi0_scale setup {time.perf_counter() - start:.1f}s: {trainer.vla.describe(cfg.env)}; {cap}; matmul "
          f"{rate / 1e12:.1f} TFLOP/s", flush=True)
    rows = []
    for way in ["warm-up"] + ["timed"] * args.steps:
        m = rl_step.timed_step(trainer, way)
        rows.append(m)
        print(f"{way} step {m['step_s']:.1f}s: rollout {m['time/rollout_s']:.1f}s, update {m['time/update_s']:.1f}s "
              f"(proximal {m['time/recompute_s']:.1f}s), sync {m['time/sync_s']:.2f}s, samples "
              f"{m['train/samples']:.0f}, peak {m['peak_gib']:.1f} GiB", flush=True)
    plan = trainer.actor.algorithm.plan(trainer.last_batch.trajectories, trainer.cfg.model, trainer.processor,
                                        trainer.mean_over_ranks)
    micro = plan.minis[0].micro_batches[0]
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter, attention_as_matmuls():
        trainer.actor._old_logprobs(micro)
    flops = counter.get_total_flops() / len(micro.mask)
    alone_s, alone_peak = rl_step.update_alone(trainer)
    samples = sum(len(t) for g in trainer.last_batch.groups for t in g)
    mfu = rl_step.passes(cfg) * flops * samples / alone_s / rate
    print(f"update alone on {samples} samples: {alone_s:.2f}s, MFU {mfu:.1%} ({flops / 1e12:.3f} TFLOP forward per "
          f"sample), peak {alone_peak:.1f} GiB", flush=True)
    trainer.close()
    return [r for r in rows if r["way"] == "timed"]


def main(args: argparse.Namespace) -> None:
    if args.dry_run:
        args.model = args.model if args.model.endswith("_tiny") else "smolvla_tiny" if smolvla(args) else "pi0_tiny"
        args.batch, args.repeats, args.warmup, args.steps = 4, 1, 0, 1
        args.groups, args.group_size, args.max_steps, args.workers, args.sims, args.micro_batch = 2, 2, 8, 1, 2, 8
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if args.openpi and smolvla(args):
        raise SystemExit("--openpi compares π0's decode with openpi's: drop it for SmolVLA")
    case_dir = Path(tempfile.mkdtemp(prefix="pi0_scale_case_")) if args.openpi else None
    ours = ours_decode(args, device, case_dir)
    if device.type == "cuda":
        torch.cuda.empty_cache()  # the decode's policy is gone: its memory back before the trainer's
    lines = ["| decode | median s | calls | max abs diff to ours (bf16) |", "|---|---|---|---|"]
    for precision, way in ours["ways"].items():
        diff = (way["actions"] - ours["actions"]).abs().max().item()
        for call in ("sample_actions", "sample_chain", "prefix"):
            lines.append(f"| ours {call}{' (Flow-SDE)' if call == 'sample_chain' else ''}, {precision} | "
                         f"{statistics.median(way[call]):.4f} | {len(way[call])} | "
                         f"{f'{diff:.3g}' if call == 'sample_actions' else ''} |")
    openpi_s = {False: float("nan"), True: float("nan")}
    for compiled in ((False, True) if args.openpi_compile else (False,)) if case_dir else ():
        result = openpi_decode(args, case_dir, compiled)
        label = f"openpi sample_actions ({'compiled' if compiled else 'eager'})"
        if "error" in result:
            print(f"{label} failed:\n{result['error']}", flush=True)
            continue
        diff = (result["actions"] - ours["actions"]).abs().max().item()
        lines.append(f"| {label} | {statistics.median(result['seconds']):.4f} | {len(result['seconds'])} | "
                     f"{diff:.3g} |")
        print(f"{label}: built in {result['build_s']:.1f}s, transformers {result['transformers']}, torch "
              f"{result['torch']}, {result['device']}", flush=True)
        openpi_s[compiled] = statistics.median(result["seconds"])
    decode_s = statistics.median(ours["sample_actions"])
    rate = matmul_rate_here(device)
    flops = ours["flops"]["decode"]
    floor_s = flops / rate
    print(f"\ndecode: model={args.model} batch={args.batch} K={args.num_steps} horizon={args.horizon} on {device} "
          f"(peak {ours['peak_gib']:.1f} GiB)\n" + "\n".join(lines), flush=True)
    print(f"decode FLOPs: {flops / 1e12:.2f} TFLOP a decode; ours at {flops / decode_s / 1e12:.1f} TFLOP/s, "
          f"{flops / decode_s / rate:.1%} of the matmul rate ({rate / 1e12:.1f} TFLOP/s); the floor (every FLOP at "
          f"that rate) {floor_s:.4f} s, so no decode of these shapes beats openpi's eager by more than "
          f"{openpi_s[False] / floor_s:.2f}x or its compiled by more than {openpi_s[True] / floor_s:.2f}x", flush=True)
    print(f"decode split: {decode_split(ours, rate)}", flush=True)
    rows = rl_steps(args) if args.steps else []
    step_s = statistics.mean(r["step_s"] for r in rows) if rows else float("nan")
    peak = max(r["peak_gib"] for r in rows) if rows else float("nan")
    if rows:
        print("\n| step s | rollout s | update s | sync s | samples | peak GiB (rollout / update / sync) |\n"
              "|---|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['step_s']:.2f} | {r['time/rollout_s']:.2f} | {r['time/update_s']:.2f} | "
                  f"{r['time/sync_s']:.2f} | {r['train/samples']:.0f} | {r['memory/rollout_peak_gib']:.1f} / "
                  f"{r['memory/update_peak_gib']:.1f} / {r['memory/sync_peak_gib']:.1f} |")
    if "fp8" in ours["ways"]:
        bf16_s = statistics.median(ours["ways"]["bf16"]["sample_actions"])
        print(f"decode fp8 prefix: {bf16_s / decode_s:.2f}x the bf16 decode ({bf16_s:.4f} s)", flush=True)
    print(f"pi0_scale: model={args.model} kernels={args.kernels} precision={args.precision} decode_s={decode_s:.4f} "
          f"openpi_s={openpi_s[False]:.4f} ratio={openpi_s[False] / decode_s:.2f} step_s={step_s:.2f} "
          f"peak_gib={peak:.1f} decode_mfu={flops / decode_s / rate:.3f} "
          f"vs_openpi_compiled={openpi_s[True] / decode_s:.2f} "
          f"vs_openpi_eager={openpi_s[False] / decode_s:.2f}", flush=True)


if __name__ == "__main__":
    status = 0
    try:
        main(parse())  # argparse's own exit (--help, a bad argument) passes through
    except Exception:
        traceback.print_exc()
        status = 1
    sys.stdout.flush()
    os._exit(status)  # Ray's and DeepSpeed's threads can hold the interpreter at exit
