"""Benchmarks that `make test` runs as CPU dry runs: the whole script on the tiny model, its promised last line."""

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
from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parents[1]
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


def test_sft_step_dry_run_prints_the_table_and_the_last_line():
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "sft_step.py"), "--model", "tiny", "--dry-run"],
                          cwd=ROOT, env=script_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert re.fullmatch(r"sft_step: model=tiny lora_rank=32 batch=8 step_s=\d+\.\d{3} peak_gib=(nan|\d+\.\d)",
                        lines[-1]), lines[-1]
    assert "| 0 (warm-up) |" in proc.stdout and "| 1 |" in proc.stdout


def test_sft_rl_dry_run_runs_the_six_commands_and_prints_a_line_per_seed(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "sft_rl.py"), "--dry-run", "--seeds", "0",
                           "--out", str(tmp_path)], cwd=ROOT, env=script_env(), capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert re.fullmatch(r"sft_rl: env=pick_place family=oft algo=ppo seed=0 sft=\d\.\d\d rl=\d\.\d\d "
                        r"episodes=\d+ minutes=\d+\.\d", lines[-1]), lines
    for folder in ("demos", "sft_first", "sft", "sft_eval", "rl", "rl_eval"):
        assert (tmp_path / "seed_0" / folder).is_dir()
    first = json.loads((tmp_path / "seed_0" / "sft_first" / "checkpoints" / "step_2" / "config.json").read_text())
    assert first["vla_scale"]["use_film"] is True and first["vla_scale"]["attention"] == "bidirectional"
    assert (tmp_path / "seed_0" / "rl" / "checkpoints" / "latest").read_text() == "step_1"
    minutes = json.loads((tmp_path / "seed_0" / "minutes.json").read_text())
    assert set(minutes) == {"sft", "rl", "sft_success", "episodes"}

    assert (tmp_path / "seed_0" / "rl" / "checkpoints" / "step_1" / "value_head.safetensors").exists()  # PPO's

    # another RL from the same SFT policy: GRPO, its seed's SFT minutes and success carried over
    again = tmp_path / "again"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "sft_rl.py"), "--dry-run", "--seeds", "0",
                           "--sft-from", str(tmp_path), "--algo", "grpo", "--out", str(again)], cwd=ROOT,
                          env=script_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert sorted(p.name for p in (again / "seed_0").iterdir()) == ["minutes.json", "rl", "rl_eval"]
    assert not (again / "seed_0" / "rl" / "checkpoints" / "step_1" / "value_head.safetensors").exists()
    assert json.loads((again / "seed_0" / "minutes.json").read_text())["sft"] == minutes["sft"]


def test_sft_rl_runs_the_mt10_recipe_and_reports_each_task(tmp_path):
    """The MT10 pipeline at toy sizes (two tasks, 60-step episodes: reach's expert succeeds, push's not; 32 px), π0
    and GRPO: the experts' demonstrations, one SFT stage, the evaluations' per-task table and the line naming env,
    family and algo; then the same seed again, every weight equal."""
    pytest.importorskip("metaworld", reason="Meta-World is not installed: `make metaworld`")
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "sft_rl.py"), "--dry-run", "--env",
                           "metaworld_mt10", "--obs", "agent_goal", "--family", "pi0", "--algo", "grpo", "--seeds",
                           "3", "--out", str(tmp_path)], cwd=ROOT, env=script_env(), capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert re.fullmatch(r"sft_rl: env=metaworld_mt10 obs=agent_goal family=pi0 algo=grpo seed=3 sft=\d\.\d\d "
                        r"rl=\d\.\d\d episodes=2 minutes=\d+\.\d", lines[-1]), lines
    assert sorted(p.name for p in (tmp_path / "seed_3").iterdir()) == [
        "demonstrate", "demos", "minutes.json", "rl", "rl_eval", "sft", "sft_eval"]  # one SFT stage
    rows = [line for line in lines if line.startswith("| reach-v3") or line.startswith("| push-v3")]
    assert len(rows) == 2 and all(re.fullmatch(r"\| \S+ \| \d\.\d\d -> \d\.\d\d \|", r) for r in rows), rows

    # the same seed again on the same demonstrations (deterministic=true in every command): the same fine-tuned and
    # RL weights, bit for bit
    again = tmp_path / "again"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "sft_rl.py"), "--dry-run", "--env",
                           "metaworld_mt10", "--obs", "agent_goal", "--family", "pi0", "--algo", "grpo", "--seeds",
                           "3", "--demos-from", str(tmp_path), "--out", str(again)], cwd=ROOT, env=script_env(),
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1].rsplit(" minutes=")[0] == lines[-1].rsplit(" minutes=")[0]
    for phase in ("sft", "rl"):
        ours = sorted((tmp_path / "seed_3" / phase / "checkpoints").rglob("*.safetensors"))
        theirs = sorted((again / "seed_3" / phase / "checkpoints").rglob("*.safetensors"))
        assert ours and [p.relative_to(tmp_path) for p in ours] == [p.relative_to(again) for p in theirs]
        for a, b in zip(ours, theirs, strict=True):
            first, second = load_file(a), load_file(b)
            assert first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first), a


def test_follows_instruction_scores_the_demonstrator_fully_and_needs_one_policy():
    script = str(ROOT / "benchmarks" / "follows_instruction.py")
    proc = subprocess.run([sys.executable, script, "--demonstrator", "--layouts", "3"], cwd=ROOT, env=script_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == ("follows_instruction: policy=demonstrator first_state=0 "
                                                    "start_spread=0.03 towards_named_cube=24/24")
    both = subprocess.run([sys.executable, script, "runs/x", "--demonstrator"], cwd=ROOT, env=script_env(),
                          capture_output=True, text=True, timeout=300)
    assert both.returncode == 2 and "not both" in both.stderr


def test_learning_curves_puts_runs_side_by_side_at_equal_environment_steps(tmp_path):
    """Two runs' real TensorBoard files: each evaluation with the environment steps trained on before it, then each
    run's last evaluation within the smaller final count."""
    from torch.utils.tensorboard import SummaryWriter

    for name, per_step, rates in (("a", 100, [0.1, 0.5, 0.9]), ("b", 40, [0.2, 0.3, 0.4])):
        writer = SummaryWriter(str(tmp_path / name / "tb"))
        for step in range(0, 21):
            if step:
                writer.add_scalar("train/env_steps", per_step, step)
            if step % 10 == 0:
                writer.add_scalar("eval/success_rate", rates[step // 10], step)
        writer.close()
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "learning_curves.py"), f"a={tmp_path / 'a'}",
                           f"b={tmp_path / 'b'}"], cwd=ROOT, env=script_env(), capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "| a | 20 | 2000 |" in proc.stdout and "| b | 20 | 800 |" in proc.stdout
    budget = proc.stdout.split("at 800 environment steps:")[1]
    assert "| a | 0 | 0 |" in budget and budget.strip().endswith("| 0.400 |")


def test_update_profile_dry_run_profiles_the_phases_and_runs_every_lever():
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "update_profile.py"), "--model", "tiny",
                           "--dry-run", "--loop-steps", "1", "--profile", "", "mb=4",
                           "--variants", "mb=4,recompute=0", "overlap=0,resident=1,kernels=eager"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600, env=script_env())
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert sum(line.startswith("profile of one update") for line in lines) == 2
    phases = [line.split(" | ")[0] for line in lines if line.startswith(("| forward", "| backward", "| step "))]
    assert phases == ["| forward", "| backward", "| step"] * 2
    assert any(line.startswith("step in the loop: ") for line in lines)
    rows = [line for line in lines if line.startswith(("| as configured", "| mb=4,recompute=0", "| overlap=0"))]
    assert len(rows) == 6  # each variant as it runs, then in the table
    assert re.fullmatch(r"update_profile: base_s=\d+\.\d\d base_mfu=\d+\.\d{3} best=\S+ best_s=\d+\.\d\d "
                        r"best_mfu=\d+\.\d{3}", lines[-1])
    bad = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "update_profile.py"), "--variants", "mb=4,x=1"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120, env=script_env())
    assert bad.returncode != 0 and "'x=1' is not key=value" in bad.stdout + bad.stderr
    if not torch.cuda.is_available():
        no_gpu = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "update_profile.py"), "--variants",
                                 "kernels=liger"], cwd=ROOT, capture_output=True, text=True, timeout=120,
                                env=script_env())
        assert no_gpu.returncode != 0
        assert "--variants 'kernels=liger': model.kernels=liger runs Liger Kernel's Triton kernels on a CUDA GPU" in (
            no_gpu.stdout + no_gpu.stderr)


def test_update_profile_profile_none_runs_only_the_levers_and_fp8_is_one():
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "update_profile.py"), "--model", "tiny",
                           "--dry-run", "--profile", "none", "--variants", "precision=fp8"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600, env=script_env())
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert not any(line.startswith(("profile of one update", "| forward")) for line in lines)
    assert sum(line.startswith("| precision=fp8 |") for line in lines) == 2
    assert lines[-1].startswith("update_profile: base_s=")
    both = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "update_profile.py"), "--profile", "none", "mb=4"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120, env=script_env())
    assert both.returncode != 0 and "--profile none means no profile" in both.stderr


def test_fp8_drift_dry_run_puts_the_fp8_products_beside_bf16s_spread():
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "fp8_drift.py"), "--model", "tiny", "--dry-run",
                           "--rows", "8", "--micro-batch", "4"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300, env=script_env())
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert [line.split(" | ")[0] for line in lines[-3:-1]] == ["| bf16 reordered", "| fp8_emulated"]
    figures = dict(kv.split("=") for kv in lines[-1].removeprefix("fp8_drift: ").split())
    assert figures["model"] == "tiny" and figures["precision"] == "fp8_emulated"
    assert 0 < float(figures["fp8_mean"]) <= float(figures["fp8_max"]) < 0.5 and float(figures["fp8_grad_cos"]) > 0.99


@pytest.mark.parametrize(("model", "precision"), [("pi0", "bf16"), ("smolvla", "fp8")])
def test_pi0_scale_dry_run_decodes_and_plays_an_rl_step(model: str, precision: str):
    """Each flow family at toy size: the decode (SmolVLA's also with its prefix in FP8, emulated, beside bf16), its
    FLOPs split, one RL step and the update alone."""
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "pi0_scale.py"), "--dry-run", "--model", model,
                           "--precision", precision], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env=script_env())
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    for way in ("bf16", "fp8") if precision == "fp8" else ("bf16",):
        row = next(line for line in lines if line.startswith(f"| ours sample_actions, {way} | "))
        diff = float(row.strip("| ").split(" | ")[3])
        assert diff == 0 if way == "bf16" else 0 < diff < 0.1, row  # FP8's actions near, not equal to, bf16's
        assert any(line.startswith(f"| ours sample_chain (Flow-SDE), {way} | ") for line in lines)
        assert any(line.startswith(f"| ours prefix, {way} | ") for line in lines)
    assert any(line.startswith("update alone on ") for line in lines)
    assert (precision == "fp8") == any(line.startswith("decode fp8 prefix: ") for line in lines)
    assert re.fullmatch(rf"pi0_scale: model={model}_tiny kernels=eager precision={precision} decode_s=\d+\.\d{{4}} "
                        r"openpi_s=nan ratio=nan step_s=\d+\.\d\d peak_gib=nan decode_mfu=\d+\.\d{3} "
                        r"vs_openpi_compiled=nan vs_openpi_eager=nan", lines[-1])
    assert any(line.startswith("decode FLOPs: ") for line in lines)
    split = next(line for line in lines if line.startswith("decode split: "))
    assert re.fullmatch(r"decode split: prefix pass \d+\.\d{4} s, \d+\.\d\d TFLOP, \d+\.\d% of the matmul rate; "
                        r"K suffix passes -?\d+\.\d{4} s, \d+\.\d\d TFLOP, -?\d+\.\d% of the matmul rate", split)


def test_sim_fleet_steps_meta_world_beside_pick_place():
    pytest.importorskip("metaworld", reason="Meta-World is not installed: `make metaworld`")
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "sim_fleet.py"), "--seconds", "1", "--sims", "2",
                           "--procs", "1", "--override", "env.camera_resolution=32"], cwd=ROOT, env=script_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("sim_fleet:")]
    assert [ln.split()[1] for ln in lines] == ["env=metaworld_mt10", "env=pick_place"]
    for line in lines:
        assert re.fullmatch(r"sim_fleet: env=\S+ sims=2 procs=1 resolution=32 env_steps_per_s=[\d.]+", line), line
        assert float(line.rsplit("=", 1)[1]) > 0


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


def test_pi0_scale_counts_the_grouped_query_attention_as_matmuls_of_the_same_result():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import pi0_scale
    from torch.utils.flop_counter import FlopCounterMode

    from vla_scale.models.pi0 import backbone
    from vla_scale.models.pi0.policy import Pi0Policy
    from vla_scale.models.pi0.spec import PRESETS

    spec = PRESETS["pi0_tiny"]()
    assert spec.paligemma.num_kv_heads < spec.paligemma.num_heads  # grouped-query attention
    torch.manual_seed(0)
    policy = Pi0Policy.from_spec(spec).eval()
    inputs, noise = pi0_scale.decode_case(spec, 2, torch.device("cpu"))
    fused = backbone.attend
    with torch.no_grad(), FlopCounterMode(display=False) as plain:
        actions = policy.sample_actions(inputs, noise.clone())
    with torch.no_grad(), FlopCounterMode(display=False) as spelled, pi0_scale.attention_as_matmuls():
        assert backbone.attend is not fused
        spelled_actions = policy.sample_actions(inputs, noise.clone())
    assert backbone.attend is fused
    torch.testing.assert_close(spelled_actions, actions, rtol=0, atol=1e-5)
    assert spelled.get_total_flops() > plain.get_total_flops()  # the attention's matmuls, uncounted in the fused kernel


def test_goal_pixels_counts_the_goal_site_growing_with_the_resolution():
    pytest.importorskip("metaworld", reason="Meta-World is not installed: `make metaworld`")
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "goal_pixels.py"), "--suite", "reach-v3",
                           "--resolutions", "64", "128", "--placements", "1"], cwd=ROOT, env=script_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    low, high = (re.fullmatch(rf"goal_pixels: resolution={r} median=(\d+) min=(\d+)", line)
                 for r, line in zip((64, 128), lines[-2:], strict=True))
    assert low and high and 0 < int(low[1]) < int(high[1])
    assert re.fullmatch(r"\| reach-v3 \| \d+ \| \d+ \|", lines[2])


@pytest.mark.parametrize("algo", ["grpo", "ppo"])
def test_sft_rl_mt10_recipe_plays_every_task_equally_often_in_80_episodes_a_step(algo):
    from argparse import Namespace

    from hydra import compose, initialize_config_dir

    from vla_scale.config import register_configs, to_config

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import sft_rl

    recipe = sft_rl.RECIPES["metaworld_mt10"]
    args = Namespace(algo=algo, family="oft", rl_args=[], dry_run=False)
    register_configs()
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        cfg = to_config(compose(config_name="config", overrides=[*recipe.task, *sft_rl.rl_overrides(args, recipe)]))
    assert cfg.algo.name == algo and cfg.algo.batch_size * cfg.algo.group_size == 80
    assert cfg.algo.batch_size % cfg.env.num_tasks == 0  # task rounds: each of the ten tasks alike


def test_rl_step_with_liger_kernels_is_refused_where_there_is_no_gpu():
    if torch.cuda.is_available():
        pytest.skip("checks the refusal on a machine without a GPU")
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "rl_step.py"), "--model", "tiny", "--dry-run",
                           "--kernels", "liger"], cwd=ROOT, env=script_env(), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode != 0
    assert "model.kernels=liger runs Liger Kernel's Triton kernels on a CUDA GPU" in proc.stdout + proc.stderr
