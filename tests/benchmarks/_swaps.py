"""The figures of bench_serve_swaps, per transport (tests/unit/test_bench_swaps.py checks them).

A swap is a dict: `how` (the transport), `version`, `put` and `swapped` (this script's clock: the pointer moved, the
replica's `evo.weights_swapped` arrived; `swapped` None when it never did) and `swap_ms` (the replica's own time
from seeing the pointer to serving the version). A request is (start, end, ok) on the same clock.
"""

import re
import statistics

from _common import pct


def spread(xs: list[float]) -> dict | None:
    return {"n": len(xs), "p50": statistics.median(xs), "p95": pct(xs, 0.95), "max": max(xs)} if xs else None


def latencies(requests: list[tuple]) -> dict:
    lat = [(e - b) * 1000 for b, e, ok in requests if ok]
    return {
        "requests": len(requests),
        "failed": sum(not ok for *_, ok in requests),
        "p50_ms": statistics.median(lat) if lat else None,
        "p95_ms": pct(lat, 0.95) if lat else None,
    }


def overlapping(requests: list[tuple], windows: list[tuple[float, float]]) -> list[tuple]:
    """The requests in flight at some moment of one of `windows` (each [start, end])."""
    return [r for r in requests if any(r[0] <= w1 and r[1] >= w0 for w0, w1 in windows)]


def fetches(log_text: str) -> list[tuple[str, float]]:
    """(version, seconds) of each `weights.fetched` line of a replica's log (structlog key=value), in order."""
    out = []
    for line in log_text.splitlines():
        if "event='weights.fetched'" not in line:
            continue
        version, seconds = re.search(r"\bversion='([^']*)'", line), re.search(r"\bseconds=([0-9.]+)", line)
        if version and seconds:
            out.append((version.group(1), float(seconds.group(1))))
    return out


def pair_fetches(swaps: list[dict], fetched: list[tuple[str, float]]) -> None:
    """Give each swap of a version its fetch (`fetch_ms`): the next fetch of that version not given yet."""
    left = list(fetched)
    for sw in swaps:
        i = next((i for i, (v, _) in enumerate(left) if v == sw["version"]), None)
        if i is not None and sw["swapped"] is not None:
            sw["fetch_ms"] = left.pop(i)[1] * 1000


def per_transport(swaps: list[dict], requests: list[tuple]) -> dict:
    """Per transport: the replica's swap time, pointer moved -> swapped, the fetch within it (and the rest: the
    standby copy and the flip), and the requests in flight during its swaps."""
    out = {}
    for how in dict.fromkeys(sw["how"] for sw in swaps):
        mine = [sw for sw in swaps if sw["how"] == how]
        done = [sw for sw in mine if sw["swapped"] is not None]
        fetched = [sw for sw in done if "fetch_ms" in sw]
        out[how] = {
            "swaps": len(mine),
            "missed": len(mine) - len(done),
            "swap_ms": spread([sw["swap_ms"] for sw in done]),
            "pointer_to_swapped_ms": spread([(sw["swapped"] - sw["put"]) * 1000 for sw in done]),
            "fetched": len(fetched),
            "fetch_ms": spread([sw["fetch_ms"] for sw in fetched]),
            "swap_less_fetch_ms": spread([sw["swap_ms"] - sw["fetch_ms"] for sw in fetched]),
            "requests_in_flight": latencies(overlapping(requests, [(sw["put"], sw["swapped"]) for sw in done])),
        }
    return out


def table(per: dict) -> list[str]:
    """The printout's lines, one per transport."""

    def ms(d, key="p50"):
        return f"{d[key]:6.0f}" if d else "     -"

    lines = []
    for how, r in per.items():
        q = r["requests_in_flight"]
        lines.append(
            f"{how:7} swaps={r['swaps']:2d} missed={r['missed']} swap p50={ms(r['swap_ms'])} "
            f"p95={ms(r['swap_ms'], 'p95')} ms; pointer->swapped p50={ms(r['pointer_to_swapped_ms'])} "
            f"p95={ms(r['pointer_to_swapped_ms'], 'p95')} ms; fetch ({r['fetched']}) p50={ms(r['fetch_ms'])} "
            f"p95={ms(r['fetch_ms'], 'p95')} ms, rest p50={ms(r['swap_less_fetch_ms'])} ms; requests in "
            f"flight {q['requests']} failed {q['failed']} p50={ms(q, 'p50_ms')} p95={ms(q, 'p95_ms')} ms"
        )
    return lines
