#!/usr/bin/env bash
# Call 28 (twenty-fifth session) on d1bb3a7: the census's timeline (no cProfile), then a
# third stage cost on a cold machine.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
BENCH_WORKER_PROFILE=0 PROFILE_S=60 bash bench/gpu_session.sh pycache profile
COST_S=120 bash bench/gpu_session.sh pycache cost
