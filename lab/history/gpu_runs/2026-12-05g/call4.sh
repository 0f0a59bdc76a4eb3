#!/usr/bin/env bash
# Call 4 of 2026-12-05g. On an H200: the torch baselines of every shipped seat measured there
# (stage baseline, its export kept) and every trace against torch with serve()'s deferrals
# counted (compare). On an H100: the correctness stages docs/benchmarks.md lists as not run
# over the kernels changed since: check (example rows against fp64, every dtype, two configs
# a row) and direct (the direct launch's GPU proof, every family).
set -u
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  BASELINE_S=160 BASELINE_BUDGET_S=130 bash bench/gpu_session.sh pycache baseline
  COMPARE_BUDGET_S=90 COMPARE_S=115 bash bench/gpu_session.sh pycache compare
else
  CHECK_S=160 CHECK_RUN_S=130 bash bench/gpu_session.sh pycache check
  DIRECT_S=120 bash bench/gpu_session.sh pycache direct
fi
