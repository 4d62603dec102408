#!/usr/bin/env bash
# Set up (idempotent) and run the whole test suite: unit, integration (real nats-server, Milvus Lite,
# Ray, SmolLM2) and the end-to-end test that waits for a promoted weights version. GPU tests skip without CUDA.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
exec .venv/bin/python -m pytest -q -ra --timeout=1800 tests/unit tests/integration tests/gpu "$@"
