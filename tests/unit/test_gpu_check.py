"""scripts/gpu_check.sh rehearsed without CUDA or vLLM (its --dry-run), so that no line of it runs first on the GPU
machine: every step's plumbing, one step that fails and one that outlives its budget, the JSON and the summary; and
the carried wheel set's checks against SHA256SUMS, which refuse a damaged part and a damaged whole, and its unpacking
with or without an xz binary."""

import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _module(name: str):
    """A script of scripts/ as a module, its siblings importable as when it runs (gpu_check imports gpu_steps)."""
    if str(ROOT / "scripts") not in sys.path:
        sys.path.insert(0, str(ROOT / "scripts"))
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def dry(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu-dry")
    t0 = time.monotonic()
    r = subprocess.run(
        [
            "bash",
            "scripts/gpu_check.sh",
            "--dry-run",
            "--out",
            str(out),
            "--inject-fail",
            "bench",
            "--inject-hang",
            "models",
            "--budget",
            "models=14",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    return r, out, json.loads((out / "gpu_check.json").read_text()), time.monotonic() - t0


def test_every_step_runs_and_a_failing_one_stops_none_after_it(dry):
    r, out, res, wall = dry
    assert r.returncode == 1, r.stdout + r.stderr
    assert res["dry_run"] is True and [s["name"] for s in res["steps"]] == ["install", "models", "gpu_tests", "bench", "up"]
    assert res["failed"] == ["models", "bench"]
    steps = {s["name"]: s for s in res["steps"]}
    hung, failed = steps["models"], steps["bench"]
    assert hung["timed_out"] and hung["seconds"] < 14 and "out of time" in hung["problems"][0]  # SIGTERM 10 s early
    assert failed["rc"] == 3 and not failed["timed_out"]
    assert steps["install"]["ok"] and steps["gpu_tests"]["ok"] and steps["up"]["ok"]
    assert res["budget_s"] == 25 + 14 + 150 + 270 + 370 and wall < 120


def test_the_figures_come_from_the_real_plumbing(dry):
    _, _, res, _ = dry
    f = res["figures"]
    assert f["install.versions.kz_fake_wheel"] == "0.0.1"  # the fake set, received, checked, unpacked and found
    assert 6.5 < f["models.shape_7b_params_b"] < 7.0  # 7B's layers with the base model's vocabulary (before the hang)
    tests = sum(len(re.findall(r"^def test_", p.read_text(), re.M)) for p in (ROOT / "tests" / "gpu").glob("test_*.py"))
    assert f["gpu_tests.collected"] == tests  # collected with the device run's own pytest options
    assert f["up.plan_fits_7b_shape"] is True and f["up.plan_problems"] == []  # the derived gpu-7b preset, planned
    assert f["up.requests"] == 0 and f["up.served_versions"] == {}  # the figures of a run with no events


def test_the_summary_shows_every_figure_and_each_failures_log_tail(dry):
    r, out, res, _ = dry
    text = (out / "summary.txt").read_text()
    assert text.strip() in r.stdout
    assert "3 of 5 steps passed" in text and "OUT OF TIME" in text and "FAILED (exit 3)" in text
    for k, v in res["figures"].items():
        assert f"{k} = {v}" in text
    bench = text.split("-- failure: bench", 1)[1]
    assert "injected failure, line 39" in bench and "injected failure, line 5\n" not in bench  # the tail only
    assert "injected hang: sleeping past the budget" in text.split("-- failure: models", 1)[1].split("-- failure:")[0]
    # a device call brings back at most 8 files, named in letters, digits, '.', '_' and '-'
    files = [p for p in out.rglob("*") if p.is_file()]
    assert len(files) <= 8 and all(re.fullmatch(r"[\w.-]+", p.name) for p in files)


def test_the_device_run_is_checked_before_it_starts(tmp_path, monkeypatch):
    check = _module("gpu_check")
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    with pytest.raises(SystemExit, match="the budgets of up add up to 1000s, over --total-s 580"):
        check.main(["--dry-run", "--out", str(tmp_path), "--budget", "up=1000"])
    assert list((tmp_path / "tmp").iterdir()) == []  # the refused dry run left no folder behind
    # every step at once is more than one device call holds: the calls are named, tests/gpu last
    with pytest.raises(
        SystemExit,
        match="run it as 3 calls on the warm machine, --only install,models,bench then --only up then --only gpu_tests",
    ):
        check.main(["--out", str(tmp_path), "--cache", str(tmp_path / "cache")])
    with pytest.raises(SystemExit, match="dry-run only"):
        check.main(["--out", str(tmp_path), "--inject-fail", "bench"])
    with pytest.raises(SystemExit, match="unknown steps"):
        check.main(["--dry-run", "--out", str(tmp_path), "--only", "install,train"])


def test_a_damaged_part_or_archive_is_refused_and_a_good_set_unpacked(tmp_path, capsys, monkeypatch):
    w = _module("gpu_wheels")
    xfer, parts, site = tmp_path / "xfer", tmp_path / "parts", tmp_path / "cache"
    assert w.fake(w.parser().parse_args(["fake", "--work", str(tmp_path / "pack"), "--out", str(xfer)])) == 0
    names = sorted(p.name for p in xfer.glob("part.*"))
    assert len(names) >= 3 and all(p.stat().st_size <= 8 * 1024 for p in xfer.glob("part.*"))
    damaged = bytearray((xfer / names[1]).read_bytes())
    damaged[0] ^= 0xFF
    (xfer / names[1]).write_bytes(bytes(damaged))
    args = ["--wheels", str(parts), "--site", str(site), "--imports", "kz_fake_wheel"]
    assert w.receive(w.parser().parse_args(["receive", "--src", str(xfer), *args])) == 1
    assert not (parts / names[1]).exists() and f"'{names[1]}'" in capsys.readouterr().out  # deleted: send it again
    assert w.install(w.parser().parse_args(["install", *args])) == 1 and not (site / "site").exists()

    good = tmp_path / "good"
    w.fake(w.parser().parse_args(["fake", "--work", str(tmp_path / "pack2"), "--out", str(good)]))
    sums = (good / "SHA256SUMS").read_text()
    (good / "SHA256SUMS").write_text(sums.replace(w.read_sums(good)[w.ARCHIVE], "0" * 64))  # parts fine, whole not
    args2 = ["--wheels", str(tmp_path / "parts2"), "--site", str(tmp_path / "cache2")]
    assert w.receive(w.parser().parse_args(["receive", "--src", str(good), *args2])) == 1
    assert "does not match" in capsys.readouterr().out and not (tmp_path / "cache2" / "site").exists()

    (tmp_path / "parts2" / "SHA256SUMS").write_text(sums)
    assert w.install(w.parser().parse_args(["install", *args2, "--imports", "kz_fake_wheel"])) == 0
    assert (tmp_path / "cache2" / "site" / "kz_fake_wheel" / "__init__.py").exists()
    assert '"kz_fake_wheel": "0.0.1"' in capsys.readouterr().out
    monkeypatch.setattr(w.shutil, "which", lambda name: None)  # a machine without xz: Python's lzma unpacks
    assert (
        w.install(w.parser().parse_args(["install", "--wheels", str(tmp_path / "parts2"), "--site", str(tmp_path / "cache3")]))
        == 0
    )
    assert (tmp_path / "cache3" / "site" / "kz_fake_wheel" / "blob.bin").stat().st_size == 24 * 1024


def test_the_up_steps_figures_and_preset_from_real_event_models(tmp_path, monkeypatch):
    from actors import events as E
    from config.settings import load_settings

    monkeypatch.syspath_prepend(str(ROOT / "tests" / "benchmarks"))
    spec = importlib.util.spec_from_file_location("gpu_up_check", ROOT / "tests" / "benchmarks" / "gpu_up_check.py")
    up = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(up)
    ref = {
        v: E.WeightsRef(version=v, path=f"/w/{v}", sha256="0" * 64, parent="w-000000", step=i)
        for i, v in enumerate(["w-000001", "w-000002"], 1)
    }
    evs = [
        E.LearnerStep(step=i, groups=2, samples=16, loss=0.1, mean_reward=0.5, grad_norm=1.0, duration_s=d)
        for i, d in ((1, 4.0), (2, 6.0))
    ]
    evs += [E.WeightsPublished(weights=r) for r in ref.values()]
    evs += [
        E.WeightsPromoted(weights=ref["w-000001"], candidate_score=0.5, live_score=0.4, previous="w-000000"),
        E.WeightsSwapped(replica="r0", version="w-000000", swap_ms=0.0, reason="joined"),
        E.WeightsSwapped(replica="r0", version="w-000000", swap_ms=80.0, canary="w-000002", reason="canary"),
        E.WeightsSwapped(replica="r0", version="w-000001", swap_ms=73.0, reason="promoted"),
        E.WeightsStatus(version="w-000002", status="evaluating"),
        E.WeightsStatus(version="w-000003", status="rejected"),
    ]
    f = up.figures_of(evs, {"requests": 40, "failed": 1, "traffic_s": 180}, 52.5, None)
    assert (f["learner_steps"], f["learner_step_s_p50"], f["learner_step_s_max"]) == (2, 5.0, 6.0)
    assert (f["published"], f["promoted_by_gate"], f["rejected_by_gate"]) == (2, 1, 1)
    assert f["served_versions"] == {"w-000001": "live", "w-000002": "canary"}
    assert (f["replica_swap_ms_p50"], f["requests"], f["failed"], f["ready_s"]) == (76.5, 40, 1, 52.5)
    assert up.force_candidate(evs) == "w-000003"  # decided by the gate; w-000002 is still being scored
    assert up.force_candidate(evs + [E.WeightsStatus(version="w-000003", status="live")]) is None

    a = up.parser().parse_args(
        [
            "up",
            "--json",
            str(tmp_path / "up.json"),
            "--model",
            str(tmp_path / "tiny"),
            "--set",
            "gate.heldout_tasks=8",
            "--set",
            "serve.weights_transport=file",
        ]
    )
    s = load_settings(up.derived_config(a, tmp_path / "state"))
    assert (s.model.source, s.model.path, s.model.name) == ("hf-folder", str(tmp_path / "tiny"), "tiny")
    assert (s.model.engine, s.gate.heldout_tasks, s.serve.weights_transport) == ("vllm", 8, "file")


def test_after_a_step_its_gpu_memory_is_awaited_and_what_it_left_on_the_gpu_is_killed(monkeypatch):
    steps = _module("gpu_steps")
    real_used = steps.gpu_used_mib
    used = iter([9000, 5000, 1200])  # the step's engine gives its memory back over two seconds
    monkeypatch.setattr(steps, "gpu_used_mib", lambda: next(used))
    waited, problems = steps.settle(500, wait_s=10)
    assert problems == [] and 1.5 <= waited < 5

    left = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # a process the step left
    monkeypatch.setattr(steps, "gpu_used_mib", lambda: 31500)
    real_run = subprocess.run
    listed = f"{left.pid}\n{os.getpid()}\n4194999\n"  # itself and a pid not of this machine are never killed
    smi = lambda argv, **kw: (  # noqa: E731  nvidia-smi's list of the processes on the GPU
        subprocess.CompletedProcess(argv, 0, listed, "") if argv[0] == "nvidia-smi" else real_run(argv, **kw)
    )
    monkeypatch.setattr(steps.subprocess, "run", smi)
    monkeypatch.setattr(steps.shutil, "which", lambda name: f"/usr/bin/{name}")
    waited, problems = steps.settle(500, wait_s=1)
    assert left.wait(timeout=10) == -9  # SIGKILL
    assert problems == [f"31000 MiB of the GPU still held 1s after it ended; killed 1 processes on the GPU ([{left.pid}])"]
    assert steps.settle(None) == (0.0, [])  # no GPU (the dry run): nothing to wait for
    monkeypatch.setattr(steps, "smi", lambda q: "[N/A]")  # an answer that is not a number
    assert real_used() is None


def test_a_failed_ups_logs_are_shown_in_a_few_lines_each(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "tests" / "benchmarks"))
    from _run_logs import tails

    state = tmp_path / "state"
    (state / "logs").mkdir(parents=True)
    (state / "logs" / "explorer.log").write_text("".join(f"explorer line {i}\n" for i in range(50)))
    (state / "logs" / "up.log").write_text("printed by up itself\n")
    ray = state / "ray" / "session_latest" / "logs"
    ray.mkdir(parents=True)
    (ray / "worker-aa.err").write_text("ok\nTraceback (most recent call last):\nValueError: Free memory on device\n")
    (ray / "worker-bb.out").write_text("INFO all well\n")
    (ray / "serve").mkdir()
    (ray / "serve" / "controller_1.log").write_text(
        "INFO 1 -- Deploying app\nWARNING 2 -- Deployment 'Agent' has 1 replicas that have taken more than 30s to be "
        "scheduled: resources required {'GPU': 0.25}\n"
    )
    text = tails(state, lines=5)
    assert "taken more than 30s to be scheduled" in text and "Deploying app" not in text
    assert "explorer line 49" in text and "explorer line 44" not in text and "printed by up itself" not in text
    assert "ValueError: Free memory on device" in text and "worker-bb" not in text
    (ray / "worker-aa.err").write_text("INFO fine\n")
    assert "no Ray worker log" in tails(state)
