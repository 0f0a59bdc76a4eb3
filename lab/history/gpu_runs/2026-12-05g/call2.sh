#!/usr/bin/env bash
# Call 2 of 2026-12-05g: issue 27's census cost after the timing rigs (graphs and estimate
# set up once per contender a seat) and the budget-bound burst count, bytecode warmed for
# both sides: stage cost with the shipped table's votes, then cold (no shipped table).
set -u
bash bench/gpu_session.sh pycache cost
cp "${OUT:-bench_out}/tuning_cost.json" "${OUT:-bench_out}/tuning_cost-votes.json" 2>/dev/null
BENCH_SEARCH=cold bash bench/gpu_session.sh pycache cost
