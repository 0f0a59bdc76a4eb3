#!/usr/bin/env bash
# Call 18 of 2026-12-06 (twenty-fourth session): a pool process's compile and load apart, first
# job against second (pool_probe.py, bytecode written this time), and the case probe again
# in a process of its own (call 14's ran beside a pool's dying processes).
set -u
unset PYTHONDONTWRITEBYTECODE
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
mkdir -p /tmp/pkgroot && ln -sfn "$PWD" /tmp/pkgroot/nbx_tune
export PYTHONPYCACHEPREFIX=/tmp/pycache PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for i in 1 2; do
  TRITON_CACHE_DIR=/tmp/pool_probe_cache_$i PYTHONPATH=/tmp/pkgroot:/tmp/site timeout 60 python3 lab/certify_cost/pool_probe.py 30 2>&1 | grep -v resource_tracker | tee -a $OUT/pool_probe.log
done
sleep 3
PYTHONPATH=/tmp/pkgroot:/tmp/site timeout 80 python3 lab/certify_cost/case_probe.py 2>&1 | tee $OUT/case_probe.log
