"""The L1-regression head against the official OpenVLA-OFT code, on `tests/fixtures/oft_l1_head` (README there).

The fixture holds an official `action_head--0_checkpoint.pt` (the official class, bf16, DDP's `module.` prefix), the
last hidden states at the 56 action rows of 8 LIBERO observations x 3 consecutive chunks (two suites, two cameras +
proprio, checkpoint C of `../shared/fixtures/oft_libero_pipeline`, whose token path matches the official code), and
what the official head, its loader, `_unnormalize_actions` and LIBERO's `process_action` made of them, in float32 and
as the official evaluation runs the head (bf16). Without `../shared` the head, the loader, the un-normalisation and
the gripper processing are checked on the stored hidden states; with it, the whole pipeline from the stored raw
observations through `PretrainedVLA.predict` on checkpoint C with the head file beside it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from vla_scale.envs.registry import simulator
from vla_scale.models.oft.action_heads import L1RegressionHead
from vla_scale.models.oft.actions import DatasetStats
from vla_scale.models.oft.checkpoint_io import load_action_head_state

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "oft_l1_head"
SHARED = Path(os.environ.get("VLA_SCALE_LIBERO_FIXTURE", ROOT.parent / "shared" / "fixtures" / "oft_libero_pipeline"))
FP32_TOL = 1e-5
"""Our float32 head against the official one in float32 (the same operations, another batching: measured 3.3e-6)."""


@pytest.fixture(scope="module")
def ref() -> dict[str, np.ndarray]:
    return dict(np.load(FIXTURE / "reference.npz"))


def our_head(ref: dict, dtype: torch.dtype) -> L1RegressionHead:
    """Our head, built for the fixture's model size, loaded through our loader from the official file."""
    head = L1RegressionHead(int(ref["hidden_size"]), int(ref["num_actions_chunk"]), int(ref["action_dim"]))
    head.load_state_dict(load_action_head_state(str(FIXTURE)))  # strict: every official name, no other
    return head.to(dtype).eval()


def normalised(ref: dict, dtype: torch.dtype) -> np.ndarray:
    hidden = torch.from_numpy(ref["hidden_states"])
    n, k = hidden.shape[:2]
    with torch.no_grad():
        out = our_head(ref, dtype)(hidden.reshape(n * k, *hidden.shape[2:]).to(dtype)).float()
    return out.numpy().reshape(ref["normalized_actions"].shape)


def stats_of(ref: dict, key: str) -> DatasetStats:
    i = list(ref["stats_keys"]).index(key)
    entry = {"action": {"q01": ref["stats_q01"][i].tolist(), "q99": ref["stats_q99"][i].tolist(),
                        "mask": ref["stats_mask"][i].tolist()}}
    return DatasetStats.from_json(entry, "bounds_q99")


def test_the_fixture_covers_what_the_head_must_be_right_on(ref):
    assert ref["hidden_states"].shape[:2] == (8, 3) and len(set(ref["unnorm_key"].tolist())) == 2
    assert np.abs(ref["normalized_actions"]).max() > 1  # outputs past [-1, 1]: nothing may clip the mode


def test_our_head_gives_the_official_normalised_actions_in_float32(ref):
    fp32 = normalised(ref, torch.float32)
    assert np.abs(fp32 - ref["normalized_actions"]).max() <= FP32_TOL
    assert np.abs(fp32 - ref["normalized_actions_bf16"]).max() <= float(ref["bf16_max_abs_diff"])


def test_our_head_in_bf16_gives_the_official_bf16_head_bit_for_bit():
    """In bf16, as the official evaluation runs its head. In a process of its own: once `deepspeed.zero.Init` has run
    in a process (an actor, another test), DeepSpeed's replacement of torch's linear adds the bias after the product
    and rounds twice in bf16."""
    script = ("import sys, numpy as np, torch; sys.path.insert(0, sys.argv[1]); import test_l1_head_official as t; "
              "ref = dict(np.load(t.FIXTURE / 'reference.npz')); "
              "print(np.array_equal(t.normalised(ref, torch.bfloat16), ref['normalized_actions_bf16']))")
    proc = subprocess.run([sys.executable, "-c", script, str(Path(__file__).parent)], capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.stdout.strip() == "True", proc.stdout[-2000:] + proc.stderr[-2000:]


def test_un_normalisation_and_libero_gripper_give_the_official_env_actions(ref):
    to_env = simulator("libero").action_postprocess("openvla")
    for suffix in ("", "_bf16"):
        for case, key in enumerate(ref["unnorm_key"].tolist()):
            # the official head's outputs through our un-normalisation (float32 in, as the official code) and
            # LIBERO's gripper processing: bit for bit
            actions = stats_of(ref, str(key)).unnormalize_actions(ref["normalized_actions" + suffix][case])
            np.testing.assert_array_equal(actions, ref["actions" + suffix][case])
            np.testing.assert_array_equal(to_env(actions), ref["env_actions" + suffix][case])
    ours = normalised(ref, torch.float32)  # and our head's, within its float32 distance from the official one
    for case, key in enumerate(ref["unnorm_key"].tolist()):
        actions = stats_of(ref, str(key)).unnormalize_actions(ours[case])
        np.testing.assert_allclose(actions, ref["actions"][case], rtol=0, atol=FP32_TOL)
        env = to_env(actions)
        np.testing.assert_allclose(env, ref["env_actions"][case], rtol=0, atol=FP32_TOL)
        np.testing.assert_array_equal(env[..., -1], ref["env_actions"][case][..., -1])  # the gripper's side


@pytest.mark.skipif(not (SHARED / "checkpoint" / "config.json").exists(),
                    reason=f"checkpoint C of the official OFT LIBERO pipeline fixture not found at {SHARED}")
def test_an_official_l1_folder_acts_as_the_official_pipeline(ref, tmp_path):
    """Checkpoint C with the official head file beside it, as an official L1 fine-tune's folder: the head decided by
    the folder, the raw observations through our whole pipeline, the official env actions of every chunk."""
    from vla_scale.envs.types import Observation
    from vla_scale.models.oft import PretrainedVLA

    folder = tmp_path / "checkpoint"
    shutil.copytree(SHARED / "checkpoint", folder)
    shutil.copy(FIXTURE / "action_head--0_checkpoint.pt", folder)
    for key in sorted(set(ref["unnorm_key"].tolist())):
        vla = PretrainedVLA.from_pretrained(str(folder), unnorm_key=key)
        assert vla.spec.action_head == "l1" and "action head l1" in vla.describe()
        cases = [c for c, k in enumerate(ref["unnorm_key"]) if k == key]
        obs = [Observation({"agentview": ref["obs_agentview"][c, j], "wrist": ref["obs_wrist"][c, j]},
                           ref["state"][c, j], str(ref["instruction"][c])) for c in cases for j in range(3)]
        batch = vla.inputs(obs)
        with torch.no_grad():
            hidden = vla.policy.action_hidden_states(batch.pixel_values, batch.input_ids, batch.attention_mask,
                                                     batch.proprio)
        want = ref["hidden_states"][cases].reshape(hidden.shape)
        assert np.abs(hidden.numpy() - want).max() <= 5e-3  # float32 on another CPU: see test_pretrained_libero
        pred = vla.predict(obs)
        np.testing.assert_allclose(pred.actions, ref["actions"][cases].reshape(pred.actions.shape), rtol=0, atol=1e-3)
        np.testing.assert_array_equal(pred.env_actions[..., -1],
                                      ref["env_actions"][cases].reshape(pred.env_actions.shape)[..., -1])
