"""The flow families' prefix pass in FP8 on the rollout engine (`rollout.precision=fp8`, models/flow/fp8.py): the
prefix's linear layers and only those multiply through e4m3 copies, made after each sync from the weights the sync
wrote, let go on release; the decode stays close to the engine's own products. The arithmetic runs emulated in
float32 (`emulate_fp8`); the H100's own products are checked in test_fp8_h100_products.py."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from torch import nn

from vla_scale.models.flow.fp8 import Fp8PrefixLinear, PrefixFp8, prefix_linears
from vla_scale.models.flow.policy import FlowInputs, FlowPolicy
from vla_scale.models.flow.rollout import FlowDecoder
from vla_scale.models.fp8 import quantise_weight
from vla_scale.models.pi0.gemma import AdaRMSNorm
from vla_scale.models.pi0.policy import Pi0Policy
from vla_scale.models.pi0.spec import TINY_VISION
from vla_scale.models.pi0.spec import tiny_spec as pi0_tiny
from vla_scale.models.smolvla.policy import SmolVLAPolicy
from vla_scale.models.smolvla.spec import tiny_spec as smolvla_tiny
from vla_scale.rollout.engine import RolloutEngine

FAMILIES = {"pi0": lambda: Pi0Policy.from_spec(pi0_tiny()), "pi05": lambda: Pi0Policy.from_spec(pi0_tiny(True)),
            "smolvla": lambda: SmolVLAPolicy.from_spec(smolvla_tiny())}


def inputs_of(policy: FlowPolicy, batch: int = 3) -> FlowInputs:
    """Seeded observations of the policy's shapes: two cameras filled, a masked third slot, prompts of 5-8 tokens."""
    spec, gen = policy.spec, torch.Generator().manual_seed(1)
    side = spec.image_size if isinstance(policy, SmolVLAPolicy) else spec.vision.image_size
    budget = spec.tokenizer_max_length if isinstance(policy, SmolVLAPolicy) else spec.max_token_len
    state_dim = getattr(spec, "max_state_dim", spec.action_dim)
    images = torch.rand(batch, spec.num_images, 3, side, side, generator=gen) * 2 - 1
    masks = torch.arange(spec.num_images).expand(batch, -1) < 2
    token_masks = torch.arange(budget).expand(batch, -1) < torch.randint(5, 9, (batch, 1), generator=gen)
    tokens = torch.randint(4, 256, (batch, budget), generator=gen) * token_masks
    return FlowInputs(images=images, image_masks=masks, tokens=tokens, token_masks=token_masks,
                      state=torch.randn(batch, state_dim, generator=gen))


def engine_of(policy: FlowPolicy, precision: str) -> RolloutEngine:
    decoder = FlowDecoder(None, env_action_dim=4, actions_per_chunk=2)
    return RolloutEngine(policy, "cpu", seed=7, precision=precision, emulate_fp8=precision == "fp8", decoder=decoder)


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request) -> tuple[str, FlowPolicy]:
    torch.manual_seed(0)
    policy = FAMILIES[request.param]().eval()
    for m in policy.modules():  # a fresh π0.5's adaRMS gates are 0: its expert would not read the prefix at all
        if isinstance(m, AdaRMSNorm):
            nn.init.normal_(m.dense.weight, std=0.1)
    return request.param, policy


def test_only_the_prefix_multiplies_in_fp8_and_the_decode_stays_close(family):
    _, policy = family
    inputs = inputs_of(policy)
    bf16, fp8 = engine_of(policy, "bf16"), engine_of(policy, "fp8")
    want = bf16.decode(inputs, 1.0, greedy=True).actions
    got = fp8.decode(inputs, 1.0, greedy=True).actions
    assert fp8.fast is None and isinstance(fp8.fp8, PrefixFp8) and fp8.fp8.nbytes() > 0
    gap = abs(got - want)
    assert 0 < gap.max() and float(((got - want) ** 2).sum() ** 0.5 / (want ** 2).sum() ** 0.5) < 0.02
    prefix = {id(m) for _, m in prefix_linears(fp8.policy)}
    swapped = {id(m) for m in fp8.policy.modules() if isinstance(m, Fp8PrefixLinear)}
    assert swapped == prefix and len(prefix) > 0
    tower_and_vlm = [m for block in fp8.policy.prefix_blocks() for m in block.modules() if isinstance(m, nn.Linear)]
    assert len(tower_and_vlm) == len(prefix)
    others = [m for m in fp8.policy.modules() if type(m) is nn.Linear]
    assert others and all(id(m) not in prefix for m in others)  # the expert, the projections: the engine's products


def test_a_sync_is_quantised_before_the_next_decode_and_release_lets_the_copies_go(family):
    _, policy = family
    inputs, engine = inputs_of(policy), engine_of(policy, "fp8")
    engine.decode(inputs, 1.0)
    layer_path, layer = prefix_linears(engine.policy)[0]
    g = torch.Generator().manual_seed(5)
    new = {name: p + 0.05 * torch.randn(p.shape, generator=g) for name, p in policy.named_parameters()}
    engine.update_weights_from_tensor(new.items(), version=1)
    old = layer.fp8.data.clone()
    assert torch.equal(layer.fp8.data.view(torch.uint8), old.view(torch.uint8))  # not yet quantised
    assert engine.decode(inputs, 1.0).version == 1
    want = quantise_weight(new[f"{layer_path}.weight"])
    assert torch.equal(layer.fp8.data.view(torch.uint8), want.data.view(torch.uint8))
    assert torch.equal(layer.fp8.scale, want.scale)

    engine.release_memory_occupation()
    assert engine.fp8 is not None and engine.fp8.nbytes() == 0
    assert not any(isinstance(m, Fp8PrefixLinear) for m in engine.policy.modules())
    engine.resume_memory_occupation()
    with pytest.raises(RuntimeError, match="sync"):
        engine.decode(inputs, 1.0)
    engine.update_weights_from_tensor(new.items(), version=2)
    assert engine.decode(inputs, 1.0).version == 2 and engine.fp8.nbytes() > 0


def test_a_prefix_matrix_tensor_cores_cannot_take_is_refused_by_name():
    policy = Pi0Policy.from_spec(pi0_tiny(vision=replace(TINY_VISION, mlp_dim=40)))
    with pytest.raises(ValueError, match=r"vision_tower.*mlp\.fc1 \(40, \d+\).*multiples of 16"):
        PrefixFp8(emulate=False).refresh(policy)
    assert not any(isinstance(m, Fp8PrefixLinear) for m in policy.modules())  # refused before any swap
