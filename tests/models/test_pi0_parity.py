"""Our π0 / π0.5 against openpi's own PyTorch code, on the fixture tests/fixtures/openpi_reference (its README says
how it was made and with which openpi commit): the fixture's `PI0Pytorch` state_dicts load into `Pi0Policy` with no
renaming, and on the same LIBERO-shaped inputs and noise give openpi's prefix embeddings, first suffix embeddings,
velocities, actions and training loss within 1e-5 (float32, CPU); the normalisation and the two prompts are
openpi's exactly."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "openpi_reference"
FILES = ["images.safetensors", "norm_case.json", "tokenizer.model", "tokenizer_case.json",
         *(f"{m}/{f}" for m in ("pi0", "pi05") for f in ("config.json", "model.safetensors", "case.safetensors"))]
_absent = [f for f in FILES if not (FIXTURE / f).exists()]
pytestmark = pytest.mark.skipif(bool(_absent), reason=f"openpi fixture not in {FIXTURE}: lacks {_absent[:3]}")

from safetensors.torch import load_file  # noqa: E402

from vla_scale.models.flow.normalize import FlowNormalizer, NormStats  # noqa: E402
from vla_scale.models.pi0.policy import Pi0Inputs, Pi0Policy, pixels_from_uint8  # noqa: E402
from vla_scale.models.pi0.tokenizer import PaliGemmaTokenizer, discretize_state  # noqa: E402

ATOL = 1e-5


def max_diff(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    assert ours.shape == theirs.shape, (ours.shape, theirs.shape)
    return (ours.double() - theirs.double()).abs().max().item()


def loaded(model: str) -> tuple[Pi0Policy, dict, dict[str, torch.Tensor], Pi0Inputs]:
    folder = FIXTURE / model
    config = json.loads((folder / "config.json").read_text())
    torch.manual_seed(0)
    policy = Pi0Policy.from_openpi_config(config)
    tensors = load_file(folder / "model.safetensors")
    for key in config.get("state_dict_keys_tied_left_out_by_save_model", []):
        tensors.pop(key, None)  # as a real openpi checkpoint (safetensors' save_model) has them
    policy.load_openpi_state_dict(tensors)
    policy.eval()
    case = load_file(folder / "case.safetensors")
    images = load_file(FIXTURE / "images.safetensors")
    keys = config["image_keys"]
    inputs = Pi0Inputs(
        images=torch.stack([pixels_from_uint8(images[f"image_{k}"]) for k in keys], dim=1),
        image_masks=torch.stack([case[f"image_mask_{k}"] for k in keys], dim=1),
        tokens=case["tokenized_prompt"], token_masks=case["tokenized_prompt_mask"], state=case["state"],
    )
    return policy, config, case, inputs


@pytest.fixture(scope="module", params=["pi0", "pi05"])
def reference(request):
    return (request.param, *loaded(request.param))


def test_the_spec_and_the_pixels_are_openpis(reference):
    model, policy, config, case, inputs = reference
    assert policy.spec.pi05 == (model == "pi05") and policy.spec.action_horizon == config["action_horizon"]
    for n, key in enumerate(config["image_keys"]):
        assert torch.equal(inputs.images[:, n, :, 0, :], case[f"pixel_values_{key}_first_row"])


def test_prefix_and_first_suffix_embeddings(reference):
    _, policy, _, case, inputs = reference
    with torch.no_grad():
        prefix, pad, blocks = policy.embed_prefix(inputs)
        suffix, suffix_pad, suffix_blocks, cond = policy.embed_suffix(inputs.state, case["noise"],
                                                                      case["step_times"][:1].expand(2))
    assert max_diff(prefix, case["prefix_embs"]) <= ATOL
    assert torch.equal(pad, case["prefix_pad_masks"]) and torch.equal(blocks, case["prefix_att_masks"].bool())
    assert max_diff(suffix, case["suffix_embs_step0"]) <= ATOL
    assert torch.equal(suffix_pad, case["suffix_pad_masks"])
    assert torch.equal(suffix_blocks.float(), case["suffix_att_masks"])
    if "adarms_cond_step0" in case:
        assert max_diff(cond, case["adarms_cond_step0"]) <= ATOL
    else:
        assert cond is None


def test_first_velocity_every_step_and_the_actions(reference):
    _, policy, config, case, inputs = reference
    batch = inputs.state.shape[0]
    with torch.no_grad():
        cache, prefix_pad = policy.prefix_cache(inputs)
        v0 = policy.denoise_step(inputs.state, prefix_pad, cache, case["noise"], case["step_times"][0].expand(batch))
        # each step from openpi's own x_t, so one step's error does not hide in the chain's
        steps = [policy.denoise_step(inputs.state, prefix_pad, cache, x, t.expand(batch))
                 for t, x in zip(case["step_times"], case["step_x_t"], strict=True)]
    actions = policy.sample_actions(inputs, case["noise"], num_steps=config["num_steps"])
    assert max_diff(v0, case["v_t_step0"]) <= ATOL
    assert max_diff(torch.stack(steps), case["step_v_t"]) <= ATOL
    assert max_diff(actions, case["actions"]) <= ATOL
    times = torch.tensor(1.0)
    for t in case["step_times"]:
        assert torch.equal(times, t)
        times = times + torch.tensor(-1.0 / config["num_steps"])


def test_the_training_loss(reference):
    _, policy, _, case, inputs = reference
    with torch.no_grad():
        loss = policy.flow_loss(inputs, case["train_actions"], case["train_noise"], case["train_time"])
    # per element relative to max(1, |loss|): squared errors reach a few hundred here, where float32's own spacing
    # (1.5e-5 at 230) is wider than 1e-5; the mean, the number training minimises, within 1e-5 absolute
    theirs = case["train_loss"]
    assert ((loss - theirs).abs() / theirs.abs().clamp_min(1.0)).max().item() <= ATOL
    assert max_diff(loss.mean(), case["train_loss_mean"]) <= ATOL


def fixture_stats() -> dict[str, NormStats]:
    """norm_case.json's statistics in the dtypes openpi computed with when it made the fixture: straight from its
    `RunningStats`, whose mean and std are float32 (float32 data) and quantiles float64 (bin edges); the JSON holds
    exactly those values. (A `norm_stats.json` read back is float64 throughout, `read_norm_stats`' default.)"""
    doc = json.loads((FIXTURE / "norm_case.json").read_text())["norm_stats"]["norm_stats"]
    return {k: NormStats(mean=np.asarray(v["mean"], np.float32), std=np.asarray(v["std"], np.float32),
                         q01=np.asarray(v["q01"], np.float64), q99=np.asarray(v["q99"], np.float64))
            for k, v in doc.items()}


def test_env_actions_are_openpis_unnormalised_actions(reference):
    _, policy, _, case, _ = reference
    normalizer = FlowNormalizer(fixture_stats(), policy.spec.resolved_normalization)
    env = case["env_actions"].numpy()
    theirs = normalizer.unnormalize("actions", case["actions"].numpy())[..., : env.shape[-1]]
    np.testing.assert_array_equal(theirs, env)


def test_normalisation_is_openpis_exactly():
    doc = json.loads((FIXTURE / "norm_case.json").read_text())
    stats = fixture_stats()
    for mode in doc["modes"]:
        norm = FlowNormalizer(stats, "quantile" if mode["use_quantiles"] else "zscore")
        for key in ("state", "actions"):
            x = np.asarray(mode["normalize"]["input"][key], dtype=np.float32)
            normed = norm.normalize(key, x)
            np.testing.assert_array_equal(normed, np.asarray(mode["normalize"]["output"][key]), err_msg=key)
            back = norm.unnormalize(key, normed)
            np.testing.assert_array_equal(back, np.asarray(mode["unnormalize_roundtrip"]["output"][key]))
            wide = np.asarray(mode["unnormalize_model_width"]["input"][key], dtype=np.float32)
            np.testing.assert_array_equal(norm.unnormalize(key, wide),
                                          np.asarray(mode["unnormalize_model_width"]["output"][key]))


def test_tokenization_is_openpis():
    doc = json.loads((FIXTURE / "tokenizer_case.json").read_text())
    for case in doc["cases"]:
        tok = PaliGemmaTokenizer(FIXTURE / doc["tokenizer_model"], case["max_len"])
        state = None if case["state"] is None else np.asarray(case["state"], dtype=np.float32)
        ids, mask = tok.tokenize(case["prompt"], state)
        assert ids.tolist() == case["tokens"] and mask.tolist() == case["mask"], case["prompt"]
        if state is not None:
            assert discretize_state(state).tolist() == case["discretized_state"]
