#!/usr/bin/env bash
# Call 31: how much of the stage cost's pick loss is the side-by-side measure's own noise
# (lab/certify_cost/pick_noise.py over the differing picks of calls 23-30, an A/A control
# beside them, 60 and 300 ms replays), then the stage cost again.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
mkdir -p /tmp/pkgroot && ln -sfn "$PWD" /tmp/pkgroot/nbx_tune
D=lab/history/gpu_runs/2026-12-06
PYTHONPATH=/tmp/pkgroot:/tmp/site timeout 300 python3 lab/certify_cost/pick_noise.py \
  $D/23-tuning_cost.json $D/26-tuning_cost.json $D/27-tuning_cost.json $D/28-tuning_cost.json \
  $D/29-tuning_cost.json $D/30-tuning_cost.json 2>&1 | tee $OUT/pick_noise.log
COST_S=120 bash bench/gpu_session.sh pycache cost
