"""Listener discovery from /proc: what the loopback-only check of `up` relies on."""

import os
import socket

from deploy.procs import descendants, exposed, listeners


def test_listeners_of_this_process_by_address():
    lo = socket.socket(socket.AF_INET)
    lo.bind(("127.0.0.1", 0))
    lo.listen()
    anyv6 = socket.socket(socket.AF_INET6)
    anyv6.bind(("::", 0))
    anyv6.listen()
    try:
        mine = listeners([os.getpid()])
        ports = {(x["host"], x["port"]) for x in mine}
        assert ("127.0.0.1", lo.getsockname()[1]) in ports and ("::", anyv6.getsockname()[1]) in ports
        assert [x["port"] for x in exposed([os.getpid()])] == [anyv6.getsockname()[1]]
    finally:
        lo.close()
        anyv6.close()
    assert os.getpid() in descendants(os.getppid())
