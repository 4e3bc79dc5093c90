"""Our SmolVLA against LeRobot's own code, on the fixture tests/fixtures/smolvla_reference (its README says how it was
made and with which LeRobot commit): LeRobot's `model.safetensors` loads into `SmolVLAPolicy` with only its `model.`
prefix stripped, and on the same inputs and noise our image preprocessing, prefix and suffix embeddings, velocities
(each Euler step's and one at a probe time, through the cached prefix), sampled actions and training loss are
LeRobot's within 1e-5 relative (float32, CPU)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "smolvla_reference"
FILES = ["case.safetensors", "policy/config.json", "policy/model.safetensors", "vlm/config.json"]
_absent = [f for f in FILES if not (FIXTURE / f).exists()]
pytestmark = pytest.mark.skipif(bool(_absent), reason=f"SmolVLA fixture not in {FIXTURE}: lacks {_absent[:3]}")

from safetensors.torch import load_file  # noqa: E402

from vla_scale.models.flow.policy import FlowInputs  # noqa: E402
from vla_scale.models.smolvla.images import tower_pixels  # noqa: E402
from vla_scale.models.smolvla.policy import SmolVLAPolicy  # noqa: E402
from vla_scale.models.smolvla.spec import spec_from_lerobot  # noqa: E402

RTOL = 1e-5
CAMERAS = ("top", "wrist")  # the policy config's image features, in its order (the prefix's)


def relative_error(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    """max |ours - theirs| over max |theirs|: the error relative to the quantity's scale."""
    assert ours.shape == theirs.shape, (ours.shape, theirs.shape)
    return ((ours.double() - theirs.double()).abs().max() / theirs.double().abs().max().clamp(min=1e-12)).item()


@pytest.fixture(scope="module")
def reference() -> tuple[SmolVLAPolicy, dict[str, torch.Tensor], FlowInputs]:
    config = json.loads((FIXTURE / "policy" / "config.json").read_text())
    vlm = json.loads((FIXTURE / "vlm" / "config.json").read_text())
    policy = SmolVLAPolicy(spec_from_lerobot(config, vlm))
    policy.load_lerobot_state_dict(load_file(FIXTURE / "policy" / "model.safetensors"))
    policy.eval()
    case = load_file(FIXTURE / "case.safetensors")
    inputs = FlowInputs(
        images=torch.stack([tower_pixels(case[f"image_raw_{c}"], policy.spec.resize_imgs_with_padding)
                            for c in CAMERAS], dim=1),
        image_masks=torch.stack([case[f"image_mask_{c}"] for c in CAMERAS], dim=1),
        tokens=case["lang_tokens"], token_masks=case["lang_masks"], state=case["state_padded"],
    )
    return policy, case, inputs


def test_the_spec_is_lerobots(reference):
    policy, _, _ = reference
    derived = json.loads((FIXTURE / "config.json").read_text())["derived"]
    spec = policy.spec
    assert (spec.num_vlm_layers, spec.expert_depth, spec.expert_width, spec.expert_mlp_dim) == (
        derived["vlm_layers_kept"], derived["expert_layers"], derived["expert_hidden_size"],
        derived["expert_intermediate_size"])
    assert [i for i in range(spec.num_vlm_layers) if spec.cross_layer(i)] == derived["cross_attention_layers"]
    assert spec.tokens_per_image == derived["image_tokens_per_camera"]
    assert sum(p.numel() for p in policy.parameters()) == derived["num_parameters"]


def test_the_images_are_prepared_as_lerobot_prepares_them(reference):
    _, case, inputs = reference
    for n, camera in enumerate(CAMERAS):
        assert relative_error(inputs.images[:, n], case[f"image_model_{camera}"]) <= RTOL


def test_prefix_and_suffix_embeddings(reference):
    policy, case, inputs = reference
    with torch.no_grad():
        tokens = [policy.vlm_with_expert.embed_image(inputs.images[:, n]) for n in range(len(CAMERAS))]
        prefix, pad, blocks = policy.embed_prefix(inputs)
        suffix, suffix_pad, suffix_blocks = policy.embed_suffix(case["noise"], case["step_times"][0])
    for camera, ours in zip(CAMERAS, tokens, strict=True):
        assert relative_error(ours, case[f"image_embs_{camera}"]) <= RTOL
    assert relative_error(prefix, case["prefix_embs"]) <= RTOL
    assert torch.equal(pad, case["prefix_pad_masks"]) and torch.equal(blocks, case["prefix_att_masks"])
    assert relative_error(suffix, case["suffix_embs_step0"]) <= RTOL
    assert torch.equal(suffix_pad, case["suffix_pad_masks"])
    assert torch.equal(suffix_blocks.float(), case["suffix_att_masks"])


def test_each_euler_step_and_the_sampled_actions(reference):
    policy, case, inputs = reference
    times, _ = policy.flow_times(policy.spec.num_steps)
    assert torch.equal(times[:, None].expand(-1, 2), case["step_times"])
    with torch.no_grad():
        cache, pad = policy.prefix_cache(inputs)
        for k in range(policy.spec.num_steps):
            v_t = policy.denoise_step(inputs.state, pad, cache, case["step_x_t"][k], case["step_times"][k])
            assert relative_error(v_t, case["step_v_t"][k]) <= RTOL, k
        probe = policy.denoise_step(inputs.state, pad, cache, case["probe_x_t"], case["probe_time"])
        actions = policy.sample_actions(inputs, case["noise"])
    assert relative_error(probe, case["probe_v_t"]) <= RTOL
    assert relative_error(actions, case["sampled_actions"]) <= RTOL


def test_the_training_loss(reference):
    policy, case, inputs = reference
    with torch.no_grad():
        suffix, _, _ = policy.embed_suffix(case["train_x_t"], case["train_time"])
        v_t = policy.velocity_joint(inputs, case["train_x_t"], case["train_time"])
        losses = policy.flow_loss(inputs, case["actions_padded"], case["train_noise"], case["train_time"])
    assert relative_error(suffix, case["train_suffix_embs"]) <= RTOL
    assert relative_error(v_t, case["train_v_t"]) <= RTOL
    assert relative_error(losses, case["train_losses"]) <= RTOL
    robot = losses[..., : case["actions"].shape[-1]]  # LeRobot's policy cuts the robot's dims, then averages
    assert relative_error(robot.mean(), case["train_loss"]) <= RTOL
    assert relative_error(robot.mean(dim=(1, 2)), case["train_loss_per_sample"]) <= RTOL
    kept = (~case["action_is_pad"])[..., None]  # and with its episode-end flags, over the kept steps
    count = kept.sum(dim=(1, 2)) * robot.shape[-1]
    assert relative_error((robot * kept).sum() / count.sum(), case["train_loss_action_is_pad"]) <= RTOL
    assert relative_error((robot * kept).sum(dim=(1, 2)) / count, case["train_loss_per_sample_action_is_pad"]) <= RTOL
