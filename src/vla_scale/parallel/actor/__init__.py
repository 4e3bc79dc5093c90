"""The trainable policy across ranks: a DeepSpeed (ZeRO-3) engine, its GRPO update and its optimizer states' moves
between GPU and host."""

from vla_scale.parallel.actor.zero3 import Actor, Mismatch, UpdateResult, deepspeed_config

__all__ = ["Actor", "Mismatch", "UpdateResult", "deepspeed_config"]
