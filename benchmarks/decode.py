"""Chunk decoding of the OpenVLA-OFT 7B shape on one GPU: the engine's fast path against its floor, bf16 and FP8.

    python benchmarks/decode.py [--batches 8 32 64 128] [--agree-batch 32] [--fp8] [--json out.json]
    python benchmarks/decode.py --model tiny --batches 2 4 --agree-batch 4 --fp8   # CPU dry run (FP8 emulated)

Random weights (oft_7b: DINOv2-L + SigLIP-So400m fused at 224 px, Llama-2-7B, 8 x 7 action slots, one proprio
token). Every timing is a whole `RolloutEngine.decode` (host inputs -> tokens, log-probs, actions on the host), the
median of several after warm-up. Printed:

1. the bf16 matmul rate measured here (8192^3, random data) and at the model's own GEMM shapes;
2. agreement of the fast bf16 path with the plain fp32 path on the same weights (greedy tokens, sampled tokens under
   the same generator seed, log-probs of the sampled tokens, logits), next to the plain bf16 path's;
3. per batch size: sequence length, matmul FLOPs of the padded batch (every row at the longest prompt's length),
   the floor (those FLOPs / measured rate), the fast path's time, its ratio to that floor and to the floor of the
   positions it actually runs (each row at its own length: the packed path skips the pads), chunks/s and peak
   memory, and the plain (SDPA) path's time; the plain path with eager attention at B=8 (transformers' eager
   attention and its own LlamaRMSNorm, prompts padded to the longest of the batch, as HF-based stacks decode);
4. where the fast path's time goes at B=64: stage times, GPU kernel time by kind (torch.profiler), and the SDPA
   backends on one Llama layer's attention.

With `--fp8`, an engine with `precision="fp8"` on the same weights (`models/oft/fp8.py`) beside it: the FP8 matmul
rate at the Llama GEMM shapes, the time to quantise the weights after a sync, its logits against the bf16 fast path's
(|delta| mean, 99th percentile, max; relative to the fp32 path), greedy agreement with bf16 overall and where bf16's
top-two logit gap exceeds twice the FP8 logit error (its root mean square over every logit), and per batch size its
decode time, chunks/s and peak memory; then its GPU kernel time by kind at B=64.

Last line: `decode: b64_over_floor=<x.xx> chunks_per_s_vs_eager_b8=<y.yy>`; with `--fp8`, then
`decode_fp8: fp8_over_bf16=<B=64 chunks/s ratio> fp8_over_eager_b8=<ratio> agree=<share>`.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import datetime
import json
import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import OmegaConf

from vla_scale.config import ModelConfig
from vla_scale.models.fp8 import fp8_problem
from vla_scale.models.oft import OFTPolicy, Processor
from vla_scale.models.oft.decode import OFTDecoder
from vla_scale.models.oft.policy import FusedRMSNorm
from vla_scale.models.oft.processor import PolicyInputs
from vla_scale.models.oft.vision import ViT
from vla_scale.objectives import logprobs_from_logits
from vla_scale.rollout.engine import RolloutEngine
from vla_scale.run_policy import fresh_vla

TEXTS = ["pick up the black bowl and place it on the plate", "open the top drawer", "put the cream cheese in the bowl"]
TEMPERATURE = 1.6
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def model_config(name: str) -> ModelConfig:
    yaml = OmegaConf.load(Path(__file__).resolve().parents[1] / "configs" / "model" / f"{name}.yaml")
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ModelConfig), yaml))


def make_inputs(processor: Processor, cfg: ModelConfig, batch: int, seed: int) -> PolicyInputs:
    """Host inputs as the env loop hands them to the engine (random images and proprio)."""
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, (batch, cfg.image_size, cfg.image_size, 3), dtype=np.uint8)
    proprio = rng.uniform(-1, 1, (batch, cfg.proprio_dim)).astype(np.float32)
    return processor.from_arrays(images, [TEXTS[i % 3] for i in range(batch)], proprio)


def median_seconds(fn: Callable[[], Any], repeats: int, warmup: int = 1) -> float:
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def matmul_rate(m: int, n: int, k: int, repeats: int = 20, dtype: torch.dtype = torch.bfloat16) -> float:
    """FLOP/s of one [m, k] x [k, n] product on random data (median after 3 warm-ups): the rate every benchmark
    measures its floor or MFU against."""
    a = torch.randn(m, k, device=DEVICE, dtype=dtype)
    b = torch.randn(k, n, device=DEVICE, dtype=dtype)
    return 2 * m * n * k / median_seconds(lambda: a @ b, repeats, warmup=3)


def fp8_matmul_rate(m: int, n: int, k: int, repeats: int = 20) -> float:
    """FP8 (e4m3) FLOP/s of one [m, k] x [k, n] product with per-row and per-column scales, bf16 out, as the FP8
    engine multiplies (median); NaN where the device has no FP8 tensor cores."""
    if DEVICE != "cuda" or fp8_problem(torch.device(DEVICE)) is not None:
        return float("nan")
    a = torch.randn(m, k, device=DEVICE).to(torch.float8_e4m3fn)
    b = torch.randn(n, k, device=DEVICE).to(torch.float8_e4m3fn).t()
    sa, sb = torch.ones(m, 1, device=DEVICE), torch.ones(1, n, device=DEVICE)
    return 2 * m * n * k / median_seconds(lambda: torch._scaled_mm(a, b, scale_a=sa, scale_b=sb,
                                                                   out_dtype=torch.bfloat16), repeats, warmup=3)


def sustained_rate(size: int, count: int) -> float:
    """bf16 FLOP/s of `count` back-to-back size^3 products (host clock around all of them)."""
    a = torch.randn(size, size, device=DEVICE, dtype=torch.bfloat16)
    b = torch.randn(size, size, device=DEVICE, dtype=torch.bfloat16)
    sync()
    start = time.perf_counter()
    for _ in range(count):
        a @ b
    sync()
    return 2 * size**3 * count / (time.perf_counter() - start)


# ---- FLOPs of the fast path (matrix products and attention; element-wise work not counted) ---------------------------
def _linear_params(*modules: Any) -> int:
    return sum(m.weight.numel() for m in modules)


def tower_flops(vit: ViT) -> tuple[int, int]:
    """(all, attention part: QK^T and AV) of one image through one tower."""
    spec = vit.spec
    n = spec.num_patches + spec.num_prefix_tokens
    total = 2 * spec.num_patches * vit.patch_embed.proj.weight.numel()
    attention = spec.blocks_run * 4 * n * n * spec.embed_dim
    for block in vit.blocks[: spec.blocks_run]:
        total += 2 * n * _linear_params(block.attn.qkv, block.attn.proj, block.mlp.fc1, block.mlp.fc2)
    return total + attention, attention


def decode_flops(policy: OFTPolicy, seq: int) -> dict[str, int]:
    """Per example, for a sequence of `seq` positions (what the fast path runs); `attention` is the part of the
    total spent in QK^T and AV (towers and Llama), the rest are weight GEMMs."""
    backbone, spec = policy.vision_backbone, policy.spec
    vits = [backbone.featurizer] + ([backbone.fused_featurizer] if backbone.fused_featurizer is not None else [])
    towers = sum(tower_flops(v)[0] for v in vits)
    attention = sum(tower_flops(v)[1] for v in vits)
    proj = policy.projector
    linears = [proj.fc1, proj.fc2] + ([proj.fc3] if proj.fused else [])
    projector = 2 * backbone.patches_per_image * _linear_params(*linears)
    if policy.proprio_projector is not None:
        projector += 2 * _linear_params(policy.proprio_projector.fc1, policy.proprio_projector.fc2)
    llm = policy.language_model.model
    layers = llm.layers[: llm.config.num_hidden_layers]
    k, d = spec.num_action_tokens, llm.config.hidden_size
    full = 0
    for layer in layers[:-1]:
        a, m = layer.self_attn, layer.mlp
        full += 2 * seq * _linear_params(a.q_proj, a.k_proj, a.v_proj, a.o_proj, m.gate_proj, m.up_proj, m.down_proj)
    llm_attention = (len(layers) - 1) * 4 * seq * seq * d + 4 * k * seq * d
    a, m = layers[-1].self_attn, layers[-1].mlp
    last = 2 * seq * _linear_params(a.k_proj, a.v_proj)
    last += 2 * k * _linear_params(a.q_proj, a.o_proj, m.gate_proj, m.up_proj, m.down_proj)
    llm = full + last + llm_attention
    head = 2 * k * d * spec.n_bins
    return {"towers": towers, "projector": projector, "llm": llm, "head": head,
            "total": towers + projector + llm + head, "attention": attention + llm_attention}


def sequence_length(policy: OFTPolicy, batch: PolicyInputs, trimmed: bool = True) -> int:
    """Positions the Llama backbone runs: BOS, patches, proprio, the rest of the prompt columns, slots, stop."""
    text = (batch.trimmed() if trimmed else batch).input_ids.shape[1]
    proprio = int(policy.proprio_projector is not None)
    return policy.vision_backbone.patches_per_image + proprio + text + policy.num_action_tokens + 1


def packed_flops(policy: OFTPolicy, batch: PolicyInputs) -> int:
    """FLOPs of the positions the packed fast path runs: each row at its own prompt length."""
    seq = sequence_length(policy, batch)
    lengths = batch.attention_mask.sum(dim=1)
    return sum(decode_flops(policy, seq - int(lengths.max() - n))["total"] for n in lengths)


# ---- agreement -------------------------------------------------------------------------------------------------------
def agreement(fast: RolloutEngine, plain: RolloutEngine, ref: RolloutEngine, batch: PolicyInputs) -> dict[str, float]:
    """Fast bf16 and plain bf16 against the plain fp32 path on the same weights (and fast against plain bf16)."""
    out: dict[str, float] = {}
    with torch.no_grad():
        logits = {name: e.logits(e.inputs(batch)) for name, e in (("fast", fast), ("plain", plain), ("ref", ref))}
    norm = logits["ref"].norm()
    for name in ("fast", "plain"):
        out[f"logits_rel_err_{name}"] = float((logits[name] - logits["ref"]).norm() / norm)
    greedy = {name: e.decode(batch, TEMPERATURE, greedy=True).tokens for name, e in
              (("fast", fast), ("plain", plain), ("ref", ref))}
    out["greedy_fast_vs_fp32"] = float((greedy["fast"] == greedy["ref"]).mean())
    out["greedy_plain_bf16_vs_fp32"] = float((greedy["plain"] == greedy["ref"]).mean())
    out["greedy_fast_vs_plain_bf16"] = float((greedy["fast"] == greedy["plain"]).mean())
    sampled = {}
    for name, e in (("fast", fast), ("plain", plain), ("ref", ref)):
        e.generator.manual_seed(1234)
        sampled[name] = e.decode(batch, TEMPERATURE)
    out["sampled_fast_vs_fp32"] = float((sampled["fast"].tokens == sampled["ref"].tokens).mean())
    out["sampled_plain_bf16_vs_fp32"] = float((sampled["plain"].tokens == sampled["ref"].tokens).mean())
    tokens = torch.from_numpy(sampled["fast"].tokens).to(DEVICE)
    ref_logp = logprobs_from_logits(logits["ref"], tokens, TEMPERATURE).cpu().numpy()
    diff = np.abs(sampled["fast"].logprobs - ref_logp)
    out["logprob_abs_diff_max"], out["logprob_abs_diff_mean"] = float(diff.max()), float(diff.mean())
    return out


def fp8_agreement(fp8: RolloutEngine, fast: RolloutEngine, ref: RolloutEngine, batch: PolicyInputs
                  ) -> dict[str, float]:
    """The FP8 engine's logits and greedy tokens against the bf16 fast path's on the same weights (and both against
    the fp32 path): greedy agreement overall and where bf16's top-two gap exceeds twice the FP8 logit error."""
    with torch.no_grad():
        logits = {name: e.logits(e.inputs(batch)) for name, e in (("fp8", fp8), ("bf16", fast), ("ref", ref))}
    delta = (logits["fp8"] - logits["bf16"]).abs()
    error = float(delta.pow(2).mean().sqrt())
    top2 = logits["bf16"].topk(2, dim=-1).values
    confident = (top2[..., 0] - top2[..., 1]) > 2 * error
    same = logits["fp8"].argmax(dim=-1) == logits["bf16"].argmax(dim=-1)
    norm = logits["ref"].norm()
    p99 = float(delta.flatten().float().quantile(0.99))
    return {"logit_abs_err_mean": float(delta.mean()), "logit_abs_err_p99": p99,
            "logit_abs_err_max": float(delta.max()), "logit_rms_err": error,
            "logits_rel_err_fp8_vs_fp32": float((logits["fp8"] - logits["ref"]).norm() / norm),
            "logits_rel_err_bf16_vs_fp32": float((logits["bf16"] - logits["ref"]).norm() / norm),
            "greedy_fp8_vs_bf16": float(same.float().mean()),
            "greedy_fp8_vs_fp32": float((logits["fp8"].argmax(-1) == logits["ref"].argmax(-1)).float().mean()),
            "confident_share": float(confident.float().mean()),
            "greedy_fp8_vs_bf16_where_confident": float(same[confident].float().mean()) if confident.any() else 1.0}


def first_decode(engine: RolloutEngine, x: PolicyInputs, report: dict[str, Any], key: str) -> RolloutEngine:
    """Time the engine's first decode (torch.compile included); on a compile failure, record it and return the same
    engine uncompiled."""
    start = time.perf_counter()
    try:
        engine.decode(x, TEMPERATURE)
    except Exception as error:  # noqa: BLE001 (measure the eager fast path rather than nothing)
        print(f"torch.compile failed ({type(error).__name__}: {str(error)[:400]}); {key} without compile")
        report[f"{key}_compile_error"] = repr(error)[:2000]
        engine = RolloutEngine(engine.policy, DEVICE, seed=0, fast=True, compile=False,
                               precision="fp8" if engine.fp8 is not None else "bf16",
                               emulate_fp8=engine.fp8 is not None and engine.fp8.emulate, decoder=OFTDecoder())
    report[f"first_decode_{key}_s"] = time.perf_counter() - start
    print(f"first {key} decode (torch.compile included): {report[f'first_decode_{key}_s']:.1f}s", flush=True)
    return engine


# ---- where the time goes ---------------------------------------------------------------------------------------------
def kernel_kind(name: str) -> str:
    n = name.lower()
    if any(s in n for s in ("fmha", "flash", "attention", "mem_eff", "cudnn_generated_fort")):
        return "attention"
    if any(s in n for s in ("gemm", "nvjet", "cutlass", "sm90_xmma", "cublas")):
        return "matmul"
    if "triton" in n:
        return "fused element-wise (compiled)"
    if "conv" in n:
        return "patch-embedding conv"
    if "memcpy" in n or "memset" in n:
        return "copies"
    return "other element-wise (eager)"


def profile_kinds(fn: Callable[[], Any]) -> tuple[dict[str, float], list[tuple[str, float]]]:
    """GPU kernel seconds by kind for one call of `fn`, and the ten costliest kernels."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    sync()
    with profile(activities=[ProfilerActivity.CUDA if DEVICE == "cuda" else ProfilerActivity.CPU]) as prof:
        fn()
        sync()
    kinds: dict[str, float] = defaultdict(float)
    kernels: list[tuple[str, float]] = []
    for event in prof.key_averages():
        seconds = getattr(event, "self_device_time_total", getattr(event, "self_cuda_time_total", 0)) / 1e6
        if seconds <= 0:
            continue
        kinds[kernel_kind(event.key)] += seconds
        kernels.append((event.key, seconds))
    kernels.sort(key=lambda item: -item[1])
    return dict(kinds), kernels[:25]


@torch.no_grad()
def where_time_goes(fast: RolloutEngine, policy: OFTPolicy, x: PolicyInputs, repeats: int
                    ) -> tuple[dict[str, float], dict[str, float], list[tuple[str, float]]]:
    """Stage times of the fast path (host copy, towers on two streams and on one, whole forward compiled and not,
    whole decode) and its GPU kernel time by kind."""
    assert fast.fast is not None
    stages: dict[str, float] = {}
    on_device = fast.inputs(x)
    stages["h2d pinned (engine.inputs)"] = median_seconds(lambda: fast.inputs(x), repeats)
    fast.pin_memory = False
    stages["h2d pageable"] = median_seconds(lambda: fast.inputs(x), repeats)
    fast.pin_memory = DEVICE == "cuda"
    pixels = on_device.pixel_values.to(policy.projector.fc1.weight.dtype)
    stages["vision towers"] = median_seconds(lambda: fast.fast.vision(pixels), repeats)
    fast.fast.side_by_side = False
    stages["vision towers, one stream"] = median_seconds(lambda: fast.fast.vision(pixels), repeats)
    fast.fast.side_by_side = True
    stages["forward (towers..bins)"] = median_seconds(lambda: fast.logits(on_device), repeats)
    kinds, kernels = profile_kinds(lambda: fast.logits(on_device))
    eager = RolloutEngine(policy, DEVICE, seed=0, fast=True, compile=False, decoder=OFTDecoder())
    stages["forward, not compiled"] = median_seconds(lambda: eager.logits(on_device), repeats)
    stages["decode (all)"] = median_seconds(lambda: fast.decode(x, TEMPERATURE), repeats)
    return stages, kinds, kernels


def sdpa_backends(batch: int, seq: int, heads: int = 32, dim: int = 128) -> dict[str, float]:
    """Seconds of one bidirectional Llama attention [batch, heads, seq, dim] (bf16, no mask, the packed path's layout)
    per SDPA backend, median of 20."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v = (torch.randn(batch, seq, heads, dim, device=DEVICE, dtype=torch.bfloat16).transpose(1, 2)
               for _ in range(3))
    out = {}
    for backend in (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION):
        try:
            with sdpa_kernel(backend):
                out[backend.name] = median_seconds(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v),
                                                   20, warmup=3)
        except RuntimeError as error:
            out[backend.name] = float("nan")
            print(f"{backend.name}: {str(error)[:120]}")
    return out


def gap_table(stages: dict[str, float], kinds: dict[str, float], flops: dict[str, int], rate: float
              ) -> dict[str, float]:
    """Decode time minus floor, split: weight GEMMs over their floor, attention kernels over theirs, element-wise
    kernels, time between kernels inside the forward, and what the engine does around the forward."""
    gemm_floor = (flops["total"] - flops["attention"]) / rate
    gemm = kinds.get("matmul", 0.0) + kinds.get("patch-embedding conv", 0.0)
    attention = kinds.get("attention", 0.0)
    elementwise = sum(v for k, v in kinds.items() if k not in ("matmul", "patch-embedding conv", "attention"))
    return {"floor": flops["total"] / rate,
            f"GEMM kernels over their floor ({gemm:.4f}s at {gemm_floor * rate / max(gemm, 1e-9) / 1e12:.0f} TFLOP/s)":
                gemm - gemm_floor,
            f"attention kernels over their floor ({attention:.4f}s)": attention - flops["attention"] / rate,
            "element-wise kernels (norms, rotary, activations, adds, copies)": elementwise,
            "between kernels (launch gaps, host work in the forward; overlap of the towers counts against it)":
                stages["forward (towers..bins)"] - sum(kinds.values()),
            "around the forward (H2D, sampling, log-probs, D2H, actions)": stages["decode (all)"] - stages[
                "forward (towers..bins)"]}


@contextlib.contextmanager
def transformers_norms(policy: OFTPolicy) -> Iterator[None]:
    """transformers' own LlamaRMSNorm (element-wise passes in float32) in place of our fused one, as HF-based stacks
    run it: the same parameters and results up to rounding, another forward."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    fused = [m for m in policy.language_model.modules() if isinstance(m, FusedRMSNorm)]
    for module in fused:
        module.__class__ = LlamaRMSNorm
    try:
        yield
    finally:
        for module in fused:
            module.__class__ = FusedRMSNorm


def set_attention(policy: OFTPolicy, name: str) -> str:
    """Switch the Llama backbone's attention implementation; returns the previous one."""
    llm = policy.language_model
    before = llm.config._attn_implementation
    if hasattr(llm, "set_attn_implementation"):
        llm.set_attn_implementation(name)
    else:
        llm.config._attn_implementation = name
    assert llm.config._attn_implementation == name, llm.config._attn_implementation
    return before


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="oft_7b")
    p.add_argument("--batches", type=int, nargs="+", default=[8, 32, 64, 128])
    p.add_argument("--agree-batch", type=int, default=32)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--json", default="")
    p.add_argument("--fp8", action="store_true", help="an FP8 engine beside bf16 (emulated in fp32 on a CPU)")
    args = p.parse_args()
    torch._dynamo.config.cache_size_limit = 64  # bf16 and FP8 blocks of two towers, each compiled once
    report: dict[str, Any] = {"date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                              "gpu": torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu",
                              "torch": torch.__version__}
    print(f"{report['date']}  {report['gpu']}  torch {report['torch']}", flush=True)

    # first GPU work of the run (the card as found, at rest): median of 20 after 3 warm-ups, as KINDS.md measures it;
    # then the rate a second of back-to-back products sustains (what a long forward pass sees)
    size = 8192 if DEVICE == "cuda" else 512
    rate = matmul_rate(size, size, size)
    sustained = sustained_rate(size, 1000 if DEVICE == "cuda" else 5)
    report["matmul_tflops_8192"], report["matmul_tflops_8192_sustained"] = rate / 1e12, sustained / 1e12
    m = 64 * 338 if DEVICE == "cuda" else 256
    shapes = {"q/k/v/o": (m, 4096, 4096), "gate/up": (m, 11008, 4096), "down": (m, 4096, 11008)}
    report["matmul_tflops_shapes"] = {name: matmul_rate(*s) / 1e12 for name, s in shapes.items()}
    print(f"bf16 matmul 8192^3: {rate / 1e12:.0f} TFLOP/s (median of 20), {sustained / 1e12:.0f} sustained over "
          "1000 back to back; at the Llama GEMMs of B=64 (M=64*338): "
          + ", ".join(f"{k} {v:.0f}" for k, v in report["matmul_tflops_shapes"].items()), flush=True)

    cfg = model_config(args.model)
    vla = fresh_vla(cfg, TEXTS)
    processor = vla.processor
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    with torch.device(DEVICE):
        policy = vla.new_policy()
    torch.set_default_dtype(torch.float32)
    print(f"{args.model}: {sum(q.numel() for q in policy.parameters()) / 1e9:.3f}B parameters (bf16, random)",
          flush=True)
    # on CUDA the engine's defaults: fast path, compiled, pinned staging (CPU dry run: fast path, eager)
    fast = (RolloutEngine(policy, DEVICE, seed=0, decoder=OFTDecoder()) if DEVICE == "cuda"
            else RolloutEngine(policy, seed=0, fast=True, decoder=OFTDecoder()))
    plain = RolloutEngine(policy, DEVICE, seed=0, fast=False, decoder=OFTDecoder())
    assert fast.fast is not None and fast.fast.compiled == (DEVICE == "cuda") and plain.fast is None

    fast = first_decode(fast, make_inputs(processor, cfg, 8, seed=99), report, "fast")
    fp8 = None
    if args.fp8:  # the same weights (shared with the bf16 engines), multiplied in FP8
        fp8 = RolloutEngine(policy, DEVICE, seed=0, precision="fp8", emulate_fp8=DEVICE != "cuda", decoder=OFTDecoder())
        assert fp8.fp8 is not None
        report["fp8_quantise_s"] = median_seconds(lambda: fp8.fp8.refresh(policy), 3)
        report["fp8_weight_gib"] = fp8.fp8.nbytes() / 2**30
        report["fp8_matmul_tflops_shapes"] = {name: fp8_matmul_rate(*s) / 1e12 for name, s in shapes.items()}
        print(f"fp8 weights {report['fp8_weight_gib']:.2f} GiB, quantised after a sync in "
              f"{report['fp8_quantise_s']:.3f}s; fp8 matmul at the Llama GEMMs of B=64: "
              + ", ".join(f"{k} {v:.0f}" for k, v in report["fp8_matmul_tflops_shapes"].items()), flush=True)
        fp8 = first_decode(fp8, make_inputs(processor, cfg, 8, seed=99), report, "fp8")

    ref = RolloutEngine(copy.deepcopy(policy).float(), DEVICE, seed=0, fast=False, decoder=OFTDecoder())
    agree_inputs = make_inputs(processor, cfg, args.agree_batch, seed=7)
    report["agreement"] = agreement(fast, plain, ref, agree_inputs)
    if fp8 is not None:
        report["fp8_agreement"] = fp8_agreement(fp8, fast, ref, agree_inputs)
        print(f"fp8 agreement at B={args.agree_batch}: "
              + ", ".join(f"{k}={v:.4g}" for k, v in report["fp8_agreement"].items()), flush=True)
    del ref
    if DEVICE == "cuda":
        torch.cuda.empty_cache()
    print(f"agreement at B={args.agree_batch} (same weights; fp32 = plain path in float32): "
          + ", ".join(f"{k}={v:.4g}" for k, v in report["agreement"].items()), flush=True)

    rows = []
    for batch in args.batches:
        x = make_inputs(processor, cfg, batch, seed=batch)
        seq = sequence_length(policy, x)
        flops = decode_flops(policy, seq)
        if DEVICE == "cuda":
            torch.cuda.reset_peak_memory_stats()
        t_fast = median_seconds(lambda x=x: fast.decode(x, TEMPERATURE), args.repeats)
        peak = torch.cuda.max_memory_allocated() / 2**30 if DEVICE == "cuda" else 0.0
        t_plain = median_seconds(lambda x=x: plain.decode(x, TEMPERATURE), args.repeats)
        t_fp8, peak_fp8 = float("nan"), float("nan")
        if fp8 is not None:
            if DEVICE == "cuda":
                torch.cuda.reset_peak_memory_stats()
            t_fp8 = median_seconds(lambda x=x: fp8.decode(x, TEMPERATURE), args.repeats)
            peak_fp8 = torch.cuda.max_memory_allocated() / 2**30 if DEVICE == "cuda" else 0.0
        row = {"fp8_s": t_fp8, "fp8_peak_gib": peak_fp8,
               "B": batch, "T_fast": seq, "T_plain": sequence_length(policy, x, trimmed=False),
               "gflop": batch * flops["total"] / 1e9, "floor_s": batch * flops["total"] / rate, "fast_s": t_fast,
               "packed_floor_s": packed_flops(policy, x) / rate,
               "plain_s": t_plain, "peak_gib": peak, "flops_split": {k: batch * v for k, v in flops.items()}}
        rows.append(row)
        print(f"B={batch}: fast {t_fast:.3f}s floor {row['floor_s']:.3f}s plain {t_plain:.3f}s fp8 {t_fp8:.3f}s",
              flush=True)
    report["rows"] = rows

    x8 = make_inputs(processor, cfg, 8, seed=8)
    x8_trim = x8.trimmed()
    before = set_attention(policy, "eager")
    with transformers_norms(policy):
        t_eager = median_seconds(lambda: plain.decode(x8_trim, TEMPERATURE), args.repeats)
        t_eager_padded = median_seconds(lambda: plain.decode(x8, TEMPERATURE), args.repeats)
    set_attention(policy, before)
    report["eager_b8_s"], report["eager_b8_padded64_s"] = t_eager, t_eager_padded

    stage_batch = 64 if 64 in args.batches else args.batches[-1]
    x64 = make_inputs(processor, cfg, stage_batch, seed=64)
    stages, kinds, kernels = where_time_goes(fast, policy, x64, args.repeats)
    report["stages_b64"], report["kernel_kinds_b64"], report["top_kernels_b64"] = stages, kinds, kernels
    report["sdpa_backends_b64"] = sdpa_backends(stage_batch, sequence_length(policy, x64)) if DEVICE == "cuda" else {}
    if fp8 is not None:
        report["fp8_kernel_kinds_b64"], report["fp8_top_kernels_b64"] = profile_kinds(
            lambda: fp8.logits(fp8.inputs(x64)))

    print()
    print(f"bf16 matmul rate measured here: {rate / 1e12:.0f} TFLOP/s (8192^3, random data, median of 20, first work "
          f"of the run; {sustained / 1e12:.0f} sustained); floor = matmul and attention FLOPs / that rate")
    print(f"{'B':>4} {'T':>4} {'TFLOP':>7} {'floor s':>8} {'fast s':>8} {'/floor':>7} {'/packed':>8} {'chunks/s':>9}"
          f" {'peak GiB':>9} {'plain s':>8} {'T plain':>8}")
    for r in rows:
        print(f"{r['B']:>4} {r['T_fast']:>4} {r['gflop'] / 1e3:>7.1f} {r['floor_s']:>8.3f} {r['fast_s']:>8.3f} "
              f"{r['fast_s'] / r['floor_s']:>7.2f} {r['fast_s'] / r['packed_floor_s']:>8.2f} "
              f"{r['B'] / r['fast_s']:>9.1f} {r['peak_gib']:>9.1f} {r['plain_s']:>8.3f} {r['T_plain']:>8}")
    b64 = next((r for r in rows if r["B"] == 64), rows[-1])
    fast_rate = b64["B"] / b64["fast_s"]
    print(f"transformers' eager attention and RMSNorm (plain path, bf16) B=8: {t_eager:.3f}s = "
          f"{8 / t_eager:.1f} chunks/s with prompts padded to "
          f"the batch's longest (fast B={b64['B']}: {fast_rate / (8 / t_eager):.2f}x); padded to max_text_len as the "
          f"Processor gives them: {t_eager_padded:.3f}s = {8 / t_eager_padded:.1f} chunks/s "
          f"({fast_rate / (8 / t_eager_padded):.2f}x)")
    print("(/packed: against the floor of the positions the packed path runs, each row at its own prompt length)")
    print(f"fast B={b64['B']} against the sustained rate's floor: "
          f"{b64['fast_s'] / (b64['floor_s'] * rate / sustained):.2f}x")
    print(f"fast path at B={stage_batch}, seconds: " + ", ".join(f"{k} {v:.4f}" for k, v in stages.items()))
    if report["sdpa_backends_b64"]:
        print(f"SDPA at B={stage_batch}, one Llama layer (bf16, no mask), seconds: "
              + ", ".join(f"{k} {v:.5f}" for k, v in report["sdpa_backends_b64"].items()))
    total = sum(kinds.values())
    print(f"GPU kernel time by kind at B={stage_batch} (one forward, {total:.4f}s): "
          + ", ".join(f"{k} {v:.4f}" for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])))
    for name, seconds in kernels[:15]:
        print(f"  {seconds:.4f}s  {name[:110]}")
    gap = gap_table(stages, kinds, next(r for r in rows if r["B"] == stage_batch)["flops_split"], rate)
    report["gap_b64"] = gap
    print(f"gap to the floor at B={stage_batch} (decode {stages['decode (all)']:.4f}s, floor {gap['floor']:.4f}s):")
    for name, seconds in gap.items():
        if name != "floor":
            print(f"  {name:<66} {seconds:>8.4f}s")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1, default=str))
    print(f"decode: b64_over_floor={b64['fast_s'] / b64['floor_s']:.2f} "
          f"chunks_per_s_vs_eager_b8={fast_rate / (8 / t_eager):.2f}")
    if fp8 is not None:
        print_fp8(report, rows, b64, t_eager)


def print_fp8(report: dict[str, Any], rows: list[dict[str, Any]], b64: dict[str, Any], t_eager: float) -> None:
    """The FP8 engine's table, kernel split and last line."""
    print(f"\nfp8 engine (e4m3, per-channel weight and per-row activation scales; quantised after a sync in "
          f"{report['fp8_quantise_s']:.3f}s, {report['fp8_weight_gib']:.2f} GiB of FP8 weights beside the bf16 ones)")
    print(f"{'B':>4} {'bf16 s':>8} {'fp8 s':>8} {'fp8/bf16 time':>14} {'chunks/s':>9} {'fp8 peak GiB':>13}")
    for r in rows:
        print(f"{r['B']:>4} {r['fast_s']:>8.3f} {r['fp8_s']:>8.3f} {r['fp8_s'] / r['fast_s']:>14.2f} "
              f"{r['B'] / r['fp8_s']:>9.1f} {r['fp8_peak_gib']:>13.1f}")
    kinds = report["fp8_kernel_kinds_b64"]
    print(f"fp8 GPU kernel time by kind at B={b64['B']} (one forward, {sum(kinds.values()):.4f}s): "
          + ", ".join(f"{k} {v:.4f}" for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])))
    for name, seconds in report["fp8_top_kernels_b64"][:10]:
        print(f"  {seconds:.4f}s  {name[:110]}")
    a = report["fp8_agreement"]
    print(f"greedy bins, fp8 against bf16: {a['greedy_fp8_vs_bf16']:.4f} of all; "
          f"{a['greedy_fp8_vs_bf16_where_confident']:.4f} where bf16's top-two gap > 2 x the fp8 logit error "
          f"({a['logit_rms_err']:.4f} rms; {a['confident_share']:.4f} of the positions)")
    speed = b64["fast_s"] / b64["fp8_s"]
    print(f"decode_fp8: fp8_over_bf16={speed:.2f} fp8_over_eager_b8={(b64['B'] / b64['fp8_s']) / (8 / t_eager):.2f} "
          f"agree={a['greedy_fp8_vs_bf16_where_confident']:.4f}")


if __name__ == "__main__":
    main()
