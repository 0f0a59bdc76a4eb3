#!/usr/bin/env bash
# Call 2 of 2026-12-06: census-only A/B on one warm machine (call 1 ran the new tree first, on
# a cold machine, then the base: not comparable). A = working tree, B = basecopy/ (169e43d).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
mkdir -p /tmp/ab_new /tmp/ab_base && ln -sfn "$PWD" /tmp/ab_new/nbx_tune && ln -sfn "$PWD/basecopy" /tmp/ab_base/nbx_tune
export PYTHONPYCACHEPREFIX=/tmp/pycache PYTHONUNBUFFERED=1
timeout 330 python3 lab/history/gpu_runs/2026-12-06/census_ab.py /tmp/ab_new /tmp/ab_base ${PAIRS:-3} 2>&1 | tee $OUT/ab.log
