"""Rollout: the decoding engine, the env loop and the trajectories it produces."""
