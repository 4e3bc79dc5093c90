"""benchmarks/rl_step.py as `make test` runs it on the CPU: the whole script at a tiny size, and what it prints."""

from __future__ import annotations

import json
import re
import resource
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import script_env

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow  # each runs a benchmark script whole: a few RL steps or rollouts


def rl_step(*args: str) -> list[str]:
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "rl_step.py"), "--model", "tiny", "--dry-run",
                           *args], cwd=ROOT, env=script_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout.strip().splitlines()


def test_rl_step_help_prints_the_options_and_exits_0():
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "rl_step.py"), "--help"], cwd=ROOT,
                          env=script_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.startswith("usage: rl_step.py") and "--dry-run" in proc.stdout
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    bad = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "rl_step.py"), "--stages", "two"], cwd=ROOT,
                         env=script_env(), capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "invalid int value: 'two'" in bad.stderr and "Traceback" not in bad.stderr


def planned(*args: str) -> subprocess.CompletedProcess[str]:
    """rl_step --dry-run at oft_7b's size in at most 4 GiB of data memory: 7.6B parameters built would need 28 GiB
    in float32, so the plan must come from their shapes alone."""
    def small() -> None:
        resource.setrlimit(resource.RLIMIT_DATA, (4 * 2**30, 4 * 2**30))

    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / "rl_step.py"), "--model", "oft_7b", "--dry-run",
                           *args], cwd=ROOT, env=script_env(), capture_output=True, text=True, timeout=120,
                          preexec_fn=small)


def test_rl_step_dry_run_at_7b_checks_the_plan_and_memory_without_building_the_policy():
    proc = planned("--memory-gib", "80", "--micro-batch", "192")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert "its weights are not built" in lines[0] and "do not shrink to a CPU run" in lines[0]
    assert "768 samples; update in 4 micro-batches of ~192 (ours), 48 of ~16 (anchors)" in lines[1]
    assert "7.558B parameters" in lines[2] and "37.8 GiB left for activations under --memory-gib 80" in lines[2]
    assert "update 112.1 GiB" in lines[3]  # the anchors' optimizer state on the GPU during their update
    assert lines[-1] == ("rl_step plan: model=oft_7b params=7.558B rollout_gib=42.2 update_gib=28.1 host_gib=84.0 "
                         "fits=yes")
    short = planned("--memory-gib", "40")
    assert short.returncode == 1 and "does not fit --memory-gib 40: train LoRA adapters" in short.stdout
    assert short.stdout.strip().splitlines()[-1].endswith("fits=no")
    bad = planned("--micro-batch", "4")
    assert bad.returncode == 1 and "rl_step plan: invalid configuration" in bad.stdout
    assert "1*192 exceeds 96" in bad.stdout and "Traceback" not in bad.stderr
    lora = planned("--memory-gib", "48", "--lora-rank", "32")
    assert lora.returncode == 0 and "0.110B trained" in lora.stdout, lora.stdout[-3000:] + lora.stderr[-3000:]


def test_rl_step_dry_run_prints_both_ways_and_the_last_line():
    lines = rl_step("--memory-gib", "80", "--micro-batch", "4")
    assert re.fullmatch(r"rl_step: step_speedup=\d+\.\d\d rollout_speedup=\d+\.\d\d update_mfu=\d+\.\d\d "
                        r"peak_gib=(nan|\d+\.\d) step_s=\d+\.\d\d update_precision=bf16", lines[-1]), lines[-1]
    rows = [line for line in lines if line.startswith(("| ours |", "| anchors |"))]
    assert {row.split("|")[1].strip() for row in rows} == {"ours", "anchors"}
    assert any("| rollout GiB | update GiB | sync GiB | peak GiB |" in line for line in lines)
    assert any("update alone on the last step's" in line for line in lines)
    assert any("no GPU: no memory cap" in line for line in lines)


def test_rl_step_dry_run_puts_ppo_beside_grpo():
    lines = rl_step("--algo", "ppo", "--micro-batch", "4")
    assert re.fullmatch(r"rl_step ppo: step_ratio=\d+\.\d{3} update_ratio=\d+\.\d{3} peak_gib=(nan|\d+\.\d) "
                        r"grpo_peak_gib=(nan|\d+\.\d)", lines[-1]), lines[-1]
    assert [line.split("|")[1].strip() for line in lines[-3:-1]] == ["grpo", "ppo"]
    assert not any(line.startswith("| anchors |") for line in lines)


def test_rl_step_dry_run_with_the_rollout_during_the_update(tmp_path):
    figures = tmp_path / "rl_step.json"
    lines = rl_step("--max-staleness", "1", "--micro-batch", "4", "--json", str(figures))
    assert re.fullmatch(r"rl_step: step_speedup=\d+\.\d\d rollout_speedup=\d+\.\d\d update_mfu=\d+\.\d\d "
                        r"peak_gib=(nan|\d+\.\d) step_s=\d+\.\d\d update_precision=bf16", lines[-1]), lines[-1]
    rows = json.loads(figures.read_text())["rows"]
    ours, anchors = ([r for r in rows if r["way"] == way] for way in ("ours", "anchors"))
    assert all(r["time/rollout_ahead_s"] > 0 for r in ours)  # the next step's rollout ran during this update
    assert all(r["time/rollout_ahead_s"] == 0 and r["train/staleness_mean"] == 0 for r in anchors)
    assert "each rollout during the update before" in lines[-2]


def test_rl_step_dry_runs_of_lora_with_the_l1_head_and_the_update_sweep():
    # and the update's levers: LoRA's base products in FP8 (emulated on the CPU), a ViT block's and a Llama layer's
    lines = rl_step("--lora-rank", "4", "--action-head", "l1", "--update-precision", "fp8", "--recompute-layers", "0",
                    "--resident", "1")
    assert re.fullmatch(r"rl_step: step_speedup=nan rollout_speedup=nan update_mfu=\d+\.\d\d peak_gib=nan "
                        r"step_s=\d+\.\d\d update_precision=fp8_emulated", lines[-1]), lines[-1]
    assert any("update: fp8_emulated products (11 layers in FP8), recompute_layers=0, resident_sub_groups=1" in line
               for line in lines)
    assert any("update FLOPs = 2 x forward" in line for line in lines)  # no weight gradients of the frozen base
    assert any("action_head=l1" in line for line in lines) and not any(line.startswith("| anchors |") for line in lines)
    lines = rl_step("--update-sweep", "4", "8")
    assert lines[-2:] == [line for line in lines[-2:] if re.fullmatch(r"\| [48] \| [24] \| \d+\.\d \| .*", line)]
    assert len(lines[-2:]) == 2 and lines[-3] == "|---|---|---|---|---|"


def test_rl_step_rollout_sweep_dry_run_prints_every_cost_and_way():
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "rl_step.py"), "--model", "tiny", "--dry-run",
                           "--rollout-sweep", "0", "1"],
                          cwd=ROOT, env=script_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert re.fullmatch(r"rl_step rollouts: sim_ms=0:rollout_speedup=\d+\.\d\d sim_ms=1:rollout_speedup=\d+\.\d\d",
                        lines[-1]), lines[-1]
    rows = [line.split("|")[1:5] for line in lines if re.match(r"\| [01] \|", line)]
    assert [(r[0].strip(), r[2].strip(), r[3].strip()) for r in rows] == [
        (ms, way, s) for ms in "01" for way, s in (("ours", "1"), ("ours", "2"), ("anchors", "1"))]


def test_rl_step_pair_in_two_calls_the_anchors_alone_then_ours_against_their_rows(tmp_path):
    saved = tmp_path / "anchors.json"
    lines = rl_step("--only-anchors", "--micro-batch", "4", "--json", str(saved))
    assert re.fullmatch(r"rl_step anchors: step_s=\d+\.\d\d rollout_s=\d+\.\d\d device=cpu json=\S+", lines[-1])
    assert not any(line.startswith("| ours |") for line in lines)
    assert [r["way"] for r in json.loads(saved.read_text())["rows"]] == ["anchors"]
    lines = rl_step("--anchors-from", str(saved), "--micro-batch", "4", "--memory-gib", "80")
    assert re.fullmatch(r"rl_step: step_speedup=\d+\.\d\d rollout_speedup=\d+\.\d\d update_mfu=\d+\.\d\d "
                        r"peak_gib=(nan|\d+\.\d) step_s=\d+\.\d\d update_precision=bf16", lines[-1]), lines[-1]
    rows = [line.split("|")[1].strip() for line in lines if line.startswith(("| ours |", "| anchors |"))]
    assert rows.count("ours") == 2 and rows.count("anchors") == 1  # ours as it ran and in the table; theirs read
    assert any(f"the anchors' rows from {saved} (cpu)" in line for line in lines)


def test_rl_step_pair_refuses_before_building_what_cannot_be_compared(tmp_path, monkeypatch, capsys):
    saved = tmp_path / "anchors.json"
    shape = {"model": "tiny", "groups": 12, "group_size": 8, "max_steps": 64, "sim_ms": 0.0, "workers": 2, "sims": 6,
             "lora_rank": 0, "dry_run": False}
    saved.write_text(json.dumps({"shape": shape, "rows": [{"way": "anchors", "step_s": 1.0}]}))
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import rl_step  # parse() refuses before the script builds anything

    cases = [(["--anchors-from", str(saved), "--groups", "3"], "--groups 12 there, 3 here. Give this run the same"),
             (["--anchors-from", str(tmp_path / "missing.json")], "not the --json of an --only-anchors run"),
             (["--only-anchors"], "give --json FILE"),
             (["--only-anchors", "--only-ours", "--json", str(saved)], "leave out --only-ours")]
    for extra, says in cases:
        monkeypatch.setattr(sys, "argv", ["rl_step.py", "--model", "tiny", *extra])
        with pytest.raises(SystemExit) as exit_:
            rl_step.parse()
        assert exit_.value.code == 2 and says in capsys.readouterr().err, extra
    monkeypatch.setattr(sys, "argv", ["rl_step.py", "--model", "tiny", "--anchors-from", str(saved)])
    assert rl_step.parse().only_ours  # the same shape: our way only, against the saved rows


def test_rl_step_with_liger_kernels_is_refused_where_there_is_no_gpu():
    if torch.cuda.is_available():
        pytest.skip("checks the refusal on a machine without a GPU")
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "rl_step.py"), "--model", "tiny", "--dry-run",
                           "--kernels", "liger"], cwd=ROOT, env=script_env(), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode != 0
    assert "model.kernels=liger runs Liger Kernel's Triton kernels on a CUDA GPU" in proc.stdout + proc.stderr
