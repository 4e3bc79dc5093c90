"""Weight sync from a ZeRO-3 actor into the rollout engine: time and extra memory against bucket size, the bandwidth
floor, colocated memory, and (on GPUs) the actor's training-step MFU.

    python benchmarks/weight_sync.py                                   # CPU, 1 rank, a 172.5M-parameter policy
    deepspeed --num_gpus 2 benchmarks/weight_sync.py                   # CPU, 2 ranks over gloo
    torchrun --nproc_per_node 2 benchmarks/weight_sync.py --model oft_7b --buckets 128 512 2048 --mfu-batch 16

Random weights. Every rank holds a ZeRO-3 shard of the actor (built under `zero.Init`) and a full rollout engine on
its own device; one sync gathers the actor's parameters bucket by bucket (collectives over all ranks), copies each
bucket into the engine and proves the result by checksums (`parallel/sync/weight_sync.py`). Printed by rank 0:

1. the floor: all-gather bandwidth and device copy bandwidth measured here, and the time to all-gather every
   parameter once and copy it into the engine at those rates;
2. per bucket size: the sync's median time (of which verification), effective GB/s, × floor, and the extra peak
   memory over the steady state (GPU: allocator peak; CPU: sampled RSS);
3. colocated memory: allocated memory with actor and engine resident, with the actor's optimizer state
   offloaded (rollout), with the engine released (update), and the time of each move;
4. with --mfu-batch B..: one GRPO update of B samples per rank, its time and MFU (model FLOPs counted by
   torch's FlopCounterMode on the forward, times 3 for forward and backward, over the H200's 989 TFLOP/s dense bf16
   and over the matmul rate measured here).

Last line: `weight_sync: params=<n> bucket_mb=<b> seconds=<t> peak_mib=<m>` for the fastest bucket size.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import psutil
import torch
import torch.distributed as dist
from omegaconf import OmegaConf

from vla_scale.batches import MicroBatch, MiniBatch, RowIndex, UpdatePlan
from vla_scale.config import AlgoConfig, DeepSpeedConfig, ModelConfig
from vla_scale.models.oft import PretrainedVLA
from vla_scale.models.oft.decode import OFTDecoder
from vla_scale.parallel.actor import Actor
from vla_scale.parallel.sync.weight_sync import gathered_buckets, sync_weights
from vla_scale.rollout.engine import RolloutEngine
from vla_scale.run_policy import fresh_vla
from vla_scale.run_setup import init_distributed

sys.path.insert(0, str(Path(__file__).resolve().parent))
from decode import matmul_rate  # noqa: E402

TEXTS = ["pick up the black bowl and place it on the plate", "open the top drawer", "put the cream cheese in the bowl"]
H200_BF16_DENSE = 989e12
CPU_100M = dict(name="cpu100m", image_size=64, patch_size=8, vision_dim=256, vision_layers=2, hidden_size=1024,
                num_layers=8, num_heads=8, intermediate_size=2816, vocab_size=32064)


def model_config(name: str) -> ModelConfig:
    if name == "cpu100m":
        return ModelConfig(**CPU_100M)
    yaml = OmegaConf.load(Path(__file__).resolve().parents[1] / "configs" / "model" / f"{name}.yaml")
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ModelConfig), yaml))


def say(*args: object) -> None:
    if dist.get_rank() == 0:
        print(*args, flush=True)


def sync_device(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed(fn: Callable[[], object], device: torch.device, repeats: int = 3) -> float:
    times = []
    for _ in range(repeats):
        dist.barrier()
        sync_device(device)
        start = time.perf_counter()
        fn()
        sync_device(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


class PeakMemory:
    """Extra memory at the peak of a block over its start: the allocator's peak on a GPU, sampled RSS on CPU."""

    def __init__(self, device: torch.device):
        self.device, self.peak, self._stop = device, 0, threading.Event()

    def __enter__(self) -> PeakMemory:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
            self.base = torch.cuda.memory_allocated()
        else:
            self.base = self.peak = psutil.Process().memory_info().rss
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def _sample(self) -> None:
        proc = psutil.Process()
        while not self._stop.wait(0.002):
            self.peak = max(self.peak, proc.memory_info().rss)

    def __exit__(self, *exc: object) -> None:
        if self.device.type == "cuda":
            self.peak = torch.cuda.max_memory_allocated()
        else:
            self._stop.set()
            self._thread.join()

    @property
    def extra_mib(self) -> float:
        return (self.peak - self.base) / 2**20


def floor_rates(device: torch.device, world: int) -> tuple[float, float]:
    """(all-gather output bytes/s, device copy bytes/s counting read + write), measured on 256 MiB per rank."""
    n = 2**28 // 2
    shard = torch.ones(n, dtype=torch.bfloat16, device=device)
    full = torch.empty(n * world, dtype=torch.bfloat16, device=device)
    gather_s = timed(lambda: dist.all_gather_into_tensor(full, shard), device, 5) if world > 1 else float("inf")
    dst = torch.empty_like(full)
    copy_s = timed(lambda: dst.copy_(full), device, 5)
    return full.numel() * 2 / gather_s, 2 * full.numel() * 2 / copy_s


def build(vla: PretrainedVLA, ds: DeepSpeedConfig, device: torch.device):
    dtype = torch.bfloat16 if ds.bf16 else torch.float32
    torch.manual_seed(0)
    actor = Actor(vla.new_policy, ds, AlgoConfig(micro_batches=1, lr=1e-6), scorer=vla.chunk_scorer())
    torch.set_default_dtype(dtype)  # the engine's copy is built in its own dtype, on its own device
    with device:
        policy = vla.new_policy()
    torch.set_default_dtype(torch.float32)
    return actor, RolloutEngine(policy, device, fast=False, compile=False, decoder=OFTDecoder())


def bucket_table(actor: Actor, engine: RolloutEngine, buckets: list[int], floor_s: float, verified_floor_s: float,
                 repeats: int):
    say(f"{'bucket MB':>9} {'buckets':>7} {'gather s':>8} {'unverif. s':>10} {'x floor':>7} {'sync s':>8} "
        f"{'verify s':>8} {'GB/s':>7} {'x floor':>7} {'x v.floor':>9} {'extra MiB':>9}")
    rows = []
    version = 0
    for mb in buckets:
        gather_s = timed(lambda mb=mb: [None for _ in gathered_buckets(actor.policy, mb)], engine.device, repeats)
        plain_s = timed(lambda mb=mb: sync_weights(actor.policy, engine, 0, mb, verify=False), engine.device, repeats)
        times, verify, extra = [], [], []
        for _ in range(repeats):
            version += 1
            dist.barrier()
            with PeakMemory(engine.device) as mem:
                report = sync_weights(actor.policy, engine, version, mb)
            times.append(report.seconds)
            verify.append(report.verify_seconds)
            extra.append(mem.extra_mib)
        seconds = statistics.median(times[1:] if repeats > 1 else times)
        peak = max(extra[1:] if repeats > 1 else extra)
        say(f"{mb:>9} {report.buckets:>7} {gather_s:>8.3f} {plain_s:>10.3f} {plain_s / floor_s:>7.2f} {seconds:>8.3f} "
            f"{statistics.median(verify):>8.3f} "
            f"{report.bytes / seconds / 1e9:>7.1f} {seconds / floor_s:>7.2f} {seconds / verified_floor_s:>9.2f} "
            f"{peak:>9.0f}")
        rows.append((mb, seconds, peak))
    return rows


def gather_check(actor: Actor, bucket_mb: int) -> None:
    """Our gathers against DeepSpeed's own (`GatheredParameters`, a few parameters at a time): same checksum?"""
    import deepspeed

    from vla_scale.tensors.checksum import Fingerprints

    ours, theirs = Fingerprints(), Fingerprints()
    for bucket in gathered_buckets(actor.policy, bucket_mb):
        ours.add(bucket)
    params = list(actor.policy.named_parameters())
    for i in range(0, len(params), 16):
        chunk = params[i : i + 16]
        with deepspeed.zero.GatheredParameters([p for _, p in chunk]):
            theirs.add([(name, p.data) for name, p in chunk])
    same = ours.checksum() == theirs.checksum()
    say(f"gather check: our coalesced all-gathers == DeepSpeed's GatheredParameters: {same} ({ours.checksum()})")
    if not same:
        raise SystemExit("the gathered weights differ from DeepSpeed's")


def allocated_gib(device: torch.device) -> float:
    """Memory in use: the GPU allocator's on a GPU, the process RSS on CPU."""
    if device.type == "cuda":
        return torch.cuda.memory_allocated() / 2**30
    return psutil.Process().memory_info().rss / 2**30


def verify_parts(engine: RolloutEngine, bucket_mb: int) -> None:
    """Where a sync's verification goes: the bit comparison and the fingerprints, each over the whole model."""
    from vla_scale.parallel.sync.weight_sync import _bucket_plan, _compare
    from vla_scale.tensors.checksum import fingerprints

    named = dict(engine.policy.named_parameters())
    chunks = _bucket_plan(engine.policy, bucket_mb)  # compared with themselves by bucket: the reads of a real check

    def compare() -> bool:
        return torch.stack([flag for chunk in chunks for _, flag in _compare(chunk, named)]).any().item()

    compare_s = timed(compare, engine.device, 3)
    fingerprint_s = timed(lambda: fingerprints(list(named.values())).cpu(), engine.device, 3)
    say(f"verification over the whole model: bit comparison {compare_s:.3f} s, "
        f"fingerprints {fingerprint_s:.3f} s")


def colocated_memory(actor: Actor, engine: RolloutEngine, bucket_mb: int) -> None:
    gib = lambda: allocated_gib(engine.device)  # noqa: E731
    say(f"{'state':<44} {'allocated GiB':>13} {'move s':>7}")
    say(f"{'actor + engine resident (after an update)':<44} {gib():>13.1f} {'':>7}")
    moves = [("actor optimizer state offloaded (first: pins)", actor.offload_states),
             ("actor optimizer state reloaded", actor.reload_states),
             ("actor optimizer state offloaded (rollout)", actor.offload_states),
             ("... and engine released (update, states back)", lambda: (engine.release_memory_occupation(),
                                                                        actor.reload_states())),
             ("actor offloaded, engine resumed + synced", lambda: (actor.offload_states(),
                                                                   engine.resume_memory_occupation(),
                                                                   sync_weights(actor.policy, engine, 10**6,
                                                                                bucket_mb)))]
    for label, move in moves:
        seconds = timed(move, engine.device, repeats=1)
        say(f"{label:<44} {gib():>13.1f} {seconds:>7.2f}")
    actor.reload_states()


def micro_batch(cfg: ModelConfig, vla: PretrainedVLA, batch: int, seed: int):
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, (batch, cfg.image_size, cfg.image_size, 3), dtype=np.uint8)
    proprio = rng.uniform(-1, 1, (batch, cfg.proprio_dim)).astype(np.float32)
    prepared = vla.processor.transform.prepare(images[:, None])
    inputs = vla.processor.encode(prepared, [TEXTS[i % 3] for i in range(batch)], proprio)
    k = cfg.chunk_len * cfg.action_dim
    tokens = torch.from_numpy(rng.integers(0, cfg.n_bins, (batch, k)))
    advantages = torch.from_numpy(rng.choice([-1.0, 1.0], batch).astype(np.float32))
    mask = torch.ones(batch, k, dtype=torch.bool)
    return MicroBatch(inputs, tokens, torch.full((batch, k), -np.log(cfg.n_bins), dtype=torch.float32), advantages,
                      mask, mask.float() / mask.numel(), RowIndex.first_steps(batch))


def mfu(actor: Actor, engine: RolloutEngine, cfg: ModelConfig, vla: PretrainedVLA, batch: int) -> None:
    from torch.utils.flop_counter import FlopCounterMode

    mb = micro_batch(cfg, vla, batch, dist.get_rank())
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        engine.policy(mb.inputs.on(engine.device))
    flops = 3 * counter.get_total_flops()  # forward + backward (twice the forward)
    engine.release_memory_occupation()  # colocated: the engine's weights leave while the actor updates
    actor.update(UpdatePlan((MiniBatch((mb,)),)))  # warm-up
    if engine.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    seconds = timed(lambda: actor.update(UpdatePlan((MiniBatch((mb,)),))), engine.device, 3)
    peak = torch.cuda.max_memory_allocated() / 2**30 if engine.device.type == "cuda" else allocated_gib(engine.device)
    rate = matmul_rate(8192, 8192, 8192)
    say(f"{'update B/rank':>13} {'seconds':>8} {'TFLOP/rank':>10} {'MFU (989)':>10} {'MFU (matmul)':>12} "
        f"{'matmul TFLOP/s':>14} {'peak GiB':>8}")
    say(f"{batch:>13} {seconds:>8.3f} {flops / 1e12:>10.1f} {flops / seconds / H200_BF16_DENSE:>10.1%} "
        f"{flops / seconds / rate:>12.1%} {rate / 1e12:>14.0f} {peak:>8.1f}")
    engine.resume_memory_occupation()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="cpu100m", help="cpu100m, or a configs/model name (oft_7b)")
    p.add_argument("--buckets", type=int, nargs="+", default=[16, 64, 256])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--mfu-batch", type=int, nargs="*", default=[], help="samples per rank for MFU updates")
    p.add_argument("--ds", nargs="*", default=[], help="DeepSpeedConfig overrides, e.g. activation_checkpointing=true")
    p.add_argument("--skip-memory", action="store_true", help="leave out the colocated-memory table")
    p.add_argument("--local_rank", type=int, default=0, help=argparse.SUPPRESS)  # the deepspeed launcher adds it
    args = p.parse_args()
    rank, world = init_distributed()
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    cfg = model_config(args.model)
    vla = fresh_vla(cfg, TEXTS)
    start = time.perf_counter()
    ds = DeepSpeedConfig(zero_stage=3, bf16=device.type == "cuda")
    for item in args.ds:
        key, value = item.split("=", 1)
        setattr(ds, key, type(getattr(ds, key))(float(value)) if value[0].isdigit() else value == "true")
    say(f"deepspeed: {ds}")
    actor, engine = build(vla, ds, device)
    params = sum(p.numel() for p in engine.policy.parameters())
    nbytes = sum(p.numel() * p.element_size() for p in engine.policy.parameters())
    dtype = next(engine.policy.parameters()).dtype
    say(f"{args.model}: {params / 1e6:.1f}M parameters ({nbytes / 1e9:.2f} GB as {dtype}), "
        f"{world} rank(s) on {device.type}, built in {time.perf_counter() - start:.1f}s, torch {torch.__version__}")
    gather_bw, copy_bw = floor_rates(device, world)
    floor_s = (nbytes / gather_bw if world > 1 else 0.0) + 2 * nbytes / copy_bw
    say(f"floor: all-gather {gather_bw / 1e9:.0f} GB/s (output bytes), copy {copy_bw / 1e9:.0f} GB/s (read+write): "
        f"{nbytes / 1e9:.2f} GB / {gather_bw / 1e9:.0f} + 2 x {nbytes / 1e9:.2f} GB / {copy_bw / 1e9:.0f} "
        f"= {floor_s:.3f} s")
    verify_bytes = 2 * nbytes + 2 * nbytes / world  # compare both copies; two fingerprint passes over this rank's half
    verified_floor_s = floor_s + verify_bytes / copy_bw
    say(f"verified floor: + ({2 * nbytes / 1e9:.2f} + {2 * nbytes / world / 1e9:.2f}) GB read / "
        f"{copy_bw / 1e9:.0f} = {verified_floor_s:.3f} s")
    first = UpdatePlan((MiniBatch((micro_batch(cfg, vla, 2, rank),)),))
    actor.update(first)  # optimizer state exists from here on
    gather_check(actor, args.buckets[-1])
    rows = bucket_table(actor, engine, args.buckets, floor_s, verified_floor_s, args.repeats)
    verify_parts(engine, args.buckets[-1])
    if not args.skip_memory:
        colocated_memory(actor, engine, min(rows, key=lambda r: r[1])[0])
    for batch in args.mfu_batch:
        try:
            mfu(actor, engine, cfg, vla, batch)
        except torch.OutOfMemoryError:
            say(f"{batch:>13} out of GPU memory (no larger batch tried)")
            break
    mb, seconds, peak = min(rows, key=lambda r: r[1])
    say(f"weight_sync: params={params} bucket_mb={mb} seconds={seconds:.3f} peak_mib={peak:.0f}")


if __name__ == "__main__":
    main()
