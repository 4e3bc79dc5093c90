"""The FP8 products' arithmetic as an H100 computes it, checked on the CPU through mmaemu (bit-exact emulation of the
H100's FP8 tensor-core GEMMs): the actor's update products (models/fp8_update.py) and the rollout's
(models/fp8.py), each through its CUDA path (`torch._scaled_mm`'s arguments, layouts and flags) with
`torch._scaled_mm` standing on mmaemu, and the log-prob drift of a small policy whose blocks multiply so.

What is exact and what is modelled: mmaemu returns the H100's bits for tensor-wise scaled calls (its H100 PCIe
profile); our products scale per row, which it does not take (torch runs them through a CUTLASS kernel of its own).
`h100_scaled_mm` therefore takes mmaemu's tensor-core accumulator of the e4m3 operands (unit scales, K unsplit: a
row-scaled kernel does not split K the way cuBLAS may) and applies the row and column scales in float32 before one
rounding to the output dtype, as the row-scaled epilogue does. The accumulator is the H100's to the bit; the epilogue
is our model of CUTLASS's."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vla_scale.models.fp8 import fp8_linear, quantise_rows, quantise_weight
from vla_scale.models.fp8_update import Fp8LinearFunction, block_linears, use_update_precision

mmaemu = pytest.importorskip("mmaemu", reason="mmaemu (the H100's FP8 GEMMs emulated bit for bit) is not installed: "
                                              "pip install mmaemu, or make install (the dev extra lists it)")

ONE = torch.tensor(1.0)


def h100_scaled_mm(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
                   out_dtype: torch.dtype, use_fast_accum: bool = False) -> torch.Tensor:
    """`torch._scaled_mm` with row scales [M, 1] and column scales [1, N] as the H100 computes it (module docstring);
    mmaemu refuses what cuBLAS refuses (layouts, sides not multiples of 16)."""
    assert scale_a.shape == (a.shape[0], 1) and scale_b.shape == (1, b.shape[1]), "not a row-scaled call"
    assert scale_a.is_contiguous() and scale_b.is_contiguous() and scale_a.dtype == scale_b.dtype == torch.float32
    assert out_dtype == torch.bfloat16, "torch's row-scaled kernel writes bf16 only"
    with torch.no_grad():
        acc = mmaemu.scaled_mm(a, b, ONE, ONE, out_dtype=torch.float32, use_fast_accum=use_fast_accum, splitk=1)
    return (acc * scale_a * scale_b).to(out_dtype)


def expected(a: torch.Tensor, b: torch.Tensor, fast: bool) -> torch.Tensor:
    """(a @ bᵀ) in bf16 from the H100's accumulator, a [M, K] and b [N, K] each quantised per row here (the recipe
    the module docstring states), through mmaemu's other entry (`accumulate`, which takes any layout)."""
    (qa, sa), (qb, sb) = quantise_rows(a), quantise_rows(b)
    with torch.no_grad():
        acc = mmaemu.accumulate(qa, qb, use_fast_accum=fast, splitk=1)
    return (acc * sa[:, None] * sb[None, :]).to(torch.bfloat16)


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int16)


@pytest.fixture
def h100(monkeypatch):
    monkeypatch.setattr(torch, "_scaled_mm", h100_scaled_mm)


def test_the_update_products_are_the_h100s_to_the_bit(h100):
    """Forward (fast accumulation), input and weight gradients (float32 promotion every 128 products) through the
    CUDA path; every contraction longer than 128, so the two accumulations differ; 200 tokens, so the weight
    gradient's contraction is padded to 208 with zero tokens."""
    torch.manual_seed(0)
    x = (torch.randn(5, 40, 256) * torch.logspace(-2, 1, 256)).bfloat16().requires_grad_()
    w = (torch.randn(160, 256) * 0.1).bfloat16().requires_grad_()
    g = (torch.randn(5, 40, 160) * torch.logspace(-3, 0, 200).view(5, 40, 1)).bfloat16()
    y = Fp8LinearFunction.apply(x, w, None, False)
    y.backward(g)
    rows, grads = x.detach().reshape(-1, 256), g.reshape(-1, 160)
    forward = expected(rows, w.detach(), fast=True)
    assert not torch.equal(bits(forward), bits(expected(rows, w.detach(), fast=False)))
    assert torch.equal(bits(y.detach().reshape(-1, 160)), bits(forward))
    assert torch.equal(bits(x.grad.reshape(-1, 256)), bits(expected(grads, w.detach().t(), fast=False)))
    assert torch.equal(bits(w.grad), bits(expected(grads.t(), rows.t(), fast=False)))


def test_the_rollouts_products_are_the_h100s_to_the_bit(h100):
    torch.manual_seed(1)
    x, w = torch.randn(24, 64).bfloat16(), torch.randn(48, 64).bfloat16()
    out = fp8_linear(x, quantise_weight(w), None, emulate=False)
    assert torch.equal(bits(out), bits(expected(x, w, fast=False)))


def test_the_float32_emulation_stays_within_the_h100s_rounding(h100):
    """What the CPU tests run (`emulate`) against what the H100 computes: apart by the bf16 rounding of the output
    and the tensor cores' truncated accumulation (13 fraction bits per block of 32 products), never more."""
    torch.manual_seed(2)
    x, w = torch.randn(64, 256).bfloat16(), torch.randn(64, 256).bfloat16()
    tensor_cores = Fp8LinearFunction.apply(x, w, None, False).float()
    emulated = Fp8LinearFunction.apply(x.float(), w.float(), None, True)
    (qx, sx), (qw, sw) = quantise_rows(x), quantise_rows(w)
    magnitude = (qx.float().abs() @ qw.float().abs().t()) * sx[:, None] * sw[None, :]
    bound = emulated.abs() * 2.0**-8 + magnitude * 2.0**-12
    assert ((tensor_cores - emulated).abs() <= bound).all()
    assert not torch.equal(tensor_cores, emulated.bfloat16().float())  # the two are not the same arithmetic


def test_a_small_policys_log_probs_drift_within_bounds_under_the_h100s_fp8_products(h100):
    """The tiny OFT policy's per-token log-probs of its own greedy tokens, its blocks' products on the H100's FP8
    arithmetic against float32: at most 16 times the drift of the whole policy in bf16 (e4m3 keeps 3 mantissa bits to
    bf16's 7: 16 times the rounding step), and small in absolute terms."""
    from test_fp8_update import CFG, TOK, micro_batch

    from vla_scale.run_policy import build_policy

    torch.manual_seed(0)
    policy = build_policy(CFG, TOK).eval()
    inputs = micro_batch(3).inputs

    def logprobs(dtype: torch.dtype, fp8: bool) -> torch.Tensor:
        use_update_precision(policy, "fp8_emulated" if fp8 else "bf16", torch.device("cpu"), bf16=False)
        for _, m in block_linears(policy):
            m.fp8_emulate = False  # the CUDA path, on mmaemu's products
        with torch.no_grad():
            logits = policy.to(dtype)(inputs).float()
        return torch.log_softmax(logits, -1)

    exact = logprobs(torch.float32, fp8=False)
    tokens = exact.argmax(-1, keepdim=True)
    bf16 = (logprobs(torch.bfloat16, fp8=False).gather(-1, tokens) - exact.gather(-1, tokens)).abs()
    fp8 = (logprobs(torch.bfloat16, fp8=True).gather(-1, tokens) - exact.gather(-1, tokens)).abs()
    assert fp8.mean() <= 16 * bf16.mean() and fp8.mean() < 0.05 and fp8.max() < 0.5
    assert fp8.mean() > bf16.mean()  # the FP8 products did run
    np.testing.assert_array_less(0, fp8.numpy().max())
