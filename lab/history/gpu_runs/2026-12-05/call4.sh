#!/bin/bash
# Call 4 of 2026-12-05 (calls 1 and 3 in one, for a short device budget): census of the fused
# ops' rows (fused_rows.tsv) into the session database, export, then every fused example
# trace against torch on that database and the shipped table (bench/torch_compare.py).
FINAL_OUT=$OUT
export OUT=/tmp/o; mkdir -p $OUT
CENSUS_TRACES=lab/history/gpu_runs/2026-12-05/fused_rows.tsv CENSUS_TOTAL_S=${CENSUS_TOTAL_S:-200} \
  bash bench/gpu_session.sh pycache census_all
export PYTHONPATH=/tmp/pkgroot:/tmp/site PYTHONPYCACHEPREFIX=/tmp/pycache NBX_TUNE_DB=sqlite:////tmp/nbx-session.db PYTHONUNBUFFERED=1
timeout ${COMPARE_S:-290} python3 bench/torch_compare.py --budget-s ${COMPARE_BUDGET_S:-240} examples/traces/*_fused.tsv \
  > $OUT/compare.log 2>&1; tail -60 $OUT/compare.log
cp $OUT/session.log $OUT/hopper.json $OUT/torch_compare.json $OUT/compare.log $FINAL_OUT/ 2>/dev/null
tar czf $FINAL_OUT/rest.tgz -C $OUT . 2>/dev/null
ls -la $FINAL_OUT
