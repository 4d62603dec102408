"""The benchmarks' host check (tests/benchmarks/_hours.py): an hour on a host much slower than the committed hours'
stops before anything runs, with the figures; without a limit it only says how the host compares."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import _hours  # noqa: E402


def _results(tmp_path: Path) -> Path:
    (tmp_path / "a.json").write_text(json.dumps({"host_forward_s": {"before_up": 1.55, "cpu": "x"}}))
    (tmp_path / "b.json").write_text(json.dumps({"host_forward_s": {"before_up": 2.25}}))
    (tmp_path / "old.json").write_text(json.dumps({"host_forward_s": 1.0}))  # no before_up: not counted
    (tmp_path / "other.json").write_text(json.dumps({"figures": [1, 2]}))
    return tmp_path


def test_committed_hosts_reads_before_up_only(tmp_path):
    assert _hours.committed_hosts(_results(tmp_path)) == [1.55, 2.25]


def test_slow_host_stops_with_the_figures(tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        _hours.check_host(5.46, 2.5, _results(tmp_path))
    msg = str(stop.value)
    assert "5.46 s is above the limit 2.50 s" in msg
    assert "1.55-2.25 s over 2 committed hours" in msg


def test_no_limit_or_within_it_only_reports(tmp_path, capsys):
    _hours.check_host(5.46, None, _results(tmp_path))
    _hours.check_host(2.0, 2.5, _results(tmp_path))
    out = capsys.readouterr().out.splitlines()
    assert out == [
        "host_forward_s 5.46 s (1.55-2.25 s over 2 committed hours)",
        "host_forward_s 2.00 s (1.55-2.25 s over 2 committed hours)",
    ]


def test_no_committed_hour(tmp_path, capsys):
    _hours.check_host(1.2, 2.5, tmp_path)
    assert "no committed hour to compare" in capsys.readouterr().out


def test_host_like_pairs_the_limit_with_that_hours_host(tmp_path):
    res = _results(tmp_path)
    assert _hours.host_limit(None, None) is None
    assert _hours.host_limit(2.5, None) == 2.5
    assert _hours.host_limit(None, res / "a.json") == pytest.approx(1.25 * 1.55)  # 1.9375
    assert _hours.host_limit(2.5, res / "a.json") == pytest.approx(1.9375)  # the tighter one
    assert _hours.host_limit(1.5, res / "a.json") == 1.5
    with pytest.raises(SystemExit, match="records no host_forward_s.before_up"):
        _hours.host_limit(2.5, res / "old.json")
    with pytest.raises(SystemExit, match="2.34 s is above the limit 1.94 s"):  # the 2026-12-02 hour's host vs lag_r1's
        _hours.check_host(2.34, _hours.host_limit(2.5, res / "a.json"), res)
