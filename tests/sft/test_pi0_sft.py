"""Supervised fine-tuning of a tiny π0 on a LeRobot dataset (CPU, gloo): the run through launch/sft.py, the loss on
a repeated batch, a resume bit for bit, the refusals before compute, and the examples as openpi prepares them."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT, run_script

pytest.importorskip("av", reason="PyAV (the av package) writes and reads the datasets' videos: `make install`")

from vla_scale import checkpoint  # noqa: E402
from vla_scale.config import ConfigError  # noqa: E402
from vla_scale.datasets.episodes import Episode  # noqa: E402
from vla_scale.datasets.lerobot import LeRobotKeys, write_dataset  # noqa: E402
from vla_scale.envs.pick_place import CAMERAS  # noqa: E402
from vla_scale.envs.registry import simulator  # noqa: E402
from vla_scale.models.interface import chunk_index  # noqa: E402
from vla_scale.models.pi0.demonstrations import TIME_FLOOR, resize_with_pad  # noqa: E402
from vla_scale.sft.trainer import SupervisedTrainer  # noqa: E402

TOKENIZER = ROOT / "tests" / "fixtures" / "openpi_reference" / "tokenizer.model"
PI0 = ["env=pick_place", "model=pi0_tiny", f"model.pi0.tokenizer={TOKENIZER}", "model.pi0.max_token_len=24",
       "progress=false", "sft.batch_size=4", "sft.log_every=1"]


def _episodes(lengths: tuple[int, ...] = (7, 9)) -> list[Episode]:
    """Demonstrations of pick_place's instructions with random frames, states and actions (no simulator)."""
    rng = np.random.default_rng(0)
    texts = simulator("pick_place").instructions("pick_place")
    return [Episode(texts[i % len(texts)], {c: rng.integers(0, 256, (n, 64, 64, 3), dtype=np.uint8) for c in CAMERAS},
                    rng.normal(size=(n, 4)).astype(np.float32), rng.uniform(-1, 1, (n, 7)).astype(np.float32), True)
            for i, n in enumerate(lengths)]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    keys = LeRobotKeys(cameras={c: f"observation.images.{c}" for c in CAMERAS})
    return write_dataset(tmp_path_factory.mktemp("pi0") / "demos", _episodes(), keys, video=False)


def _config(*overrides: str):
    from hydra import compose, initialize_config_dir

    from vla_scale.config import register_configs, to_config

    register_configs()
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        return to_config(compose(config_name="config", overrides=[*PI0, "deterministic=true", *overrides]))


def _fine_tune(run: Path, dataset: Path, *overrides: str) -> SupervisedTrainer:
    trainer = SupervisedTrainer(_config(f"sft.dataset={dataset}", *overrides), str(run))
    try:
        trainer.train()
    finally:
        trainer.close()
    return trainer


@pytest.mark.slow  # fine-tunes
def test_launch_sft_fine_tunes_a_tiny_pi0_and_saves_an_openpi_folder(tmp_path, dataset):
    from vla_scale.models.pi0.checkpoint import read_pi0_folder

    run = tmp_path / "run"
    proc = run_script("sft", *PI0, f"sft.dataset={dataset}", "sft.steps=3", "model.pi0.image_size=32",
                      "model.pi0.patch_size=8", f"run_dir={run}")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "resized with padding to 32" in proc.stdout
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("sft: steps=3 loss=") and last.endswith(f"checkpoint={run / 'checkpoints' / 'step_3'}")
    assert np.isfinite(float(last.split("loss=")[1].split()[0]))
    spec = read_pi0_folder(run / "checkpoints" / "step_3")[0]
    assert (spec.vision.image_size, spec.vision.patch_size) == (32, 8)  # the tower's shape travels with the folder


@pytest.mark.slow  # fine-tunes
def test_the_flow_loss_falls_on_a_repeated_batch():
    import torch

    from vla_scale.config import DeepSpeedConfig, EnvConfig, ModelConfig, SftConfig
    from vla_scale.models.pi0.settings import Pi0ModelConfig
    from vla_scale.parallel.actor import Actor
    from vla_scale.run_policy import vla_for_env
    from vla_scale.run_setup import init_distributed

    episodes = _episodes()
    model = ModelConfig(family="pi0", pi0=Pi0ModelConfig(tokenizer=str(TOKENIZER), max_token_len=24))
    source = vla_for_env(model, EnvConfig(name="pick_place", suite="pick_place", num_tasks=4))
    source = source.with_demonstrations("pick_place", episodes)
    demos = source.demonstrations(episodes)
    init_distributed()
    torch.manual_seed(0)
    actor = Actor(source.new_policy, DeepSpeedConfig(zero_stage=3), SftConfig(lr=3e-3), scorer=source.chunk_scorer())
    draw = demos.draw(np.random.default_rng(0), 8)
    losses = [actor.supervised_update([demos.batch(draw, np.arange(8))])["loss"] for _ in range(12)]
    assert losses[-1] < 0.8 * losses[0] and min(losses[-3:]) < min(losses[:3]), losses


@pytest.mark.slow  # fine-tunes
def test_a_resumed_pi0_fine_tune_ends_bit_for_bit_where_an_uninterrupted_one_does(tmp_path, dataset):
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    _fine_tune(whole, dataset, "sft.steps=3")
    _fine_tune(parts, dataset, "sft.steps=2")
    _fine_tune(parts, dataset, "sft.steps=3", "resume=true")
    a = (Path(checkpoint.checkpoint_root(str(whole))) / "step_3" / "model.safetensors").read_bytes()
    b = (Path(checkpoint.checkpoint_root(str(parts))) / "step_3" / "model.safetensors").read_bytes()
    assert a == b


def test_bad_input_is_refused_before_compute(tmp_path, dataset):
    def refused(*overrides: str) -> str:
        with pytest.raises(ConfigError) as err:
            SupervisedTrainer(_config(f"sft.dataset={dataset}", *overrides), str(tmp_path / "never"))
        assert not (tmp_path / "never").exists()
        return str(err.value)

    assert "model.pi0.action_horizon <= 7" in refused("model.pi0.action_horizon=8")
    assert "model.pi0.tokenizer is not set" in refused("model.pi0.tokenizer=")
    not_sp = tmp_path / "tokenizer.json"
    not_sp.write_text("{}")
    assert "is not a readable SentencePiece model" in refused(f"model.pi0.tokenizer={not_sp}")
    assert "set model.pi0.max_token_len=" in refused("model.pi0.max_token_len=12")
    assert "must be a multiple of patch_size 8" in refused("model.pi0.image_size=30", "model.pi0.patch_size=8")
    empty = tmp_path / "empty"
    empty.mkdir()
    assert f"model.checkpoint='{empty}'" in refused(f"model.checkpoint={empty}")


@pytest.mark.parametrize(("preset", "layout"), [("pi0_tiny", "openpi"), ("pi0_tiny", "lerobot"),
                                               ("pi05_tiny", "openpi"), ("pi05_tiny", "lerobot")])
def test_model_checkpoint_picks_the_family_from_the_folder_and_fine_tunes_its_weights(tmp_path, dataset, preset,
                                                                                      layout):
    """A π0 folder of either layout under `model.checkpoint=` is a π0 policy whatever model.family says (unless the
    command line set it), its weights are the folder's, and SFT continues from them."""
    import torch

    from vla_scale.config import EnvConfig, ModelConfig
    from vla_scale.models.flow.normalize import norm_stats_of
    from vla_scale.models.pi0.checkpoint import write_pi0_folder
    from vla_scale.models.pi0.policy import Pi0Policy
    from vla_scale.models.pi0.spec import PRESETS
    from vla_scale.run_policy import vla_for_env

    torch.manual_seed(3)
    policy = Pi0Policy.from_spec(replace(PRESETS[preset](), max_token_len=64))
    rng = np.random.default_rng(0)
    stats = {k: norm_stats_of(rng.normal(size=(50, n))) for k, n in (("state", 4), ("actions", 7))}
    folder = write_pi0_folder(tmp_path / layout, policy, stats, tokenizer_file=TOKENIZER, layout=layout)
    env = EnvConfig(name="pick_place", suite="pick_place", num_tasks=4)
    source = vla_for_env(ModelConfig(checkpoint=str(folder)), env)  # model.family is oft by default
    found = f"{'π0.5' if preset == 'pi05_tiny' else 'π0'} checkpoint, {layout if layout == 'openpi' else 'LeRobot'}"
    assert source.family == "pi0" and found in source.source, source.source
    loaded = source.new_policy().state_dict()
    assert all(torch.equal(loaded[k], v) for k, v in policy.state_dict().items())
    with pytest.raises(ConfigError, match="drop model.family"):
        vla_for_env(ModelConfig(checkpoint=str(folder), family="oft"), env, explicit=["model.family"])
    trainer = _fine_tune(tmp_path / "run", dataset, f"model.checkpoint={folder}", "sft.steps=1")
    assert trainer.cfg.model.family == "pi0"


def test_images_are_resized_with_padding_and_chunks_marked_past_the_end():
    wide = np.full((32, 64, 3), 200, dtype=np.uint8)
    out = resize_with_pad(wide, 28)
    assert out.shape == (28, 28, 3)
    assert (out[:7] == 0).all() and (out[21:] == 0).all() and (out[7:21] == 200).all()  # 14 rows kept, centred
    assert resize_with_pad(out, 28) is out
    index, pad = chunk_index(3, 4)
    assert index.tolist() == [[0, 1, 2, 2], [1, 2, 2, 2], [2, 2, 2, 2]]
    assert pad.tolist() == [[False, False, False, True], [False, False, True, True], [False, True, True, True]]


def test_a_steps_noise_and_times_come_from_the_seeded_generator():
    from vla_scale.models.pi0.demonstrations import Pi0Demonstrations

    demos = Pi0Demonstrations(*(np.zeros((5, 1)) for _ in range(2)), *(np.zeros((5, 1)) for _ in range(3)),
                              np.zeros((5, 4, 8), dtype=np.float32), np.ones((5, 4, 8), dtype=np.float32))
    a, b = (demos.draw(np.random.default_rng(7), 1000) for _ in range(2))
    assert np.array_equal(a.noise, b.noise) and np.array_equal(a.time, b.time) and a.noise.shape == (1000, 4, 8)
    assert a.time.min() >= TIME_FLOOR and a.time.max() <= 1.0
    assert abs(a.time.mean() - (TIME_FLOOR + (1 - TIME_FLOOR) * 0.6)) < 0.03  # Beta(1.5, 1) has mean 0.6


def test_openpis_augmentation_is_pi0s_default_drawn_once_a_step_whatever_the_split(dataset):
    """auto augments π0's images as openpi does (one draw a step, so micro-batches and ranks see the same images as
    one batch would), none leaves them as the demonstrations hold them; OFT refuses openpi's before the dataset is
    read."""
    import torch

    from vla_scale.models.pi0.policy import pixels_from_uint8
    from vla_scale.run_policy import vla_for_env

    cfg = _config(f"sft.dataset={dataset}")
    source = vla_for_env(cfg.model, cfg.env).with_demonstrations("pick_place", _episodes())
    plain, augmented = (source.demonstrations(_episodes(), mode) for mode in ("none", "auto"))
    draw, plain_draw = augmented.draw(np.random.default_rng(3), 4), plain.draw(np.random.default_rng(3), 4)
    assert draw.augment is not None and plain_draw.augment is None
    assert np.array_equal(draw.index, plain_draw.index) and np.array_equal(draw.noise, plain_draw.noise)
    whole = augmented.batch(draw, np.arange(4)).inputs.images
    halves = torch.cat([augmented.batch(draw, np.arange(s, s + 2)).inputs.images for s in (0, 2)])
    assert torch.equal(whole, halves)
    as_held = pixels_from_uint8(torch.from_numpy(plain.images[draw.index]))
    assert torch.equal(plain.batch(plain_draw, np.arange(4)).inputs.images, as_held)
    assert float((whole - as_held).abs().max()) > 0.1
    with pytest.raises(ValueError, match="sft.image_augmentation"):
        source.demonstrations(_episodes(), "flip")

    oft = _config(f"sft.dataset={dataset.parent / 'not_read'}", "model=tiny_pick_place",
                  "sft.image_augmentation=openpi")
    with pytest.raises(ConfigError, match="image_augmentation=openpi: this policy's fine-tuning takes auto or none"):
        SupervisedTrainer(oft, str(dataset.parent / "oft_run"))
