"""The Ray cluster as the fleet sees it: joining or starting Ray, checking an address before anything starts, counting
the simulation nodes (those offering the `sim` resource). Ray is imported where it is used: checking an address
needs none of it."""

from __future__ import annotations

import os
import socket

RAY_CONNECT_TIMEOUT_S = 10.0
"""How long `ray_address_problem` waits for a Ray head to accept a connection."""


def ray_address_problem(address: str, timeout_s: float = RAY_CONNECT_TIMEOUT_S) -> str | None:
    """Why `address` (`host:port` of a Ray head, or `ray://host:port`) cannot be joined, or None: nothing accepting
    connections there within `timeout_s`. Checked before anything starts, because `ray.init` retries such an address
    without end. '' (a local Ray) and `auto` (Ray's own lookup, which fails by itself) are not checked."""
    if not address or address == "auto":
        return None
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        return f"parallel.ray_address={address!r} is not host:port (e.g. 10.0.0.1:6379); leave it empty for a local Ray"
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as err:
        return (f"parallel.ray_address={address!r}: nothing accepted a connection there within {timeout_s:.0f} s "
                f"({err}); start the head with `ray start --head --port={port}` on {host}, fix the address, or "
                "leave it empty for a local Ray")
    return None


def start_ray(address: str = "", dashboard: bool = False, num_cpus: int = 0) -> None:
    """Join `address`, or start a local Ray (dashboard off unless asked, and then bound to 127.0.0.1)."""
    import ray

    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    if address:
        problem = ray_address_problem(address)
        if problem:
            raise ConnectionError(problem)
        ray.init(address=address, log_to_driver=True)
        return
    ray.init(
        address="local",  # a new local instance, whatever RAY_ADDRESS says
        num_cpus=num_cpus or os.cpu_count(),
        include_dashboard=dashboard,
        dashboard_host="127.0.0.1",
        log_to_driver=True,
        configure_logging=False,
    )


def sim_node_count() -> int:
    """Alive Ray nodes that offer the `sim` resource."""
    import ray

    return sum(1 for node in ray.nodes() if node.get("Alive") and node.get("Resources", {}).get("sim", 0) > 0)
