"""README's "Current figures": at most ten rows, each naming results files that exist, and every number it
quotes found in them (as recorded, or x100 for shares and points, at the precision the README shows)."""

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NUMBER = re.compile(r"(?<![\w.-])[-+]?\d+(?:\.\d+)?(?![\w.])")


def _rows() -> list[tuple[str, str, str]]:
    text = (ROOT / "README.md").read_text()
    table = text.split("## Current figures", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| ") and not line.startswith(("| what", "|---"))]
    return [tuple(c.strip() for c in row.strip().strip("|").split(" | ")) for row in rows]


def _numbers(node) -> list[float]:
    if isinstance(node, bool):
        return []
    if isinstance(node, (int, float)):
        return [float(node)]
    if isinstance(node, dict):
        return [x for v in node.values() for x in _numbers(v)]
    if isinstance(node, list):
        return [x for v in node for x in _numbers(v)]
    return []


def _found(quoted: str, values: list[float]) -> bool:
    digits = len(quoted.split(".")[1]) if "." in quoted else 0
    q = abs(float(quoted))
    for v in values:
        for x in (abs(v), abs(100 * v)):
            if abs(round(x, digits) - q) <= 10**-digits / 2 + 1e-9:
                return True
    return False


def test_every_quoted_figure_is_in_the_results_file_its_row_names():
    rows = _rows()
    assert 0 < len(rows) <= 10
    for what, figure, results in rows:
        files = re.findall(r"`([^`]+\.json)`", results)
        assert files, f"row {what!r} names no results file"
        values = []
        for f in files:
            path = ROOT / "tests" / "benchmarks" / f
            assert path.exists(), f"{what!r}: {path} does not exist"
            values += _numbers(json.loads(path.read_text()))
        figure = re.sub(r"`[^`]*`", "", figure)  # names in backticks (versions, settings) are not figures
        missing = [n for n in NUMBER.findall(figure) if not _found(n, values)]
        assert not missing, f"{what!r}: {missing} not in {files}"
