#!/usr/bin/env bash
# Call 11 of 2026-12-06 (twenty-third session): census-only A/B of the working tree (the
# parent's GPU target from torch, not Triton's driver; a worker's first screen of a config
# waits for the compile process holding its lock) against basecopy/ = ab406c1 (the fork-server
# pool), then where an audit's timing goes (lab/certify_cost/audit_probe.py), then stage cost.
#   git archive ab406c1 --prefix=basecopy/ | tar x; rm -rf basecopy/lab basecopy/docs; ln -s ../.whl basecopy/.whl
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
mkdir -p /tmp/ab_new /tmp/ab_base /tmp/pkgroot && ln -sfn "$PWD" /tmp/ab_new/nbx_tune && ln -sfn "$PWD/basecopy" /tmp/ab_base/nbx_tune
export PYTHONPYCACHEPREFIX=/tmp/pycache PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 200 python3 lab/history/gpu_runs/2026-12-06/census_ab.py /tmp/ab_new /tmp/ab_base ${PAIRS:-3} 2>&1 | tee $OUT/ab.log | tail -8
ln -sfn "$PWD" /tmp/pkgroot/nbx_tune
PYTHONPATH=/tmp/pkgroot:/tmp/site timeout 90 python3 lab/certify_cost/audit_probe.py 2>&1 | tee $OUT/audit_probe.log | tail -12
COST_S=150 bash bench/gpu_session.sh pycache cost
