#!/bin/bash
# Call 3 of 2026-12-05: every example trace, the fused ones included, against torch, on the
# shipped table (the fused seats merged in from call 1): bench/torch_compare.py.
FINAL_OUT=$OUT
export OUT=/tmp/o; mkdir -p $OUT
COMPARE_S=${COMPARE_S:-330} COMPARE_BUDGET_S=${COMPARE_BUDGET_S:-270} bash bench/gpu_session.sh pycache compare
cp $OUT/session.log $OUT/torch_compare.json $FINAL_OUT/ 2>/dev/null
ls -la $FINAL_OUT
