"""Demonstration episodes read from and written to LeRobot-format datasets on disk (numpy, pyarrow and PyAV only)."""
