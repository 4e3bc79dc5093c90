"""PPO through the real entry scripts (MuJoCo, Ray, DeepSpeed, TensorBoard): the value head saved beside the policy
in every checkpoint, a resume that continues the same run bit for bit, the folder evaluated as a policy, RL from
it resuming its critic (and refusing one that does not fit), the L1 head, and LoRA with the value head under ZeRO-3
on two ranks."""

import shutil
import subprocess

import pytest
from conftest import TINY, read_scalars, run_script, script_env, train_ok, two_ranks
from safetensors import safe_open

PPO = ["algo=ppo", "algo.batch_size=8", "algo.group_size=1"]
CRITIC_SCALARS = ("train/value_loss", "train/value_clip_frac", "train/explained_variance", "train/value_mean",
                  "train/return_mean", "train/advantage_mean", "train/advantage_std", "train/critic_warmup")


@pytest.mark.slow
def test_a_ppo_run_saves_its_critic_resumes_and_its_folder_is_a_policy(tmp_path):
    whole = tmp_path / "whole"
    proc = train_ok(*PPO, "steps=2", "eval_every=10", "save_every=1", f"run_dir={whole}")
    assert "critic: a fresh value head (the policy is a fresh one)" in proc.stdout
    step = whole / "checkpoints" / "step_2"
    with safe_open(str(step / "value_head.safetensors"), "pt") as head, \
            safe_open(str(step / "model.safetensors"), "pt") as policy:
        assert head.metadata() == {"position": "prompt_last", "width": "256"}
        assert head.get_tensor("net.4.weight").abs().sum() > 0  # trained away from its zero start
        assert not any(key.startswith("value_head") for key in policy.keys())  # the policy's files: the policy alone
    scalars = read_scalars(str(whole / "tb"))
    for tag in CRITIC_SCALARS:
        assert [s for s, _ in scalars[tag]] == [1, 2], tag

    part = tmp_path / "part"  # stopped after step 1, resumed: step 2 again, bit for bit
    shutil.copytree(whole, part, ignore=shutil.ignore_patterns("step_2", "tb"))
    (part / "checkpoints" / "latest").write_text("step_1")
    train_ok(*PPO, "steps=2", "eval_every=10", "save_every=1", f"run_dir={part}", "resume=true")
    resumed = read_scalars(str(part / "tb"))
    for tag in ("train/policy_loss", "train/grad_norm", "train/success_rate", *CRITIC_SCALARS):
        assert resumed[tag] == [x for x in scalars[tag] if x[0] == 2], tag
    with safe_open(str(step / "value_head.safetensors"), "pt") as a, \
            safe_open(str(part / "checkpoints" / "step_2" / "value_head.safetensors"), "pt") as b:
        assert all(a.get_tensor(k).equal(b.get_tensor(k)) for k in a.keys())

    proc = run_script("eval", *TINY, f"model.checkpoint={whole}", f"run_dir={tmp_path / 'eval'}", "env.num_tasks=1")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"evaluating {step} on reach" in proc.stdout

    proc = train_ok(*PPO, "steps=1", "eval_every=10", "save_every=0", f"model.checkpoint={whole}",
                    f"run_dir={tmp_path / 'again'}")
    assert f"critic: the value head of {step}" in proc.stdout
    proc = run_script("train", *TINY, *PPO, f"model.checkpoint={whole}", "algo.critic.width=8",
                      f"run_dir={tmp_path / 'narrow'}", timeout=120)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "value_head.safetensors does not fit a value head of width 8" in proc.stderr
    assert "set algo.critic.width=256" in proc.stderr


@pytest.mark.slow
def test_ppo_from_a_folder_without_a_critic_starts_a_fresh_one_and_trains_the_l1_head_one_step_off(tmp_path):
    """GRPO's L1-head folder, then PPO from it with the next rollout played during each update
    (`algo.max_staleness=1`): the values and old log-probs come from the proximal pass."""
    grpo = tmp_path / "grpo"
    train_ok("model.action_head=l1", "steps=1", "eval_every=10", "save_every=1", f"run_dir={grpo}")
    proc = train_ok(*PPO, "algo.max_staleness=1", "algo.tis_cap=2.0", "steps=3", "eval_every=10", "save_every=3",
                    f"model.checkpoint={grpo}", f"run_dir={tmp_path / 'ppo'}")
    assert f"critic: a fresh value head ({grpo / 'checkpoints' / 'step_1'} has no value head)" in proc.stdout
    assert (tmp_path / "ppo" / "checkpoints" / "step_3" / "value_head.safetensors").exists()
    scalars = read_scalars(str(tmp_path / "ppo" / "tb"))
    assert all(v > 0 for _, v in scalars["train/value_loss"])
    assert max(v for _, v in scalars["train/staleness_max"]) == 1.0


@pytest.mark.slow
def test_lora_and_the_value_head_train_under_zero3_on_two_ranks(tmp_path):
    cmd = two_ranks(*TINY, *PPO, "model.lora.rank=4", "steps=2", "eval_every=10", "save_every=2", "deepspeed=zero3",
                    f"run_dir={tmp_path / 'run'}")
    proc = subprocess.run(cmd, cwd=tmp_path, env=script_env(), capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    step = tmp_path / "run" / "checkpoints" / "step_2"
    assert (step / "adapter_model.safetensors").exists()
    with safe_open(str(step / "value_head.safetensors"), "pt") as head:
        assert head.get_tensor("net.4.weight").abs().sum() > 0
    scalars = read_scalars(str(tmp_path / "run" / "tb"))
    assert [s for s, _ in scalars["train/value_loss"]] == [1, 2]
    assert all(v > 0 for _, v in scalars["train/grad_norm"])
