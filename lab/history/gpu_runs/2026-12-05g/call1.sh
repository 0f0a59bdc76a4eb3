#!/usr/bin/env bash
# Call 1 of 2026-12-05g. On an H200: the torch baselines of every shipped seat measured there
# (stage baseline) and every trace against torch with serve()'s deferrals counted (compare).
# On an H100 (baselines shipped already): transformers' Llama under serve() with the
# deferrals (stage serve, after the shipped table's import), then a census under cProfile.
set -u
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  bash bench/gpu_session.sh pycache baseline
  COMPARE_BUDGET_S=200 COMPARE_S=250 bash bench/gpu_session.sh pycache compare
else
  SERVE_ARGS="--census-budget-s 60" SERVE_S=300 bash bench/gpu_session.sh pycache baseline_import serve
  bash bench/gpu_session.sh pycache profile
fi
