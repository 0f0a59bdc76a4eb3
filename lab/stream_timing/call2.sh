#!/bin/bash
# Every example trace (unfused and fused) against torch on the shipped table with the
# stream-timed seats merged in (bench/torch_compare.py), then, in what is left of the
# call, the re-certification cost on a sample of the shipped seats (bench/recertify_cost.py).
FINAL_OUT=$OUT
export OUT=/tmp/o; mkdir -p $OUT
COMPARE_S=${COMPARE_S:-300} COMPARE_BUDGET_S=${COMPARE_BUDGET_S:-260} bash release/gpu_session.sh pycache compare
cp $OUT/session.log $OUT/torch_compare.json $FINAL_OUT/ 2>/dev/null
tar czf $FINAL_OUT/rest.tgz -C $OUT . 2>/dev/null
ls -la $FINAL_OUT
