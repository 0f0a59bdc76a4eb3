#!/usr/bin/env bash
# Call 5 of 2026-12-05f: torch baselines. The shipped table imported, `nbx-tune baseline` over
# every example trace (each certified seat against torch's op on this GPU, recorded), the
# export that carries them; then every trace against torch with serve()'s deferrals counted.
set -u
bash bench/gpu_session.sh pycache baseline
COMPARE_BUDGET_S=200 COMPARE_S=250 bash bench/gpu_session.sh pycache compare
