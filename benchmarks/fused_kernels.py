"""The layers `model.kernels=liger` swaps, eager beside Liger Kernel's, forward + backward at the policies' shapes.

    python benchmarks/fused_kernels.py [--batch 4] [--seq 600] [--iters 20]

bf16 on one CUDA GPU (needs liger-kernel: `pip install -e '.[kernels]'`). Shapes: OpenVLA-OFT 7B's Llama (width 4096,
MLP 11008, 32 heads of 128) over `--seq` positions, and π0's PaliGemma Gemma (width 2048, MLP 16384, 8 query heads
and one key head of 256) and its expert's adaRMS norm (width 1024) over as many; `--batch` rows. Each layer is what
the policy runs today (eager: OFT's `FusedRMSNorm`, transformers' MLPs and rotary function, π0's `rotate` and
`AdaRMSNorm`) beside its `models/liger.py` class, and one whole Llama decoder layer both ways. Per layer: the median
forward + backward time of `--iters` after warm-up (CUDA events), the memory the forward leaves for the backward
(MiB: outputs and saved tensors), and the largest error of Liger's outputs and gradients relative to the eager ones'
largest magnitude. Last lines, one per layer: `kernels: layer=<name> eager_ms=<t> liger_ms=<t> speedup=<x>`.
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import version

import torch
from torch import Tensor, nn
from transformers import GemmaConfig, LlamaConfig
from transformers.models.gemma.modeling_gemma import GemmaMLP, GemmaRMSNorm, GemmaRotaryEmbedding
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaMLP, LlamaRotaryEmbedding

from vla_scale.models.kernels import use_kernels
from vla_scale.models.oft.policy import FusedRMSNorm, _fuse_norms
from vla_scale.models.pi0.backbone import PaliGemmaWithExpert
from vla_scale.models.pi0.gemma import AdaRMSNorm

CUDA = torch.device("cuda")
BF16 = torch.bfloat16


@dataclass
class Case:
    """One layer both ways: `call(module, *inputs)`; inputs with `grad` get a gradient."""

    name: str
    shape: str
    eager: nn.Module | None
    liger: nn.Module | None
    inputs: list[Tensor]
    grad: list[bool]
    call: Callable[..., Tensor | tuple[Tensor, ...]]
    liger_call: Callable[..., Tensor | tuple[Tensor, ...]] | None = None


def randn(*shape: int) -> Tensor:
    return torch.randn(shape, device=CUDA, dtype=BF16)


def on_gpu(module: nn.Module) -> nn.Module:
    return module.to(CUDA, BF16)


def llama_cases(batch: int, seq: int) -> list[Case]:
    config = LlamaConfig(hidden_size=4096, intermediate_size=11008, num_attention_heads=32, num_key_value_heads=32,
                         hidden_act="silu", num_hidden_layers=1)
    config._attn_implementation = "sdpa"
    x = randn(batch, seq, 4096)
    cos, sin = LlamaRotaryEmbedding(config).to(CUDA)(x, torch.arange(seq, device=CUDA)[None])
    norm, mlp = on_gpu(FusedRMSNorm(4096, 1e-5)), on_gpu(LlamaMLP(config))
    layer = on_gpu(_fuse_norms(LlamaDecoderLayer(config, 0)))
    from transformers.models.llama import modeling_llama

    def rope(_: nn.Module | None, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        return modeling_llama.apply_rotary_pos_emb(q.transpose(1, 2), k.transpose(1, 2), cos, sin)

    def liger_rope(_: nn.Module | None, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        from vla_scale.models.liger import liger_rope

        return liger_rope(q.transpose(1, 2), k.transpose(1, 2), cos, sin)

    return [
        Case("llama_rms_norm", f"[{batch}, {seq}, 4096]", norm, liger_copy(norm), [x], [True], lambda m, a: m(a)),
        Case("llama_swiglu_mlp", f"[{batch}, {seq}, 4096] -> 11008", mlp, liger_copy(mlp), [x], [True],
             lambda m, a: m(a)),
        Case("llama_rope", f"q, k [{batch}, 32, {seq}, 128]", None, None,
             [randn(batch, seq, 32, 128), randn(batch, seq, 32, 128)], [True, True], rope, liger_rope),
        Case("llama_decoder_layer", f"[{batch}, {seq}, 4096]", layer, liger_copy(layer), [x], [True],
             lambda m, a: m(a, position_embeddings=(cos, sin))),
    ]


def pi0_cases(batch: int, seq: int) -> list[Case]:
    config = GemmaConfig(hidden_size=2048, intermediate_size=16384, head_dim=256, num_attention_heads=8,
                         num_key_value_heads=1, hidden_act="gelu_pytorch_tanh", hidden_activation="gelu_pytorch_tanh")
    x = randn(batch, seq, 2048)
    positions = torch.arange(seq, device=CUDA)[None].expand(batch, -1)
    cos, sin = GemmaRotaryEmbedding(config).to(CUDA)(x, positions)
    norm, mlp = on_gpu(GemmaRMSNorm(2048, 1e-6)), on_gpu(GemmaMLP(config))
    ada = on_gpu(AdaRMSNorm(1024, 1024, 1e-6))
    nn.init.normal_(ada.dense.weight, std=0.02)

    def rope(_: nn.Module | None, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        return PaliGemmaWithExpert.rotary(q, k, cos, sin)

    def liger_rope(_: nn.Module | None, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        from vla_scale.models.liger import LigerPaliGemmaWithExpert

        return LigerPaliGemmaWithExpert.rotary(q, k, cos, sin)

    return [
        Case("gemma_rms_norm", f"[{batch}, {seq}, 2048]", norm, liger_copy(norm), [x], [True], lambda m, a: m(a)),
        Case("gemma_geglu_mlp", f"[{batch}, {seq}, 2048] -> 16384", mlp, liger_copy(mlp), [x], [True],
             lambda m, a: m(a)),
        Case("pi0_rope", f"q [{batch}, 8, {seq}, 256], k [{batch}, 1, {seq}, 256]", None, None,
             [randn(batch, 8, seq, 256), randn(batch, 1, seq, 256)], [True, True], rope, liger_rope),
        Case("pi05_ada_rms_norm", f"[{batch}, {seq}, 1024]", ada, liger_copy(ada),
             [randn(batch, seq, 1024), randn(batch, 1024)], [True, True], lambda m, a, c: m(a, c)),
    ]


def liger_copy(module: nn.Module) -> nn.Module:
    return use_kernels(copy.deepcopy(module), "liger")


def forward_backward(case: Case, liger: bool) -> tuple[list[Tensor], list[Tensor], Callable[[], None]]:
    """(outputs, gradients of the inputs and parameters, one step to time) of one side."""
    module = case.liger if liger else case.eager
    call = case.liger_call if liger and case.liger_call else case.call
    xs = [x.detach().clone().requires_grad_(g) for x, g in zip(case.inputs, case.grad, strict=True)]
    params = [] if module is None else [p for p in module.parameters() if p.requires_grad]

    def step() -> list[Tensor]:
        for t in [*xs, *params]:
            t.grad = None
        out = call(module, *xs)
        outs = [out] if isinstance(out, Tensor) else [o for o in out if isinstance(o, Tensor)]
        torch.manual_seed(0)
        torch.autograd.backward(outs, [torch.randn_like(o) for o in outs])
        return outs

    outs = step()
    return outs, [t.grad for t in [*xs, *params] if t.grad is not None], step


def relative(got: list[Tensor], want: list[Tensor]) -> float:
    return max(float((a.float() - b.float()).abs().max() / b.float().abs().max()) for a, b in
               zip(got, want, strict=True))


def timed(step: Callable[[], object], iters: int) -> float:
    """Median milliseconds of `step` after warm-up."""
    for _ in range(3):
        step()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def kept_mib(case: Case, liger: bool) -> float:
    """What one forward leaves allocated for its backward (outputs and saved tensors), MiB."""
    module = case.liger if liger else case.eager
    call = case.liger_call if liger and case.liger_call else case.call
    xs = [x.detach().clone().requires_grad_(g) for x, g in zip(case.inputs, case.grad, strict=True)]
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    out = call(module, *xs)
    torch.cuda.synchronize()
    kept = (torch.cuda.memory_allocated() - before) / 2**20
    del out
    return kept


def measure(case: Case, iters: int) -> dict[str, float]:
    eager_out, eager_grads, eager_step = forward_backward(case, liger=False)
    liger_out, liger_grads, liger_step = forward_backward(case, liger=True)
    row = {"out_err": relative(liger_out, eager_out), "grad_err": relative(liger_grads, eager_grads),
           "eager_ms": timed(eager_step, iters), "liger_ms": timed(liger_step, iters),
           "eager_mib": kept_mib(case, False), "liger_mib": kept_mib(case, True)}
    row["speedup"] = row["eager_ms"] / row["liger_ms"]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=600)
    parser.add_argument("--iters", type=int, default=20)
    args = parser.parse_args()
    if not torch.cuda.is_available() or importlib.util.find_spec("liger_kernel") is None:
        raise SystemExit("benchmarks/fused_kernels.py times Liger Kernel's Triton kernels: it needs a CUDA GPU and "
                         "liger-kernel (pip install -e '.[kernels]')")
    torch.manual_seed(0)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, liger-kernel {version('liger-kernel')}, bf16, "
          f"forward + backward, median of {args.iters}")
    header = (f"{'layer':<22} {'shape':<40} {'eager ms':>9} {'liger ms':>9} {'speedup':>8} {'eager MiB':>10} "
              f"{'liger MiB':>10} {'out err':>9} {'grad err':>9}")
    print(header)
    rows = []
    for case in [*llama_cases(args.batch, args.seq), *pi0_cases(args.batch, args.seq)]:
        row = measure(case, args.iters)
        rows.append((case.name, row))
        print(f"{case.name:<22} {case.shape:<40} {row['eager_ms']:>9.3f} {row['liger_ms']:>9.3f} "
              f"{row['speedup']:>7.2f}x {row['eager_mib']:>10.1f} {row['liger_mib']:>10.1f} {row['out_err']:>9.2e} "
              f"{row['grad_err']:>9.2e}")
        case.eager = case.liger = None
        torch.cuda.empty_cache()
    for name, row in rows:
        print(f"kernels: layer={name} eager_ms={row['eager_ms']:.3f} liger_ms={row['liger_ms']:.3f} "
              f"speedup={row['speedup']:.2f}")


if __name__ == "__main__":
    main()
