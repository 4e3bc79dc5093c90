"""Every class of bad input, through the real entry scripts: one clear error naming the key or the file and the fix,
given before Ray or any simulator starts (Ray's temp folder stays empty), and nothing in a run directory changes."""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from pathlib import Path

import pytest
from conftest import TINY, run_script, script_env

from vla_scale.run_policy import fresh_vla


def refused(script: str, *args: str, code: int = 1) -> str:
    """Run an entry script that must stop before Ray starts with exit code `code`; its output."""
    ray_tmp = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # short: Ray's socket paths live under it
    try:
        proc = run_script(script, *args, env=dict(script_env(), RAY_TMPDIR=ray_tmp), timeout=120)
        out = proc.stdout + proc.stderr
        assert proc.returncode == code, out[-3000:]
        assert not any(Path(ray_tmp).iterdir()), "Ray started before the input was checked"
        assert "Traceback" not in out, out[-3000:]
        return out
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)


def tree_digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


CONFIG_CASES = [  # one command per class; each phrase must appear in the error
    ("out-of-range values and unknown names, all in one error", "train",
     ["parallel.sims_per_worker=0", "parallel.num_workers=-2", "algo.mini_batches=0", "algo.lr=0", "algo.temperature=0",
      "sync.bucket_mb=0", "env.max_steps=0", "save_every=-1", "algo.name=reinforce"],
     ["parallel.sims_per_worker=0 must be >= 1", "parallel.num_workers=-2 must be >= 1",
      "algo.mini_batches=0 must be >= 1", "algo.lr=0.0 must be > 0", "algo.temperature=0.0 must be > 0",
      "sync.bucket_mb=0 must be >= 1",
      "env.max_steps=0 must be >= 1", "save_every=-1 must be >= 0",
      "algo.name='reinforce': choose one of ['grpo', 'ppo', 'rloo']"]),
    ("PPO options that contradict each other", "train",
     ["algo=ppo", "algo.filter_low=0.1", "algo.critic.warmup_steps=120", "algo.gamma=1.5", "algo.gae_lambda=-0.1",
      "algo.critic.position=cls", "algo.critic.width=0"],
     ["algo=ppo trains every episode, but algo.filter_low=0.1", "algo.critic.warmup_steps=120 trains only the value "
      "head for the whole run (steps=120)", "algo.gamma=1.5 must be <= 1.0", "algo.gae_lambda=-0.1 must be >= 0",
      "algo.critic.position='cls': choose one of ['prompt_last', 'action_mean']", "algo.critic.width=0 must be >= 1"]),
    ("GRPO with groups of one", "train", ["algo.group_size=1", "algo.batch_size=4"],
     ["algo.group_size=1: GRPO normalises each episode against its group", "algo=ppo trains groups of one"]),
    ("policy that does not fit the env", "train", ["model=tiny_libero", "model.proprio_dim=8"],
     ["proprio projector takes 8", "proprio_dim"]),
    ("missing LIBERO assets, another MuJoCo", "eval",
     ["env=libero_spatial", "model=tiny_libero", "env.libero.assets=/nonexistent", "env.libero.mujoco=3.1.0"],
     ["/nonexistent has no scenes/", "env.libero.assets", "install mujoco==3.1.0", "or set env.libero.mujoco="]),
    ("keys by their former names", "train", ["env.max_delta=0.05", "env.libero_assets=/x", "trainer.nnodes=2",
                                             "env.rollout.precision=fp8", "deepspeed.sync_bucket_mb=8",
                                             "env.num_workers=1", "env.disagg_sim.enable=true"],
     ["env.max_delta is now env.reach.max_delta: write env.reach.max_delta=0.05", "env.libero.assets=/x",
      "trainer.nnodes: the trainer group", "env.rollout.precision is now rollout.precision",
      "deepspeed.sync_bucket_mb is now sync.bucket_mb: write sync.bucket_mb=8",
      "env.num_workers is now parallel.num_workers: write parallel.num_workers=1",
      "env.disagg_sim.enable is now parallel.disagg_sim.enable"]),
    ("keys by their former names (eval)", "eval", ["env.libero_scenes=official", "checkpoint=runs/x",
                                                   "env.rollout.pipeline_stage_num=2"],
     ["env.libero_scenes is now env.libero.scenes", "rollout.pipeline_stage_num=2",
      "checkpoint is now model.checkpoint: write model.checkpoint=runs/x"]),
    ("disaggregated mode without a cluster", "train", ["parallel.disagg_sim.enable=true"],
     ["parallel.disagg_sim.enable=true places simulators", "parallel.ray_address=<head>:6379"]),
    ("Ray address nothing answers (train)", "train", ["parallel.ray_address=127.0.0.1:1"],
     ["parallel.ray_address='127.0.0.1:1'", "within 10 s"]),
    ("Ray address nothing answers (eval)", "eval", ["parallel.ray_address=127.0.0.1:1"],
     ["parallel.ray_address='127.0.0.1:1'", "within 10 s"]),
]


def test_a_ray_address_must_be_host_and_port():
    from vla_scale.parallel.sim.cluster import ray_address_problem

    assert "is not host:port" in ray_address_problem("headnode")
    assert ray_address_problem("") is None and ray_address_problem("auto") is None


def test_bad_configuration_is_refused_before_anything_starts(tmp_path):
    """Each case a command of its own, two at a time (each spends its few seconds importing, on one core)."""
    from concurrent.futures import ThreadPoolExecutor

    def attempt(i: int) -> tuple[str, list[str], str]:
        name, script, args, phrases = CONFIG_CASES[i]
        return name, phrases, refused(script, *TINY, *args, f"run_dir={tmp_path / f'run{i}'}")

    with ThreadPoolExecutor(max_workers=2) as pool:
        for name, phrases, out in pool.map(attempt, range(len(CONFIG_CASES))):
            for phrase in phrases:
                assert phrase in out, (name, phrase, out[-3000:])


def test_a_damaged_checkpoint_file_is_named(tmp_path):
    """A checkpoint folder with LIBERO's 8-D proprio (no fixture needed), its config.json then damaged."""
    from vla_scale.config import ModelConfig
    from vla_scale.envs.reach import instructions

    folder = tmp_path / "checkpoint"
    small = ModelConfig(image_size=32, patch_size=8, vision_dim=32, hidden_size=32, num_layers=1, num_heads=2,
                        intermediate_size=64, proprio_dim=8)
    fresh_vla(small, instructions()).save_pretrained(str(folder))
    (folder / "config.json").write_text("{not json")
    out = refused("train", "--config-name", "oft_libero_spatial", f"model.checkpoint={folder}",
                  f"run_dir={tmp_path / 'run'}")
    assert f"{folder}/config.json is not readable JSON" in out


@pytest.fixture
def run_copy(saved_run, tmp_path) -> Path:
    """A copy of the saved 3-step run to point bad commands at."""
    shutil.copytree(saved_run, tmp_path / "run")
    return tmp_path / "run"


RUN_CASES = [  # (id, overrides, exit code, phrases): resume commands against the run
    ("another model", ["model.hidden_size=48", "algo.lr=1e-5"], 1,
     ["model.hidden_size=48 but the run trained with 32", "algo.lr=1e-05 but the run trained with"]),
    ("already at steps", ["steps=2"], 0, ["is already at step 3 (steps=2): nothing to train"]),
]


@pytest.mark.slow  # run_copy: a 3-step training run
@pytest.mark.parametrize("overrides,code,phrases", [c[1:] for c in RUN_CASES], ids=[c[0] for c in RUN_CASES])
def test_resume_refusals_leave_the_run_as_it_was(run_copy, overrides, code, phrases):
    before = tree_digest(run_copy)
    out = refused("train", *TINY, *overrides, f"run_dir={run_copy}", "resume=true", code=code)
    for phrase in phrases:
        assert phrase in out, out[-3000:]
    assert tree_digest(run_copy) == before  # its .hydra record, log, checkpoints and events untouched


@pytest.mark.slow
def test_a_broken_latest_pointer_names_the_file(run_copy):
    (run_copy / "checkpoints" / "latest").write_text("step_9")
    before = tree_digest(run_copy)
    out = refused("train", *TINY, "steps=4", f"run_dir={run_copy}", "resume=true")
    assert f"{run_copy}/checkpoints/latest names 'step_9'" in out
    assert tree_digest(run_copy) == before


@pytest.mark.slow
def test_eval_of_a_damaged_step_folder_names_the_file(run_copy, tmp_path):
    out = refused("eval", *TINY, "model.hidden_size=48", f"model.checkpoint={run_copy}", f"run_dir={tmp_path / 'eval'}")
    assert "model.hidden_size=48 but" in out and "has 32" in out  # never silently the checkpoint's value
    weights = run_copy / "checkpoints" / "step_3" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])  # a copy cut short
    out = refused("eval", *TINY, f"model.checkpoint={run_copy}", f"run_dir={tmp_path / 'eval'}")
    assert f"{weights} is unreadable" in out


def l1_folder(folder: Path) -> Path:
    """A checkpoint folder with an L1-regression head, the TINY policy's sizes (no fixture needed)."""
    from vla_scale.config import ModelConfig
    from vla_scale.envs.reach import instructions

    tiny = ModelConfig(hidden_size=32, intermediate_size=64, num_layers=1, vision_dim=32, num_heads=2,
                       action_head="l1")
    fresh_vla(tiny, instructions()).save_pretrained(str(folder))
    return folder


HEAD_CASES = [  # (id, script, what is done to the L1 folder, the command's extra overrides, phrases)
    ("token GRPO on an L1 fine-tune", "train", None, ["model.action_head=tokens"],
     ["model.action_head=tokens but", "is an L1-regression fine-tune", "model.action_head=l1 or auto",
      "token-head SFT checkpoint"]),
    ("a diffusion head", "eval", "diffusion", [], ["diffusion-head fine-tune", "DDIM noise-prediction head"]),
    ("two head files", "train", "two", [], ["holds 2 action head files", "action_head--150000_checkpoint.pt"]),
    ("a head of another model", "eval", "shapes", [], ["does not fit the model beside it", "model.fc1.weight"]),
]


@pytest.mark.parametrize("script,damage,overrides,phrases", [c[1:] for c in HEAD_CASES],
                         ids=[c[0] for c in HEAD_CASES])
def test_an_action_head_that_cannot_be_used_is_refused(tmp_path, script, damage, overrides, phrases):
    import torch

    folder = l1_folder(tmp_path / "checkpoint")
    head = folder / "action_head--latest_checkpoint.pt"
    if damage == "diffusion":
        torch.save({}, folder / "noisy_action_projector--150000_checkpoint.pt")
    elif damage == "two":
        shutil.copy(head, folder / "action_head--150000_checkpoint.pt")
    elif damage == "shapes":
        state = torch.load(head, weights_only=True)
        state["module.model.fc1.weight"] = torch.zeros(32, 7 * 64)
        torch.save(state, head)
    out = refused(script, *TINY, f"model.checkpoint={folder}", *overrides, f"run_dir={tmp_path / 'run'}")
    for phrase in phrases:
        assert phrase in out, out[-3000:]
