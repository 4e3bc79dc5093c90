"""Hydra entry of the trainer: `python launch/train.py [overrides]`, `deepspeed launch/train.py`, `torchrun`
(the launcher's command line made Hydra's by `vla_scale.launcher.hydra_argv`)."""

from __future__ import annotations

import logging
import math
import os
import sys
import warnings

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from vla_scale.launcher import hydra_argv, run_to_the_end

sys.argv = hydra_argv(sys.argv)
warnings.filterwarnings("ignore", category=FutureWarning, module="torch.distributed")
logging.getLogger("DeepSpeed").setLevel(logging.WARNING)

from vla_scale.config import (  # noqa: E402
    ConfigError,
    explicit_keys,
    moved_key_error,
    register_configs,
    to_config,
    validate,
)

register_configs()
if moved := moved_key_error(sys.argv[1:]):
    sys.exit(moved)


@hydra.main(config_path="../configs", config_name="config", version_base="1.3")
def main(dict_cfg: DictConfig) -> float:
    cfg = to_config(dict_cfg)
    run_dir = cfg.run_dir or HydraConfig.get().runtime.output_dir
    explicit = explicit_keys(HydraConfig.get().overrides.task)
    try:  # the configuration, the Ray address and the policy against the env first: they need no DeepSpeed nor
        validate(cfg, int(os.environ.get("WORLD_SIZE", "1")))  # Llama, whose imports alone take seconds
        from vla_scale.run_setup import checked_policy

        vla = checked_policy(cfg, explicit)
    except ConfigError as err:
        sys.exit(f"error: {err}")
    from vla_scale.trainer import RunComplete, SimulatorLost, Trainer

    # a resumed run's checkpoint, FP8 on this device: checked before anything starts
    ran = run_to_the_end(lambda: Trainer(cfg, run_dir, explicit, vla), RunComplete, (SimulatorLost,))
    if ran is None:
        return float("nan")
    trainer, metrics = ran
    if trainer.rank == 0:
        print(f"run directory: {run_dir}")
        rate = metrics["eval/success_rate"]
        shown = "-" if math.isnan(rate) else f"{rate:.3f}"  # eval_every=0: no evaluation ran
        print(f"train: steps={cfg.steps} eval_success_rate={shown}", flush=True)
    return metrics["eval/success_rate"]


if __name__ == "__main__":
    main()
