"""Faults a cluster run meets, on real parts: SIGTERM (preemption) saves and says how to resume, a second one stops
at once; a trainer killed while its checkpoint is published leaves `latest` naming a complete checkpoint that
resumes bit for bit; a file-size limit hit while a checkpoint is written is one clear error, the previous
checkpoint intact and latest; checkpoint folders are data, never code."""

from __future__ import annotations

import hashlib
import os
import resource
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import ROOT, TINY, read_scalars, script_env

from vla_scale import checkpoint
from vla_scale.run_policy import fresh_vla, vla_for_env


def start_train(*overrides: str) -> tuple[subprocess.Popen, list[str]]:
    """launch/train.py with TINY and `overrides`, its output lines collected as they come."""
    proc = subprocess.Popen([sys.executable, str(ROOT / "launch" / "train.py"), *TINY, *overrides], cwd=ROOT,
                            env=script_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True).start()
    return proc, lines


def wait_for(condition, timeout: float = 300.0, every: float = 0.002) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(every)


def digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_second_sigterm_stops_at_once() -> None:
    from vla_scale.stop_signals import StopSignals

    stop, before = StopSignals(), signal.getsignal(signal.SIGTERM)
    stop.install()
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.requested  # the first one only asks
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGTERM)
    finally:
        stop.uninstall()
    assert signal.getsignal(signal.SIGTERM) is before  # the handler it replaced is back


@pytest.mark.slow
def test_sigterm_finishes_the_step_saves_and_says_how_to_resume(tmp_path: Path) -> None:
    run = tmp_path / "run"
    proc, lines = start_train("steps=40", "save_every=0", "eval_every=100", f"run_dir={run}")
    wait_for(lambda: any(line.startswith("training steps") for line in lines))
    time.sleep(1.0)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 143, "".join(lines)[-3000:]
    out = "".join(lines)
    assert "SIGTERM received" in out and "resume=true" in out, out[-3000:]
    tag = checkpoint.latest_tag(str(run))
    assert tag is not None and checkpoint.latest_step(str(run)) >= 1
    assert checkpoint.resume_problems(str(run), _saved_groups(run / "checkpoints" / tag), 1) == []
    assert not list((run / "checkpoints").glob("*.partial"))
    # resumable: the state files and the saved config match (the kill tests below resume for real)


@pytest.mark.slow
@pytest.mark.parametrize("named,delay_s", [("step_2", 0.0), ("step_1", 0.1)], ids=["as_it_publishes", "mid_step"])
def test_a_killed_trainer_resumes_bit_for_bit(tmp_path: Path, saved_run: Path, named: str, delay_s: float) -> None:
    """SIGKILL the moment `latest` names step 2 (its checkpoint just published), or 0.1 s into step 2."""
    run = tmp_path / "run"
    proc, lines = start_train("steps=3", "save_every=1", "eval_every=10", f"run_dir={run}")
    latest = run / "checkpoints" / "latest"
    wait_for(lambda: latest.exists() and latest.read_text().strip() == named or proc.poll() is not None)
    time.sleep(delay_s)
    assert proc.poll() is None, "".join(lines)[-3000:]  # still training
    proc.kill()
    proc.wait()
    step = run / "checkpoints" / checkpoint.latest_tag(str(run))
    for name in ("trainer_state_rank0.json", "model.safetensors", "config.json", "tokenizer.json",
                 "zero_pp_rank_0_mp_rank_00_optim_states.pt"):
        assert (step / name).exists(), (step, name)  # what latest names is whole
    shutil.rmtree(run / "tb")  # the killed run's events; the resumed run writes step 3 alone
    resumed = subprocess.run([sys.executable, str(ROOT / "launch" / "train.py"), *TINY, "steps=3", "save_every=1",
                              "eval_every=10", f"run_dir={run}", "resume=true"], cwd=ROOT, env=script_env(),
                             capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    whole, part = read_scalars(str(saved_run / "tb")), read_scalars(str(run / "tb"))
    first = int(step.name[5:])
    for tag in ("train/policy_loss", "train/grad_norm", "train/success_rate", "sync/version"):
        assert part[tag] == [x for x in whole[tag] if x[0] > first], tag


@pytest.mark.slow
def test_a_file_size_limit_while_saving_is_one_clear_error(tmp_path: Path, saved_run: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(saved_run, run, ignore=shutil.ignore_patterns("step_3", "step_2"))
    (run / "checkpoints" / "latest").write_text("step_1")
    before = digest(run / "checkpoints" / "step_1")
    proc, lines = start_train("steps=2", "save_every=1", "eval_every=10", f"run_dir={run}", "resume=true")
    wait_for(lambda: any(line.startswith("training steps") for line in lines) or proc.poll() is not None)
    resource.prlimit(proc.pid, resource.RLIMIT_FSIZE, (200_000, 200_000))  # as a full disk would stop the save
    assert proc.wait(timeout=300) == 1
    out = "".join(lines)
    assert "cannot write the checkpoint" in out and "at most 200000 bytes" in out, out[-3000:]
    assert "step_1 stays the latest checkpoint" in out and "bytes" in out and "Traceback" not in out, out[-3000:]
    assert checkpoint.latest_tag(str(run)) == "step_1" and digest(run / "checkpoints" / "step_1") == before
    assert not (run / "checkpoints" / "step_2").exists() and not list((run / "checkpoints").glob("*.partial"))


@pytest.mark.slow
def test_a_file_size_limit_on_tensorboard_events_is_one_clear_error(tmp_path: Path, saved_run: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(saved_run, run, ignore=shutil.ignore_patterns("step_3", "step_2", "tb"))
    (run / "checkpoints" / "latest").write_text("step_1")
    before = digest(run / "checkpoints")
    proc, lines = start_train("steps=2", "save_every=1", "eval_every=10", f"run_dir={run}", "resume=true")
    wait_for(lambda: any(line.startswith("training steps") for line in lines) or proc.poll() is not None)
    resource.prlimit(proc.pid, resource.RLIMIT_FSIZE, (1000, 1000))  # a step's scalars take more than that
    assert proc.wait(timeout=300) == 1
    out = "".join(lines)
    assert f"TensorBoard cannot write its events in {run / 'tb'}" in out and "bytes are free" in out, out[-3000:]
    assert "Traceback" not in out and digest(run / "checkpoints") == before  # step_1 intact, still latest


def test_a_failed_write_removes_the_partial_folder_and_names_the_path(tmp_path: Path) -> None:
    import torch

    run = tmp_path / "run"
    partial = run / "checkpoints" / checkpoint.partial_tag("step_2")
    partial.mkdir(parents=True)
    (partial / "half_written.pt").write_bytes(b"x" * 10)
    err = checkpoint.write_failure(str(run), str(partial), OSError(28, "No space left on device", str(partial / "a")),
                                   torch.nn.Linear(10, 10))
    assert not partial.exists()
    assert f"writing {partial / 'a'} failed" in str(err) and "No space left" in str(err)
    assert "needs about 2200 bytes" in str(err) and "no earlier checkpoint exists" in str(err)


def _saved_groups(step: Path) -> dict:
    import json

    from vla_scale.config import AlgoConfig, LoraConfig, ModelConfig

    saved = json.loads((step / checkpoint.RUN_CONFIG).read_text())
    model = ModelConfig(**{**saved["model"], "lora": LoraConfig(**saved["model"]["lora"])})
    return {"model": model, "algo": AlgoConfig(**saved["algo"])}


def test_a_checkpoint_folder_is_data_never_code(tmp_path: Path) -> None:
    """The official folders ship `modeling_*.py` for transformers' trust_remote_code: nothing of it runs here, and
    the hub downloads none of it; pickles are read with weights_only (tests/models/test_checkpoint_io.py)."""
    import fnmatch
    import json

    import torch

    from vla_scale.config import EnvConfig, ModelConfig, ParallelConfig
    from vla_scale.envs.reach import instructions
    from vla_scale.models.hub import LOADED_FILES

    torch.manual_seed(0)
    fresh_vla(ModelConfig(), instructions()).save_pretrained(str(tmp_path))
    marker = tmp_path / "code_ran"
    for name in ("modeling_prismatic.py", "configuration_prismatic.py", "processing_prismatic.py"):
        (tmp_path / name).write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    config = json.loads((tmp_path / "config.json").read_text())
    config["auto_map"] = {"AutoConfig": "configuration_prismatic.OpenVLAConfig",
                          "AutoModelForVision2Seq": "modeling_prismatic.OpenVLAForActionPrediction"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    vla = vla_for_env(ModelConfig(checkpoint=str(tmp_path)), EnvConfig())
    assert vla.policy is not None and not marker.exists()
    assert not any(fnmatch.fnmatch(name, pattern) for pattern in LOADED_FILES for name in ("modeling_prismatic.py",
                                                                                           "configuration_prismatic.py"))
    assert ParallelConfig().ray_dashboard is False  # the dashboard stays off unless asked (then on 127.0.0.1)
