"""Every shipped config loads and validates; every impossible one fails with an error naming keys and the fix."""

import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from vla_scale.config import Config, ConfigError, register_configs, to_config, validate

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
GROUP_OPTIONS = [(group.name, yaml.stem) for group in sorted(CONFIGS.iterdir()) if group.is_dir()
                 for yaml in sorted(group.glob("*.yaml"))]


def load(*overrides: str) -> Config:
    register_configs()
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        return to_config(compose(config_name="config", overrides=list(overrides)))


def test_every_group_has_options():
    assert {g for g, _ in GROUP_OPTIONS} >= {"model", "env", "algo", "parallel", "deepspeed"}


@pytest.mark.parametrize("group,option", GROUP_OPTIONS)
def test_every_shipped_config_loads_and_validates(group, option):
    cfg = load(f"{group}={option}")
    validate(cfg)
    assert isinstance(cfg, Config)


TOP_LEVEL = sorted(path.stem for path in CONFIGS.glob("*.yaml"))


@pytest.mark.parametrize("name", TOP_LEVEL)
def test_every_top_level_config_loads_and_validates(name):
    register_configs()
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        cfg = to_config(compose(config_name=name))
    validate(cfg)


def test_oft_libero_configs_carry_simplevla_rl_settings_on_their_suite():
    register_configs()
    for suite in ("libero_spatial", "libero_object", "libero_goal", "libero_10", "libero_90", "libero_130"):
        with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
            cfg = to_config(compose(config_name=f"oft_{suite}"))
        assert cfg.env.suite == suite and cfg.env.max_steps == 512 and cfg.env.num_eval_init_states == 50
        assert (cfg.algo.batch_size, cfg.algo.group_size, cfg.algo.lr, cfg.algo.temperature) == (64, 8, 5e-6, 1.6)
        assert cfg.model.name == "oft_7b" and cfg.model.center_crop and cfg.deepspeed.bf16


def test_top_level_config_is_the_embedded_default():
    cfg = validate(load())
    assert (cfg.env.name, cfg.model.name, cfg.algo.name, cfg.deepspeed.zero_stage) == ("reach", "tiny", "grpo", 3)


def test_every_simulator_has_its_own_settings_group_that_builds_its_kwargs():
    from vla_scale.envs.registry import SIMULATORS

    group = {"libero": "libero_spatial", "metaworld": "metaworld_mt10"}
    for name, sim in SIMULATORS.items():
        env = load(f"env={group.get(name, name)}").env
        assert env.name == name and isinstance(env.simulator(), sim.settings)
        assert set(env.simulator_kwargs()) == {"camera_resolution", "max_steps", *env.simulator().simulator_kwargs()}
    cfg = load("env=reach", "env.reach.physics_substeps=5", "env.libero.settle_steps=3")
    assert cfg.env.simulator_kwargs()["physics_substeps"] == 5 and "settle_steps" not in cfg.env.simulator_kwargs()
    with pytest.raises(Exception, match="max_delta"):
        load("env.max_delta=0.1")  # a simulator's own key lives in its group: env.reach.max_delta


def test_unknown_key_fails_at_load():
    with pytest.raises(Exception, match="batch_sise"):
        load("algo.batch_sise=3")


BAD = [
    (["algo.batch_size=3", "algo.group_size=3"], ["algo.batch_size*algo.group_size", "parallel.num_workers", "one of"]),
    (["rollout.pipeline_stage_num=3"], ["= 64 must divide", "rollout.pipeline_stage_num", "1*2*2*3 = 12",
                                            "[1, 2, 4, 8, 16, 32, 64]"]),
    (["rollout.pipeline_stage_num=0"], ["rollout.pipeline_stage_num=0 must be >= 1"]),
    (["env.name=libbero"], ["env.name='libbero'", "choose one of"]),
    (["model.kernels=triton"], ["model.kernels='triton'", "choose one of ['eager', 'liger']"]),
    (["env.suite=libero_spatial"], ["env.suite='libero_spatial'", "choose one of"]),
    (["algo.group_size=1", "algo.batch_size=4"], ["algo.group_size=1", "at least 2 episodes"]),
    (["algo.filter_low=0.8", "algo.filter_high=0.2"], ["algo.filter_low", "algo.filter_high"]),
    (["model.image_size=60"], ["model.image_size=60", "model.patch_size=16"]),
    (["algo.mini_batches=8", "algo.micro_batches=4"], ["algo.mini_batches*algo.micro_batches", "lower them"]),
    (["env.num_tasks=7"], ["env.num_tasks=7", "has 3 tasks"]),
    (["env.num_train_init_states=45"], ["env.num_train_init_states", "env.num_eval_init_states", "50"]),
    (["env.extra_train_init_states=1"], ["env.extra_train_init_states", "40 + 10 + 1", "50 init states"]),
    (["deepspeed.zero_stage=4"], ["deepspeed.zero_stage=4"]),
    (["deepspeed=zero2", "deepspeed.offload_param=true"], ["deepspeed.offload_param=true", "zero_stage=3"]),
    (["deepspeed=zero2", "deepspeed.leaf_modules=true"], ["deepspeed.leaf_modules=true", "zero_stage=3"]),
    (["algo.loss_agg=seq_mean"], ["algo.loss_agg='seq_mean'", "trajectory_mean"]),
    (["algo.old_logprobs=engine"], ["algo.old_logprobs='engine'", "recompute"]),
    (["algo.tis_cap=2"], ["algo.tis_cap=2.0 needs algo.old_logprobs=recompute"]),
    (["deepspeed=zero3_offload", "deepspeed.offload_states_during_rollout=true"],
     ["deepspeed.offload_states_during_rollout=true", "offload_optimizer=false"]),
    (["deepspeed.resident_sub_groups=2"], ["deepspeed.resident_sub_groups=2", "stream_optimizer_states=true"]),
    (["deepspeed.recompute_layers=-2"], ["deepspeed.recompute_layers=-2", ">= -1"]),
]


@pytest.mark.parametrize("overrides,phrases", BAD, ids=[" ".join(o) for o, _ in BAD])
def test_bad_config_gives_one_clear_error(overrides, phrases):
    cfg = load(*overrides)
    with pytest.raises(ConfigError) as err:
        validate(cfg)
    for phrase in phrases:
        assert phrase in str(err.value)


def test_all_problems_reported_together():
    cfg = load("algo.group_size=1", "model.image_size=60")
    with pytest.raises(ConfigError) as err:
        validate(cfg)
    assert "algo.group_size" in str(err.value) and "model.image_size" in str(err.value)


def test_extra_train_init_states_join_the_train_split_and_leave_the_eval_split_as_it_was():
    from vla_scale.config import init_state_ids

    plain, more = load("env=pick_place").env, load("env=pick_place", "env.extra_train_init_states=5").env
    assert init_state_ids(more, "eval") == init_state_ids(plain, "eval") == list(range(80, 100))
    assert init_state_ids(more, "train") == [*range(80), *range(100, 105)]
    assert init_state_ids(plain, "train") == list(range(80))
    validate(load("env=pick_place", "env.extra_train_init_states=99900"))


def test_world_size_enters_the_arithmetic():
    cfg = load("algo.batch_size=2", "algo.group_size=2", "parallel.num_workers=1", "parallel.sims_per_worker=2",
               "algo.mini_batches=1")
    validate(cfg, world_size=1)
    with pytest.raises(ConfigError, match="ranks"):
        validate(cfg, world_size=4)


def test_every_field_is_documented_and_config_md_is_current():
    from vla_scale.config.docs import config_markdown, field_docs

    missing = [f"{cls}.{name}" for cls, rows in field_docs().items() for name, _, _, doc in rows if not doc]
    assert not missing, f"fields without a docstring: {missing}"
    assert (CONFIGS.parent / "docs" / "CONFIG.md").read_text().strip() == config_markdown().strip(), \
        "docs/CONFIG.md is stale: run `python -m vla_scale.config.docs > docs/CONFIG.md`"


def _numeric_keys(schema: type, prefix: str = "") -> list[str]:
    import dataclasses

    keys = []
    for f in dataclasses.fields(schema):
        kind = f.type if isinstance(f.type, str) else f.type.__name__
        if dataclasses.is_dataclass(f.default_factory if f.default_factory is not dataclasses.MISSING else None):
            keys += _numeric_keys(f.default_factory, f"{prefix}{f.name}.")  # type: ignore[arg-type]
        elif kind in ("int", "float"):
            keys.append(prefix + f.name)
    return keys


def test_every_numeric_key_has_a_range_or_choices():
    from vla_scale.config import BOUNDS
    from vla_scale.config.checks import choices

    keys = _numeric_keys(Config)
    assert len(keys) > 50
    assert [k for k in keys if k not in BOUNDS and k not in choices()] == []


@pytest.mark.parametrize("key", ["parallel.num_workers", "parallel.sims_per_worker", "algo.mini_batches",
                                 "algo.micro_batches", "model.patch_size", "model.num_heads", "sync.bucket_mb",
                                 "deepspeed.prefetch_bucket_size", "parallel.step_timeout_s", "algo.lr", "steps"])
def test_a_zero_count_or_size_is_refused_by_name_without_dividing_by_it(key):
    cfg = load(f"{key}=0")
    with pytest.raises(ConfigError) as err:
        validate(cfg)
    assert f"{key}=0" in str(err.value) and "must be" in str(err.value)


def test_without_group_filtering_an_update_may_split_the_whole_batch():
    """Every group is kept when the filter passes all (0, 1): micro-batches may then number up to the episodes."""
    kept_all = ["algo.batch_size=4", "algo.group_size=4", "algo.mini_batches=2", "algo.micro_batches=8",
                "algo.filter_low=0", "algo.filter_high=1"]
    validate(load(*kept_all))
    with pytest.raises(ConfigError, match="one group kept by algo.filter_low/filter_high"):
        validate(load(*kept_all[:4]))


def test_reading_the_configuration_imports_no_torch():
    """A refused key (a moved one, a value out of range) is answered in a fraction of a second: the schema, its
    checks and `vla_scale.models`' package import build nothing of the policy until a check needs it."""
    code = ("import sys, vla_scale.config, vla_scale.models; "
            "print(sorted(m for m in ('torch', 'transformers', 'deepspeed', 'ray') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_config_md_gives_the_presets_values_beside_the_schema_defaults():
    """The default run takes model=tiny, whose patch side is 16 where the schema's default is 8: the doc says both,
    and which preset the default run takes."""
    from vla_scale.config.docs import config_markdown

    text = config_markdown()
    assert "the default run (`configs/config.yaml`) takes `model=tiny`, `env=reach`" in text
    row = next(line for line in text.splitlines() if line.startswith("| `model.patch_size` |"))
    assert row.startswith("| `model.patch_size` | int | `8` | oft_7b: `14`; tiny, tiny_libero, tiny_metaworld, "
                          "tiny_pick_place: `16` |"), row
    row = next(line for line in text.splitlines() if line.startswith("| `model.pi0.max_token_len` |"))
    assert "pi0_tiny: `48`" in row, row
