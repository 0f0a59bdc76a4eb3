#!/usr/bin/env bash
# Call 27 (twenty-fifth session) on d1bb3a7 (the compile pool with no GPU context): stage
# cost again, then stage recert (48 shipped hopper seats, stale by a source change:
# re-certified against a fresh census).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
COST_S=120 bash bench/gpu_session.sh pycache cost
RECERT_S=330 bash bench/gpu_session.sh pycache recert
