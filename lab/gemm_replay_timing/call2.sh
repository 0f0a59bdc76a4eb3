#!/bin/bash
# matmul timed as a stream: a census of the 79 GEMM seats of the example traces
# (gemm_rows.tsv; the ranked search, as a fresh census runs it) into the session database,
# its export in $OUT/hopper.json (merged into the shipped table with release/merge_table.py).
# Carry bench_out/ holding an earlier call's export to resume (stage import).
set -u
STAGES="pycache"; ls bench_out/*.json >/dev/null 2>&1 && STAGES="$STAGES import"
bash release/gpu_session.sh $STAGES
NBX_TUNE_SEARCH=ranked CENSUS_TRACES=lab/gemm_replay_timing/gemm_rows.tsv CENSUS_TOTAL_S=${CENSUS_TOTAL_S:-480} \
  bash release/gpu_session.sh pycache census_all
python3 - <<'PY'
import json, os
d = json.load(open(os.environ["OUT"] + "/hopper.json"))
print(len(d["entries"]), "entries exported")
PY
ls -la $OUT
