"""The actor's FP8 products (`deepspeed.update_precision`, models/fp8_update.py) through the float32 emulation: each
product's operands quantised along its contraction, the swap of the blocks' linear layers, the refusals, and an RL
update of the ZeRO-3 actor."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from vla_scale.batches import MicroBatch, MiniBatch, RowIndex, UpdatePlan
from vla_scale.config import AlgoConfig, ConfigError, DeepSpeedConfig, LoraConfig, ModelConfig, validate
from vla_scale.envs.reach import instructions
from vla_scale.models.fp8 import dequantise, quantise_rows
from vla_scale.models.fp8_update import (
    Fp8Linear,
    Fp8LinearFunction,
    Fp8LoRALinear,
    block_linears,
    update_problem,
    use_update_precision,
)
from vla_scale.models.lora import add_adapters
from vla_scale.models.oft import Processor
from vla_scale.models.oft.decode import OFTScorer
from vla_scale.models.tokenizer import WordTokenizer
from vla_scale.parallel.actor import Actor
from vla_scale.run_policy import build_policy, spec_from_model_config
from vla_scale.run_setup import init_distributed

CPU = torch.device("cpu")
CFG = ModelConfig(image_size=32, patch_size=8, vision_dim=32, hidden_size=32, num_layers=2, num_heads=2,
                  intermediate_size=64, chunk_len=4)
TOK = WordTokenizer.from_instructions(instructions())


def fake_quantised(t: torch.Tensor) -> torch.Tensor:
    """t's rows as the FP8 product multiplies them: e4m3 with one scale per row, back in float32."""
    return dequantise(*quantise_rows(t))


def test_each_product_quantises_its_operands_along_its_contraction():
    torch.manual_seed(0)
    x = torch.randn(3, 5, 64, requires_grad=True)
    w = (torch.randn(32, 64) * torch.logspace(-2, 1, 64)).requires_grad_()  # input channels of spread magnitudes
    b = torch.randn(32, requires_grad=True)
    g = torch.randn(3, 5, 32) * torch.logspace(-3, 0, 15).view(3, 5, 1)  # tokens of spread magnitudes
    y = Fp8LinearFunction.apply(x, w, b, True)
    y.backward(g)
    rows, grads = x.detach().reshape(-1, 64), g.reshape(-1, 32)
    assert torch.equal(y.detach(), (fake_quantised(rows) @ fake_quantised(w.detach()).t()).view(3, 5, 32) + b)
    assert torch.equal(x.grad, (fake_quantised(grads) @ fake_quantised(w.detach().t()).t()).view(3, 5, 64))
    assert torch.equal(w.grad, fake_quantised(grads.t()) @ fake_quantised(rows.t()).t())
    assert torch.equal(b.grad, grads.sum(0))
    # and each is close to float32's: e4m3 keeps 3 mantissa bits, errors of the products' terms average out
    x2, w2 = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    F.linear(x2, w2).backward(g)
    for fp8, exact in ((x.grad, x2.grad), (w.grad, w2.grad)):
        assert (fp8 - exact).norm() / exact.norm() < 0.05


def test_a_frozen_weight_gets_no_gradient_product():
    x, w = torch.randn(4, 32, requires_grad=True), torch.randn(16, 32)
    Fp8LinearFunction.apply(x, w, None, True).sum().backward()
    assert x.grad is not None and w.grad is None


def test_the_blocks_linear_layers_swap_and_swap_back():
    torch.manual_seed(0)
    policy = build_policy(CFG, TOK).eval()
    add_adapters(policy, LoraConfig(rank=4, alpha=8.0, target_modules=["q_proj"]))
    names = [n for n, _ in block_linears(policy)]
    assert len(names) == 4 + 2 * 7  # the ViT block's qkv, proj, fc1, fc2; each Llama layer's seven projections
    assert not any(n.startswith(("projector", "proprio_projector", "language_model.lm_head")) for n in names)
    spec = spec_from_model_config(CFG, TOK.vocab_size, TOK.eos_id)
    processor = Processor.for_spec(spec, TOK)
    rng = np.random.default_rng(0)
    inputs = processor.encode(processor.transform.prepare(rng.integers(0, 256, (2, 1, 32, 32, 3), dtype=np.uint8)),
                              instructions()[:2], rng.uniform(-1, 1, (2, CFG.proprio_dim)).astype(np.float32))
    with torch.no_grad():
        before = policy(inputs)
        assert use_update_precision(policy, "fp8_emulated", CPU, bf16=False) == len(names)
        kinds = {type(m) for _, m in block_linears(policy)}
        assert kinds == {Fp8Linear, Fp8LoRALinear}
        fp8 = policy(inputs)
        assert use_update_precision(policy, "bf16", CPU, bf16=False) == 0
        assert torch.equal(policy(inputs), before)
    assert not torch.equal(fp8, before) and (fp8 - before).abs().max() < 0.1 * before.abs().max()


def test_fp8_is_refused_before_any_product_where_it_cannot_run(tiny_config):
    problem = update_problem("fp8", CPU, bf16=True)
    assert problem is not None and "deepspeed.update_precision=fp8" in problem and "FP8 tensor cores" in problem
    assert update_problem("fp8_emulated", CPU, bf16=False) is None
    policy = build_policy(CFG, TOK)
    with pytest.raises(ValueError, match="deepspeed.update_precision=fp8 multiplies on FP8 tensor cores"):
        use_update_precision(policy, "fp8", CPU, bf16=True)
    assert all(type(m) is torch.nn.Linear for _, m in block_linears(policy))
    with pytest.raises(ConfigError, match="deepspeed.update_precision=fp8 writes its products in bf16"):
        validate(tiny_config("deepspeed.update_precision=fp8"))
    with pytest.raises(ConfigError, match="deepspeed.update_precision"):
        validate(tiny_config("deepspeed.update_precision=fp16"))


def micro_batch(seed: int, rows: int = 4) -> MicroBatch:
    rng = np.random.default_rng(seed)
    spec = spec_from_model_config(CFG, TOK.vocab_size, TOK.eos_id)
    processor = Processor.for_spec(spec, TOK)
    images = rng.integers(0, 256, (rows, 1, 32, 32, 3), dtype=np.uint8)
    inputs = processor.encode(processor.transform.prepare(images), [instructions()[i % 3] for i in range(rows)],
                              rng.uniform(-1, 1, (rows, CFG.proprio_dim)).astype(np.float32))
    k = CFG.chunk_len * 7
    mask = torch.ones(rows, k, dtype=torch.bool)
    return MicroBatch(inputs, torch.from_numpy(rng.integers(0, 256, (rows, k))), torch.full((rows, k), -5.5),
                      torch.from_numpy(rng.choice([-1.0, 1.0], rows).astype(np.float32)), mask,
                      mask.float() / mask.numel(), RowIndex.first_steps(rows))


def test_the_zero3_actor_updates_through_fp8_products_with_its_master_weights_as_they_were():
    """ZeRO-3 gathers each layer's weight for its forward and again for its backward: the swapped layers read it
    there, and the update lands close to float32's (the same gradient up to FP8's rounding)."""
    init_distributed()
    results = {}
    for precision in ("bf16", "fp8_emulated"):  # bf16 here: the CPU actor's own float32 products
        torch.manual_seed(0)
        actor = Actor(lambda zero3: build_policy(CFG, TOK, zero3),
                      DeepSpeedConfig(zero_stage=3, update_precision=precision, activation_checkpointing=True),
                      AlgoConfig(micro_batches=1, lr=1e-2), scorer=OFTScorer())
        assert actor.fp8_layers == (0 if precision == "bf16" else 18)
        results[precision] = actor.update(UpdatePlan((MiniBatch((micro_batch(1),)),))).metrics()
        assert all(p.dtype == torch.float32 for p in actor.engine.optimizer.param_groups[0]["params"])
    exact, fp8 = results["bf16"], results["fp8_emulated"]
    assert fp8["policy_loss"] == pytest.approx(exact["policy_loss"], rel=0.05, abs=1e-3)
    assert fp8["grad_norm"] == pytest.approx(exact["grad_norm"], rel=0.05)
    assert fp8["grad_norm"] != exact["grad_norm"]  # the products did run in FP8
