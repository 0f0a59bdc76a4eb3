#!/bin/bash
# The linear layers' own seats (layout=nt, a flag since this study): a census of the 37 seats
# of nt_rows.tsv into the session database and its export (hopper.json, merged into the
# shipped table with release/merge_table.py), then the fused traces, whose GEMMs are all nt,
# against torch on those picks (the shipped table serves the rest).
set -u
CENSUS_TRACES=lab/nt_layout/nt_rows.tsv CENSUS_TOTAL_S=${CENSUS_TOTAL_S:-260} \
  bash release/gpu_session.sh pycache census_all
COMPARE_S=${COMPARE_S:-170} COMPARE_BUDGET_S=${COMPARE_BUDGET_S:-140} \
  COMPARE_TRACES="$(ls examples/traces/*_bf16_fused.tsv | tr '\n' ' ')" bash release/gpu_session.sh compare
ls -la $OUT
