"""Which processes `up` runs and what they listen on, read from /proc (Linux): `status` and the tests use it
to check that nothing of ours or Ray's listens on a non-loopback address. And an actor process's priority."""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path

LISTEN = "0A"  # TCP state in /proc/net/tcp*


def descendants(pid: int) -> list[int]:
    """`pid` and every process below it."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(d.name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def _addr(hex_addr: str) -> tuple[str, int]:
    host, port = hex_addr.split(":")
    raw = bytes.fromhex(host)
    if len(raw) == 4:
        ip = ipaddress.IPv4Address(raw[::-1])
    else:  # four little-endian 32-bit words
        ip = ipaddress.IPv6Address(b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4)))
        if ip.ipv4_mapped:
            ip = ip.ipv4_mapped
    return str(ip), int(port, 16)


def _listening_inodes() -> dict[str, tuple[str, int]]:
    out = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if len(f) > 9 and f[3] == LISTEN:
                out[f[9]] = _addr(f[1])
    return out


def listeners(pids: list[int]) -> list[dict]:
    """[{"pid", "name", "host", "port"}] for every TCP socket the processes listen on."""
    inodes, out = _listening_inodes(), []
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
            name = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            continue
        for fd in fds:
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:[") and (ino := link[8:-1]) in inodes:
                host, port = inodes[ino]
                out.append({"pid": pid, "name": name, "host": host, "port": port})
    return out


def exposed(pids: list[int]) -> list[dict]:
    """The listeners that are not on a loopback address."""
    return [x for x in listeners(pids) if not ipaddress.ip_address(x["host"]).is_loopback]


def renice_process(n: int) -> None:
    """Add `n` to the niceness of every thread of this process (at most 19). Linux niceness is per thread, and
    Ray runs an actor's code on a thread of its own: `os.nice` there would leave the others, and every thread
    they start later, at the old priority."""
    tids = os.listdir("/proc/self/task") if os.path.isdir("/proc/self/task") else []
    if not tids:
        os.nice(n)
    for tid in map(int, tids):
        try:
            os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + n))
        except OSError:  # a thread that ended meanwhile
            pass
