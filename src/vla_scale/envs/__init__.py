"""Simulators: the embedded reach task, LIBERO, their registry, and the processes that run them."""
