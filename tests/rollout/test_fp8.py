"""FP8 rollouts (`models/oft/fp8.py`): the quantisation arithmetic, emulated on the CPU, and the engine's use of it.

Scales and saturation of the per-row quantisation, the emulated product against float32, an FP8 engine's logits
against the bf16 fast path's, the order sync -> checksum of the exact weights -> quantisation, release and resume,
and the refusals: a device without FP8 tensor cores, the plain path, matrices FP8 tensor cores cannot multiply, a
configuration whose old log-probs would be the FP8 engine's. Where a GPU with FP8 tensor cores is, the real product
is checked against the emulation (marked `gpu`).
"""

import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from vla_scale.config import ConfigError, RolloutConfig
from vla_scale.models.fp8 import (
    E4M3_MAX,
    check_shape,
    dequantise,
    fp8_linear,
    fp8_problem,
    quantise_rows,
    quantise_weight,
)
from vla_scale.models.oft.decode import OFTDecoder
from vla_scale.models.oft.fp8 import Fp8Weights
from vla_scale.models.tokenizer import WordTokenizer
from vla_scale.rollout.engine import RolloutEngine
from vla_scale.run_policy import build_policy
from vla_scale.tensors.checksum import weights_checksum

sys.path.insert(0, str(Path(__file__).parent))
from test_engine_fast_path import CFG, official_case, tiny_case  # noqa: E402


def test_rows_are_scaled_to_the_largest_e4m3_value():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 64, generator=g) * torch.tensor([1e-3, 1.0, 30.0, 1e4, 3e30, 0.0])[:, None]
    data, scale = quantise_rows(x)
    assert data.dtype == torch.float8_e4m3fn and scale.dtype == torch.float32 and scale.shape == (6,)
    torch.testing.assert_close(scale[:5], x[:5].abs().amax(dim=1) / E4M3_MAX, rtol=1e-6, atol=0)
    values = data.float()
    assert torch.isfinite(values).all()  # e4m3fn has no infinity: an unclamped overflow would be NaN
    assert torch.equal(values[:5].abs().amax(dim=1), torch.full((5,), E4M3_MAX))  # each row's largest saturates
    assert torch.equal(values[5], torch.zeros(64)) and scale[5] > 0  # a zero row: zeros, a finite scale
    back = dequantise(data, scale)
    normal = values.abs() >= 2**-6  # e4m3's normal range: 3 mantissa bits, rounding error <= 2^-4 of the value
    assert ((back - x).abs() <= 2**-4 * x.abs() * 1.0001)[normal].all()


def test_the_emulated_product_is_close_to_float32():
    g = torch.Generator().manual_seed(1)
    x, w, b = torch.randn(40, 256, generator=g), torch.randn(96, 256, generator=g), torch.randn(96, generator=g)
    want = torch.nn.functional.linear(x, w, b)
    got = fp8_linear(x, quantise_weight(w), b, emulate=True)
    assert got.shape == want.shape and got.dtype == x.dtype
    assert float((got - want).norm() / want.norm()) < 0.05


@pytest.fixture(scope="module", params=["official-fused-gqa", "tiny-causal"])
def case(request):
    return official_case() if request.param.startswith("official") else tiny_case("causal")


def test_an_fp8_engine_decodes_close_to_the_bf16_fast_path(case):
    policy, batch = case
    bf16 = RolloutEngine(policy, seed=7, fast=True, decoder=OFTDecoder())
    fp8 = RolloutEngine(policy, seed=7, precision="fp8", emulate_fp8=True, decoder=OFTDecoder())
    assert fp8.fast is not None and fp8.fp8 is not None
    with torch.no_grad():
        want, got = bf16.logits(bf16.inputs(batch)), fp8.logits(fp8.inputs(batch))
    error = (got - want).abs()
    assert 0 < float(error.max()) and float((got - want).norm() / want.norm()) < 0.15
    top2 = want.topk(2, dim=-1).values
    confident = (top2[..., 0] - top2[..., 1]) > 2 * float(error.max())
    assert confident.any()
    assert torch.equal(got.argmax(-1)[confident], want.argmax(-1)[confident])
    assert fp8.fp8.nbytes() > 0


def test_a_sync_lands_exactly_and_is_quantised_before_the_next_decode(case):
    policy, batch = case
    engine = RolloutEngine(policy, seed=7, precision="fp8", emulate_fp8=True, decoder=OFTDecoder())
    engine.decode(batch, 1.6)
    assert engine.fp8 is not None
    old = engine.fp8.layers[0].o.data.clone()
    g = torch.Generator().manual_seed(5)
    new = {name: p + 0.05 * torch.randn(p.shape, generator=g) for name, p in policy.named_parameters()}
    engine.update_weights_from_tensor(new.items(), version=1)
    # what the sync's checksum sees: the sent weights, bit for bit, not their FP8 copies
    assert engine.checksum() == weights_checksum(new.items())
    assert torch.equal(engine.fp8.layers[0].o.data.view(torch.uint8), old.view(torch.uint8))  # not yet quantised
    engine.decode(batch, 1.6)
    layer = policy.language_model.model.layers[0]
    want = quantise_weight(new[next(n for n, p in policy.named_parameters() if p is layer.self_attn.o_proj.weight)])
    assert torch.equal(engine.fp8.layers[0].o.data.view(torch.uint8), want.data.view(torch.uint8))
    assert torch.equal(engine.fp8.layers[0].o.scale, want.scale)


def test_release_lets_the_fp8_copies_go_and_resume_needs_a_sync(case):
    policy, batch = case
    engine = RolloutEngine(policy, seed=7, precision="fp8", emulate_fp8=True, decoder=OFTDecoder())
    weights = {name: p.detach().clone() for name, p in policy.named_parameters()}
    engine.decode(batch, 1.6)
    engine.release_memory_occupation()
    assert engine.fp8 is not None and engine.fp8.nbytes() == 0
    engine.resume_memory_occupation()
    with pytest.raises(RuntimeError, match="sync"):
        engine.decode(batch, 1.6)
    engine.update_weights_from_tensor(weights.items(), version=2)
    assert engine.decode(batch, 1.6).version == 2 and engine.fp8.nbytes() > 0


def test_fp8_is_refused_where_it_cannot_run():
    policy, _ = tiny_case("causal")
    if fp8_problem(torch.device("cpu")) is None:
        pytest.fail("a CPU must not count as able to run FP8 products")
    with pytest.raises(ValueError, match="FP8 tensor cores.*rollout.precision=bf16"):
        RolloutEngine(policy, "cpu", precision="fp8", decoder=OFTDecoder())
    with pytest.raises(ValueError, match="fast path"):
        RolloutEngine(policy, precision="fp8", emulate_fp8=True, fast=False, decoder=OFTDecoder())
    with pytest.raises(ValueError, match="choose one of"):
        RolloutEngine(policy, precision="int4", decoder=OFTDecoder())
    with pytest.raises(ValueError, match=r"multiples of 16"):
        check_shape("decoder layer 0 o", torch.zeros(40, 24), emulate=False)
    check_shape("decoder layer 0 o", torch.zeros(40, 24), emulate=True)
    narrow = build_policy(replace(CFG, vision_dim=24, hidden_size=48), WordTokenizer.from_instructions(["reach"]))
    with pytest.raises(ValueError, match=r"tower block 0 qkv \(72, 24\).*multiples of 16"):
        Fp8Weights(emulate=False).refresh(narrow)


def test_the_configuration_needs_recomputed_old_logprobs_for_fp8():
    from vla_scale.config import Config, validate

    cfg = Config()
    fp8 = replace(cfg, rollout=RolloutConfig(precision="fp8"))
    with pytest.raises(ConfigError, match="algo.old_logprobs=recompute"):
        validate(replace(fp8, algo=replace(cfg.algo, old_logprobs="rollout")))
    validate(replace(fp8, algo=replace(cfg.algo, old_logprobs="recompute", tis_cap=2.0)))
    with pytest.raises(ConfigError, match="rollout.precision"):
        validate(replace(cfg, rollout=RolloutConfig(precision="fp16")))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or fp8_problem(torch.device("cuda")) is not None,
                    reason="needs a GPU with FP8 tensor cores")
def test_the_fp8_tensor_cores_compute_the_emulated_product():
    g = torch.Generator(device="cuda").manual_seed(2)
    x = torch.randn(200, 512, device="cuda", generator=g, dtype=torch.bfloat16)
    w = quantise_weight(torch.randn(320, 512, device="cuda", generator=g, dtype=torch.bfloat16))
    got, want = fp8_linear(x, w, None, emulate=False), fp8_linear(x, w, None, emulate=True)
    # the same products up to the order of the float32 sums and the bf16 rounding of the output
    assert float((got.float() - want.float()).abs().max()) <= 1e-2 * float(want.float().abs().max())
