#!/usr/bin/env bash
# Call 16 of 2026-12-06 (twenty-fourth session), on the working tree (3ba3681 and the draws
# written in place): what a case's draw pays for (draw_probe.py), what the first seat's
# compiles wait for (pool_probe.py), then stage recert.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
mkdir -p /tmp/pkgroot && ln -sfn "$PWD" /tmp/pkgroot/nbx_tune
export PYTHONPYCACHEPREFIX=/tmp/pycache PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
PYTHONPATH=/tmp/pkgroot:/tmp/site timeout 60 python3 lab/certify_cost/draw_probe.py 2>&1 | tee $OUT/draw_probe.log
PYTHONPATH=/tmp/pkgroot:/tmp/site timeout 60 python3 lab/certify_cost/pool_probe.py 2>&1 | grep -v resource_tracker | tee $OUT/pool_probe.log
RECERT_S=330 bash bench/gpu_session.sh pycache recert
