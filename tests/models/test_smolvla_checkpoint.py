"""SmolVLA's folders both ways, against LeRobot's own: the fixture's `policy/` (written by LeRobot's SmolVLAPolicy
and its processors, tests/fixtures/smolvla_reference) read into a source whose tokenizer, normaliser, policy and
decoder give LeRobot's actions; a folder we write reads back the same and holds what LeRobot's reader takes (that
LeRobot itself loads it and reproduces the fixture is `check_folder.py`'s, run in the reference environment: see the
fixture's README); broken folders refused by file before a tensor is read."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file as load_numpy
from safetensors.torch import load_file, save_file

from vla_scale.models.families import CheckpointFolderError
from vla_scale.models.flow.layout import pad_last
from vla_scale.models.flow.policy import FlowInputs
from vla_scale.models.smolvla.checkpoint import load_weights, read_smolvla_folder, write_smolvla_folder
from vla_scale.models.smolvla.source import SmolVLASource

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "smolvla_reference"
POLICY = FIXTURE / "policy"
pytestmark = pytest.mark.skipif(not (POLICY / "model.safetensors").exists(), reason="the SmolVLA fixture is absent")


@pytest.fixture(scope="module")
def case() -> dict[str, np.ndarray]:
    return load_numpy(str(FIXTURE / "case.safetensors"))


@pytest.fixture(scope="module")
def source() -> SmolVLASource:
    return SmolVLASource.from_folder(str(POLICY), "pick_place")


def _inputs(source: SmolVLASource, case: dict[str, np.ndarray]) -> FlowInputs:
    """The fixture's batch through our tokenizer and normaliser (its images as LeRobot's policy fed the tower)."""
    tasks = json.loads((FIXTURE / "case.json").read_text())["task"]
    prompts = [source.tokenizer.tokenize(t) for t in tasks]
    normalizer = source.normalizer()
    assert normalizer is not None
    state = normalizer.normalize("state", case["state_raw"].astype(np.float64))
    np.testing.assert_allclose(state, case["state"], rtol=0, atol=1e-6)  # LeRobot's MEAN_STD
    images = np.stack([case["image_model_top"], case["image_model_wrist"]], axis=1)
    return FlowInputs(images=torch.from_numpy(images), image_masks=torch.ones(2, 2, dtype=torch.bool),
                      tokens=torch.from_numpy(np.stack([p for p, _ in prompts])),
                      token_masks=torch.from_numpy(np.stack([m for _, m in prompts])),
                      state=torch.from_numpy(pad_last(state, source.spec.max_state_dim)))


def test_a_lerobot_folder_decodes_lerobots_actions(source, case) -> None:
    assert source.family == "smolvla" and "LeRobot layout" in source.source
    assert source.actions_per_chunk == 10 and source.spec.num_images == 2
    policy = source.new_policy().eval()
    expected = load_file(str(POLICY / "model.safetensors"))
    ours = policy.state_dict()
    assert all(torch.equal(ours[name.removeprefix("model.")], tensor) for name, tensor in expected.items())
    inputs = _inputs(source, case)
    with torch.no_grad():
        sampled = policy.sample_actions(inputs, torch.from_numpy(case["noise"]))
    torch.testing.assert_close(sampled, torch.from_numpy(case["sampled_actions"]), rtol=1e-4, atol=1e-5)
    env = source.chunk_decoder()
    env.env_action_dim = 7  # the fixture's robot
    np.testing.assert_allclose(env.env_chunk(sampled.numpy()), case["env_actions"], rtol=1e-4, atol=1e-5)


def test_a_folder_we_write_reads_back_and_holds_lerobots_files(source, tmp_path) -> None:
    spec, stats, tokenizer, _ = read_smolvla_folder(POLICY)
    write_smolvla_folder(tmp_path, load_weights(POLICY), spec, stats, tokenizer, ["top", "wrist"], 10)
    again, stats_again, own, found = read_smolvla_folder(tmp_path)
    assert again == spec and found.n_action_steps == 10 and own == tmp_path / "tokenizer"
    for key in ("state", "actions"):
        np.testing.assert_array_equal(stats_again[key].mean, stats[key].mean)
        np.testing.assert_array_equal(stats_again[key].std, stats[key].std)
    written, theirs = load_file(str(tmp_path / "model.safetensors")), load_file(str(POLICY / "model.safetensors"))
    assert set(written) == set(theirs) and all(torch.equal(written[k], theirs[k]) for k in theirs)
    ours_config, their_config = (json.loads((f / "config.json").read_text()) for f in (tmp_path, POLICY))
    assert {k: v["type"] for k, v in ours_config["input_features"].items()} == \
        {k: v["type"] for k, v in their_config["input_features"].items()}  # cameras at the side we render
    for key in ("type", "output_features", "chunk_size", "n_action_steps", "max_state_dim",
                "max_action_dim", "resize_imgs_with_padding", "tokenizer_max_length", "num_steps", "num_vlm_layers",
                "self_attn_every_n_layers", "expert_width_multiplier", "attention_mode", "normalization_mapping"):
        assert ours_config[key] == their_config[key], key
    steps = [[s["registry_name"] for s in json.loads((f / "policy_preprocessor.json").read_text())["steps"]]
             for f in (tmp_path, POLICY)]
    assert steps[0] == steps[1]
    assert json.loads((tmp_path / "vlm" / "config.json").read_text())["text_config"]["num_hidden_layers"] == 6


def test_broken_folders_are_refused_by_file(tmp_path) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(POLICY, broken)
    (broken / "config.json").write_text("{not json")
    with pytest.raises(CheckpointFolderError, match="config.json is not readable JSON"):
        read_smolvla_folder(broken)
    shutil.copyfile(POLICY / "config.json", broken / "config.json")
    tensors = load_file(str(POLICY / "model.safetensors"))
    tensors["model.state_proj.weight"] = torch.zeros(64, 16)
    save_file(tensors, str(broken / "model.safetensors"))
    with pytest.raises(CheckpointFolderError, match=r"model.safetensors does not fit.*state_proj.weight"):
        read_smolvla_folder(broken)
    shutil.copyfile(POLICY / "model.safetensors", broken / "model.safetensors")
    for stats in broken.glob("policy_*processor*"):
        stats.unlink()
    with pytest.raises(CheckpointFolderError, match="no normalisation statistics"):
        read_smolvla_folder(broken)
    config = json.loads((POLICY / "config.json").read_text()) | {"vlm_model_name": "someone/other-vlm"}
    (broken / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointFolderError, match="other-vlm.*copy that VLM's config.json"):
        read_smolvla_folder(broken)
