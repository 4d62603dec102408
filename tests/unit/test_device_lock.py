"""Every role that loads weights onto a CUDA device waits for the deployment's device start-up lock (vLLM asserts that
free GPU memory did not change while it profiles at start-up); on the CPU nothing waits."""

import subprocess
import sys
import time

from policies.device_lock import LOCK_NAME, device_startup

HOLD = """
import sys, time
sys.path.insert(0, {root!r})
from policies.device_lock import device_startup
with device_startup({state!r}, "cuda:0"):
    print("held", flush=True)
    time.sleep(1.5)
"""


def test_a_cuda_start_up_waits_for_another_process_start_up_and_a_cpu_one_does_not(tmp_path):
    from pathlib import Path

    root = str(Path(__file__).resolve().parents[2])
    p = subprocess.Popen([sys.executable, "-c", HOLD.format(root=root, state=str(tmp_path))], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "held"
    t0 = time.monotonic()
    with device_startup(tmp_path, "cpu"):
        assert time.monotonic() - t0 < 0.5
    with device_startup(tmp_path, "cuda"):
        waited = time.monotonic() - t0
    p.wait(10)
    assert waited > 0.8 and (tmp_path / LOCK_NAME).exists()


def test_engines_and_the_learner_load_under_the_lock(tmp_path, tiny_dir, monkeypatch):
    import contextlib

    from config.settings import load_settings
    from policies.engines import roles
    from policies.learning import trainer

    seen = []

    @contextlib.contextmanager
    def record(state, device):
        seen.append(str(device))
        yield

    monkeypatch.setattr(roles, "device_startup", record)
    monkeypatch.setattr(trainer, "device_startup", record)
    s = load_settings(None)
    s.state_dir = str(tmp_path / "state")
    roles.make_engine(s, tiny_dir, role="gate")
    t = trainer.Trainer(s, tiny_dir)
    t._load()  # a scratch or reference copy
    assert seen == [s.model.device, s.learner.device, s.learner.device]
