#!/usr/bin/env bash
# Call 23 (not run in the twenty-fourth session: its device time was spent): a compile
# process's GPU context timed apart from its first job (pool_probe.py, POOL_PROBE_CONTEXT=1,
# twice: bytecode written by the first), then stage cost (the threaded Freivalds check and
# the quiet thread pools together) and the census's timeline.
set -u
unset PYTHONDONTWRITEBYTECODE
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
mkdir -p /tmp/pkgroot && ln -sfn "$PWD" /tmp/pkgroot/nbx_tune
export PYTHONPYCACHEPREFIX=/tmp/pycache PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for i in 1 2; do
  POOL_PROBE_CONTEXT=1 TRITON_CACHE_DIR=/tmp/pool_probe_cache_$i PYTHONPATH=/tmp/pkgroot:/tmp/site timeout 60 \
    python3 lab/certify_cost/pool_probe.py 30 2>&1 | grep -v resource_tracker | tee -a $OUT/pool_probe.log
done
COST_S=130 bash bench/gpu_session.sh pycache cost
BENCH_WORKER_PROFILE=0 PROFILE_S=60 bash bench/gpu_session.sh pycache profile
