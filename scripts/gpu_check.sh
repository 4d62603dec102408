#!/usr/bin/env bash
# The whole GPU path in one 15-minute lease, under 10 minutes (issue 28): the carried wheels installed, tests/gpu,
# bench_vllm_swap at the 7B shape (dummy weights, requests in flight, file vs shared), `up --config
# config/gpu-7b.yaml` with the small base model for 3 minutes under scripted users through a promotion, `down`.
# Each step has its own time budget and never stops the later ones; one summary at the end (every figure, every
# failure with its log tail), the figures as JSON in OUT/gpu_check.json. Details: scripts/gpu_check.py.
#
# 1. Here, once (needs PyPI and ../shared/gpu/device-wheels.txt): vLLM 0.26 for the machine's torch 2.11, Ray, verl,
#    ... (~360 MiB of xz, ../shared/GPU.md) + gpu_wheels.py's EXTRA (nats-server, the base model, BFCL's data, the
#    embedder: ~185 MiB of wheels), as parts of at most 56 MiB, since the tree (~4 MiB) travels with each: ~10 parts
#      bash scripts/gpu_check.sh pack                 -> .xfer/gpu/part.NN + .xfer/gpu/SHA256SUMS (git-ignored)
# 2. On the device, one call per part, back to back (the machine stays warm ~30 s after a call, and keeps the
#    ignored .gpu-cache/ while warm):
#      run(carry=[".xfer/gpu/part.00", ".xfer/gpu/SHA256SUMS"], command="bash scripts/gpu_check.sh receive")
#    `receive` moves the part into .gpu-cache/parts, checks it against SHA256SUMS (a bad one is deleted: send it
#    again) and says what is missing; the call that brings the last part also joins, checks and unpacks the set.
# 3. In the next call, at once:
#      run(command="bash scripts/gpu_check.sh --out $OUT", timeout_s=600)
#    `--only bench,up` reruns some steps; `--budget up=300` moves time; `--wheels DIR` (or KAIZEN_GPU_WHEELS)
#    names another folder of parts. Default budgets: 575 s in all (install 25, models 30, gpu_tests 90, bench 160,
#    up 270: its traffic ends 50 s before the budget does, for `down`: up to 3 minutes once `up` is ready).
# Device time: a start (1-2 min) + ~10 short calls + this one (<= 10 min) is most of a 15-minute lease: there is
# no room for a second full run, only for `--only` of what failed.
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
