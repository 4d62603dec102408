#!/usr/bin/env bash
# The whole GPU path in one 15-minute lease, in two device calls and a third while time is left (issue 28): the
# carried wheels installed, tests/gpu, bench_vllm_swap at the 7B shape (dummy weights, requests in flight, file vs
# shared), `up --config config/gpu-7b.yaml` with the small base model for 3 minutes under scripted users through a
# promotion, `down`.
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
# 3. Then, at once one after the other (a 600 s call holds one of gpu_steps.CALLS), the third while time is left:
#      run(command="bash scripts/gpu_check.sh --out $OUT --only install,models,bench", timeout_s=420)
#      run(command="bash scripts/gpu_check.sh --out $OUT --only up", timeout_s=460)
#      run(command="bash scripts/gpu_check.sh --out $OUT --only gpu_tests", timeout_s=190)
#    `--budget up=300` moves time; `--wheels DIR` (or KAIZEN_GPU_WHEELS) names another folder of parts. Budgets
#    (gpu_steps.BUDGET_S, sized from two runs): install 25, models 80, gpu_tests 150, bench 270, up 370.
# Device time, as the second run (H200, 2026-11-27) spent it: the first call 34 s with the machine's start, each
# carry call ~5 s (93 s held after 8), the unpack 6 s (threaded; the last part's call can start the first check
# call's command too), then ~375 s + ~380 s: ~14 of the 15 minutes; tests/gpu only with what is left.
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
