#!/usr/bin/env bash
# Call 24 (twenty-fifth session) and 26 (its compile process asking for no stream): can the compile pool compile with no GPU context
# (meta_probe.py), then census-only pairs of the working tree (the pool on meta tensors,
# nothing loaded) against basecopy/ = HEAD, then stage cost on the working tree.
#   git archive HEAD --prefix=basecopy/ | tar x; rm -rf basecopy/{lab,docs,tests,bench,examples}; ln -s ../.whl basecopy/.whl
set -u
unset PYTHONDONTWRITEBYTECODE
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
mkdir -p /tmp/ab_new /tmp/ab_base && ln -sfn "$PWD" /tmp/ab_new/nbx_tune && ln -sfn "$PWD/basecopy" /tmp/ab_base/nbx_tune
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
export PYTHONPYCACHEPREFIX=/tmp/pycache PYTHONUNBUFFERED=1
PYTHONPATH=/tmp/ab_new:/tmp/site timeout 120 python3 lab/certify_cost/meta_probe.py 16 2>&1 | grep -v resource_tracker | tee $OUT/meta_probe.log
timeout ${AB_S:-150} python3 lab/history/gpu_runs/2026-12-06/census_ab.py /tmp/ab_new /tmp/ab_base ${PAIRS:-3} 2>&1 | tee $OUT/ab.log | tail -10
COST_S=130 bash bench/gpu_session.sh pycache cost
