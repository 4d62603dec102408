"""pytest imports test modules by basename (rootdir-relative, no packages): two test files with the
same name in different folders stop collection of the whole suite."""

from collections import Counter
from pathlib import Path


def test_no_two_test_files_share_a_basename():
    root = Path(__file__).resolve().parents[1]
    names = Counter(p.name for p in root.rglob("test_*.py"))
    assert [n for n, c in names.items() if c > 1] == []
