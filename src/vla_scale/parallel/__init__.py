"""Placement across processes and GPUs: the DeepSpeed actor, the simulator fleet, weight sync into engines."""
