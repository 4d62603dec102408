#!/usr/bin/env bash
# The whole GPU path in one 15-minute lease, in two device calls (issue 28): the carried wheels installed, tests/gpu,
# bench_vllm_swap at the 7B shape (dummy weights, requests in flight, file vs shared), `up --config
# config/gpu-7b.yaml` with the small base model for 3 minutes under scripted users through a promotion, `down`.
# Each step has its own time budget and never stops the later ones; one summary at the end (every figure, every
# failure with its log tail), the figures as JSON in OUT/gpu_check.json. Details: scripts/gpu_check.py.
#
# 1. Here, once (needs PyPI and ../shared/gpu/device-wheels.txt): vLLM 0.26 for the machine's torch 2.11, Ray, verl,
#    ... + gpu_wheels.py's EXTRA (nats-server, the base model, BFCL's data, the embedder): 536 MB of xz in 2026-11,
#    as parts of 60 MiB, since the tree (~3.3 MiB) travels with each and a call carries 64 MiB: 9 parts (~6 min here)
#      bash scripts/gpu_check.sh pack                 -> .xfer/gpu/part.NN + .xfer/gpu/SHA256SUMS (git-ignored)
# 2. On the device, one call per part, back to back (the machine stays warm ~30 s after a call, and keeps the
#    ignored .gpu-cache/ while warm):
#      run(carry=[".xfer/gpu/part.00", ".xfer/gpu/SHA256SUMS"], command="bash scripts/gpu_check.sh receive")
#    `receive` moves the part into .gpu-cache/parts, checks it against SHA256SUMS (a bad one is deleted: send it
#    again) and says what is missing; the call that brings the last part also joins, checks and unpacks the set.
# 3. Then two calls, at once one after the other (a 600 s call holds one of them, gpu_steps.CALLS):
#      run(command="bash scripts/gpu_check.sh --out $OUT --only install,models,gpu_tests,bench", timeout_s=500)
#      run(command="bash scripts/gpu_check.sh --out $OUT --only up", timeout_s=340)
#    `--budget up=300` moves time; `--wheels DIR` (or KAIZEN_GPU_WHEELS) names another folder of parts. Budgets
#    (gpu_steps.BUDGET_S, sized from the first run): install 25, models 60, gpu_tests 150, bench 220, up 300.
# Device time, as the first run (H200, 2026-11-27) spent it: the first call 30 s with the machine's start, each
# carry call ~5 s, the unpack 41 s (one xz thread; now threaded), so ~2 min before the checks, then 455 s + 300 s:
# ~14.5 of the 15 minutes. No room for a second run of either call: only `--only` of one step that failed.
# Rehearsal on a CPU, no CUDA, no vLLM (tests/unit/test_gpu_check.py runs it in CI):
#      bash scripts/gpu_check.sh --dry-run --out /tmp/gpu-dry [--inject-fail bench] [--inject-hang gpu_tests]
set -uo pipefail
cd "$(dirname "$0")/.."
if [ -n "${PYTHON:-}" ]; then PY=$PYTHON
elif [ -x .venv/bin/python ]; then PY=.venv/bin/python   # here and in CI
else PY=python3                                           # the GPU machine: its image's Python holds torch
fi
case "${1:-}" in
  pack|receive|install) exec "$PY" scripts/gpu_wheels.py "$@" ;;
  *) exec "$PY" scripts/gpu_check.py "$@" ;;
esac
