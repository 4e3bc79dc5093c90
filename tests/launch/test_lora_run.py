"""A LoRA run through the real entry scripts: adapters beside each checkpoint, a resume that continues the same run,
its step folder evaluated by launch/eval.py (real MuJoCo, Ray, DeepSpeed, TensorBoard)."""

import shutil

import pytest
from conftest import TINY, read_scalars, run_script, train_ok
from safetensors import safe_open


@pytest.mark.slow
def test_a_lora_run_saves_adapters_resumes_and_evaluates(tmp_path):
    whole = tmp_path / "whole"
    train_ok("steps=2", "eval_every=10", "save_every=1", "model.lora.rank=8", f"run_dir={whole}")
    step = whole / "checkpoints" / "step_2"
    assert (step / "adapter_config.json").exists() and (step / "adapter_model.safetensors").exists()
    with safe_open(str(step / "model.safetensors"), "pt") as merged, \
            safe_open(str(step / "adapter_model.safetensors"), "pt") as adapters:
        assert not any("lora_" in key for key in merged.keys())  # merged: a plain policy's tensors
        assert adapters.keys() and all(k.startswith("base_model.model.") for k in adapters.keys())
    scalars = read_scalars(str(whole / "tb"))
    assert "memory/update_peak_gib" not in scalars  # memory per phase is a GPU figure

    part = tmp_path / "part"  # stopped after step 1, resumed
    shutil.copytree(whole, part, ignore=shutil.ignore_patterns("step_2", "tb"))
    (part / "checkpoints" / "latest").write_text("step_1")
    train_ok("steps=2", "eval_every=10", "save_every=1", "model.lora.rank=8", f"run_dir={part}", "resume=true")
    resumed = read_scalars(str(part / "tb"))
    for tag in ("train/policy_loss", "train/grad_norm", "train/success_rate", "sync/version"):
        assert resumed[tag] == [x for x in scalars[tag] if x[0] == 2], tag

    proc = run_script("eval", *TINY, f"model.checkpoint={whole}", f"run_dir={tmp_path / 'eval'}", "env.num_tasks=1")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"evaluating {step} on reach" in proc.stdout
