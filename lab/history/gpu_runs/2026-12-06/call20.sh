#!/usr/bin/env bash
# Call 20 of 2026-12-06 (twenty-fourth session): a GEMM case's draw with gigabytes held in the
# process (draw_probe.py), then the case probe again.
set -u
unset PYTHONDONTWRITEBYTECODE
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
mkdir -p /tmp/pkgroot && ln -sfn "$PWD" /tmp/pkgroot/nbx_tune
export PYTHONPYCACHEPREFIX=/tmp/pycache PYTHONUNBUFFERED=1
PYTHONPATH=/tmp/pkgroot:/tmp/site timeout 90 python3 lab/certify_cost/draw_probe.py 2>&1 | tee $OUT/draw_probe.log
