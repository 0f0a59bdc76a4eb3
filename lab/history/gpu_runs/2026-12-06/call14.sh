#!/usr/bin/env bash
# Call 14 of 2026-12-06 (twenty-third session), on main: what the stream timing's first
# estimate of a config pays for (lab/certify_cost/estimate_probe.py).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
mkdir -p /tmp/pkgroot && ln -sfn "$PWD" /tmp/pkgroot/nbx_tune
export PYTHONPYCACHEPREFIX=/tmp/pycache PYTHONUNBUFFERED=1
PYTHONPATH=/tmp/pkgroot:/tmp/site timeout 100 python3 lab/certify_cost/estimate_probe.py 2>&1 | grep -v resource_tracker | tee $OUT/estimate_probe.log
