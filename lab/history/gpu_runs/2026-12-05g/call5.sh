#!/usr/bin/env bash
# Call 5 of 2026-12-05g: `nbx-tune census --baseline` on a GPU: the shipped table imported,
# then GPT-2's fused trace censused (its seats current from the table) and its seats timed
# against torch here and recorded.
set -u
OUT=${OUT:-bench_out}
bash bench/gpu_session.sh pycache baseline_import
export PYTHONPATH=/tmp/pkgroot:/tmp/site NBX_TUNE_DB=sqlite:////tmp/nbx-session.db
timeout 150 python3 -m nbx_tune.cli.app census --model examples/traces/gpt2_seq1024_bf16_fused.tsv --baseline \
  2>&1 | tee "$OUT/census_baseline.log" | tail -40
