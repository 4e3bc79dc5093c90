"""Simulators at scale: child processes hosting envs, their images in shared memory, the fleet of sim workers over
them (in the trainer's process or as Ray actors) and the Ray cluster helpers. Imports no torch."""
