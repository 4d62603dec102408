"""The GPU path checked in one lease (issue 28): run by scripts/gpu_check.sh, which documents how to use it.

Five steps, each a process group under its own time budget (SIGTERM 10 s before the budget ends, SIGKILL at
it); a step that fails or runs out of time never stops the later ones:
  install    the carried wheel set checked against SHA256SUMS, unpacked once, its modules found (scripts/gpu_wheels.py)
  models     the base model converted, the 7B-shaped config folder written (tests/benchmarks/gpu_up_check.py models)
  gpu_tests  pytest tests/gpu
  bench      bench_vllm_swap.py at the 7B shape, dummy weights, requests in flight, file vs shared transport
  up         `main.py up --config config/gpu-7b.yaml` with the small base model under scripted users, through a
             promotion, then `down` (tests/benchmarks/gpu_up_check.py up)
At the end: one summary (every figure, every failure with its log tail) printed and written to OUT/summary.txt,
the figures as JSON in OUT/gpu_check.json, and each step's log as OUT/<step>.log.

`--dry-run` runs the same plumbing without CUDA or vLLM: the real argument parsing, budgets, process groups, JSON
and summary; a fake wheel set built by the packing code, received and installed through the same SHA256SUMS
checks; the models step without conversion; pytest collecting tests/gpu with the device run's options; the
benchmark's and main.py's --help checked for every flag the device run passes; the `up` step's derived preset
validated and planned at the 7B shape. `--inject-fail STEP` / `--inject-hang STEP` (dry run only) add a command
that fails, or that outlives the step's budget, to show that path too.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gpu_steps import BUDGET_S, CALLS, ROOT, STEPS, gpu_used_mib, plan, run_step, settle, smi


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="scripts/gpu_check.sh", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", default=os.environ.get("OUT", ""), help="folder for the JSON, summary and logs (default $OUT)")
    ap.add_argument(
        "--wheels",
        default=os.environ.get("KAIZEN_GPU_WHEELS", ""),
        help="folder of the received parts and SHA256SUMS (default $KAIZEN_GPU_WHEELS or .gpu-cache/parts)",
    )
    ap.add_argument(
        "--cache",
        default=str(ROOT / ".gpu-cache"),
        help="ignored folder kept on a warm machine: the "
        "unpacked site, the 7B-shaped config, vLLM's compile cache, the `up` state",
    )
    ap.add_argument("--dry-run", action="store_true", help="the plumbing only, on a CPU without vLLM")
    ap.add_argument("--only", default=",".join(STEPS), help="comma-separated steps (run in the order " + ",".join(STEPS) + ")")
    ap.add_argument(
        "--budget",
        action="append",
        default=[],
        metavar="STEP=SECONDS",
        help="a step's time budget (defaults: " + ", ".join(f"{k} {v}" for k, v in BUDGET_S.items()) + ")",
    )
    ap.add_argument("--total-s", type=float, default=580, help="refuse budgets that add up to more")
    ap.add_argument("--up-minutes", type=float, default=3.0)
    ap.add_argument("--up-preset", default="config/gpu-7b.yaml", help="the preset `up` runs (its model: the small base)")
    ap.add_argument("--bench-swaps", type=int, default=3, help="swaps per transport")
    ap.add_argument("--bench-clients", type=int, default=32)
    ap.add_argument("--bench-config", default="", help="a HF config folder instead of the 7B-shaped one")
    ap.add_argument(
        "--flashinfer-sampler",
        action="store_true",
        help="keep vLLM's FlashInfer sampler (~125 s cold compile; off by default: VLLM_USE_FLASHINFER_SAMPLER=0)",
    )
    ap.add_argument("--tail", type=int, default=30, help="log lines shown for a failed step")
    ap.add_argument("--inject-fail", default="", metavar="STEP", help="dry run: STEP also runs a failing command")
    ap.add_argument("--inject-hang", default="", metavar="STEP", help="dry run: STEP also runs a command past its budget")
    return ap


def environment(cache: Path, a) -> dict:
    site = cache / "site"
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "VLLM_CACHE_ROOT": str(cache / "vllm"),
        "VLLM_USE_FLASHINFER_SAMPLER": "1" if a.flashinfer_sampler else "0",
    }
    paths = [str(site)] if site.is_dir() else []
    env["PYTHONPATH"] = os.pathsep.join(paths + [str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH", "")] if p])
    if (site / "bin").is_dir():  # console scripts of the carried wheels, nats-server among them
        env["PATH"] = f"{site / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return env


def flatten(d, prefix: str = "") -> dict:
    if not isinstance(d, dict) or not d:
        return {prefix: d}
    out = {}
    for k, v in d.items():
        out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def figures(name: str, out: Path, log: str) -> dict:
    """What a step measured: its JSON, if it wrote one, and what its log says (pytest's counts, copy times)."""
    path = out / f"{name}.json"
    found = flatten(json.loads(path.read_text())) if path.exists() else {}
    if name == "gpu_tests":
        last = next(
            (
                ln
                for ln in reversed(log.splitlines())
                if re.search(
                    r"\d+ (passed|failed|skipped|errors?|tests? "
                    r"collected)\b.* in [\d.]+s",
                    ln,
                )
            ),
            "",
        )
        counts = re.findall(r"(\d+) (passed|failed|skipped|errors?|deselected|tests? collected)", last)
        found.update({kind.split()[0] if "collected" not in kind else "collected": int(n) for n, kind in counts})
        if m := re.search(r"shared copy of (\d+) tensors: first ([\d.]+) ms, then p50 ([\d.]+) ms", log):
            found.update(shared_copy_tensors=int(m[1]), shared_copy_first_ms=float(m[2]), shared_copy_p50_ms=float(m[3]))
    return found


def stop_up(cache: Path, a) -> None:
    """`main.py down` for the up step's state dir, if an `up` still runs there."""
    state = cache / "up" / "state"
    if (state / "run.json").exists():
        try:
            subprocess.run(
                [sys.executable, "main.py", "down"],
                cwd=ROOT,
                timeout=60,
                capture_output=True,
                env={**environment(cache, a), "KAIZEN_STATE_DIR": str(state)},
            )
        except subprocess.TimeoutExpired:  # what it left on the GPU is killed by `settle`
            pass


def summary(res: dict, tail: int) -> str:
    steps = res["steps"]
    lines = [
        f"== GPU check{' (dry run)' if res['dry_run'] else ''} on {res['device']}: "
        f"{sum(s['ok'] for s in steps)} of {len(steps)} steps passed in {res['seconds']:.0f}s "
        f"(budgets {res['budget_s']:.0f}s) ==",
        f"{'step':<10} {'result':<34} seconds / budget",
    ]
    for s in steps:
        result = "ok" if s["ok"] else ("OUT OF TIME" if s["timed_out"] else f"FAILED (exit {s['rc']})")
        lines.append(f"{s['name']:<10} {result:<34} {s['seconds']:7.1f} / {s['budget_s']:.0f}")
    lines.append("-- figures --")
    lines += [f"{k} = {v}" for k, v in res["figures"].items()] or ["(none)"]
    for s in (s for s in steps if not s["ok"]):
        text = Path(s["log"]).read_text(errors="replace").splitlines() if Path(s["log"]).exists() else []
        lines += [f"-- failure: {s['name']}: {'; '.join(s['problems'])} (log {s['log']}); its last {tail} lines:", *text[-tail:]]
    return "\n".join(lines)


def main(argv=None) -> int:
    a = parser().parse_args(argv)
    if (a.inject_fail or a.inject_hang) and not a.dry_run:
        raise SystemExit("--inject-fail and --inject-hang are for --dry-run only")
    if not a.out:
        raise SystemExit("give --out DIR (or set OUT)")
    named = a.only.split(",") + [b.split("=")[0] for b in a.budget] + [x for x in (a.inject_fail, a.inject_hang) if x]
    unknown = [s for s in named if s not in STEPS]
    if unknown:
        raise SystemExit(f"unknown steps {unknown}; steps: {STEPS}")
    out = Path(a.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    cache = Path(tempfile.mkdtemp(prefix="kz-gpu-dry-")) if a.dry_run else Path(a.cache).resolve()
    work = cache / "figures"
    work.mkdir(parents=True, exist_ok=True)
    try:  # a run refused here leaves no dry-run folder behind
        steps = plan(a, cache, work)
        total = sum(s["budget_s"] for s in steps)
        for call in CALLS:
            part = [s for s in steps if s["name"] in call]
            if (t := sum(s["budget_s"] for s in part)) > a.total_s:
                raise SystemExit(
                    f"the budgets of {','.join(s['name'] for s in part)} add up to {t:.0f}s, over --total-s {a.total_s:.0f}"
                )
        if total > a.total_s and not a.dry_run:
            raise SystemExit(
                f"the budgets add up to {total:.0f}s, over one call's --total-s {a.total_s:.0f}: run it as {len(CALLS)} calls "
                "on the warm machine, " + " then ".join(f"--only {','.join(c)}" for c in CALLS)
            )
    except SystemExit:
        if a.dry_run:
            shutil.rmtree(cache, ignore_errors=True)
        raise
    t0, results, figs = time.monotonic(), [], {}
    dev = smi("name,memory.total,driver_version") or "no GPU (no nvidia-smi answer)"
    print(
        f"[gpu_check] {'dry run' if a.dry_run else 'device run'} on {dev}: {', '.join(s['name'] for s in steps)} "
        f"within {total:.0f}s; logs and figures in {out}",
        flush=True,
    )
    for step in steps:
        for stale in (work / f"{step['name']}.json", out / f"{step['name']}.log"):
            stale.unlink(missing_ok=True)
        if step["name"] == "up":
            stop_up(cache, a)  # a fresh state dir: nothing left of an earlier run on this machine
            shutil.rmtree(cache / "up", ignore_errors=True)
        before = None if a.dry_run else gpu_used_mib()
        r = run_step(step, environment(cache, a), out / f"{step['name']}.log")
        if step["name"] == "up":
            stop_up(cache, a)  # stopped mid-run: `down` anyway, before the GPU is checked
        r["gpu_settle_s"], left = settle(before)
        if left:
            r["ok"] = False
            r["problems"] += left
        try:
            found = figures(step["name"], work, Path(r["log"]).read_text(errors="replace"))
        except (ValueError, OSError) as exc:  # a step that wrote half a JSON file has failed anyway
            found, r["ok"] = {}, False
            r["problems"].append(f"its figures could not be read: {exc}")
        if (used := gpu_used_mib()) is not None:
            found.update(gpu_mem_used_mib_after=used, gpu_settle_s=r["gpu_settle_s"])
        figs.update({f"{step['name']}.{k}": v for k, v in found.items()})
        results.append(r)
        print(
            f"[gpu_check] {r['name']}: {'ok' if r['ok'] else 'FAILED'} in {r['seconds']}s {'; '.join(r['problems'])}", flush=True
        )
        # written after every step: a call cut short by the device's limit still brings back what ran
        res = {
            "dry_run": a.dry_run,
            "device": dev,
            "seconds": round(time.monotonic() - t0, 1),
            "budget_s": total,
            "steps": results,
            "figures": figs,
            "failed": [r["name"] for r in results if not r["ok"]],
        }
        (out / "gpu_check.json").write_text(json.dumps(res, indent=1))
        text = summary(res, a.tail)
        (out / "summary.txt").write_text(text + "\n")
    print(text, flush=True)
    for r in results:  # what comes back from the device is at most 16 MiB a file
        log = Path(r["log"])
        if log.exists() and log.stat().st_size > 8 << 20:
            data = log.read_bytes()[-(8 << 20) :]
            log.write_bytes(b"[gpu_check] log cut to its last 8 MiB\n" + data)
    if a.dry_run:
        shutil.rmtree(cache, ignore_errors=True)
    return 0 if not res["failed"] else 1


if __name__ == "__main__":
    sys.exit(main())
