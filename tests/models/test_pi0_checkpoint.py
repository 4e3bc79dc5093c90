"""π0 / π0.5 checkpoint folders (models/pi0/checkpoint.py, models/families.py): each layout written and read back bit
for bit, openpi's fixture as a converted folder, the family told from the files, and every refusal, each raised
before a tensor is read."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from vla_scale.models.families import CheckpointFolderError, checkpoint_family
from vla_scale.models.flow.normalize import FlowNormalizer, NormStats
from vla_scale.models.pi0 import checkpoint
from vla_scale.models.pi0.checkpoint import (
    EMBED,
    HEAD,
    action_horizon_problems,
    read_pi0_folder,
    write_pi0_folder,
)
from vla_scale.models.pi0.policy import Pi0Inputs, Pi0Policy
from vla_scale.models.pi0.spec import tiny_spec

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "openpi_reference"
TOKENIZER = FIXTURE / "tokenizer.model"
OFT_FOLDER = Path(__file__).resolve().parents[3] / "shared" / "fixtures" / "oft_official_tiny"


def tiny_policy(pi05: bool, seed: int = 0) -> Pi0Policy:
    torch.manual_seed(seed)
    policy = Pi0Policy.from_spec(tiny_spec(pi05)).eval()
    with torch.no_grad():
        for param in policy.parameters():
            param.normal_(0.0, 0.2)
    return policy


def stats(state_dim: int = 8, action_dim: int = 7) -> dict[str, NormStats]:
    g = np.random.default_rng(0)

    def one(dim: int) -> NormStats:
        q01 = g.normal(size=dim) - 1.0
        return NormStats(mean=g.normal(size=dim), std=g.random(dim) + 0.1, q01=q01, q99=q01 + g.random(dim) + 0.5)

    return {"state": one(state_dim), "actions": one(action_dim)}


def actions(policy: Pi0Policy) -> torch.Tensor:
    s, g = policy.spec, torch.Generator().manual_seed(3)
    inputs = Pi0Inputs(
        images=torch.rand(2, s.num_images, 3, s.vision.image_size, s.vision.image_size, generator=g) * 2 - 1,
        image_masks=torch.tensor([[True, True, False], [True, True, True]]),
        tokens=torch.randint(1, 256, (2, s.max_token_len), generator=g),
        token_masks=torch.arange(s.max_token_len)[None] < torch.tensor([[5], [9]]),
        state=torch.randn(2, s.action_dim, generator=g))
    return policy.sample_actions(inputs, policy.sample_noise(2, generator=g), num_steps=3)


def same_stats(a: dict[str, NormStats], b: dict[str, NormStats]) -> bool:
    return sorted(a) == sorted(b) and all(
        all((x is None and y is None) or np.array_equal(x, y) for x, y in
            ((a[k].mean, b[k].mean), (a[k].std, b[k].std), (a[k].q01, b[k].q01), (a[k].q99, b[k].q99))) for k in a)


@pytest.fixture
def no_tensor_reads(monkeypatch):
    """A refusal must come before any tensor is read."""
    def refuse(*args, **kwargs):
        raise AssertionError("a tensor was read before the refusal")

    monkeypatch.setattr(checkpoint, "load_file", refuse)


def written(tmp_path: Path, pi05: bool = False, layout: str = "openpi", **kwargs) -> Path:
    folder = tmp_path / f"{layout}_{'pi05' if pi05 else 'pi0'}"
    write_pi0_folder(folder, tiny_policy(pi05), stats(), TOKENIZER, layout=layout, **kwargs)
    return folder


# ---- round trips --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("layout", ["openpi", "lerobot"])
@pytest.mark.parametrize("pi05", [False, True])
def test_a_written_folder_reads_back_bit_for_bit(tmp_path, layout, pi05):
    policy, norm = tiny_policy(pi05), stats()
    folder = write_pi0_folder(tmp_path / "ckpt", policy, norm, TOKENIZER, layout=layout)
    spec, state, read_stats, tokenizer, found = read_pi0_folder(folder)
    assert spec == replace(policy.spec, norm_convention="lerobot" if layout == "lerobot" else "")
    assert (found.family, found.layout) == ("pi05" if pi05 else "pi0", layout)
    assert found.note == f"{'π0.5' if pi05 else 'π0'} checkpoint, " + (
        "openpi layout" if layout == "openpi" else f"LeRobot layout (type {'pi05' if pi05 else 'pi0'!r})")
    assert tokenizer == folder / "tokenizer.model" and tokenizer.read_bytes() == TOKENIZER.read_bytes()
    assert same_stats(read_stats, norm)
    ours = policy.state_dict()
    assert sorted(state) == sorted(ours) and all(torch.equal(state[k], ours[k]) for k in ours)
    loaded = Pi0Policy(spec).eval()
    loaded.load_openpi_state_dict(state)
    assert torch.equal(actions(loaded), actions(policy))
    mode = spec.resolved_normalization
    out = actions(policy).numpy()
    assert np.array_equal(FlowNormalizer(read_stats, mode).unnormalize("actions", out),
                          FlowNormalizer(norm, mode).unnormalize("actions", out))


def test_the_openpi_layout_is_what_openpis_conversion_writes(tmp_path):
    folder = written(tmp_path, asset_id="physical-intelligence/libero")
    config = json.loads((folder / "config.json").read_text())
    assert config == {"action_dim": 8, "action_horizon": 4, "paligemma_variant": "vla_scale_custom",
                      "action_expert_variant": "vla_scale_custom", "precision": "float32"}
    with safe_open(folder / "model.safetensors", framework="pt") as f:
        names = set(f.keys())
    assert HEAD in names and EMBED not in names and not any(n.startswith("model.") for n in names)
    norm = json.loads((folder / "assets" / "physical-intelligence" / "libero" / "norm_stats.json").read_text())
    assert sorted(norm["norm_stats"]) == ["actions", "state"]
    assert sorted(norm["norm_stats"]["state"]) == ["mean", "q01", "q99", "std"]
    assert read_pi0_folder(folder)[4].asset_id == "physical-intelligence/libero"


@pytest.mark.parametrize("pi05", [False, True])
def test_the_lerobot_layout_prefixes_model_and_keeps_the_stats_in_the_processor_files(tmp_path, pi05):
    folder = written(tmp_path, pi05, layout="lerobot")
    with safe_open(folder / "model.safetensors", framework="pt") as f:
        names = set(f.keys())
    assert all(n.startswith("model.") for n in names) and "model." + HEAD in names
    assert ("model.time_mlp_in.weight" in names) == pi05 and ("model.state_proj.weight" in names) != pi05
    config = json.loads((folder / "config.json").read_text())
    assert config["type"] == ("pi05" if pi05 else "pi0")
    assert (config["chunk_size"], config["n_action_steps"], config["max_action_dim"], config["max_state_dim"],
            config["num_inference_steps"], config["tokenizer_max_length"]) == (4, 4, 8, 8, 10, 24 if pi05 else 12)
    mode = "QUANTILES" if pi05 else "MEAN_STD"
    assert config["normalization_mapping"] == {"VISUAL": "IDENTITY", "STATE": mode, "ACTION": mode}
    assert config["input_features"]["observation.state"] == {"type": "STATE", "shape": [8]}
    assert config["output_features"] == {"action": {"type": "ACTION", "shape": [7]}}
    pre = json.loads((folder / "policy_preprocessor.json").read_text())
    step = next(s for s in pre["steps"] if s["registry_name"] == "normalizer_processor")
    assert step["state_file"].startswith("policy_preprocessor_step_") and step["config"]["norm_map"]["ACTION"] == mode
    with safe_open(folder / step["state_file"], framework="numpy") as f:
        assert np.array_equal(f.get_tensor("observation.state.mean"), stats()["state"].mean)
        assert np.array_equal(f.get_tensor("action.q99"), stats()["actions"].q99)
    assert (folder / "policy_postprocessor_step_0_unnormalizer_processor.safetensors").exists()
    assert read_pi0_folder(folder)[4].n_action_steps == 4


def test_lerobot_folders_of_float32_statistics_and_no_side_file_read(tmp_path):
    """As LeRobot saves them: float32 statistics, only the post-processor's for the actions, no vla_scale.json
    (then the config's own fields decide: real variants, so only the family and the shapes check are exercised)."""
    folder = written(tmp_path, layout="lerobot")
    pre = json.loads((folder / "policy_preprocessor.json").read_text())
    state_file = next(s for s in pre["steps"] if s.get("state_file"))["state_file"]
    with safe_open(folder / state_file, framework="numpy") as f:
        kept = {k: f.get_tensor(k).astype(np.float32) for k in f.keys() if k.startswith("observation.")}
    from safetensors.numpy import save_file as save_numpy
    save_numpy(kept, str(folder / state_file))
    _, _, read_stats, _, _ = read_pi0_folder(folder)
    assert np.array_equal(read_stats["state"].std, stats()["state"].std.astype(np.float32))
    assert np.array_equal(read_stats["actions"].mean, stats()["actions"].mean)
    (folder / "vla_scale.json").unlink()
    with pytest.raises(CheckpointFolderError, match="paligemma_variant='vla_scale_custom'"):
        read_pi0_folder(folder)


def test_openpis_fixture_model_reads_as_a_converted_folder(tmp_path):
    """The parity fixture's PI0Pytorch weights (both tied names kept) with its config.json and norm stats under a
    nested asset id, no vla_scale.json: the family comes from the weights."""
    for model in ("pi0", "pi05"):
        folder = tmp_path / model
        folder.mkdir()
        for name in ("model.safetensors", "config.json"):
            shutil.copyfile(FIXTURE / model / name, folder / name)
        assets = folder / "assets" / "physical-intelligence" / "libero"
        assets.mkdir(parents=True)
        norm = json.loads((FIXTURE / "norm_case.json").read_text())["norm_stats"]
        (assets / "norm_stats.json").write_text(json.dumps(norm))
        spec, state, read_stats, tokenizer, found = read_pi0_folder(folder)
        assert (found.family, found.layout, found.asset_id) == (model, "openpi", "physical-intelligence/libero")
        assert spec.pi05 == (model == "pi05") and spec.action_horizon == 10 and spec.vocab_size == 257
        assert tokenizer is None and sorted(read_stats) == ["actions", "state"]
        Pi0Policy(spec).load_openpi_state_dict(state)


# ---- the family ---------------------------------------------------------------------------------------------------
@pytest.mark.skipif(not OFT_FOLDER.exists(), reason=f"no OFT fixture at {OFT_FOLDER}")
def test_an_oft_folder_is_told_apart_and_refused_as_pi0(no_tensor_reads):
    found = checkpoint_family(OFT_FOLDER)
    assert (found.family, found.layout) == ("oft", "openvla")
    assert found.note == "OpenVLA-OFT checkpoint, official OpenVLA layout"
    with pytest.raises(CheckpointFolderError, match="not a π0"):
        read_pi0_folder(OFT_FOLDER)


def fake_folder(path: Path, config: dict, names: list[str]) -> Path:
    path.mkdir()
    (path / "config.json").write_text(json.dumps(config))
    save_file({n: torch.zeros(2) for n in names}, str(path / "model.safetensors"))
    return path


def test_a_folder_of_an_unknown_family_is_refused(tmp_path, no_tensor_reads):
    folder = fake_folder(tmp_path / "a", {"model_type": "bert"}, ["encoder.layer.0.weight"])
    with pytest.raises(CheckpointFolderError, match="no checkpoint vla_scale knows.*encoder.layer.0.weight"):
        read_pi0_folder(folder)
    act = fake_folder(tmp_path / "b", {"type": "act"}, ["model.backbone.weight"])
    with pytest.raises(CheckpointFolderError, match="LeRobot 'act' policy"):
        checkpoint_family(act)
    with pytest.raises(CheckpointFolderError, match="no checkpoint folder"):
        checkpoint_family(tmp_path / "missing")
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "model.safetensors").write_bytes(b"not a safetensors file at all")
    with pytest.raises(CheckpointFolderError, match="not a safetensors file"):
        checkpoint_family(tmp_path / "c")


def test_a_pi0_folder_with_oft_keys_and_the_reverse_are_refused(tmp_path, no_tensor_reads):
    oft = ["language_model.model.embed_tokens.weight", "vision_backbone.featurizer.cls_token"]
    openpi = fake_folder(tmp_path / "a", {"paligemma_variant": "gemma_2b", "action_dim": 32}, oft)
    with pytest.raises(CheckpointFolderError, match="holds OpenVLA-OFT weights"):
        read_pi0_folder(openpi)
    lerobot = fake_folder(tmp_path / "b", {"type": "pi0"}, ["model." + n for n in oft])
    with pytest.raises(CheckpointFolderError, match="LeRobot type 'pi0'.*OpenVLA-OFT weights"):
        checkpoint_family(lerobot)
    pi0 = [HEAD, "state_proj.weight"]
    openvla = fake_folder(tmp_path / "c", {"model_type": "openvla", "vision_backbone_id": "x"}, pi0)
    with pytest.raises(CheckpointFolderError, match="OpenVLA model's but the weights are π0's"):
        checkpoint_family(openvla)


def test_a_lerobot_type_that_contradicts_the_weights_is_refused(tmp_path, no_tensor_reads):
    folder = written(tmp_path, pi05=False, layout="lerobot")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | {"type": "pi05"}))
    with pytest.raises(CheckpointFolderError, match="type 'pi05'.*weights are π0's"):
        read_pi0_folder(folder)


# ---- refusals -----------------------------------------------------------------------------------------------------
def test_missing_norm_stats_are_refused_naming_the_file(tmp_path, no_tensor_reads):
    folder = written(tmp_path)
    shutil.rmtree(folder / "assets")
    with pytest.raises(CheckpointFolderError, match=r"assets/<asset_id>/norm_stats.json"):
        read_pi0_folder(folder)
    lerobot = written(tmp_path, layout="lerobot")
    for file in lerobot.glob("policy_*processor*"):
        file.unlink()
    with pytest.raises(CheckpointFolderError, match="policy_preprocessor.json's normalizer_processor"):
        read_pi0_folder(lerobot)


def test_several_asset_ids_need_one_chosen(tmp_path, no_tensor_reads):
    folder = written(tmp_path)
    shutil.copytree(folder / "assets" / "libero", folder / "assets" / "droid")
    with pytest.raises(CheckpointFolderError, match=r"several asset ids \['droid', 'libero'\]: choose one"):
        read_pi0_folder(folder)
    with pytest.raises(CheckpointFolderError, match="no .*assets/aloha/norm_stats.json"):
        read_pi0_folder(folder, asset_id="aloha")


def test_several_asset_ids_read_with_one_chosen(tmp_path):
    folder = written(tmp_path)
    shutil.copytree(folder / "assets" / "libero", folder / "assets" / "droid")
    assert read_pi0_folder(folder, asset_id="droid")[4].asset_id == "droid"


def test_a_tokenizer_that_is_not_sentencepiece_is_refused(tmp_path, no_tensor_reads):
    folder = written(tmp_path)
    (folder / "tokenizer.model").write_text('{"model": {"type": "BPE"}}')
    with pytest.raises(CheckpointFolderError, match="tokenizer.model is not a SentencePiece model"):
        read_pi0_folder(folder)
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{}")
    with pytest.raises(CheckpointFolderError, match="not a SentencePiece model"):
        write_pi0_folder(tmp_path / "new", tiny_policy(False), stats(), bad)
    assert not (tmp_path / "new").exists()


def test_weights_that_do_not_fit_the_config_are_refused(tmp_path, no_tensor_reads):
    folder = written(tmp_path)
    side = json.loads((folder / "vla_scale.json").read_text())
    side["pi0_spec"]["expert"]["mlp_dim"] = 96
    (folder / "vla_scale.json").write_text(json.dumps(side))
    with pytest.raises(CheckpointFolderError, match=r"do not fit.*other shapes: .*mlp.down_proj.weight \(32, 64\) "
                                                    r"\(config: \(32, 96\)\)"):
        read_pi0_folder(folder)
    side["pi0_spec"]["expert"]["mlp_dim"] = 64
    side["pi0_spec"]["action_horizon"] = 5
    (folder / "vla_scale.json").write_text(json.dumps(side))
    with pytest.raises(CheckpointFolderError, match="action_horizon=4 but vla_scale.json has action_horizon=5"):
        read_pi0_folder(folder)


def test_norm_stats_that_do_not_fit_are_refused(tmp_path, no_tensor_reads):
    with pytest.raises(CheckpointFolderError, match="actions: 9-d statistics but the model's vectors are 8-d"):
        write_pi0_folder(tmp_path / "a", tiny_policy(False), stats(action_dim=9))
    no_quantiles = {k: NormStats(mean=s.mean, std=s.std) for k, s in stats().items()}
    with pytest.raises(CheckpointFolderError, match="quantile normalisation needs q01 and q99"):
        write_pi0_folder(tmp_path / "b", tiny_policy(True), no_quantiles)


def test_an_action_horizon_the_env_cannot_take():
    assert action_horizon_problems(50, 10, max_steps=220, robot_action_dim=7, env_action_dim=7,
                                   model_action_dim=32) == []
    problems = action_horizon_problems(4, 8, max_steps=3, robot_action_dim=7, env_action_dim=6, model_action_dim=6)
    assert len(problems) == 4
    assert "8 actions played per chunk but the policy predicts 4: play between 1 and 4" in problems[0]
    assert "step limit 3 is shorter than one chunk" in problems[1]
    assert "7-d actions (its statistics), the env takes 6-d" in problems[2]
    assert "do not fit the model's 6-d output" in problems[3]
