#!/usr/bin/env bash
# Call 30 (not run: the twenty-fifth session's device time was spent). Why the census's
# stream timing and the bench's graph replay rank two configs of 512 x 4096 x 32000 bf16 (nn)
# the other way round (call 29: the persistent 128 x 128 SCHEDULE=1 pick 0.2078 against
# 0.2090 ms on the stream, 0.2176 against 0.2086 ms in graphs): every config of the space
# timed three ways (lab/gemm_replay_timing/rank.py), then stage cost on the H200 again.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
mkdir -p /tmp/pkgroot && ln -sfn "$PWD" /tmp/pkgroot/nbx_tune
PYTHONPATH=/tmp/pkgroot:/tmp/site timeout 200 python3 lab/gemm_replay_timing/rank.py --budget-s 150 \
  --rows 512,4096,32000,nn 2>&1 | tee $OUT/rank.log | tail -30
COST_S=120 bash bench/gpu_session.sh pycache cost
