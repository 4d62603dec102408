"""bench_guard_power's replay of the guard's check (tests/benchmarks/bench_guard_power.py) on rates of 0 and 1, where
every draw is certain and so is the verdict, with the guard's futility stop and without it."""

import importlib.util
import sys
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[2]


def _mod():
    sys.path.insert(0, str(ROOT / "tests" / "benchmarks"))
    spec = importlib.util.spec_from_file_location("bench_guard_power", ROOT / "tests" / "benchmarks" / "bench_guard_power.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _guard(early_fraction=0.5):
    return SimpleNamespace(base_k=8, chunk_entries=8, early_fraction=early_fraction, alpha=0.05)


def test_a_version_that_never_succeeds_where_the_base_always_does_is_always_caught():
    m = _mod()
    # base 8/8 on every entry, the version 0/4: its 0 of 32 against 64 of 64 on the first chunk cannot stop early (no
    # success), and on the whole suite 0 of 64 against 128 of 128 gives an exact p far below 0.05
    assert m.detection_rate([0.0] * 16, [1.0] * 16, 4, _guard(), runs=20) == 1.0
    assert m.detection_rate([1.0] * 16, [1.0] * 16, 4, _guard(), runs=20) == 0.0  # the base against itself: never
    assert m.detection_rate([0.0] * 16, [0.0] * 16, 4, _guard(), runs=20) == 0.0  # no success anywhere: no loss


def test_the_futility_stop_lets_a_version_through_whose_first_half_shows_no_loss():
    m = _mod()
    half_broken = [1.0] * 8 + [0.0] * 8  # level with the base on the first chunk, nothing on the second
    # the first chunk is half the suite: delta 0 and avg 1 there, so the check stops `not_below`, as the guard's does
    assert m.detection_rate(half_broken, [1.0] * 16, 4, _guard(early_fraction=0.5), runs=20) == 0.0
    # without the stop the whole suite decides: 32 of 64 successes against the base's 128 of 128, p far below 0.05
    assert m.detection_rate(half_broken, [1.0] * 16, 4, _guard(early_fraction=1.0), runs=20) == 1.0
