#!/bin/bash
# The GEMM seats still below 0.9 of torch after call 2's ranked census (full_rows.tsv)
# tuned in full with the stream timing; export in $OUT/hopper.json. Then stage cost
# (census vs triton.autotune, issue 27) with matmul timed as a stream.
set -u
NBX_TUNE_SEARCH=full CENSUS_TRACES=lab/gemm_replay_timing/full_rows.tsv CENSUS_TOTAL_S=${CENSUS_TOTAL_S:-250} \
  bash release/gpu_session.sh pycache census_all
COST_S=${COST_S:-200} bash release/gpu_session.sh pycache cost
ls -la $OUT
