#!/usr/bin/env bash
# Call 14 of 2026-12-06 (twenty-fourth session): what the stream timing's first estimate pays
# for (estimate_probe.py), where a seat's inputs and oracles go (case_probe.py), then
# census-only pairs of the working tree (the audit at a kernel's smallest seat, a long
# burst's estimate over one burst, the Freivalds check's host side on threads) against
# basecopy/ = 26ee6e4, then stage cost on the working tree.
#   git archive 26ee6e4 --prefix=basecopy/ | tar x; rm -rf basecopy/lab basecopy/docs; ln -s ../.whl basecopy/.whl
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
mkdir -p /tmp/pkgroot /tmp/ab_new /tmp/ab_base && ln -sfn "$PWD" /tmp/pkgroot/nbx_tune
ln -sfn "$PWD" /tmp/ab_new/nbx_tune && ln -sfn "$PWD/basecopy" /tmp/ab_base/nbx_tune
export PYTHONPYCACHEPREFIX=/tmp/pycache PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
PYTHONPATH=/tmp/pkgroot:/tmp/site timeout 100 python3 lab/certify_cost/estimate_probe.py 2>&1 | grep -v resource_tracker | tee $OUT/estimate_probe.log
PYTHONPATH=/tmp/pkgroot:/tmp/site timeout 80 python3 lab/certify_cost/case_probe.py 2>&1 | tee $OUT/case_probe.log
timeout 170 python3 lab/history/gpu_runs/2026-12-06/census_ab.py /tmp/ab_new /tmp/ab_base ${PAIRS:-2} 2>&1 | tee $OUT/ab.log | tail -8
COST_S=130 bash bench/gpu_session.sh pycache cost
