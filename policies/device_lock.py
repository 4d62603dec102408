"""One start-up on a GPU at a time, across every process of a deployment.

vLLM measures free GPU memory while it profiles at start-up and asserts that free memory did not rise meanwhile; an
actor that loads or frees a model on the same device during that time makes it fail, or plan with the wrong budget.
All six actors and the Serve replicas start at once, so every role that puts weights on a CUDA device does it under
one file lock in the state dir: vLLM engines, transformers engines, the learner's model and its scratch and reference
copies. Afterwards memory use is steady (PyTorch's caching allocator keeps what a step used). On the CPU: no lock.
`file_lock` is the one exclusive lock across a node's processes that every such file lock here uses.
"""

from __future__ import annotations

import contextlib
import fcntl
from pathlib import Path

LOCK_NAME = "device-start.lock"


@contextlib.contextmanager
def file_lock(path: Path):
    """An exclusive lock across this node's processes (released when the file closes, also if the process dies)."""
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


@contextlib.contextmanager
def device_startup(state_dir: str | Path, device: str):
    """Hold the deployment's device start-up lock while loading onto `device` (a no-op unless it is a CUDA device)."""
    if not str(device).startswith("cuda"):
        yield
        return
    state = Path(state_dir)
    state.mkdir(parents=True, exist_ok=True)
    with file_lock(state / LOCK_NAME):
        yield
