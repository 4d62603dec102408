"""compare_hours' figures (tests/benchmarks/compare_hours.py): the gain read from a live-traffic hour's suite, the
guard's level per quarter of the hour, the early-step figures, and the rank correlation, on hand-written files."""

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _mod():
    spec = importlib.util.spec_from_file_location("compare_hours", ROOT / "tests" / "benchmarks" / "compare_hours.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _check(minute, delta):
    return {"minute": minute, "version": "w", "verdict": "not_below", "delta": delta, "p_value": 1.0, "entries": 24}


def test_guard_level_per_quarter_and_after_minute_15():
    m = _mod()
    checks = [_check(2, 0.02), _check(10, 0.04), _check(16, 0.06), _check(44, 0.10), _check(50, 0.02)]
    lv = m.guard_level(checks)
    assert lv["guard_q1"] == pytest.approx(3.0)  # (2 + 4) / 2 points
    assert lv["guard_q2"] == pytest.approx(6.0)
    assert lv["guard_q3"] == pytest.approx(10.0)  # minute 44 is in the third quarter (30 <= m < 45)
    assert lv["guard_q4"] == pytest.approx(2.0)
    assert lv["guard_after15"] == pytest.approx(6.0)  # (6 + 10 + 2) / 3
    assert m.guard_level([]) == {}
    assert m.guard_level([_check(1, 0.05)])["guard_q2"] is None
    # A 90-minute run: quarters of 22.5 minutes, so minute 50 is in the third and minute 80 in the fourth.
    lv90 = m.guard_level([_check(10, 0.02), _check(30, 0.04), _check(50, 0.06), _check(80, 0.08)], minutes=90)
    assert [lv90[f"guard_q{i}"] for i in range(1, 5)] == pytest.approx([2.0, 4.0, 6.0, 8.0])
    assert lv90["guard_after15"] == pytest.approx(6.0)


def test_a_live_traffic_hour_reads_its_suite_and_its_first_ten_steps(tmp_path):
    m = _mod()
    steps = [{"step": i + 1, "lr": 1e-5 if i < 5 else 5e-6, "kl_drift": 0.01 * (i + 1), "kl": 0.1} for i in range(12)]
    d = {
        "newest_vs_base": {"bfcl_single": {"delta": 0.0625, "p_value": 0.02}},
        "learner_steps": 12,
        "users": {"requests": 10, "right": 3},
        "steps": steps,
        "guard_checks": [_check(20, 0.04) | {"duration_s": 120, "entries": 24}],
        "cycle_p50_s": {"gate_s": 18.1},
        "host_forward_s": {"before_up": 0.21, "before_scoring": 0.23},
        "score_s": 96,
        "k": 16,
        "suite": {"bfcl_single": ["e1", "e2", "e3"]},
        "scores": {"w-000001": {}, "w-000012": {}},
    }
    f = tmp_path / "live_traffic_cpu_simple_x_r1.json"
    f.write_text(json.dumps(d))
    row = m.figures(f)
    assert row["hour"] == "cpu_simple_x_r1"
    assert row["gain"] == pytest.approx(6.25) and row["p"] == 0.02
    assert row["lr_sum10"] == pytest.approx(5 * 1.0 + 5 * 0.5)  # units of 1e-5
    assert row["drift_at10"] == pytest.approx(0.10)  # after the tenth step, not the last
    assert row["guard_after15"] == pytest.approx(4.0)
    assert (row["gate_p50_s"], row["host_forward_s"]) == (18.1, 0.23)  # the host's speed beside the hour's figures
    assert row["guard_s_per_entry"] == pytest.approx(120 / 24)  # the loop's own speed, under the hour's load
    assert row["score_ms_per_sample"] == pytest.approx(1000 * 96 / (2 * 3 * 16))  # the host's, alone after the hour
    assert m.scoring_speed({"score_s": 96}) is None
    assert m.guard_speed([]) is None and m.guard_speed([{"minute": 3, "delta": 0.0}]) is None
    assert m.guard_speed([_check(5, 0.0) | {"duration_s": 100, "entries": 48}, _check(9, 0.0)]) == pytest.approx(100 / 48)


def test_spearman_ranks_with_ties_and_skips_missing():
    m = _mod()
    assert m.spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert m.spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert m.spearman([1, None, 3], [1, 2, 3]) is None  # two pairs left: too few
    # ties share their mean rank: x ranks (0.5, 0.5, 2), y ranks (0, 1, 2); rho = 1.5 / sqrt(1.5 * 2)
    assert m.spearman([1, 1, 2], [1, 2, 3]) == pytest.approx(1.5 / (1.5 * 2) ** 0.5)


def test_the_hosts_speed_is_a_forward_pass_on_one_thread_and_the_thread_count_is_restored(tiny_dir, monkeypatch):
    import torch

    monkeypatch.syspath_prepend(str(ROOT / "tests" / "benchmarks"))
    from _hours import host_cpu, host_forward_s

    threads = torch.get_num_threads()
    assert host_forward_s(tiny_dir, repeats=2) > 0 and torch.get_num_threads() == threads
    assert host_cpu().endswith("cores)")


def test_two_hours_head_to_head_pairs_their_newest_versions_on_the_entries_both_scored():
    m = _mod()

    def hour(newest, entries, per_entry):
        old = {"bfcl_single": {"per_entry": [0.0] * len(entries)}}  # an older version's scores are not read
        return {
            "suite": {"bfcl_single": entries},
            "newest_served": newest,
            "scores": {"w-000001": old, newest: {"bfcl_single": {"per_entry": per_entry}}},
        }

    a = hour("w-000009", ["e1", "e2", "e3", "e4"], [0.25, 0.5, 0.0, 0.5])
    b = hour("w-000007", ["e2", "e1", "e4", "e5"], [0.75, 0.25, 1.0, 1.0])  # another order; e3, e5 not shared
    r = m.head_to_head(a, b)["bfcl_single"]
    # shared e1, e2, e4: a 0.25, 0.5, 0.5; b 0.25, 0.75, 1.0 -> differences 0, +0.25, +0.5
    assert r["n"] == 3 and (r["wins"], r["losses"]) == (2, 0)
    assert r["a"] == pytest.approx(100 * 1.25 / 3) and r["b"] == pytest.approx(100 * 2.0 / 3)
    assert r["delta"] == pytest.approx(100 * 0.75 / 3)
    assert r["p_value"] == pytest.approx(0.5)  # of the 4 sign flips of (+0.25, +0.5), 2 reach |0.75|
    assert m.head_to_head(a, hour("w-000002", ["x"], [1.0])) == {}  # nothing in common

    # a second seed's pair: e1, e2 at a 0.5, 0.0 and b 0.25, 0.5 -> differences -0.25, +0.5
    c, d = hour("w-000004", ["e1", "e2"], [0.5, 0.0]), hour("w-000005", ["e1", "e2"], [0.25, 0.5])
    r = m.pooled([(a, b), (c, d)])["bfcl_single"]
    # five entry pairs (the same entry on two seeds counts twice): a 1.75, b 2.75, differences summing to +1.0
    assert r["n"] == 5 and (r["wins"], r["losses"]) == (3, 1)
    assert r["a"] == pytest.approx(35.0) and r["b"] == pytest.approx(55.0) and r["delta"] == pytest.approx(20.0)
    # of the 16 sign flips of (+0.25, +0.5, -0.25, +0.5), |sum| >= 1.0 in 6: the 0.25s cancel and the 0.5s agree
    # (4, |sum| 1.0), or all four point one way (2, |sum| 1.5)
    assert r["p_value"] == pytest.approx(6 / 16)
    assert m.pooled([(a, b)]) == m.head_to_head(a, b)  # one pair pooled is that pair


def test_pairs_and_their_pool_are_written_as_json(tmp_path, monkeypatch, capsys):
    m = _mod()

    def hour(name, per_entry):
        f = tmp_path / f"{name}.json"
        scores = {"w-000003": {"bfcl_single": {"per_entry": per_entry}}}
        f.write_text(json.dumps({"suite": {"bfcl_single": ["e1", "e2"]}, "newest_served": "w-000003", "scores": scores}))
        return str(f)

    a1, b1, a2, b2 = hour("a1", [0.0, 0.5]), hour("b1", [0.5, 0.5]), hour("a2", [0.5, 0.0]), hour("b2", [0.5, 1.0])
    out = tmp_path / "pairs.json"
    monkeypatch.setattr("sys.argv", ["compare_hours", "--pair", a1, b1, "--pair", a2, b2, "--json", str(out)])
    m.main()
    doc = json.loads(out.read_text())
    assert [(p["a"], p["b"]) for p in doc["pairs"]] == [("a1", "b1"), ("a2", "b2")]
    assert doc["pairs"][0]["bfcl_single"]["delta"] == pytest.approx(25.0)  # (+0.5 + 0) / 2 entries
    # pooled: differences +0.5, 0 (pair 1) and 0, +1.0 (pair 2) over 4 entry pairs
    assert doc["pooled"]["bfcl_single"]["n"] == 4 and doc["pooled"]["bfcl_single"]["delta"] == pytest.approx(37.5)
    assert "pooled" in capsys.readouterr().out  # what it wrote, it also printed


def test_gains_pair_each_version_over_its_own_hours_base_so_a_host_shift_in_the_base_cancels():
    m = _mod()

    def hour(base, newest):
        return {
            "suite": {"bfcl_single": ["e1", "e2", "e3"]},
            "base": {"bfcl_single": {"per_entry": base}},
            "newest_served": "w-000002",
            "scores": {"w-000002": {"bfcl_single": {"per_entry": newest}}},
        }

    a = hour([0.25, 0.5, 0.0], [0.5, 0.5, 0.25])  # gains +0.25, 0, +0.25
    b = hour([0.5, 0.75, 0.25], [0.75, 0.75, 0.25])  # its host's base a quarter higher everywhere; gains +0.25, 0, 0
    assert m.gains_per_entry(b) == {"bfcl_single": {"e1": 0.25, "e2": 0.0, "e3": 0.0}}
    plain = m.head_to_head(a, b)["bfcl_single"]
    assert plain["delta"] == pytest.approx(100 * 0.5 / 3) and (plain["wins"], plain["losses"]) == (2, 0)
    g = m.head_to_head(a, b, gains=True)["bfcl_single"]
    # per entry b's gain minus a's: 0, 0, -0.25 -> one loss; both sign flips of (-0.25) reach |0.25|
    assert g["a"] == pytest.approx(100 * 0.5 / 3) and g["b"] == pytest.approx(100 * 0.25 / 3)
    assert g["delta"] == pytest.approx(-100 * 0.25 / 3) and (g["wins"], g["losses"]) == (0, 1)
    assert g["p_value"] == pytest.approx(1.0)
    assert m.pooled([(a, b)], gains=True) == m.head_to_head(a, b, gains=True)
    assert m.head_to_head(a, {**b, "base": {}}, gains=True) == {}  # an hour without its base scores pairs nothing


def test_two_versions_of_one_hour_are_paired_on_its_entries_and_the_base_is_one_of_them(tmp_path, monkeypatch):
    m = _mod()
    d = {
        "suite": {"bfcl_single": ["e1", "e2", "e3"]},
        "base": {"bfcl_single": {"per_entry": [0.0, 0.25, 0.5]}},
        "scores": {
            "w-000010": {"bfcl_single": {"per_entry": [0.25, 0.25, 0.5]}},
            "w-000020": {"bfcl_single": {"per_entry": [0.5, 0.75, 0.25]}},
        },
    }
    r = m.within(d, "w-000010", "w-000020")["bfcl_single"]
    # differences +0.25, +0.5, -0.25: sum +0.5 over 3 entries; of the 8 sign flips, |sum| >= 0.5 in 6
    # (all but +0.25 -0.5 +0.25 and its mirror, whose sums are 0)
    assert (r["n"], r["wins"], r["losses"]) == (3, 2, 1)
    assert r["a"] == pytest.approx(100 / 3) and r["b"] == pytest.approx(50.0) and r["delta"] == pytest.approx(50 / 3)
    assert r["p_value"] == pytest.approx(6 / 8)
    assert m.within(d, "base", "w-000010")["bfcl_single"]["delta"] == pytest.approx(25 / 3)
    assert m.within(d, "w-000010", "w-000099") == {}  # a version the hour did not score pairs nothing
    f = tmp_path / "hour.json"
    f.write_text(json.dumps(d))
    out = tmp_path / "versions.json"
    monkeypatch.setattr("sys.argv", ["compare_hours", "--versions", str(f), "w-000010", "w-000020", "--json", str(out)])
    m.main()
    doc = json.loads(out.read_text())["versions"][0]
    assert (doc["hour"], doc["a"], doc["b"]) == ("hour", "w-000010", "w-000020") and doc["bfcl_single"]["n"] == 3


def test_a_pair_can_name_a_version_of_an_hour_in_place_of_its_newest(tmp_path, monkeypatch):
    m = _mod()
    scores = {"w-000010": {"bfcl_single": {"per_entry": [0.25, 0.25]}}, "w-000020": {"bfcl_single": {"per_entry": [0.5, 1.0]}}}
    long_hour = tmp_path / "long.json"
    long_hour.write_text(json.dumps({"suite": {"bfcl_single": ["e1", "e2"]}, "newest_served": "w-000020", "scores": scores}))
    other = tmp_path / "other.json"
    other_scores = {"w-000005": {"bfcl_single": {"per_entry": [0.5, 0.5]}}}
    other.write_text(json.dumps({"suite": {"bfcl_single": ["e2", "e1"]}, "newest_served": "w-000005", "scores": other_scores}))
    out = tmp_path / "pair.json"
    monkeypatch.setattr("sys.argv", ["compare_hours", "--pair", f"{long_hour}@w-000010", str(other), "--json", str(out)])
    m.main()
    p = json.loads(out.read_text())["pairs"][0]
    assert (p["a"], p["a_version"], p["b"], p["b_version"]) == ("long", "w-000010", "other", "w-000005")
    # w-000010's 0.25, 0.25 against other's 0.5, 0.5 on the same entries: +0.25 each, +25 points, both wins
    assert p["bfcl_single"]["delta"] == pytest.approx(25.0) and (p["bfcl_single"]["wins"], p["bfcl_single"]["losses"]) == (2, 0)
    assert m.hour(str(long_hour))["newest_served"] == "w-000020"  # a bare file keeps its newest
    with pytest.raises(SystemExit, match="did not score w-000099: it scored w-000010, w-000020"):
        m.hour(f"{long_hour}@w-000099")
