"""The real entry script, end to end: launch/train.py with a tiny config (real MuJoCo, Ray, DeepSpeed, TensorBoard)."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import script_env

from vla_scale.logging import read_scalars, read_text_tags

ROOT = Path(__file__).resolve().parents[1]
TINY = [
    "model.hidden_size=32", "model.intermediate_size=64", "model.num_layers=1", "model.vision_dim=32",
    "model.num_heads=2", "algo.batch_size=2", "algo.group_size=4", "algo.mini_batches=1", "algo.max_resample_rounds=0",
    "algo.filter_low=0", "algo.filter_high=1",
    "env.num_workers=1", "env.sims_per_worker=2", "env.num_eval_init_states=2", "env.max_steps=16", "progress=false",
]


def train(*overrides: str, flags: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    env = script_env()
    cmd = [sys.executable, str(ROOT / "launch" / "train.py"), *flags, *TINY, *overrides]
    proc = subprocess.run(cmd, cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc


@pytest.mark.slow
def test_two_steps_write_every_promised_scalar(tmp_path):
    proc = train("steps=2", "eval_every=1", "save_every=0", f"run_dir={tmp_path}")
    assert f"run directory: {tmp_path}" in proc.stdout
    scalars = read_scalars(str(tmp_path / "tb"))
    for tag in ["train/success_rate", "eval/success_rate", "train/policy_loss", "train/clip_frac", "train/entropy",
                "time/rollout_s", "time/update_s", "time/sync_s"]:
        assert tag in scalars, tag
    assert [s for s, _ in scalars["train/policy_loss"]] == [1, 2]
    assert [s for s, _ in scalars["eval/success_rate"]] == [0, 1, 2]
    assert [v for _, v in scalars["sync/version"]] == [1, 2]
    # the rollout <-> actor mismatch before each update: CPU float32 computes the same function on both sides
    for tag in ("train/mismatch_abs_log_ratio", "train/mismatch_approx_kl", "train/mismatch_outside_clip"):
        assert [s for s, _ in scalars[tag]] == [1, 2] and all(abs(v) < 1e-5 for _, v in scalars[tag]), tag


@pytest.mark.slow
def test_simplevla_rl_loss_options_train(tmp_path):
    """Old log-probs recomputed by the actor with truncated IS weights, episodes weighted equally: two steps run and
    the mismatch is measured over every token (CPU float32: the same function on both sides)."""
    train("steps=2", "eval_every=10", "save_every=0", "algo.old_logprobs=recompute", "algo.tis_cap=2",
          "algo.loss_agg=trajectory_mean", f"run_dir={tmp_path}")
    scalars = read_scalars(str(tmp_path / "tb"))
    assert [s for s, _ in scalars["train/policy_loss"]] == [1, 2]
    for tag in ("train/mismatch_abs_log_ratio", "train/mismatch_approx_kl", "train/mismatch_outside_clip"):
        assert all(abs(v) < 1e-5 for _, v in scalars[tag]), (tag, scalars[tag])


@pytest.fixture(scope="module")
def whole_run(tmp_path_factory) -> Path:
    """3 uninterrupted steps, saving after each: the reference the resumed and colocated runs must reproduce."""
    whole = tmp_path_factory.mktemp("whole")
    train("steps=3", "eval_every=10", "save_every=1", f"run_dir={whole}")
    return whole


@pytest.mark.slow
def test_resume_continues_the_same_run(tmp_path, whole_run):
    whole, part = whole_run, tmp_path / "part"
    train("steps=2", "eval_every=10", "save_every=1", f"run_dir={part}")
    assert (part / "checkpoints" / "step_2" / "model.safetensors").exists()
    train("steps=3", "eval_every=10", "save_every=1", f"run_dir={part}", "resume=true")
    a, b = read_scalars(str(whole / "tb")), read_scalars(str(part / "tb"))
    assert [s for s, _ in b["train/policy_loss"]] == [1, 2, 3]
    for tag in ["train/success_rate", "train/policy_loss", "sync/version"]:
        assert a[tag] == b[tag], tag


@pytest.mark.slow
def test_colocated_memory_options_train_the_same(tmp_path, whole_run):
    """Optimizer state offloaded around rollouts and the engine released during updates: identical training."""
    train("steps=3", "eval_every=10", "save_every=1", f"run_dir={tmp_path}", "deepspeed=zero3_colocated",
          "deepspeed.sync_verify_every=2")
    a, b = read_scalars(str(whole_run / "tb")), read_scalars(str(tmp_path / "tb"))
    for tag in ["train/success_rate", "train/policy_loss", "train/grad_norm", "eval/success_rate"]:
        assert a[tag] == b[tag], tag
    assert [s for s, _ in read_text_tags(str(tmp_path / "tb"))["sync/checksum"]] == [0, 2]  # every 2nd sync


@pytest.mark.slow
def test_resume_with_another_model_or_algorithm_is_refused_before_anything_starts(tmp_path, whole_run):
    env = script_env()
    proc = subprocess.run([sys.executable, str(ROOT / "launch" / "train.py"), *TINY, "steps=4", "resume=true",
                           f"run_dir={whole_run}", "model.hidden_size=48", "algo.lr=1e-5"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    out = proc.stderr + proc.stdout
    assert proc.returncode != 0, out[-3000:]
    assert "model.hidden_size=48 but the run trained with 32" in out and "algo.lr=1e-05" in out
    assert "Started a local Ray instance" not in out


@pytest.mark.slow
def test_deterministic_runs_repeat_with_two_threads(tmp_path):
    """deterministic=true: two same-seed runs on two intra-op threads give the same numbers bit for bit."""
    env = dict(script_env(), OMP_NUM_THREADS="2")
    scalars = []
    for name in ("a", "b"):
        # the default model and batch (make train's): big enough for two threads to sum in different orders
        cmd = [sys.executable, str(ROOT / "launch" / "train.py"), "steps=1", "eval_every=10", "save_every=0",
               "progress=false", "deterministic=true", f"run_dir={tmp_path / name}"]
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
        scalars.append(read_scalars(str(tmp_path / name / "tb")))
    for tag in ("train/policy_loss", "train/grad_norm", "train/entropy", "train/success_rate", "eval/success_rate"):
        assert scalars[0][tag] == scalars[1][tag], tag


@pytest.mark.slow
def test_resume_without_checkpoint_says_what_to_do(tmp_path):
    env = script_env()
    proc = subprocess.run([sys.executable, str(ROOT / "launch" / "train.py"), *TINY, "steps=1", "resume=true",
                           f"run_dir={tmp_path}"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "has no checkpoint" in proc.stderr + proc.stdout


@pytest.mark.slow
def test_multirun_sweep_gives_each_job_its_run_directory(tmp_path):
    proc = train("seed=0,1", "steps=1", "eval_every=1", "save_every=0", f"hydra.sweep.dir={tmp_path}", flags=("-m",))
    runs = sorted(p.parent.name for p in tmp_path.glob("*/tb"))
    assert runs == ["job0_seed0", "job1_seed1"], proc.stdout
    for run in runs:
        assert "eval/success_rate" in read_scalars(str(tmp_path / run / "tb"))


def test_bad_config_fails_before_any_compute(tmp_path):
    env = script_env()
    proc = subprocess.run([sys.executable, str(ROOT / "launch" / "train.py"), "algo.batch_size=3", "algo.group_size=3",
                           f"run_dir={tmp_path}"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "algo.batch_size*algo.group_size" in proc.stderr
    assert not (tmp_path / "tb").exists()


@pytest.mark.slow
def test_two_ranks_under_the_deepspeed_launcher_share_one_run(tmp_path):
    deepspeed = Path(sys.executable).with_name("deepspeed")  # else the one on PATH (wheels installed elsewhere)
    deepspeed = deepspeed if deepspeed.exists() else Path(shutil.which("deepspeed") or deepspeed)
    cmd = [str(deepspeed), "--num_gpus", "2", str(ROOT / "launch" / "train.py"), *TINY, "algo.batch_size=4",
           "steps=2", "eval_every=1", "save_every=1", "deepspeed=zero3"]
    proc = subprocess.run(cmd, cwd=tmp_path, env=script_env(), capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    runs = list((tmp_path / "runs").iterdir())
    assert len(runs) == 1, runs  # one directory for both ranks
    assert proc.stdout.count("tensorboard:") == 1  # only rank 0 prints
    step = runs[0] / "checkpoints" / "step_2"
    assert (step / "trainer_state_rank0.json").exists() and (step / "trainer_state_rank1.json").exists()
    scalars = read_scalars(str(runs[0] / "tb"))
    assert [s for s, _ in scalars["sync/version"]] == [1, 2]
    # DeepSpeed's own conversion of the 2-way sharded checkpoint gives exactly the weights we export
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
    from safetensors.torch import load_file

    converted = get_fp32_state_dict_from_zero_checkpoint(str(runs[0] / "checkpoints"), tag="step_2")
    exported = load_file(str(step / "model.safetensors"))
    assert set(converted) == set(exported)
    assert all(torch.equal(converted[k].float(), exported[k].float()) for k in exported)
    # every rank's engine held the same weights after every sync, and the checksums were logged
    logged = read_text_tags(str(runs[0] / "tb"))["sync/checksum"]
    assert [s for s, _ in logged] == [0, 1, 2] and all("on 2 rank(s)" in text for _, text in logged)

    # killed after step 1: resuming both ranks from that checkpoint gives step 2 exactly again
    part = tmp_path / "part"
    shutil.copytree(runs[0], part, ignore=shutil.ignore_patterns("step_2", "tb"))
    (part / "checkpoints" / "latest").write_text("step_1")
    proc = subprocess.run([*cmd, f"run_dir={part}", "resume=true"], cwd=tmp_path, env=script_env(),
                          capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    resumed = read_scalars(str(part / "tb"))
    assert [s for s, _ in resumed["train/policy_loss"]] == [2]
    for tag in ["train/success_rate", "train/policy_loss", "train/grad_norm", "sync/version"]:
        assert resumed[tag] == [x for x in scalars[tag] if x[0] == 2], tag
    assert resumed["eval/success_rate"] == [x for x in scalars["eval/success_rate"] if x[0] >= 1]
