#!/usr/bin/env bash
# Call 10 of 2026-12-06 (twenty-third session), on ab406c1 (the fork-server compile pool
# merged): what the parent pays to learn its GPU's target and to exit (exit_probe.py), then
# stage profile (the census's timeline, its worker under cProfile, the .prof kept under $OUT).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPYCACHEPREFIX=/tmp/pycache
timeout 120 python3 lab/certify_cost/exit_probe.py 3 2>&1 | tee $OUT/exit_probe.log
PROFILE_S=90 bash bench/gpu_session.sh pycache profile
