"""benchmarks/pi0_scale.py as `make test` runs it on the CPU: the whole script at a tiny size, and what it prints."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import script_env

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow  # each runs a benchmark script whole: a few RL steps or rollouts


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
