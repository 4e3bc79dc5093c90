"""One simulator playing one episode: the embedded reach task, LIBERO, their registry and records (numpy only)."""
