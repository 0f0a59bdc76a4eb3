#!/bin/bash
# One device call: every config of matmul's space timed three ways at the losing GEMM rows
# (rank.py), then the fused traces against torch on the shipped table (nt seats included).
set -u
bash release/gpu_session.sh pycache  # installs .whl into /tmp/site, links the package
mkdir -p /tmp/pkgroot && ln -sfn "$PWD" /tmp/pkgroot/nbx_tune
PYTHONPATH=/tmp/pkgroot:/tmp/site PYTHONUNBUFFERED=1 timeout ${RANK_S:-360} \
  python3 lab/gemm_replay_timing/rank.py --budget-s ${RANK_BUDGET_S:-300} 2>&1 | tee $OUT/rank.log
COMPARE_S=${COMPARE_S:-200} COMPARE_BUDGET_S=${COMPARE_BUDGET_S:-170} \
  COMPARE_TRACES="$(ls examples/traces/*_bf16_fused.tsv | tr '\n' ' ')" bash release/gpu_session.sh compare
ls -la $OUT
