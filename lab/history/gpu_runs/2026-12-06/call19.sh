#!/usr/bin/env bash
# Call 19 of 2026-12-06 (twenty-fourth session): a GEMM case's draw before and after the GPU is
# used (draw_probe.py, with a cProfile of one), and a pool process's compile and load apart
# (pool_probe.py, twice: bytecode written by the first).
set -u
unset PYTHONDONTWRITEBYTECODE
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
mkdir -p /tmp/pkgroot && ln -sfn "$PWD" /tmp/pkgroot/nbx_tune
export PYTHONPYCACHEPREFIX=/tmp/pycache PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
PYTHONPATH=/tmp/pkgroot:/tmp/site timeout 60 python3 lab/certify_cost/draw_probe.py 2>&1 | tee $OUT/draw_probe.log
for i in 1 2; do
  TRITON_CACHE_DIR=/tmp/pool_probe_cache_$i PYTHONPATH=/tmp/pkgroot:/tmp/site timeout 60 python3 lab/certify_cost/pool_probe.py 30 2>&1 | grep -v resource_tracker | tee -a $OUT/pool_probe.log
done
