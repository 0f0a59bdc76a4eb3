#!/usr/bin/env bash
# Call 7 of 2026-12-06 (twenty-second session): how long the census's processes take to import
# alone and together (lab/certify_cost/start_probe.py), census-only A/B of the working tree
# (compile jobs by priority: the seat being tuned first, a later audit's space on idle
# processes) against basecopy/ (571b1f2: one first-in-first-out queue), then stage cost.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
mkdir -p /tmp/ab_new /tmp/ab_base && ln -sfn "$PWD" /tmp/ab_new/nbx_tune && ln -sfn "$PWD/basecopy" /tmp/ab_base/nbx_tune
export PYTHONPYCACHEPREFIX=/tmp/pycache PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
PYTHONPATH=/tmp/ab_new:/tmp/site timeout 90 python3 lab/certify_cost/start_probe.py 3 2>&1 | tee $OUT/start_probe.log
timeout 220 python3 lab/history/gpu_runs/2026-12-06/census_ab.py /tmp/ab_new /tmp/ab_base ${PAIRS:-3} 2>&1 | tee $OUT/ab.log | tail -12
bash bench/gpu_session.sh pycache cost
