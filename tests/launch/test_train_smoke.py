"""The real entry script, end to end: launch/train.py with a tiny config (real MuJoCo, DeepSpeed, TensorBoard; Ray
where sim workers are its actors)."""

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import TINY, read_scalars, read_text_tags, run_script, script_env, train_ok, two_ranks

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_simplevla_rl_loss_options_train(tmp_path):
    """Old log-probs recomputed by the actor with truncated IS weights, episodes weighted equally, two mini-batches:
    the mismatch is measured over every token (CPU float32: the same function on both sides), and reading the first
    mini-batch's old log-probs off its own update forward trains exactly as recomputing them in a pass first. The
    second run's sim workers are Ray actors (a local Ray started for them), which plays the same episodes."""
    runs = {}
    for from_update, in_trainer in (("true", "true"), ("false", "false")):
        run = tmp_path / from_update
        train_ok("steps=2", "eval_every=10", "save_every=0", "algo.old_logprobs=recompute", "algo.tis_cap=2",
                 "algo.loss_agg=trajectory_mean", "algo.mini_batches=2", f"algo.old_logprobs_from_update={from_update}",
                 f"parallel.sim_workers_in_trainer={in_trainer}", f"run_dir={run}")
        runs[from_update] = read_scalars(str(run / "tb"))
    scalars = runs["true"]
    assert [s for s, _ in scalars["train/policy_loss"]] == [1, 2]
    for tag in ("train/mismatch_abs_log_ratio", "train/mismatch_approx_kl", "train/mismatch_outside_clip"):
        assert all(abs(v) < 1e-5 for _, v in scalars[tag]), (tag, scalars[tag])
    for tag in ("train/policy_loss", "train/grad_norm", "train/entropy", "train/clip_frac", "train/success_rate",
                "train/mismatch_abs_log_ratio", "eval/success_rate"):
        assert runs["true"][tag] == runs["false"][tag], tag


@pytest.mark.slow
def test_colocated_memory_options_train_the_same(tmp_path, saved_run):
    """Optimizer state offloaded around rollouts and the engine released during updates: identical training."""
    train_ok("steps=3", "eval_every=10", "save_every=1", f"run_dir={tmp_path}", "deepspeed=zero3_colocated",
          "sync.verify_every=2")
    a, b = read_scalars(str(saved_run / "tb")), read_scalars(str(tmp_path / "tb"))
    for tag in ["train/success_rate", "train/policy_loss", "train/grad_norm", "eval/success_rate"]:
        assert a[tag] == b[tag], tag
    assert [s for s, _ in read_text_tags(str(tmp_path / "tb"))["sync/checksum"]] == [0, 2]  # every 2nd sync


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
def test_a_multirun_sweep_gives_each_job_its_run_directory_and_every_promised_scalar(tmp_path):
    ray_tmp = Path(tempfile.mkdtemp(prefix="ray", dir="/tmp"))  # short: Ray's socket paths would live under it
    proc = run_script("train", "-m", *TINY, "seed=0,1", "steps=2", "eval_every=1", "save_every=0",
                      f"hydra.sweep.dir={tmp_path}", env=dict(script_env(), RAY_TMPDIR=str(ray_tmp)))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert not any(ray_tmp.iterdir()), "colocated sim workers need no Ray, yet it started"
    ray_tmp.rmdir()
    runs = sorted(p.parent.name for p in tmp_path.glob("*/tb"))
    assert runs == ["job0_seed0", "job1_seed1"], proc.stdout
    for run in runs:
        assert f"run directory: {tmp_path / run}" in proc.stdout
        scalars = read_scalars(str(tmp_path / run / "tb"))
        for tag in ["train/success_rate", "eval/success_rate", "train/policy_loss", "train/clip_frac",
                    "train/entropy", "time/rollout_s", "time/make_room_s", "time/update_s", "time/recompute_s",
                    "time/sync_s"]:
            assert tag in scalars, (run, tag)
        assert [s for s, _ in scalars["train/policy_loss"]] == [1, 2]
        assert [s for s, _ in scalars["eval/success_rate"]] == [0, 1, 2]
        # reach's 3 tasks drawn in rounds: step 1 plays tasks 0 and 1, step 2 task 2 and task 0 again
        per_task = {t: dict(scalars[t]) for t in scalars if t.startswith("train/task_")}
        assert set(per_task) == {f"train/task_{k}_success_rate" for k in range(3)}, sorted(per_task)
        assert [sorted(rates) for _, rates in sorted(per_task.items())] == [[1, 2], [1], [2]]
        first = [per_task[f"train/task_{k}_success_rate"][1] for k in (0, 1)]
        assert np.isclose(np.mean(first), dict(scalars["train/success_rate"])[1])
        assert [v for _, v in scalars["sync/version"]] == [1, 2]
        # each step's resident memory: the trainer's, and its simulator processes' largest and total
        for tag in ("memory/trainer_rss_gib", "memory/sim_rss_gib_max", "memory/sim_rss_gib_sum"):
            assert [s for s, _ in scalars[tag]] == [1, 2] and all(0.01 < v < 20 for _, v in scalars[tag]), tag
        # the rollout <-> actor mismatch before each update: CPU float32 computes the same function on both sides
        for tag in ("train/mismatch_abs_log_ratio", "train/mismatch_approx_kl", "train/mismatch_outside_clip"):
            assert [s for s, _ in scalars[tag]] == [1, 2] and all(abs(v) < 1e-5 for _, v in scalars[tag]), tag


@pytest.mark.slow
def test_two_ranks_under_the_deepspeed_launcher_share_one_run(tmp_path):
    cmd = two_ranks(*TINY, "algo.batch_size=4", "steps=2", "eval_every=1", "save_every=1", "deepspeed=zero3")
    proc = subprocess.run(cmd, cwd=tmp_path, env=script_env(), capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    port = cmd[cmd.index("--master_port") + 1]  # DeepSpeed's CPU all-reduce buffers are named after it
    assert not list(Path("/dev/shm").glob(f"deepspeed_allreduce_buffer_*_{port}_*")), "left in /dev/shm"
    runs = list((tmp_path / "runs").iterdir())
    assert len(runs) == 1, runs  # one directory for both ranks
    assert proc.stdout.count("tensorboard:") == 1  # only rank 0 prints
    step = runs[0] / "checkpoints" / "step_2"
    assert (step / "trainer_state_rank0.json").exists() and (step / "trainer_state_rank1.json").exists()
    scalars = read_scalars(str(runs[0] / "tb"))
    assert [s for s, _ in scalars["sync/version"]] == [1, 2]
    # DeepSpeed's own conversion of the 2-way sharded checkpoint gives exactly the weights we export
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    from vla_scale.models.oft.checkpoint_io import iter_tensors

    converted = get_fp32_state_dict_from_zero_checkpoint(str(runs[0] / "checkpoints"), tag="step_2")
    exported = dict(iter_tensors(str(step)))  # the step folder's weights and proprio projector
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
