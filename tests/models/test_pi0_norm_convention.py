"""π0's normalisation by LeRobot's edge rules (`FlowNormalizer(..., convention="lerobot")`) gives what LeRobot 0.4.4's
own processor steps gave (tests/fixtures/lerobot_reference/make_normalization.py ran them), bit for bit, where
openpi's rules differ; a LeRobot folder is read with them and `model.pi0.norm_convention` chooses."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from vla_scale.config import ConfigError, EnvConfig, ModelConfig
from vla_scale.models.flow.normalize import FlowNormalizer, NormStats
from vla_scale.models.pi0.checkpoint import read_pi0_folder, write_pi0_folder
from vla_scale.models.pi0.policy import Pi0Policy
from vla_scale.models.pi0.run import source_for_env as pi0_source_for_env
from vla_scale.models.pi0.spec import tiny_spec

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
REFERENCE = load_file(str(FIXTURES / "lerobot_reference" / "normalization.safetensors"))
TOKENIZER = FIXTURES / "openpi_reference" / "tokenizer.model"
CASES = {"mean_std": "zscore", "quantiles": "quantile"}


def reference_stats(case: str) -> dict[str, NormStats]:
    def one(key: str) -> NormStats:
        return NormStats(**{stat: REFERENCE[f"{case}.{key}.{stat}"] for stat in ("mean", "std", "q01", "q99")})

    return {"state": one("observation.state"), "actions": one("action")}


@pytest.mark.parametrize("case", sorted(CASES))
def test_lerobots_rules_give_lerobots_numbers_bit_for_bit(case: str) -> None:
    norm = FlowNormalizer(reference_stats(case), CASES[case], convention="lerobot")
    state, action, model_action = (REFERENCE[f"{case}.{k}"] for k in ("state", "action", "model_action"))
    for ours, theirs in ((norm.normalize("state", state), REFERENCE[f"{case}.state_normalized"]),
                         (norm.normalize("actions", action), REFERENCE[f"{case}.action_normalized"]),
                         (norm.unnormalize("actions", model_action), REFERENCE[f"{case}.action_unnormalized"])):
        assert ours.dtype == np.float32
        np.testing.assert_array_equal(ours, theirs)
    # the model's actions padded past the robot's 7: the padding stays as it is, as LeRobot cuts it off
    padded = np.concatenate([model_action, np.full((len(model_action), 3), 0.25, np.float32)], axis=-1)
    wide = norm.unnormalize("actions", padded)
    np.testing.assert_array_equal(wide[:, :7], REFERENCE[f"{case}.action_unnormalized"])
    assert np.all(wide[:, 7:] == 0.25)


@pytest.mark.parametrize("case", sorted(CASES))
def test_openpis_rules_differ_from_lerobots_on_the_same_statistics(case: str) -> None:
    """What the choice is for: with a std of 0 or a range of 0, openpi's 1e-6 and LeRobot's 1e-8 part ways by far."""
    openpi = FlowNormalizer(reference_stats(case), CASES[case], convention="openpi")
    theirs = REFERENCE[f"{case}.state_normalized"]
    ours = openpi.normalize("state", REFERENCE[f"{case}.state"].astype(np.float64))
    zero = 1 if case == "mean_std" else 2  # the fixture's constant dimension of each mode
    assert np.max(np.abs(ours[:, zero] - theirs[:, zero]) / np.abs(theirs[:, zero])) > 0.5
    others = [d for d in range(8) if d != zero]
    np.testing.assert_allclose(ours[:, others], theirs[:, others], rtol=1e-4, atol=1e-5)  # eps over a range


def test_an_unknown_convention_is_refused() -> None:
    with pytest.raises(ValueError, match="choose one of"):
        FlowNormalizer(reference_stats("mean_std"), "zscore", convention="jax")


def test_a_lerobot_folder_normalises_as_lerobot_and_the_key_chooses(tmp_path: Path) -> None:
    policy = Pi0Policy.from_spec(replace(tiny_spec(False), max_token_len=24))  # room for pick_place's prompts
    stats = reference_stats("mean_std")
    lerobot = write_pi0_folder(tmp_path / "lerobot", policy, stats, TOKENIZER, layout="lerobot")
    openpi = write_pi0_folder(tmp_path / "openpi", policy, stats, TOKENIZER, layout="openpi")
    assert read_pi0_folder(lerobot, load=False)[0].resolved_norm_convention == "lerobot"
    assert read_pi0_folder(openpi, load=False)[0].resolved_norm_convention == "openpi"
    env = EnvConfig(name="pick_place", suite="pick_place", num_tasks=1)

    def convention(folder: Path, key: str = "") -> str:
        model = ModelConfig(family="pi0", checkpoint=str(folder))
        model.pi0.norm_convention = key
        source = pi0_source_for_env(model, env)
        normalizer = source.normalizer()
        assert normalizer is not None
        return normalizer.convention

    assert convention(lerobot) == "lerobot" and convention(openpi) == "openpi"
    assert convention(lerobot, "openpi") == "openpi" and convention(openpi, "lerobot") == "lerobot"
    fresh = ModelConfig(family="pi0")
    fresh.pi0.tokenizer, fresh.pi0.norm_convention = str(TOKENIZER), "bogus"
    with pytest.raises(ConfigError, match="norm_convention"):
        pi0_source_for_env(fresh, env)
