"""Where the RL update's time goes at a model's shape, and what each lever does to it, on one device.

    python benchmarks/update_profile.py --model oft_7b --sim-ms 26 --memory-gib 80 --micro-batch 128 \\
        --variants mb=128 mb=64,recompute=8 mb=32,recompute=16 mb=32,recompute=0,gib=0,resident=3
    python benchmarks/update_profile.py --model tiny --dry-run       # CPU: the whole script in seconds (make test)

The trainer is built and warmed up as `benchmarks/rl_step.py` builds it (the same flags: `--memory-gib`,
`--micro-batch`, `--max-staleness`, ...; our way's settings), one RL step is played for its samples (then
`--loop-steps` more, timed as rl_step times ours), and then:

1. **The profile** (`--profile`: of each variant named there): one update alone on those samples under
   torch.profiler, each DeepSpeed engine call (forward, backward, the optimizer step) bracketed by a device
   synchronisation, so every kernel falls in its phase. Per phase: wall seconds, GPU busy seconds (the union of
   kernels and copies), idle seconds, and the kernels' time by kind (matrix products, attention, the optimizer's
   kernels, copies host->device, device->host and on the device, the rest: norms, activations, casts). The
   backward's time includes the checkpointed layers' recomputed forward. Also the allocator's cache flushes during
   the update (`num_alloc_retries`: a flush frees every cached block and retries an allocation that did not fit;
   DeepSpeed warns of them).
2. **The levers**: the same update alone (same samples, same FLOP count) under each `--variants` entry, a
   comma-separated list of `key=value`: `mb` samples per micro-batch, `recompute` Llama layers that recompute
   (`deepspeed.recompute_layers`, -1 all), `resident` sub-groups whose optimizer states stay on the GPU
   (`deepspeed.resident_sub_groups`), `overlap` 0 to queue the streamed states' copies on the compute stream in turn
   (1: on two copy streams of their own, beside the step: the default), `gib` the memory cap (0: the whole card),
   `kernels` eager or liger (`model.kernels`; the actor's live layers swapped for that row only; liger on a GPU),
   `precision` bf16 or fp8 (`deepspeed.update_precision`: the blocks' products on FP8 tensor cores; a CPU dry run
   multiplies them as `fp8_emulated`, in float32).
   Each row: seconds, MFU (three forward-equivalents of model FLOPs per sample, as rl_step counts them), peak GiB,
   cache flushes. A variant that runs out of memory says so.

Last line: `update_profile: base_s=<s> base_mfu=<x> best=<variant> best_s=<s> best_mfu=<x>` (best: the fastest
variant that fits under --memory-gib).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import rl_step  # noqa: E402  (the trainer's settings, its build and the update alone)

from vla_scale.config import Config  # noqa: E402
from vla_scale.models.kernels import KERNELS, kernels_problem, use_kernels  # noqa: E402

KINDS = (("attention", ("flash", "fmha", "attention", "efficient_attention")),
         ("gemm", ("gemm", "cutlass", "xmma", "nvjet", "cublas", "sm90_", "sm80_")),
         ("optimizer", ("adam", "multi_tensor")),
         ("nccl", ("nccl",)))
"""Kernel kinds by name fragments (lower case), first match wins (attention first: flash kernels name cutlass's
types); copies are told by the profiler's own names."""


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="oft_7b")
    p.add_argument("--groups", type=int, default=12)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--max-steps", type=int, default=64)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--sims", type=int, default=6)
    p.add_argument("--stages", type=int, default=2)
    p.add_argument("--micro-batch", type=int, default=128, help="samples per micro-batch of the profiled update")
    p.add_argument("--memory-gib", type=float, default=0.0, help="cap the GPU memory at this many GiB (0: none)")
    p.add_argument("--sim-ms", type=float, default=0.0)
    p.add_argument("--max-staleness", type=int, default=1, choices=(0, 1),
                   help="1 (default): the engine's weights stay on the GPU through the update, as in the loop")
    p.add_argument("--variants", nargs="*", default=[], metavar="KEY=VALUE,...",
                   help="levers, each one update alone: mb, recompute, resident, overlap, gib, kernels, precision "
                        "(docstring)")
    p.add_argument("--profile", nargs="*", default=[""], metavar="KEY=VALUE,...",
                   help="profile one update under each of these variants ('': as configured; none alone: no "
                        "profile, only the levers' rows)")
    p.add_argument("--loop-steps", type=int, default=0,
                   help="whole RL steps timed after the warm-up one (the update inside the loop, beside the rollout "
                        "ahead with --max-staleness 1)")
    p.add_argument("--kernels", default="eager", choices=("eager", "liger"),
                   help="model.kernels of the profiled update (liger: Liger Kernel's Triton kernels, on a GPU)")
    p.add_argument("--dry-run", action="store_true", help="CPU: the whole script at a tiny size, in seconds")
    args = p.parse_args()
    for name, value in (("lora_rank", 0), ("precision", "bf16"), ("action_head", "tokens"), ("run_algo", ""),
                        ("steps", 1), ("warmup_steps", 0), ("only_ours", True), ("recompute_layers", None),
                        ("resident", None), ("update_precision", "bf16")):
        setattr(args, name, value)  # what rl_step's settings read
    if "none" in args.profile:
        if len(args.profile) > 1:
            p.error(f"--profile none means no profile: leave out the others ({' '.join(args.profile)})")
        args.profile = []
    for text in args.variants + args.profile:
        Variant.parse(text)  # a bad one ends here, before anything is built
    return args


@dataclass
class Variant:
    """One lever setting of the update (unset fields: the run's own)."""

    text: str
    mb: int | None = None
    recompute: int | None = None
    resident: int | None = None
    overlap: bool = True
    gib: float | None = None
    kernels: str | None = None
    precision: str | None = None
    keys: dict[str, str] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str) -> Variant:
        known = {"mb", "recompute", "resident", "overlap", "gib", "kernels", "precision"}
        v = cls(text)
        for part in filter(None, text.split(",")):
            key, sep, value = part.partition("=")
            if not sep or key not in known:
                raise SystemExit(f"--variants {text!r}: {part!r} is not key=value with a key of {sorted(known)}")
            if key == "gib":
                v.gib = float(value)
            elif key == "overlap":
                v.overlap = value not in ("0", "false")
            elif key == "kernels":
                if value not in KERNELS:
                    raise SystemExit(f"--variants {text!r}: kernels={value!r} is not one of {', '.join(KERNELS)}")
                v.kernels = value
            elif key == "precision":
                if value not in ("bf16", "fp8"):
                    raise SystemExit(f"--variants {text!r}: precision={value!r} is not bf16 or fp8")
                v.precision = value
            else:
                setattr(v, key, int(value))
        return v

    def config(self, cfg: Config, samples: int) -> Config:
        algo = cfg.algo if self.mb is None else replace(cfg.algo, micro_batches=max(1, samples // self.mb))
        ds = cfg.deepspeed
        if self.recompute is not None:
            ds = replace(ds, recompute_layers=self.recompute)
        if self.resident is not None:
            ds = replace(ds, resident_sub_groups=self.resident)
        if self.precision is not None:
            ds = replace(ds, update_precision=rl_step.update_precision(self.precision, torch.cuda.is_available()))
        return replace(cfg, algo=algo, deepspeed=ds)


def kind_of(name: str) -> str:
    low = name.lower()
    if "memcpy" in low or low.startswith("memcpy"):
        for tag, kind in (("htod", "copy host->device"), ("dtoh", "copy device->host"), ("dtod", "copy on device")):
            if tag in low.replace(" ", "").replace("_", ""):
                return kind
        return "copy on device"
    if "memset" in low:
        return "other"
    for kind, fragments in KINDS:
        if any(f in low for f in fragments):
            return kind
    return "other"


def union_ns(spans: list[tuple[int, int]]) -> float:
    """Nanoseconds covered by the union of `spans`."""
    total, end = 0.0, float("-inf")
    for start, stop in sorted(spans):
        if stop <= end:
            continue
        total += stop - max(start, end)
        end = stop
    return total


PHASES = ("forward", "backward", "step")


def bracket(engine: Any) -> Callable[[], None]:
    """Each outermost engine call of the update (DeepSpeed's own calls nest) in a synchronised `record_function`
    range named by its phase; returns the undo."""
    from torch.profiler import record_function

    originals = {name: getattr(engine, name) for name in PHASES}
    cuda = engine.device.type == "cuda"
    depth = [0]

    def timed(name: str, call: Callable) -> Callable:
        def run(*a: Any, **k: Any) -> Any:
            if depth[0]:
                return call(*a, **k)
            depth[0] += 1
            try:
                if cuda:
                    torch.cuda.synchronize()
                with record_function(f"update/{name}"):
                    out = call(*a, **k)
                    if cuda:
                        torch.cuda.synchronize()
            finally:
                depth[0] -= 1
            return out
        return run

    for name, call in originals.items():
        setattr(engine, name, timed(name, call))

    def undo() -> None:
        for name in originals:
            delattr(engine, name)
    return undo


def profile_update(trainer: Any) -> dict[str, dict[str, float]]:
    """One update alone under the profiler: per phase, wall / busy / idle seconds and each kernel kind's seconds (the
    profiler's raw events: each kernel and copy once, on the host's clock)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if trainer.actor.device.type == "cuda" else [])
    undo = bracket(trainer.actor.engine)
    try:
        with profile(activities=activities) as prof:
            seconds, _ = rl_step.update_alone(trainer)
    finally:
        undo()
    events = list(prof.profiler.kineto_results.events())
    on_host = [e for e in events if e.device_type().name == "CPU"]
    ranges = {name: [(e.start_ns(), e.end_ns()) for e in on_host if e.name() == f"update/{name}"] for name in PHASES}
    device = [(e.start_ns(), e.end_ns(), e.name()) for e in events  # kernels and copies, not the ranges' GPU echo
              if e.device_type().name == "CUDA" and not e.name().startswith("update/")]
    print_top_kernels(device)
    table: dict[str, dict[str, float]] = {}
    for phase, spans in ranges.items():
        row: dict[str, float] = {"calls": float(len(spans)), "wall": sum(b - a for a, b in spans) / 1e9}
        inside = [d for d in device if any(a <= d[0] < b for a, b in spans)]
        row["busy"] = union_ns([(start, end) for start, end, _ in inside]) / 1e9
        row["idle"] = row["wall"] - row["busy"]
        for start, end, name in inside:
            kind = kind_of(name)
            row[kind] = row.get(kind, 0.0) + (end - start) / 1e9
        table[phase] = row
    table["update"] = {"wall": seconds}
    return table


def print_top_kernels(device: list[tuple[int, int, str]], count: int = 12) -> None:
    """The kernels that took the most time over the update, by name (cut to 90 characters), with their kind."""
    total: dict[str, list[float]] = {}
    for start, end, name in device:
        entry = total.setdefault(name[:90], [0.0, 0])
        entry[0] += (end - start) / 1e9
        entry[1] += 1
    lines = ["| kernel | kind | s | launches |", "|---|---|---|---|"]
    for name, (seconds, launches) in sorted(total.items(), key=lambda kv: -kv[1][0])[:count]:
        lines.append(f"| `{name}` | {kind_of(name)} | {seconds:.2f} | {launches:.0f} |")
    print("\n".join(lines), flush=True)


PROFILE_KINDS = ("gemm", "attention", "optimizer", "copy host->device", "copy device->host", "copy on device",
                 "nccl", "other")


def print_profile(table: dict[str, dict[str, float]]) -> None:
    head = ["phase", "calls", "wall s", "GPU busy s", "GPU idle s", *[f"{k} s" for k in PROFILE_KINDS]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for phase in PHASES:
        r = table[phase]
        lines.append(f"| {phase} | {r['calls']:.0f} | {r['wall']:.2f} | {r['busy']:.2f} | {r['idle']:.2f} | "
                     + " | ".join(f"{r.get(k, 0.0):.2f}" for k in PROFILE_KINDS) + " |")
    accounted = sum(table[p]["wall"] for p in PHASES)
    print("\n".join(lines))
    print(f"update alone under the profiler: {table['update']['wall']:.1f}s, of which the engine's calls "
          f"{accounted:.1f}s (the rest: the loss, metrics, moving the batch)", flush=True)


def run_variant(trainer: Any, cfg: Config, v: Variant, samples: int, cap_gib: float) -> dict[str, Any]:
    """The update alone under variant `v`: seconds, peak GiB, cache flushes, or out of memory. `kernels` swaps the
    actor's live policy's layers for this variant only (the same parameters under ZeRO-3's hooks)."""
    rl_step.use_update_settings(trainer, v.config(cfg, samples))
    if v.kernels is not None:
        use_kernels(trainer.actor.policy, v.kernels)
    stream = trainer.actor._states_stream
    saved = (stream.fetch, stream.send) if stream is not None else None
    if stream is not None and not v.overlap:
        stream.fetch = stream.send = None  # each copy queued on the compute stream, in turn
    gib = cap_gib if v.gib is None else v.gib
    if trainer.actor.device.type == "cuda":
        rl_step.cap_memory(gib)
    flushes = alloc_retries()
    try:
        seconds, peak = rl_step.update_alone(trainer)
        return {"seconds": seconds, "peak": peak, "flushes": alloc_retries() - flushes, "gib": gib}
    except torch.OutOfMemoryError:
        trainer.actor.engine.optimizer.zero_grad()
        if trainer.actor.device.type == "cuda":
            torch.cuda.empty_cache()
        return {"seconds": float("nan"), "peak": float("nan"), "flushes": float("nan"), "gib": gib}
    finally:
        if stream is not None and saved is not None:
            stream.fetch, stream.send = saved
        if v.kernels is not None:
            use_kernels(trainer.actor.policy, cfg.model.kernels)


def alloc_retries() -> float:
    return float(torch.cuda.memory_stats().get("num_alloc_retries", 0)) if torch.cuda.is_available() else 0.0


def main(args: argparse.Namespace) -> None:
    variants = [Variant.parse(text) for text in args.variants]
    for v in variants:
        problem = kernels_problem(v.kernels) if v.kernels else None
        if problem:
            raise SystemExit(f"--variants {v.text!r}: {problem}")
    if args.dry_run:
        args.groups, args.group_size, args.max_steps, args.workers, args.sims, args.micro_batch = 2, 4, 16, 1, 2, 8
        args.max_staleness = 0
    from vla_scale.trainer import Trainer

    substeps = rl_step.substeps_for(args.sim_ms)
    cfg = rl_step.trainer_config(args, substeps)
    if args.memory_gib:
        print(rl_step.cap_memory(args.memory_gib), flush=True)
    start = time.perf_counter()
    trainer = Trainer(cfg, tempfile.mkdtemp(prefix="update_profile_"))
    trainer.setup()
    rl_step.keep_batches(trainer)
    rl_step.warm_up(trainer, cfg)
    device = trainer.actor.device
    size, dtype = (8192, torch.bfloat16) if device.type == "cuda" else (512, torch.float32)
    rate = rl_step.matmul_rate(size, size, size, dtype=dtype)
    warm = rl_step.timed_step(trainer, "warm-up")  # the samples, and the states' first allocation and pinning
    flops = rl_step.forward_flops(trainer)
    samples = sum(len(t) for g in trainer.last_batch.groups for t in g)
    work = rl_step.passes(cfg) * flops * samples
    print(f"update_profile setup {time.perf_counter() - start:.1f}s: model={cfg.model.name} device={device} "
          f"samples={samples} micro-batches={cfg.algo.micro_batches} forward {flops / 1e12:.3f} TFLOP/sample "
          f"matmul {rate / 1e12:.1f} TFLOP/s; warm-up step {warm['step_s']:.1f}s "
          f"(update {warm['time/update_s']:.1f}s)", flush=True)
    for _ in range(args.loop_steps):
        m = rl_step.timed_step(trainer, "ours")
        print(f"step in the loop: {m['step_s']:.1f}s, update {m['time/update_s']:.1f}s "
              f"(MFU {work / m['time/update_s'] / rate:.1%}), rollout {m['time/rollout_s']:.1f}s, ahead "
              f"{m['time/rollout_ahead_s']:.1f}s, wait {m['time/rollout_wait_s']:.1f}s, sync {m['time/sync_s']:.2f}s, "
              f"GPU busy {m['gpu_busy']:.0%}, peak {m['peak_gib']:.1f} GiB", flush=True)
    for text in args.profile:
        v = Variant.parse(text)
        rl_step.use_update_settings(trainer, v.config(cfg, samples))
        if device.type == "cuda":
            rl_step.cap_memory(args.memory_gib if v.gib is None else v.gib)
        print(f"\nprofile of one update, {text or 'as configured'}:", flush=True)
        print_profile(profile_update(trainer))
    rows = []
    for v in [Variant.parse(""), *variants]:
        r = run_variant(trainer, cfg, v, samples, args.memory_gib)
        r["variant"] = v.text or "as configured"
        r["mfu"] = work / r["seconds"] / rate
        rows.append(r)
        print(f"| {r['variant']} | {r['gib']:g} | {r['seconds']:.1f} | {r['mfu']:.1%} | {r['peak']:.1f} | "
              f"{r['flushes']:.0f} |", flush=True)
    trainer.close()
    base_s, base_mfu = rows[0]["seconds"], rows[0]["mfu"]
    print("\n| variant | cap GiB (0: card) | update s | MFU | peak GiB | cache flushes |\n|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['variant']} | {r['gib']:g} | {r['seconds']:.1f} | {r['mfu']:.1%} | {r['peak']:.1f} | "
              f"{r['flushes']:.0f} |")
    fitting = [r for r in rows if r["seconds"] == r["seconds"] and (not args.memory_gib or r["gib"] == args.memory_gib)]
    best = min(fitting, key=lambda r: r["seconds"]) if fitting else rows[0]
    print(f"update_profile: base_s={base_s:.2f} base_mfu={base_mfu:.3f} best={best['variant'].replace(' ', '_')} "
          f"best_s={best['seconds']:.2f} best_mfu={best['mfu']:.3f}", flush=True)
    sys.stdout.flush()
    os._exit(0)  # Ray's and DeepSpeed's threads can hold the interpreter at exit


if __name__ == "__main__":
    arguments = parse()
    try:
        main(arguments)
    except BaseException:
        traceback.print_exc()
        sys.stdout.flush()
        os._exit(1)
