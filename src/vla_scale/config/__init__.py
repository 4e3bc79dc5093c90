"""The run's configuration: the typed schema (`schema.py`), its checks (`checks.py`), what the entry scripts read
off the command line before Hydra (`command_line.py`) and docs/CONFIG.md's generator (`docs.py`, run as
`python -m vla_scale.config.docs`)."""

from vla_scale.config.checks import (
    BOUNDS,
    UPPER,
    lora_problems,
    published_protocol_problems,
    range_problems,
    record_problems,
    sft_problems,
    validate,
    value_at,
)
from vla_scale.config.command_line import MOVED_KEYS, explicit_keys, moved_key_error, moved_key_problems
from vla_scale.config.schema import (
    AlgoConfig,
    Config,
    ConfigError,
    DeepSpeedConfig,
    DemoConfig,
    DisaggSimConfig,
    EnvConfig,
    LoraConfig,
    ModelConfig,
    ParallelConfig,
    RecordConfig,
    RolloutConfig,
    SftConfig,
    SyncConfig,
    as_yaml,
    init_state_ids,
    register_configs,
    to_config,
)

__all__ = [
    "BOUNDS", "MOVED_KEYS",
    "UPPER", "AlgoConfig", "Config", "ConfigError", "DeepSpeedConfig", "DemoConfig", "DisaggSimConfig",
    "EnvConfig", "LoraConfig", "ModelConfig", "ParallelConfig", "RecordConfig", "RolloutConfig", "SftConfig",
    "SyncConfig",
    "as_yaml", "explicit_keys", "init_state_ids", "lora_problems",
    "moved_key_error", "moved_key_problems", "published_protocol_problems", "range_problems", "register_configs",
    "record_problems", "sft_problems", "to_config", "validate", "value_at",
]
