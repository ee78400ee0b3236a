"""Free TCP ports for the servers the tests start (Ray heads and clusters, the S3 server).

A port is chosen below the kernel's ephemeral range (``net.ipv4.ip_local_port_range``) and above
the ports Ray hands its workers (10002-19999 by default). A port the kernel handed out and that
was free when asked can be taken again before the server binds it: by any outgoing connection on
the machine (the other pytest process's Ray and TensorFlow servers make many), which once left an
end-to-end head's client server without its port (`ray start --block` then stopped the head).
Below that range only a server that asks for the port by number can take it.
"""

from __future__ import annotations

import contextlib
import random
import socket

_LOW = 20000  # above Ray's worker ports


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def free_ports(n: int) -> list[int]:
    """``n`` distinct free ports, all held while they are chosen (Ray refuses a head whose
    components share one), from below the ephemeral range where it leaves room, else from the
    kernel."""
    high = _ephemeral_low()
    with contextlib.ExitStack() as stack:
        chosen: list[int] = []
        candidates = random.sample(range(_LOW, high), min(high - _LOW, 200)) if high - _LOW >= 100 else []
        for port in candidates:
            if len(chosen) == n:
                break
            sock = stack.enter_context(socket.socket())
            try:
                sock.bind(("", port))  # free on every address: Ray binds the node's, or loopback
            except OSError:
                continue
            chosen.append(port)
        while len(chosen) < n:  # no room below the ephemeral range on this machine
            sock = stack.enter_context(socket.socket())
            sock.bind(("127.0.0.1", 0))
            chosen.append(sock.getsockname()[1])
        return chosen


def free_port() -> int:
    return free_ports(1)[0]
