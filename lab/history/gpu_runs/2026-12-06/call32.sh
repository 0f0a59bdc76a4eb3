#!/usr/bin/env bash
# Call 32: the stage cost twice with the picks' side-by-side repeats at 300 ms (the bench's
# new default) and the A/A column.
set -u
COST_S=150 bash bench/gpu_session.sh pycache cost
cp bench_out/tuning_cost.json $OUT/tuning_cost-a.json; cp bench_out/session.log $OUT/session-a.log
rm -f bench_out/session.log
COST_S=150 bash bench/gpu_session.sh pycache cost
cp bench_out/tuning_cost.json $OUT/tuning_cost-b.json; cp bench_out/session.log $OUT/session-b.log
