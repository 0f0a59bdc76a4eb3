#!/usr/bin/env bash
# Call 5 of 2026-12-06 (call 4 never got a machine; 274 s of device time left): the
# resident-operand probe, then stage cost on ea81e97 (the census's first audit at the
# kernel's last seat, the teardown skipped, resident oracle operands, with 8f8365d's
# quick estimates as screened and no exit waits).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
mkdir -p /tmp/ab_new && ln -sfn "$PWD" /tmp/ab_new/nbx_tune
PYTHONPYCACHEPREFIX=/tmp/pycache PYTHONPATH=/tmp/ab_new:/tmp/site timeout 60 python3 lab/history/gpu_runs/2026-12-06/oracle_probe.py 2>&1 | tee $OUT/probe.log
bash bench/gpu_session.sh pycache cost
