"""SmolVLA on the tiny shapes: the RL chains over it (noise level 0 is `sample_actions` bit for bit, `chain_logprobs`
gives `sample_chain`'s log-probs back), the cached prefix against the joint pass, a flow-loss backward, the spec's
checks and presets (the full one's ~450M parameters counted on the meta device), and LeRobot state_dicts refused
by the key that is wrong."""

from __future__ import annotations

import pytest
import torch
from transformers import SmolVLMConfig
from transformers.models.smolvlm.modeling_smolvlm import SmolVLMConnector

from vla_scale.models.flow.policy import FlowInputs
from vla_scale.models.smolvla.images import resize_with_pad, tower_pixels
from vla_scale.models.smolvla.policy import SmolVLAPolicy
from vla_scale.models.smolvla.spec import (
    PRESETS,
    SmolVLASpec,
    TextSpec,
    VisionSpec,
    check_spec,
    smolvla_spec,
    spec_from_lerobot,
    tiny_spec,
)
from vla_scale.models.smolvla.vlm import pixel_shuffle
from vla_scale.objectives.flow_sde import action_mask

B, K = 3, 4


def policy(seed: int = 0, noise_std: tuple[float, float] | None = None, **overrides: object) -> SmolVLAPolicy:
    """A tiny policy with every parameter drawn at random (norms included), so no layer is near the identity."""
    torch.manual_seed(seed)
    p = SmolVLAPolicy.from_spec(tiny_spec(num_steps=K, **overrides), noise_std=noise_std).eval()
    with torch.no_grad():
        for param in p.parameters():
            param.normal_(0.0, 0.3)
    return p


def inputs(p: SmolVLAPolicy, seed: int = 1) -> FlowInputs:
    g = torch.Generator().manual_seed(seed)
    s = p.spec
    lengths = torch.tensor([3, s.tokenizer_max_length, 5])
    return FlowInputs(
        images=torch.rand(B, s.num_images, 3, s.image_size, s.image_size, generator=g) * 2 - 1,
        image_masks=torch.tensor([[True, False], [True, False], [True, False]]),
        tokens=torch.randint(0, s.text.vocab_size, (B, s.tokenizer_max_length), generator=g),
        token_masks=torch.arange(s.tokenizer_max_length)[None] < lengths[:, None],
        state=torch.randn(B, s.max_state_dim, generator=g),
    )


@pytest.fixture(scope="module")
def case():
    p = policy()
    return p, inputs(p), p.sample_noise(B, generator=torch.Generator().manual_seed(2))


def test_noise_level_zero_is_sample_actions_bit_for_bit(case):
    p, x, noise = case
    chain = p.sample_chain(x, noise, 0.0, generator=torch.Generator().manual_seed(3))
    assert torch.equal(chain.actions, p.sample_actions(x, noise))
    assert chain.chain.shape == (B, K + 1, p.spec.chunk_size, p.spec.max_action_dim)
    assert torch.equal(chain.logprobs, torch.zeros(B, K))


def test_chain_logprobs_gives_sample_chains_logprobs_back(case):
    p, x, noise = case
    mask = action_mask(p.spec.chunk_size, p.spec.max_action_dim, 4)
    chosen = torch.tensor([[True, False, True, False], [False, False, False, True], [True, True, True, True]])
    chain = p.sample_chain(x, noise, 0.4, generator=torch.Generator().manual_seed(4), stochastic=chosen, mask=mask)
    again = p.chain_logprobs(x, chain.chain, 0.4, stochastic=chosen, mask=mask)
    assert torch.allclose(again, chain.logprobs, atol=1e-4, rtol=1e-5)
    assert torch.equal(again == 0, ~chosen)


def test_flow_noise_chains_score_again_with_gradients_into_the_head():
    p = policy(noise_std=(0.08, 0.16))
    x = inputs(p)
    noise = p.sample_noise(B, generator=torch.Generator().manual_seed(2))
    chain = p.sample_chain(x, noise, generator=torch.Generator().manual_seed(5))
    logprobs, entropy = p.chain_logprobs(x, chain.chain, with_entropy=True)
    assert torch.allclose(logprobs, chain.logprobs, atol=1e-3, rtol=1e-5) and entropy.shape == (B, K)
    logprobs.sum().backward()
    assert p.noise_head is not None and p.noise_head.net[0].weight.grad is not None


def test_the_cached_prefix_gives_the_joint_passs_velocity(case):
    p, x, noise = case
    time = torch.tensor([1.0, 0.55, 0.1])
    with torch.no_grad():
        joint = p.velocity_joint(x, noise, time)
        cache, pad = p.prefix_cache(x)  # the second camera slot is masked everywhere: left out here
        cached = p.denoise_step(x.state, pad, cache, noise, time)
    assert pad.shape[1] < p.embed_prefix(x)[1].shape[1]
    assert torch.allclose(joint, cached, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("overrides", [{}, {"attention_mode": "self_attn"}, {"self_attn_every_n_layers": 3},
                                       {"num_expert_layers": 2, "attention_mode": "self_attn"},
                                       {"prefix_length": 40}])
def test_every_layout_runs_cached_as_it_runs_joint(overrides):
    p = policy(**overrides)
    x = inputs(p)
    noise = p.sample_noise(B, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        joint = p.velocity_joint(x, noise, torch.full((B,), 0.3))
        cache, pad, _ = p.prefix_pass(x)
        cached = p.denoise_step(x.state, pad, cache, noise, torch.full((B,), 0.3))
    assert torch.allclose(joint, cached, atol=1e-5, rtol=1e-5)


def test_a_fresh_tiny_policy_trains_a_flow_loss():
    torch.manual_seed(0)
    p = SmolVLAPolicy.from_spec(PRESETS["smolvla_tiny"]())
    torch.manual_seed(0)
    again = SmolVLAPolicy.from_spec(PRESETS["smolvla_tiny"]())
    assert all(torch.equal(a, b) for a, b in zip(p.state_dict().values(), again.state_dict().values(), strict=True))
    p.train()
    x = inputs(p)
    actions = torch.randn(B, p.spec.chunk_size, p.spec.max_action_dim)
    noise, time = torch.randn_like(actions), torch.tensor([0.2, 0.5, 0.9])
    loss = p(x, actions, noise, time)
    assert loss.shape == actions.shape
    loss.mean().backward()
    assert p.action_in_proj.weight.grad is not None and p.state_proj.weight.grad is not None
    assert p.vlm_with_expert.lm_expert.layers[1].self_attn.k_proj.weight.grad is not None
    first = {n: t.grad.clone() for n, t in p.named_parameters() if t.grad is not None}
    p.zero_grad()
    p.activation_checkpointing_enable()  # every layer recomputed in the backward pass: the same gradients
    p(x, actions, noise, time).mean().backward()
    again = {n: t.grad for n, t in p.named_parameters() if t.grad is not None}
    assert again.keys() == first.keys()
    assert all(torch.allclose(again[n], g, atol=1e-6, rtol=1e-4) for n, g in first.items())


def test_the_full_preset_has_smolvlas_450m_parameters():
    with torch.device("meta"):
        p = SmolVLAPolicy(smolvla_spec())
    count = sum(t.numel() for t in p.state_dict().values())
    assert 445e6 < count < 455e6
    expert = p.vlm_with_expert.lm_expert
    assert expert.layers[0].self_attn.k_proj.weight.shape == (320, 720)  # joint layer: from the expert's width
    assert expert.layers[1].self_attn.k_proj.weight.shape == (320, 320)  # cross layer: from the VLM's keys
    assert expert.layers[0].mlp.gate_proj.weight.shape == (2048, 720)
    assert smolvla_spec().tokens_per_image == 64 and smolvla_spec().prefix_len == 3 * 64 + 48 + 1


def test_check_spec_names_the_field():
    with pytest.raises(ValueError, match=r"text\.num_heads=5 is not a multiple of text\.num_kv_heads=2"):
        check_spec(tiny_spec(text=TextSpec(width=32, depth=4, mlp_dim=64, num_heads=5, num_kv_heads=2, head_dim=8,
                                           vocab_size=256)))
    with pytest.raises(ValueError, match=r"vision\.width"):
        tiny_spec(vision=VisionSpec(image_size=32, patch_size=8, width=30, num_heads=4))
    with pytest.raises(ValueError, match="expert_width_multiplier"):
        tiny_spec(expert_width_multiplier=0.72)
    with pytest.raises(ValueError, match="num_expert_layers"):
        tiny_spec(num_expert_layers=3)
    with pytest.raises(ValueError, match="attention_mode"):
        tiny_spec(attention_mode="both")


def test_the_spec_round_trips_and_reads_lerobots_config():
    spec = tiny_spec()
    assert SmolVLASpec.from_dict(spec.to_dict()) == spec
    lerobot = {"type": "smolvla", "chunk_size": 50, "max_state_dim": 32, "max_action_dim": 32,
               "resize_imgs_with_padding": [512, 512], "num_vlm_layers": 16, "num_expert_layers": -1,
               "vlm_model_name": "HuggingFaceTB/SmolVLM2-500M-Video-Instruct",
               "input_features": {f"observation.images.camera{i}": {"type": "VISUAL", "shape": [3, 256, 256]}
                                  for i in (1, 2, 3)} | {"observation.state": {"type": "STATE", "shape": [6]}}}
    assert spec_from_lerobot(lerobot) == smolvla_spec()
    with pytest.raises(ValueError, match="vlm_model_name"):
        spec_from_lerobot({**lerobot, "vlm_model_name": "someone/other-vlm"})


def test_a_lerobot_state_dict_loads_and_a_wrong_one_is_named():
    p = policy()
    theirs = {f"model.{k}": v.clone() for k, v in p.state_dict().items()}
    fresh = policy(seed=1)
    fresh.load_lerobot_state_dict(theirs)
    assert all(torch.equal(a, b) for a, b in zip(fresh.state_dict().values(), p.state_dict().values(), strict=True))
    key = "vlm_with_expert.lm_expert.layers.1.self_attn.k_proj.weight"
    with pytest.raises(ValueError, match=f"missing: {key}"):
        fresh.load_lerobot_state_dict({k: v for k, v in theirs.items() if k != f"model.{key}"})
    with pytest.raises(ValueError, match="unexpected: vlm_with_expert.extra.weight"):
        fresh.load_lerobot_state_dict({**theirs, "model.vlm_with_expert.extra.weight": torch.zeros(1)})
    with pytest.raises(ValueError, match=rf"other shapes: {key} \(16, 24\)"):
        fresh.load_lerobot_state_dict({**theirs, f"model.{key}": torch.zeros(16, 24)})


def test_pixel_shuffle_is_the_connectors():
    config = SmolVLMConfig(vision_config={"hidden_size": 6}, text_config={"hidden_size": 8, "num_attention_heads": 2},
                           scale_factor=2)
    patches = torch.randn(2, 16, 6)
    assert torch.equal(pixel_shuffle(patches, 2), SmolVLMConnector(config).pixel_shuffle(patches, 2))


def test_images_are_resized_into_the_bottom_right_and_mapped_to_minus_one_one():
    images = torch.rand(2, 3, 48, 80)
    out = resize_with_pad(images, 64, 64)
    assert out.shape == (2, 3, 64, 64) and torch.equal(out[:, :, :26], torch.zeros(2, 3, 26, 64))
    assert torch.equal(tower_pixels(torch.ones(1, 2, 3, 30, 40), (64, 64))[0, 1, :, :16], -torch.ones(3, 16, 64))
    square = torch.rand(2, 3, 64, 64)
    assert resize_with_pad(square, 64, 64) is square
