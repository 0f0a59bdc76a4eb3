#!/usr/bin/env bash
# Call 4 of 2026-12-06 (never got a machine): the resident-operand probe (e98c233), then census-only A/B of the
# working tree (e98c233: quick estimates as screened, no exit waits, teardown skipped,
# resident operands) against basecopy/ (169e43d), then stage cost on the working tree.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
mkdir -p /tmp/ab_new /tmp/ab_base && ln -sfn "$PWD" /tmp/ab_new/nbx_tune && ln -sfn "$PWD/basecopy" /tmp/ab_base/nbx_tune
export PYTHONPYCACHEPREFIX=/tmp/pycache PYTHONUNBUFFERED=1
PYTHONPATH=/tmp/ab_new:/tmp/site timeout 120 python3 lab/history/gpu_runs/2026-12-06/oracle_probe.py 2>&1 | tee $OUT/probe.log
timeout 200 python3 lab/history/gpu_runs/2026-12-06/census_ab.py /tmp/ab_new /tmp/ab_base ${PAIRS:-2} 2>&1 | tee $OUT/ab.log
bash bench/gpu_session.sh cost
