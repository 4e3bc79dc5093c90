"""vla_scale: reinforcement learning for Vision-Language-Action policies in simulation."""

__version__ = "0.1.0"
