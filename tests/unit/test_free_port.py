"""`free_port` hands out a port below the kernel's ephemeral range, where Ray's listeners and outgoing connections
cannot take it between the choice and the server's bind, and one that binds."""

import socket
from pathlib import Path

from deploy.nats import free_port


def test_a_free_port_is_below_the_ephemeral_range_and_binds():
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = {free_port() for _ in range(8)}
    assert all(10000 <= p < low for p in ports) and len(ports) > 1
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports.pop()))


def test_a_taken_port_is_not_handed_out():
    with socket.socket() as held:
        held.bind(("127.0.0.1", free_port()))
        held.listen()
        taken = held.getsockname()[1]
        assert all(free_port() != taken for _ in range(200))
