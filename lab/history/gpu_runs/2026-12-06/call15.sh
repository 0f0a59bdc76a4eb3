#!/usr/bin/env bash
# Call 15 of 2026-12-06 (twenty-fourth session): census-only rounds of three trees, the working
# tree (rounds settle on near-equals, 3ba3681), copyc/ = e4d61c9 (the audit at the smallest
# seat, a long burst's estimate over one burst) and basecopy/ = 26ee6e4; then stage cost and
# the census's timeline (no worker cProfile) on the working tree.
#   for r in 26ee6e4:basecopy e4d61c9:copyc; do git archive ${r%%:*} --prefix=${r##*:}/ | tar x;
#     rm -rf ${r##*:}/{lab,docs,tests,bench,examples}; ln -s ../.whl ${r##*:}/.whl; done
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
mkdir -p /tmp/ab_new /tmp/ab_base /tmp/ab_c && ln -sfn "$PWD" /tmp/ab_new/nbx_tune
ln -sfn "$PWD/basecopy" /tmp/ab_base/nbx_tune && ln -sfn "$PWD/copyc" /tmp/ab_c/nbx_tune
export PYTHONPYCACHEPREFIX=/tmp/pycache PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
AB_ROOTS=/tmp/ab_c timeout 210 python3 lab/history/gpu_runs/2026-12-06/census_ab.py /tmp/ab_new /tmp/ab_base ${PAIRS:-2} 2>&1 | tee $OUT/ab.log | tail -9
COST_S=130 bash bench/gpu_session.sh pycache cost
BENCH_WORKER_PROFILE=0 PROFILE_S=60 bash bench/gpu_session.sh pycache profile
