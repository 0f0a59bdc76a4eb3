#!/usr/bin/env bash
# Call 22 of 2026-12-06 (twenty-fourth session): stage cost on the working tree (the worker's
# thread pools quiet), then census-only pairs against basecopy/ = the commit before it.
#   git archive HEAD~1 --prefix=basecopy/ | tar x; rm -rf basecopy/{lab,docs,tests,bench,examples}; ln -s ../.whl basecopy/.whl
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
mkdir -p /tmp/ab_new /tmp/ab_base && ln -sfn "$PWD" /tmp/ab_new/nbx_tune && ln -sfn "$PWD/basecopy" /tmp/ab_base/nbx_tune
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
COST_S=125 bash bench/gpu_session.sh pycache cost
export PYTHONPYCACHEPREFIX=/tmp/pycache PYTHONUNBUFFERED=1
timeout ${AB_S:-80} python3 lab/history/gpu_runs/2026-12-06/census_ab.py /tmp/ab_new /tmp/ab_base ${PAIRS:-2} 2>&1 | tee $OUT/ab.log | tail -8
