"""bench_serve_swaps' figures per transport (tests/benchmarks/_swaps.py): the fetch read from a replica's log, and
swaps and requests attributed to their transport."""

import importlib.util
from pathlib import Path

import structlog

ROOT = Path(__file__).resolve().parents[2]


def _swaps(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "tests" / "benchmarks"))
    spec = importlib.util.spec_from_file_location("_swaps", ROOT / "tests" / "benchmarks" / "_swaps.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _line(event: str, **kw) -> str:
    """A line as the replica's log writes it (config/telemetry.py's renderer)."""
    render = structlog.processors.KeyValueRenderer(key_order=["timestamp", "level", "event"], drop_missing=True)
    return render(None, "info", {"actor": "serve", "replica": "r1", "timestamp": "t", "level": "info", "event": event, **kw})


def test_fetches_are_read_from_the_replicas_log_lines_in_order(monkeypatch):
    sw = _swaps(monkeypatch)
    log = "\n".join(
        [
            _line("weights.fetched", version="w-000004", bytes=270_000_000, seconds=1.25),
            _line("swap.done", version="w-000004", total_ms=1600.0),
            _line("weights.fetched", version="w-000003", bytes=270_000_000, seconds=0.9),
            _line("weights.uploaded", version="w-000005", bucket="b", bytes=1),
        ]
    )
    assert sw.fetches(log) == [("w-000004", 1.25), ("w-000003", 0.9)]


def test_each_swap_gets_its_own_fetch_and_a_missed_swap_none(monkeypatch):
    sw = _swaps(monkeypatch)
    swaps = [
        {"how": "objects", "version": "w-000004", "put": 0.0, "swapped": 2.0, "swap_ms": 1500.0},
        {"how": "objects", "version": "w-000003", "put": 5.0, "swapped": None},
        {"how": "objects", "version": "w-000004", "put": 9.0, "swapped": 10.0, "swap_ms": 900.0},
    ]
    sw.pair_fetches(swaps, [("w-000004", 1.0), ("w-000003", 0.5), ("w-000004", 0.6)])
    assert [s.get("fetch_ms") for s in swaps] == [1000.0, None, 600.0]


def test_swaps_and_requests_in_flight_are_counted_per_transport(monkeypatch):
    sw = _swaps(monkeypatch)
    swaps = [
        {"how": "file", "version": "w-000001", "put": 10.0, "swapped": 10.3, "swap_ms": 280.0},
        {"how": "objects", "version": "w-000004", "put": 20.0, "swapped": 22.0, "swap_ms": 1900.0, "fetch_ms": 1500.0},
        {"how": "file", "version": "w-000001", "put": 30.0, "swapped": 30.5, "swap_ms": 420.0},
        {"how": "objects", "version": "w-000004", "put": 40.0, "swapped": None},
    ]
    requests = [
        (9.0, 10.1, True),  # in flight as the first file swap began
        (10.2, 12.0, False),  # began during it, failed
        (12.0, 19.9, True),  # between swaps: no transport's
        (21.9, 24.0, True),  # the objects swap's last moment
        (39.0, 45.0, True),
    ]  # during a swap that never reported: not attributed
    per = sw.per_transport(swaps, requests)
    assert list(per) == ["file", "objects"]
    f, o = per["file"], per["objects"]
    assert (f["swaps"], f["missed"], o["swaps"], o["missed"]) == (2, 0, 2, 1)
    assert f["swap_ms"]["p50"] == 350.0 and f["fetch_ms"] is None and f["fetched"] == 0
    assert round(f["pointer_to_swapped_ms"]["p50"]) == 400
    q = f["requests_in_flight"]
    assert (q["requests"], q["failed"], round(q["p50_ms"]), round(q["p95_ms"])) == (2, 1, 1100, 1100)
    assert o["fetch_ms"]["p50"] == 1500.0 and o["swap_less_fetch_ms"]["p50"] == 400.0
    assert o["requests_in_flight"]["requests"] == 1 and round(o["requests_in_flight"]["p50_ms"]) == 2100
    assert len(sw.table(per)) == 2 and "objects" in sw.table(per)[1]
