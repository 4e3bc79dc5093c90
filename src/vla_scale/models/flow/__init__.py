"""What every flow-matching family shares: the inputs, the masks and time embedding, the Euler sampler and RL's
chains over a family's prefix and suffix passes (`policy.py`), the noise head, and what the other modules here name."""
