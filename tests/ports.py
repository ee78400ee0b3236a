"""Free TCP ports for the servers the tests start (Ray heads and clusters, the S3 server)."""

from __future__ import annotations

import contextlib
import socket


def free_ports(n: int) -> list[int]:
    """``n`` distinct free ports, all held while they are chosen: a port closed and asked for again
    at once is often handed out again, and Ray refuses a head whose components share one."""
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(n)]
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]


def free_port() -> int:
    return free_ports(1)[0]
