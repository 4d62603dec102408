"""Secrets the deployment makes for itself in its state dir (the NATS password, the API key, Ray's token, the user
salt): each made once, owner-only, and read back by every process and restart that needs it."""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Callable
from pathlib import Path


def secret_file(path: Path, make: Callable[[], str] = lambda: secrets.token_urlsafe(24)) -> str:
    """The secret in `path`, made by `make()` if there is none yet: created exclusively with mode 0600 (of two processes
    that make it at once, the first file is kept and both read it, the second waiting for its value), in a folder made
    owner-only where it is new."""
    path = Path(path)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            pass  # made meanwhile: that one is kept
        else:
            with os.fdopen(fd, "w") as f:
                f.write(make())
                f.flush()
                os.fsync(f.fileno())
    for _ in range(50):  # made by another process just now: its value may not be written yet
        if value := path.read_text().strip():
            return value
        time.sleep(0.1)
    raise ValueError(f"{path} is empty (a write cut off?): remove it to have a new one made")
