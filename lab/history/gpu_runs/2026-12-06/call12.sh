#!/usr/bin/env bash
# Call 12 of 2026-12-06 (twenty-third session), on main after dbb0a55: where an audit's timing
# goes (lab/certify_cost/audit_probe.py), stage profile (the census's timeline, now ending as
# nbx-tune ends), then stage recert (48 stale shipped seats re-certified against a fresh census).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
mkdir -p /tmp/pkgroot && ln -sfn "$PWD" /tmp/pkgroot/nbx_tune
export PYTHONPYCACHEPREFIX=/tmp/pycache PYTHONUNBUFFERED=1
PYTHONPATH=/tmp/pkgroot:/tmp/site timeout 100 python3 lab/certify_cost/audit_probe.py 2>&1 | tee $OUT/audit_probe.log | tail -12
PROFILE_S=90 RECERT_S=380 bash bench/gpu_session.sh pycache profile recert
