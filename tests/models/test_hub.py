"""Checkpoints by hub id, resolved through huggingface_hub against a cache the test lays out itself (no network)."""

import shutil

import pytest

from vla_scale.config import ConfigError, EnvConfig, ModelConfig
from vla_scale.envs.reach import instructions
from vla_scale.models.hub import is_hub_id
from vla_scale.run_policy import fresh_vla, vla_for_env

COMMIT = "0123456789abcdef0123456789abcdef01234567"
SMALL = ModelConfig(image_size=32, patch_size=8, vision_dim=32, hidden_size=32, num_layers=1, num_heads=2,
                    intermediate_size=64, proprio_dim=4)


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    """$HF_HUB_CACHE/models--org--tiny/snapshots/<commit>/ with a checkpoint folder and refs/main, as the hub's cache
    lays a download out; plus a file the loader never reads, which a download would skip."""
    snapshot = tmp_path / "cache" / "models--org--tiny" / "snapshots" / COMMIT
    fresh_vla(SMALL, instructions()).save_pretrained(str(snapshot))
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text(COMMIT)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return snapshot


def test_a_hub_id_is_told_from_a_path(tmp_path):
    assert is_hub_id("moojink/openvla-7b-oft-finetuned-libero-spatial") and is_hub_id("org/name@v1.0")
    assert not is_hub_id(str(tmp_path)) and not is_hub_id("/abs/path") and not is_hub_id("runs/a/b")


def test_a_cached_hub_id_loads_offline_by_name_and_by_revision(hub_cache):
    for reference in ("org/tiny", f"org/tiny@{COMMIT}"):
        vla = vla_for_env(ModelConfig(checkpoint=reference), EnvConfig())
        assert vla.source == str(hub_cache)
        assert vla.policy.num_action_tokens == SMALL.chunk_len * SMALL.action_dim


def test_an_uncached_id_offline_and_an_unreachable_hub_are_one_clear_error(hub_cache, monkeypatch):
    with pytest.raises(ConfigError) as offline:
        vla_for_env(ModelConfig(checkpoint="org/missing"), EnvConfig())
    message = str(offline.value)
    assert "model.checkpoint='org/missing'" in message and "HF_HUB_OFFLINE" in message
    assert "model.checkpoint=/path/to/checkpoint_folder" in message
    shutil.rmtree(hub_cache.parents[2])
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:1")  # nothing answers there
    with pytest.raises(ConfigError, match=r"model.checkpoint='org/tiny' names a hub checkpoint, but the hub did not"):
        vla_for_env(ModelConfig(checkpoint="org/tiny"), EnvConfig())


def test_the_files_an_official_fine_tune_acts_with_are_fetched():
    """An L1 fine-tune's head file decides how it acts: left behind, the folder would decode LM-head bins."""
    from fnmatch import fnmatch

    from vla_scale.models.hub import LOADED_FILES

    for name in ("action_head--150000_checkpoint.pt", "proprio_projector--150000_checkpoint.pt",
                 "noisy_action_projector--100000_checkpoint.pt", "model-00001-of-00004.safetensors"):
        assert any(fnmatch(name, pattern) for pattern in LOADED_FILES), name
    assert not any(fnmatch("optimizer--150000_checkpoint.pt", p) for p in LOADED_FILES)
