#!/bin/bash
# The graph-replayed stream timing in one device call: the four streaming specs declared
# `timing = "stream"` in the device's copy of the tree only, a census of their 85 seats
# (stream_rows.tsv) into the session database, its export, then bench/elementwise_rows.py
# and bench/torch_compare.py on those picks (CENSUS_TOTAL_S, COMPARE_BUDGET_S: budgets).
# Ship the export (release/merge_table.py) only with the declaration committed, and only if
# the picks beat the shipped ones in both benches.
FINAL_OUT=$OUT
export OUT=/tmp/o; mkdir -p $OUT
for f in kernels/copy.py kernels/elementwise/spec.py; do
  sed -i -E 's/^(    name = "(copy|cat|elementwise_unary|elementwise_binary)")$/\1\n    timing = "stream"/' $f
done
grep -c 'timing = "stream"' kernels/copy.py kernels/elementwise/spec.py
CENSUS_TRACES=lab/stream_timing/stream_rows.tsv CENSUS_TOTAL_S=${CENSUS_TOTAL_S:-330} \
  bash release/gpu_session.sh pycache census_all
EW_S=60 EW_BUDGET_S=40 bash release/gpu_session.sh ew
COMPARE_S=${COMPARE_S:-200} COMPARE_BUDGET_S=${COMPARE_BUDGET_S:-170} bash release/gpu_session.sh compare
cp $OUT/session.log $OUT/hopper.json $OUT/elementwise_rows.json $OUT/torch_compare.json $FINAL_OUT/ 2>/dev/null
tar czf $FINAL_OUT/rest.tgz -C $OUT census_all_traces.json 2>/dev/null
ls -la $FINAL_OUT
