#!/usr/bin/env bash
# Call 21 of 2026-12-06 (twenty-fourth session): the case probe under three thread settings:
# as is; OpenBLAS's and OpenMP's idle threads sleeping at once instead of spinning
# (OPENBLAS_THREAD_TIMEOUT=4, OMP_WAIT_POLICY=PASSIVE); numpy's OpenBLAS on one thread.
set -u
unset PYTHONDONTWRITEBYTECODE
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
mkdir -p /tmp/pkgroot && ln -sfn "$PWD" /tmp/pkgroot/nbx_tune
export PYTHONPYCACHEPREFIX=/tmp/pycache PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/pkgroot:/tmp/site
timeout 40 python3 lab/certify_cost/case_probe.py > /dev/null 2>&1  # bytecode
for v in "X=1" "OPENBLAS_THREAD_TIMEOUT=4 OMP_WAIT_POLICY=PASSIVE" "OPENBLAS_NUM_THREADS=1"; do
  echo "=== $v" | tee -a $OUT/case_probe.log
  env $v timeout 40 python3 lab/certify_cost/case_probe.py 2>&1 | tee -a $OUT/case_probe.log | tail -1
done
