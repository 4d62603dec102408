"""Dotted overrides like `serve.port=8100` written into a preset's raw data: `load_settings(**overrides)` and the
benchmarks' `--set` (one change over a committed config, no copy of it)."""

from functools import reduce


def apply_overrides(data: dict, overrides: dict) -> dict:
    """`data` with each dotted key's value set (in place; returned), parents created as needed."""
    for dotted, value in overrides.items():
        *parents, leaf = dotted.split(".")
        reduce(lambda node, p: node.setdefault(p, {}), parents, data)[leaf] = value
    return data
