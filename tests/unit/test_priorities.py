"""Users first, for real: an actor's niceness reaches every thread of its process (Linux niceness is per
thread). tests/integration/test_e2e.py checks the priorities of a running `up`."""

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_renice_process_lowers_every_thread_and_threads_started_after():
    code = textwrap.dedent("""
        import os, threading, time
        from deploy.procs import renice_process

        def nices():
            return {int(t): os.getpriority(os.PRIO_PROCESS, int(t)) for t in os.listdir("/proc/self/task")}

        stop = threading.Event()
        th = threading.Thread(target=stop.wait, daemon=True)
        th.start()
        base = os.getpriority(os.PRIO_PROCESS, 0)
        done = []
        worker = threading.Thread(target=lambda: (renice_process(3), done.append(1)))  # as Ray does: not the main thread
        worker.start(); worker.join()
        later = []
        t2 = threading.Thread(target=lambda: later.append(os.getpriority(os.PRIO_PROCESS, 0)))
        t2.start(); t2.join()
        print(base, sorted(set(nices().values())), later[0])
        stop.set()
    """)
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    base, rest = r.stdout.split(" ", 1)
    want = min(19, int(base) + 3)
    assert rest.strip() == f"[{want}] {want}", r.stdout  # every thread, and one the main thread starts afterwards
