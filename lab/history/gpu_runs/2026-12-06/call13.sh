#!/usr/bin/env bash
# Call 13 of 2026-12-06 (twenty-third session): census-only A/B of main (the parent's GPU target
# from torch; the fork server off the census's stdout and stderr) against basecopy/ = ab406c1,
# then stage cost.
#   git archive ab406c1 --prefix=basecopy/ | tar x; rm -rf basecopy/lab basecopy/docs; ln -s ../.whl basecopy/.whl
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
mkdir -p /tmp/ab_new /tmp/ab_base && ln -sfn "$PWD" /tmp/ab_new/nbx_tune && ln -sfn "$PWD/basecopy" /tmp/ab_base/nbx_tune
export PYTHONPYCACHEPREFIX=/tmp/pycache PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 170 python3 lab/history/gpu_runs/2026-12-06/census_ab.py /tmp/ab_new /tmp/ab_base ${PAIRS:-3} 2>&1 | tee $OUT/ab.log | tail -8
COST_S=130 bash bench/gpu_session.sh pycache cost
