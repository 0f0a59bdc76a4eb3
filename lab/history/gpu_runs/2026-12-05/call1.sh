#!/bin/bash
# Call 1 of 2026-12-05: certify the new seats of the fused example traces (the rows of the
# fused ops only: every other seat is in the shipped table), prove the new families on the
# GPU against fp64 in every dtype, and time them against the patterns they replace.
FINAL_OUT=$OUT
export OUT=/tmp/o; mkdir -p $OUT
CENSUS_TRACES=lab/history/gpu_runs/2026-12-05/fused_rows.tsv CENSUS_TOTAL_S=${CENSUS_TOTAL_S:-220} FUSED_S=${FUSED_S:-150} \
  bash bench/gpu_session.sh pycache census_all fused
ls -la $OUT
cp $OUT/session.log $OUT/hopper.json $FINAL_OUT/ 2>/dev/null
cp $OUT/fused_ops.json $FINAL_OUT/ 2>/dev/null
tar czf $FINAL_OUT/rest.tgz -C $OUT . 2>/dev/null
ls -la $FINAL_OUT
