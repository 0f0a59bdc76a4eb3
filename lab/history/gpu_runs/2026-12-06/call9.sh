#!/usr/bin/env bash
# Call 9 of 2026-12-06 (twenty-second session; never ran: no device time left). Census-only A/B
# of the working tree against basecopy/, then stage cost on the working tree. Meant with the
# branch lab/forkserver-pool checked out (the compile pool forked from a server that preloaded
# torch, Triton, the kernels and Triton's cache key) and basecopy/ from main at 9e0bc5f
# (compile jobs by priority; each GPU product an oracle returns as it is judged against its
# copy on the device):  git archive 9e0bc5f --prefix=basecopy/ | tar x; rm -rf basecopy/lab
# basecopy/docs; ln -s ../.whl basecopy/.whl
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
mkdir -p /tmp/ab_new /tmp/ab_base && ln -sfn "$PWD" /tmp/ab_new/nbx_tune && ln -sfn "$PWD/basecopy" /tmp/ab_base/nbx_tune
export PYTHONPYCACHEPREFIX=/tmp/pycache PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 130 python3 lab/history/gpu_runs/2026-12-06/census_ab.py /tmp/ab_new /tmp/ab_base ${PAIRS:-2} 2>&1 | tee $OUT/ab.log | tail -8
COST_S=150 bash bench/gpu_session.sh pycache cost
