"""Text tokenizer, OpenVLA's action discretisation and the dataset normalisation (numpy only)."""

import numpy as np
import pytest

from vla_scale.envs.reach import instructions
from vla_scale.models.oft import ActionTokenizer, DatasetStats
from vla_scale.models.tokenizer import WordTokenizer


def test_word_tokenizer_knows_every_instruction_word_and_uses_llama_special_ids():
    tok = WordTokenizer.from_instructions(instructions())
    ids, mask = tok.encode(["In: What action should the robot take to reach the red block?\nOut:"], 24)
    assert (tok.unk_id, tok.bos_id, tok.eos_id) == (0, 1, 2)
    assert ids[0, 0] == tok.bos_id and mask[0].sum() > 10 and not mask[0, -1]
    assert tok.unk_id not in ids[0][mask[0]]
    with pytest.raises(ValueError, match="max_text_len"):
        tok.encode(["reach " * 30], 24)


def test_bins_decode_as_the_official_code_does():
    """Token t = text_vocab - n_bins + j decodes to centre clip(text_vocab - t - 1, 0, n_bins - 2)."""
    at = ActionTokenizer(256)
    centres = (np.linspace(-1, 1, 256)[:-1] + np.linspace(-1, 1, 256)[1:]) / 2
    text_vocab = 32000
    tokens = np.arange(text_vocab - 300, text_vocab + 64)  # text tokens, the 256 action tokens, padding rows
    official = centres[np.clip(text_vocab - tokens - 1, 0, 254)]
    np.testing.assert_array_equal(at.to_actions(tokens - (text_vocab - 256)), official)
    assert at.values[0] == at.values[1] == centres[-1] and at.values[-1] == centres[0]


def test_action_round_trip_within_half_a_bin():
    at = ActionTokenizer(256)
    actions = np.linspace(-1, 1, 1001)
    bins = at.to_bins(actions)
    assert bins.min() >= 0 and bins.max() <= 255
    assert np.abs(at.to_actions(bins) - actions).max() <= 1 / 255 + 1e-9
    assert at.to_bins(np.array([-5.0, 5.0])).tolist() == [255, 0]


STATS = {"action": {"q01": [-1.0, 0.0], "q99": [1.0, 2.0], "min": [-2.0, -1.0], "max": [2.0, 3.0],
                    "mask": [True, False]},
         "proprio": {"q01": [0.0, 10.0], "q99": [1.0, 20.0], "min": [0.0, 0.0], "max": [2.0, 40.0]}}


def test_bounds_q99_unnormalises_masked_dimensions_only():
    stats = DatasetStats.from_json(STATS, "bounds_q99")
    out = stats.unnormalize_actions(np.array([[-1.0, 0.5], [1.0, -0.25]]))
    np.testing.assert_allclose(out, [[-1.0, 0.5], [1.0, -0.25]], atol=1e-7)
    out = DatasetStats.from_json(STATS, "bounds").unnormalize_actions(np.array([[0.0, 0.5]]))
    np.testing.assert_allclose(out, [[0.0, 0.5]], atol=1e-7)


def test_proprio_normalisation_clips_to_the_unit_range():
    stats = DatasetStats.from_json(STATS, "bounds_q99")
    np.testing.assert_allclose(stats.normalize_proprio(np.array([0.5, 15.0])), [0.0, 0.0], atol=1e-7)
    np.testing.assert_array_equal(stats.normalize_proprio(np.array([-3.0, 99.0])), [-1.0, 1.0])
    with pytest.raises(ValueError, match="normalisation"):
        DatasetStats.from_json(STATS, "gaussian")
