#!/usr/bin/env bash
# Call 6 of 2026-12-06 (twenty-second session): the resident-operand probe, census-only A/B of
# the working tree (571b1f2: every lever of the twenty-first session) against basecopy/
# (169e43d, that session's start), alternating on one machine, then stage cost on the tree.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
mkdir -p /tmp/ab_new /tmp/ab_base && ln -sfn "$PWD" /tmp/ab_new/nbx_tune && ln -sfn "$PWD/basecopy" /tmp/ab_base/nbx_tune
export PYTHONPYCACHEPREFIX=/tmp/pycache PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
PYTHONPATH=/tmp/ab_new:/tmp/site timeout 60 python3 lab/history/gpu_runs/2026-12-06/oracle_probe.py 2>&1 | tee $OUT/probe.log | tail -20
timeout 200 python3 lab/history/gpu_runs/2026-12-06/census_ab.py /tmp/ab_new /tmp/ab_base ${PAIRS:-3} 2>&1 | tee $OUT/ab.log | tail -30
bash bench/gpu_session.sh pycache cost
