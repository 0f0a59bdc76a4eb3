#!/usr/bin/env bash
# Call 8 of 2026-12-06 (twenty-second session), on 117ddfd (compile jobs by priority): stage
# profile (the census's timeline, its worker under cProfile, the profile kept under $OUT),
# then stage recert (48 stale shipped seats re-certified against a fresh census of them).
set -u
PROFILE_S=90 RECERT_S=400 bash bench/gpu_session.sh pycache profile recert
