#!/bin/bash
# What making the screen cases costs, in three processes: as before (fresh fp64 buffers, every
# large product on the GPU), with the kept buffers and the skinny products in numpy, and
# with torch allocating huge pages (THP_MEM_ALLOC_ENABLE=1). bench/oracle_cost.py each time.
set -u; FINAL=$OUT
for v in "0 --as-before" "0" "1"; do set -- $v
  THP_MEM_ALLOC_ENABLE=$1 ORACLE_S=130 ORACLE_ARGS="--budget-s 110 ${2:-}" OUT=/tmp/oc$1${2:-} bash release/gpu_session.sh oracle 2>&1 | grep -v "^  " | head -30
  cp /tmp/oc$1${2:-}/oracle_cost.json $FINAL/oracle_cost_thp$1${2:-}.json
done
