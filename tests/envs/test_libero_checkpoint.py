"""A user's path with an official-format OpenVLA-OFT checkpoint folder on LIBERO, through the real entry scripts:
evaluate it (table), train it with GRPO (DeepSpeed ZeRO-3, LIBERO simulators), load the trained weights. The
folder is `../shared/fixtures/oft_libero_pipeline/checkpoint` (made by the official code: Llama-2 tokenizer files,
two images + proprio projector, two datasets' statistics); episodes are cut short to keep CPU time small."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from conftest import read_scalars, run_script

from vla_scale.run_policy import vla_for_env

ROOT = Path(__file__).resolve().parents[2]
FOLDER = Path(os.environ.get("VLA_SCALE_LIBERO_FIXTURE", ROOT.parent / "shared" / "fixtures"
                             / "oft_libero_pipeline")) / "checkpoint"
pytestmark = pytest.mark.skipif(not (FOLDER / "config.json").exists(),
                                reason=f"official OFT LIBERO checkpoint fixture not found at {FOLDER}")
SHORT = ["env.max_steps=16", "parallel.num_workers=1", "parallel.sims_per_worker=2", "progress=false"]


def run(script: str, *args: str, ok: bool = True) -> subprocess.CompletedProcess:
    proc = run_script(script.removesuffix(".py"), *args, timeout=900)
    if ok:
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc


@pytest.mark.slow
def test_evaluate_and_train_an_official_folder(tmp_path: Path) -> None:
    checkpoint = f"model.checkpoint={FOLDER}"
    before = run("eval.py", checkpoint, "env=libero_spatial", "env.num_tasks=2", "env.num_eval_init_states=2", *SHORT,
                 f"run_dir={tmp_path / 'eval_before'}")
    lines = before.stdout.strip().splitlines()
    assert lines[-1].startswith("eval: suite=libero_spatial episodes=4 success_rate="), lines[-1]
    policy_line = next(line for line in lines if line.startswith("policy:"))
    for phrase in ("agentview+wrist rendered at 256 px", "jpeg_lanczos3 to 224, centre crop", "8-d proprio",
                   "(BPE tokenizer of 32001 tokens)", "'libero_spatial_no_noops'", "openvla actions -> libero"):
        assert phrase in policy_line, policy_line
    assert (tmp_path / "eval_before" / "eval_libero_spatial.md").exists()

    run("train.py", "--config-name", "oft_libero_spatial", checkpoint, "deepspeed=zero3", "algo.batch_size=1",
        "algo.group_size=2", "algo.mini_batches=1", "algo.micro_batches=1", "algo.max_resample_rounds=0",
        "algo.filter_low=0", "algo.filter_high=1", "env.num_tasks=1", "env.num_eval_init_states=1",
        "rollout.pipeline_stage_num=1", *SHORT, "steps=2", "eval_every=2", "save_every=2",
        f"run_dir={tmp_path / 'train'}")
    scalars = read_scalars(str(tmp_path / "train" / "tb"))
    assert [s for s, _ in scalars["train/policy_loss"]] == [1, 2]
    assert [v for _, v in scalars["sync/version"]] == [1, 2]
    assert (tmp_path / "train" / "checkpoints" / "step_2" / "model.safetensors").exists()

    # the step folder is a checkpoint folder of the same policy: the official pipeline, tokenizer and statistics, so
    # `launch/eval.py model.checkpoint=<run>` evaluates it as the official folder was (tests/launch/test_eval.py)
    from vla_scale.config import EnvConfig, ModelConfig

    env = EnvConfig(name="libero", suite="libero_spatial", camera_resolution=0)
    official = vla_for_env(ModelConfig(checkpoint=str(FOLDER)), env)
    trained = vla_for_env(ModelConfig(checkpoint=str(tmp_path / "train")), env)
    assert trained.source == str(tmp_path / "train" / "checkpoints" / "step_2")
    assert trained.describe(env).split(": ", 1)[1] == official.describe(env).split(": ", 1)[1]
    instruction = "pick up the black bowl between the plate and the ramekin and place it on the plate"
    assert trained.prompt_ids(instruction).tolist() == official.prompt_ids(instruction).tolist()
    assert trained.spec.norm_stats == official.spec.norm_stats
    assert trained.policy.spec.num_action_tokens == official.spec.num_action_tokens  # every tensor loaded, strictly


def test_bad_checkpoint_inputs_fail_before_any_simulator_starts(tmp_path: Path) -> None:
    """Clear errors naming the key, from the entry script in seconds (no Ray, no simulator) and from the factory."""
    proc = run("eval.py", f"model.checkpoint={FOLDER}", "env=libero_spatial", "env.camera_resolution=128",
               f"run_dir={tmp_path / 'run'}", ok=False)
    assert proc.returncode != 0 and "set env.camera_resolution=256" in proc.stderr, proc.stderr[-2000:]
    assert "Started a local Ray instance" not in proc.stdout + proc.stderr
    from vla_scale.config import ConfigError, EnvConfig, ModelConfig

    libero = dict(name="libero", suite="libero_spatial", camera_resolution=0)
    cases = [
        (dict(checkpoint=str(FOLDER)), dict(libero, suite="libero_goal"), "model.unnorm_key=<one of them>"),
        (dict(checkpoint=str(FOLDER), max_text_len=24), libero, "model.max_text_len=24"),
        (dict(checkpoint=str(FOLDER), unnorm_key="bridge_orig"), libero, "bridge_orig"),
        (dict(checkpoint=str(tmp_path / "missing")), libero, "does not exist"),
        (dict(checkpoint=str(FOLDER)), dict(), "'reach'"),
    ]
    for model, env, phrase in cases:
        with pytest.raises(ConfigError, match=phrase):
            vla_for_env(ModelConfig(**model), EnvConfig(**env))


def test_a_folder_without_tokenizer_files_is_refused(tmp_path: Path) -> None:
    from vla_scale.models.oft import PretrainedVLA
    from vla_scale.models.oft.pretrained import CheckpointError

    folder = tmp_path / "no_tokenizer"
    folder.mkdir()
    for item in FOLDER.iterdir():
        if not item.name.startswith(("tokenizer", "special_tokens")):
            (folder / item.name).symlink_to(item)
    with pytest.raises(CheckpointError, match="has no tokenizer: tokenizer.json"):
        PretrainedVLA.from_pretrained(str(folder), unnorm_key="libero_spatial_no_noops")
    truncated = tmp_path / "truncated"
    truncated.mkdir()
    for item in FOLDER.iterdir():
        if item.name != "model.safetensors":
            (truncated / item.name).symlink_to(item)
    (truncated / "model.safetensors").write_bytes((FOLDER / "model.safetensors").read_bytes()[:4096])
    with pytest.raises(ValueError, match="unreadable.*incomplete"):
        PretrainedVLA.from_pretrained(str(truncated), unnorm_key="libero_spatial_no_noops")
